"""One rank of calibrate's synchronisation probe: what a collective costs inside a step, where each rank arrives
after its own stretch of compute, beyond what it costs back to back (the sweep's figure).

In a decode step a TP or EP rank streams a layer's weights, then meets its peers in an all-reduce or all-to-all.
The sweep times collectives back to back, the ranks already in step; in a step they arrive apart, by however
their stretches of compute differ (memory stalls, the OS), and the earliest waits. On this project's 2-core VM
that wait was 70-100 us a collective (one thread a rank, stretches of 4-16 MiB of weights), against 30-40 us
for the all-reduce itself: what the planner's `collective_base_us` ("launch, enqueue, rank skew") must hold for
the runner's multi-rank layouts, which the back-to-back fit leaves out.

Each rank times, in rounds: stretches alone (a product of 2 rows with the next weight of a pool, so it streams
from memory), the group's all-reduce of a decode step's activations alone (the runner's shared-memory one where
it can), and stretch then all-reduce in turn. wait = together - stretch - all-reduce, the slowest rank's, the
median over rounds, per stretch size; rank 0 prints {"wait_us": {"2": .., "8": .., "32": ..}} (MiB -> us).

    python -m topoplan.bench.sync_wait [--sizes-mib 2,8,32] [--iters 100] [--rounds 5]   (one process per rank)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from topoplan.bench.probes import MiB, runner_weight
from topoplan.rank_env import RankEnv
from topoplan.runner.cpu_linear import linear
from topoplan.runner.dist import join_world
from topoplan.runner.process import rank_main
from topoplan.runner.shm import shm_group

COLS = 2048
POOL_BYTES = 64 * MiB  # per stretch size: more than the caches, so every product streams


def per_call_us(fn: Callable[[], object], iters: int) -> float:
    """Mean microseconds of `fn` over `iters` calls, the slowest rank's (every rank gets the same figure)."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / iters * 1e6])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def waits_us(sizes_mib: list[int], iters: int, rounds: int, timeout_s: float) -> dict[str, float]:
    """Per stretch size (MiB): the median over rounds of together - stretch - all-reduce, in microseconds."""
    shm = shm_group(dist.group.WORLD, torch.device("cpu"), timeout_s)
    activations = torch.zeros(2, 4096)  # summed in place every call: zeros stay finite
    all_reduce = (lambda: shm.all_reduce(activations)) if shm is not None else (lambda: dist.all_reduce(activations))
    x, out = torch.randn(2, COLS), {}
    for mib in sizes_mib:
        pool = [runner_weight(torch.randn(mib * MiB // (COLS * 4), COLS), 2) for _ in range(POOL_BYTES // (mib * MiB))]
        turn = [0]

        def stretch() -> None:
            turn[0] += 1
            linear(x, pool[turn[0] % len(pool)])

        def together() -> None:
            stretch()
            all_reduce()

        together()  # warm-up: oneDNN builds its kernel on first use
        samples = [per_call_us(together, iters) - per_call_us(stretch, iters) - per_call_us(all_reduce, iters)
                   for _ in range(rounds)]
        out[str(mib)] = max(0.0, statistics.median(samples))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="topoplan.bench.sync_wait")
    parser.add_argument("--sizes-mib", default="2,8,32")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    def body(env: RankEnv) -> str | None:
        join_world(env, "gloo", args.timeout)
        result = waits_us([int(s) for s in args.sizes_mib.split(",")], args.iters, args.rounds, args.timeout)
        return json.dumps({"wait_us": result}) if env.rank == 0 else None

    rank_main("topoplan-sync-wait", body)


if __name__ == "__main__":
    main()
