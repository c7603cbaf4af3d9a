"""`python -m topoplan.runner ...`: one rank, for torchrun, mpirun, srun or `topoplan run` to start."""

from topoplan.runner.worker import main

main()
