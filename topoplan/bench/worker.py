"""One rank of `topoplan bench`: join the job, build the groups, sweep, and (rank 0) print the JSON result.

Started by `topoplan bench` through topoplan.runner.spawn (the same machinery as `topoplan run`), or by any
launcher: `torchrun --nproc-per-node 8 -m topoplan.bench.worker --ops all_reduce --sizes 4K:256M`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from typing import Any

import torch.distributed as dist

from topoplan.bench.collectives import Group, sweep
from topoplan.bench.options import BenchRequest
from topoplan.dtypes import dtype_of
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankGrid
from topoplan.rank_env import discover_rank_env
from topoplan.runner.dist import join_world, new_groups


def build_groups(world: int, layout: Layout | None, kind: str) -> list[list[int]]:
    """The rank lists the collectives run in: the world, or the layout's tp/pp/dp groups (topoplan.layout)."""
    if layout is None or kind == "world":
        return [list(range(world))]
    if layout.world != world:
        raise TopoplanError(f"--layout {layout} needs {layout.world} ranks; {world} were started")
    return RankGrid(layout).groups(kind)


def my_group(groups: list[list[int]], timeout_s: float) -> Group:
    """This rank's group (the world's own group when it spans the world)."""
    if len(groups) == 1 and len(groups[0]) == dist.get_world_size():
        return Group(tuple(groups[0]), None)
    ranks, handle = new_groups(groups, timeout_s)
    return Group(tuple(ranks), handle)


def progress_bar(total: int, enabled: bool):
    """A rich progress bar on stderr (rank 0; forced on when the spawner pipes it to a terminal)."""
    from rich.console import Console
    from rich.progress import Progress

    forced = os.environ.get("TOPOPLAN_PROGRESS") == "1"
    bar = Progress(transient=True, console=Console(stderr=True, force_terminal=forced or None),
                   disable=not (enabled and (forced or sys.stderr.isatty())))
    return bar, bar.add_task("sweeping", total=total)


def run(request: BenchRequest) -> dict[str, Any] | None:
    r = request
    env = discover_rank_env()
    backend, device = join_world(env, r.backend, r.timeout)
    groups = build_groups(env.world_size, r.layout, r.group)
    group = my_group(groups, r.timeout)
    bar, task = progress_bar(len(r.ops) * len(r.sizes), env.rank == 0)
    with bar:
        found, skipped = sweep(list(r.ops), list(r.sizes), group, env.rank, device, dtype_of(r.dtype).torch(),
                               r.iters, r.warmup, on_point=lambda op, n: bar.advance(task, n))
    if env.rank != 0:
        return None
    return {
        "backend": backend, "device": device.type, "dtype": r.dtype, "world": env.world_size,
        "group": r.group, "groups": [list(g) for g in groups], "group_size": group.size,
        "iters": r.iters, "warmup": r.warmup, "sizes": list(r.sizes),
        "results": [asdict(m) for m in found], "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> None:
    """Each rank ends with os._exit, like the runner's worker, so a dead peer cannot hold it in shutdown."""
    code = 0
    try:
        result = run(BenchRequest.from_worker_argv(argv))
        if result is not None:
            print(json.dumps(result), flush=True)
        dist.destroy_process_group()
    except TopoplanError as error:
        print(f"topoplan-bench: error: {error}", file=sys.stderr)
        code = error.exit_code
    except (RuntimeError, TimeoutError, ConnectionError) as error:
        first = (str(error).strip().splitlines() or [""])[0]
        print(f"topoplan-bench: failed: {type(error).__name__}: {first}", file=sys.stderr)
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
