"""TensorRT-LLM's scheduler replayed as a closed loop, step by step, against the published TTFT: does its in-flight
batching alone keep a benchmark's requests in waves (all C prompts together), and does that explain the measured
first-token wait (which the served model prices with an empirical factor instead, docs/planner.md section 4)?

The replay, deterministic: C requests reach an idle engine at t = 0 (a benchmark at --max-concurrency C); each
step runs one token of every decoding request, then packs waiting prompts whole, first come first served, into
the room those decodes leave in max_num_tokens (TensorRT-LLM 1.0: chunked prefill off; GUARANTEED_NO_EVICT admits
them all where memory holds C requests, as at every published row); a prompt's first token comes with its step;
a request that has generated its last token is replaced at the end of that step. Step times are the served
model's own (ReplicaSteps.step_ms). Printed per row: the measured TTFT, the served model's, and
the replay's mean over the first C requests (the run's first wave) and over the next 9 x C (its steady state).

    python benchmarks/trtllm_closed_loop.py            # the TensorRT-LLM rows of tests/data/engine_measurements.json
    python benchmarks/trtllm_closed_loop.py --silicon  # and the same runs at C16-C128 (needs the extra)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.served_validation import PUBLISHED, layout_cost, silicon_rows  # noqa: E402
from topoplan.engines import resolve  # noqa: E402
from topoplan.plan.served import ReplicaSteps  # noqa: E402


def replay(steps: ReplicaSteps, budget: int, prompt: int, gen: int, c: int, requests: int) -> list[float]:
    """First-token times (ms) of the first `requests` requests, in the order their first tokens come."""
    price = functools.lru_cache(maxsize=None)(steps.step_ms)
    now, waiting, left, firsts = 0.0, [0.0] * c, [], []  # waiting: arrival times (FCFS); left: tokens to decode
    while len(firsts) < requests:
        room, batch = budget - len(left), []
        while waiting and waiting[0] <= now and room >= prompt:
            batch.append(waiting.pop(0))
            room -= prompt
        if not left and not batch:  # idle: the next arrival starts a step
            now = waiting[0]
            continue
        now += price(len(left), len(batch) * prompt)
        left = [n - 1 for n in left]
        finished = left.count(0) + (len(batch) if gen == 1 else 0)
        left = [n for n in left if n] + [gen - 1] * (len(batch) if gen > 1 else 0)
        firsts += [now - arrived for arrived in batch]
        waiting += [now] * finished  # each finished request replaced at once
    return firsts[:requests]


def served_steps(r: dict) -> tuple[ReplicaSteps, float]:
    """The row's layout priced as served_validation does: its step times and the served model's TTFT."""
    cost = layout_cost(r)
    return cost.steps, cost.served.replica.ttft_ms


def main() -> None:
    rows = silicon_rows() if "--silicon" in sys.argv else PUBLISHED["rows"]
    print("| point | TTFT measured | served | replay: first wave | error | steady state | error |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["engine"].startswith("trtllm"):
            continue
        steps, served = served_steps(r)
        c, budget = r["concurrency"], resolve(r["engine"]).scheduler.budgets[0].max_batched_tokens
        firsts = replay(steps, budget, r["prompt"], r["gen"], c, 10 * c)
        first, steady, measured = sum(firsts[:c]) / c, sum(firsts[c:]) / (9 * c), r["ttft_ms"]
        cells = " | ".join(f"{v:.0f} | {100 * (v / measured - 1):+.0f}%" for v in (first, steady))
        print(f"| {r['model']} {r['dtype']} TP{r['tp']} C{c} {r['prompt']}/{r['gen']} | {measured:.0f} | "
              f"{served:.0f} | {cells} |")


if __name__ == "__main__":
    main()
