"""Launcher environment discovery, one case per launcher, and the precedence order."""

import pytest

from topoplan.errors import TopoplanError
from topoplan.rank_env import discover_rank_env


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n0",
      "MASTER_PORT": "1234"}, (3, 8, 1, 2, "n0", 1234, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, (5, 6, 2, 3, "127.0.0.1", 29500, "openmpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (1, 2, 1, 2, "127.0.0.1", 29500, "mpich")),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "4(x2)"},
     (7, 8, 3, 4, "127.0.0.1", 29500, "slurm")),
    ({}, (0, 1, 0, 1, "127.0.0.1", 29500, "single")),
])
def test_each_launcher(env, expected):
    got = discover_rank_env(env)
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.master_addr, got.master_port,
            got.launcher) == expected


def test_torchrun_inside_srun_wins():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5"}
    assert discover_rank_env(env).launcher == "torchrun"


@pytest.mark.parametrize("env", [{"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"},
                                 {"MASTER_PORT": "http"}])
def test_bad_values_are_user_errors(env):
    with pytest.raises(TopoplanError):
        discover_rank_env(env)


def test_local_cuda_device():
    from topoplan.rank_env import local_cuda_device

    assert local_cuda_device(3, 8, "CUDA_VISIBLE_DEVICES") == 3  # the node's GPUs, in local-rank order
    assert local_cuda_device(3, 1, "CUDA_VISIBLE_DEVICES") == 0  # srun --gpu-bind=map_gpu: only this task's GPU
    with pytest.raises(TopoplanError, match="local rank 4 has no GPU.*check HIP_VISIBLE_DEVICES"):
        local_cuda_device(4, 2, "HIP_VISIBLE_DEVICES")
