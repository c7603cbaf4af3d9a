"""One rank of `topoplan bench`: join the job, build the groups, sweep, and (rank 0) print the JSON result.

Started by `topoplan bench` through topoplan.runner.spawn (the same machinery as `topoplan run`), or by any
launcher: `torchrun --nproc-per-node 8 -m topoplan.bench.sweep_worker --ops all_reduce --sizes 4K:256M`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from topoplan.bench.collectives import Group, SweepOptions, sweep
from topoplan.bench.definitions import avg_busbw, point_count
from topoplan.bench.request import BenchRequest
from topoplan.dtypes import dtype_of
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankGrid
from topoplan.rank_env import RankEnv
from topoplan.runner.dist import join_world, new_groups
from topoplan.runner.process import Progress, rank_main
from topoplan.runner.shm import pipeline_channels, shm_group


def build_groups(world: int, layout: Layout | None, kind: str) -> list[list[int]]:
    """The rank lists the collectives run in: the world, or the layout's tp/pp/dp groups (topoplan.layout)."""
    if layout is None or kind == "world":
        return [list(range(world))]
    if layout.world != world:
        raise TopoplanError(f"--layout {layout} needs {layout.world} ranks; {world} were started")
    return RankGrid(layout).groups(kind)


def my_group(groups: list[list[int]], timeout_s: float, shared_memory: bool, device: torch.device) -> Group:
    """This rank's group (the world's own group when it spans the world), with its shared-memory all-reduce,
    all-to-all and sendrecv ring when asked for and its ranks are CPU ranks of one host (as the runner's TP and
    EP groups and pipeline stages)."""
    if len(groups) == 1 and len(groups[0]) == dist.get_world_size():
        ranks, handle = groups[0], None
    else:
        ranks, handle = new_groups(groups, timeout_s)
    shm = ring = None
    if shared_memory and len(ranks) > 1:
        group = handle if handle is not None else dist.group.WORLD
        shm = shm_group(group, device, timeout_s)
        ring = pipeline_channels(group, device, timeout_s)  # member i -> i + 1, the last -> the first: a ring
    return Group(tuple(ranks), handle, shm, ring)


def run(request: BenchRequest, env: RankEnv) -> dict[str, Any] | None:
    """Sweep on this rank; rank 0 returns the result (docs/bench.md), the others None."""
    r = request
    backend, device = join_world(env, r.backend, r.timeout)
    groups = build_groups(env.world_size, r.layout, r.group)
    group = my_group(groups, r.timeout, r.shared_memory, device)
    points = [0]
    with Progress.on_rank(env.rank) as progress:
        update = progress.task("sweeping", point_count(r.ops, len(r.sizes)))

        def on_point(op: str, n: int) -> None:
            points[0] += n
            update(points[0])

        options = SweepOptions(r.iters, r.warmup, r.redop, r.root, r.check)
        found, skipped = sweep(list(r.ops), list(r.sizes), group, env.rank, device, dtype_of(r.dtype).torch(),
                               options, on_point=on_point)
    if env.rank != 0:
        return None
    rows = [asdict(m) for m in found]
    return {
        "backend": backend, "device": device.type, "dtype": r.dtype, "world": env.world_size,
        "group": r.group, "groups": [list(g) for g in groups], "group_size": group.size,
        "iters": r.iters, "warmup": r.warmup, "sizes": list(r.sizes), "redop": r.redop, "root": r.root,
        "check": r.check, "shared_memory": group.shm is not None, "results": rows, "skipped": skipped,
        "avg_busbw_gbps": avg_busbw(rows),
    }


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank (topoplan.runner.process.rank_main, like the runner's: no hang on a dead peer)."""

    def body(env: RankEnv) -> str | None:
        result = run(BenchRequest.from_worker_argv(argv), env)
        return json.dumps(result) if result is not None else None

    rank_main("topoplan-bench", body)


if __name__ == "__main__":
    main()
