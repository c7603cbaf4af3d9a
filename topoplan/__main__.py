"""`python -m topoplan` is the same as the `topoplan` console script."""

from topoplan.cli import main

main()
