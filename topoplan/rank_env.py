"""Who am I? Read rank, world size and rendezvous address from whichever launcher started this process.

One documented order, first match wins (a job started by `srun torchrun ...` sets both; the inner
launcher is the one that owns the process):
  1. torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
  2. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK/_LOCAL_SIZE
  3. MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
  4. Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
  5. none of them: a single process, rank 0 of 1.
MASTER_ADDR / MASTER_PORT come from the environment (torchrun sets them; `topoplan launch` emits them for
mpirun and srun); without them a single-node default of 127.0.0.1:29500 is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from topoplan.errors import TopoplanError

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500

# launcher name, then its variables for: rank, world size, local rank, local world size
_LAUNCHERS: tuple[tuple[str, str, str, str, str], ...] = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the job, and where the rendezvous is."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun", "openmpi", "mpich", "slurm" or "single"


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    # SLURM_NTASKS_PER_NODE can read "4(x2)" on heterogeneous allocations: the count comes first.
    digits = raw.split("(")[0].split(",")[0].strip()
    if not digits.isdigit():
        raise TopoplanError(f"environment variable {name}={raw!r}: expected a non-negative integer")
    return int(digits)


def discover_rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """The RankEnv of this process (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    master_addr = env.get("MASTER_ADDR", DEFAULT_MASTER_ADDR)
    port_raw = env.get("MASTER_PORT", str(DEFAULT_MASTER_PORT))
    if not port_raw.isdigit():
        raise TopoplanError(f"environment variable MASTER_PORT={port_raw!r}: expected a port number")
    for launcher, rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        if rank_var in env and size_var in env:
            rank, size = _int(env, rank_var), _int(env, size_var)
            local_rank = _int(env, local_var) if local_var in env else rank
            local_size = _int(env, local_size_var) if local_size_var in env else size
            if not 0 <= rank < size:
                raise TopoplanError(f"{launcher}: {rank_var}={rank} is not below {size_var}={size}")
            return RankEnv(rank, size, local_rank, local_size, master_addr, int(port_raw), launcher)
    return RankEnv(0, 1, 0, 1, master_addr, int(port_raw), "single")


def local_cuda_device(local_rank: int, visible_devices: int, visible_var: str) -> int:
    """The CUDA device index this rank should use, given how many devices CUDA shows it.

    Every launcher format of `topoplan launch` shows each rank its node's planned GPUs in local-rank order
    (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES on ROCm), so the device is `local_rank`; a process shown a single
    GPU (a launcher binding one GPU per task, such as Slurm's `--gpu-bind=map_gpu`) uses device 0. `visible_var`
    names the variable to check in the message (HIP_VISIBLE_DEVICES on ROCm).
    """
    if visible_devices == 1:
        return 0
    if not 0 <= local_rank < visible_devices:
        raise TopoplanError(f"local rank {local_rank} has no GPU: the GPU runtime shows this process {visible_devices} "
                            f"device(s); check {visible_var} and the launcher's GPU binding")
    return local_rank
