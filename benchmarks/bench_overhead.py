"""Overhead of `topoplan bench`'s timing path versus a raw torch.distributed timing loop.

Reference: the loop anyone would write by hand (barrier; perf_counter; N x dist.all_reduce; perf_counter),
on the same 2 gloo ranks, same buffers, same sizes. Ours: topoplan.bench.collectives (prebuilt closure,
per-call perf_counter, MAX over ranks). Rounds alternate raw/ours so load from other processes hits both;
the ratio of medians is printed per size. Target: ours / raw <= 1.05. Asserts nothing.

On a shared machine gloo's own jitter (tens of percent) swamps any harness cost, so the script also
measures the harness alone, deterministically: the time per call that topoplan's loop adds around a call
that does nothing, against a bare `for` loop around the same call; that cost over the measured operation
time is the overhead without the noise.

    python benchmarks/bench_overhead.py [--iters 50] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = (4096, 65536, 1 << 20)


def rank_main(iters: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from topoplan.bench.collectives import Group, make_case, slowest, time_op
    from topoplan.rank_env import discover_rank_env
    from topoplan.runner.dist import join_world

    env = discover_rank_env()
    _, device = join_world(env, "gloo", 120)
    nothing = lambda: None  # noqa: E731
    n = 200_000
    begin = time.perf_counter()
    for _ in range(n):
        nothing()
    bare_ns = (time.perf_counter() - begin) * 1e9 / n
    harness_ns = statistics.fmean(time_op(nothing, n, 0, device)) * 1e3
    added_us = max(0.0, harness_ns - bare_ns) / 1e3
    group = Group(tuple(range(env.world_size)), None)
    for size in SIZES:
        x = torch.ones(size // 4)
        raw, ours = [], []
        for _ in range(rounds):
            for _ in range(3):  # warm-up, as both paths do
                dist.all_reduce(x)
            dist.barrier()
            begin = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            raw.append(slowest([(time.perf_counter() - begin) * 1e6 / iters], device)[0])
            call = make_case("all_reduce", size // 4, group, env.rank, device, torch.float32).call
            ours.append(slowest([statistics.fmean(time_op(call, iters, 3, device))], device)[0])
        if env.rank == 0:
            r, o = statistics.median(raw), statistics.median(ours)
            print(f"all_reduce {size:>8} B: raw loop {r:8.1f} us, topoplan bench {o:8.1f} us, "
                  f"ratio ours/raw = {o / r:.3f} (noisy); harness adds {added_us * 1e3:.0f} ns/call: "
                  f"ratio without noise = {(r + added_us) / r:.5f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if "RANK" in os.environ:
        rank_main(args.iters, args.rounds)
        return
    from topoplan.runner.spawn import spawn_ranks

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    env = {"OMP_NUM_THREADS": "1"}
    result = spawn_ranks(2, [sys.executable, __file__, "--iters", str(args.iters), "--rounds", str(args.rounds)],
                         env_per_rank=lambda rank: env, timeout_s=600)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
