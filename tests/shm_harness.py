"""One rank of tests/test_shm.py: the shared-memory collectives against gloo's on the same inputs.
Usage: python tests/shm_harness.py OUT_DIR (rank env from the spawner). Rank r writes OUT_DIR/r.json."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from topoplan.rank_env import discover_rank_env
from topoplan.runner.dist import join_world
from topoplan.runner.shm import SHM_DIR, ShmGroup, usable


def main() -> None:
    out = Path(sys.argv[1])
    join_world(discover_rank_env(), "gloo", 60)
    rank, world = dist.get_rank(), dist.get_world_size()
    before = set(os.listdir(SHM_DIR))
    group = dist.new_group(list(range(world)))
    shm = ShmGroup(group, timeout_s=60, capacity=4096)
    dist.barrier()
    leftover = sorted(name for name in set(os.listdir(SHM_DIR)) - before if name.startswith("topoplan-"))
    generator = torch.Generator().manual_seed(rank)
    same, gathered_ok = [], []
    for call in range(7):  # more calls than parities: slots are reused
        x = torch.randn(3, 5 + call, generator=generator)
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        got = shm.all_reduce(x.clone())
        same.append(torch.allclose(got, expected, rtol=1e-6, atol=1e-6))
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        gathered_ok.append(torch.equal(shm.all_gather(x, dim=-1), torch.cat(parts, dim=-1)))
    reduced = shm.all_reduce(torch.randn(64, generator=generator))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, reduced.tolist(), group=group)
    result = {"usable": usable(group, torch.device("cpu")), "leftover": leftover, "same": same,
              "gathered": gathered_ok, "bitwise_equal_on_every_rank": all(r == everyone[0] for r in everyone),
              "fits": [shm.fits(torch.empty(1024)), shm.fits(torch.empty(1025))]}
    (out / f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
