"""Does a serving run's TTFT depend on the output length? The test that settles which TTFT mechanisms a served
model can use: an engine's first-token wait is set before a request decodes anything, so a scheduler whose
admission is not full (its KV cache and max_batch_size hold every request in flight) gives a TTFT that does not
move with the output length at a fixed prompt and concurrency.

For each group of published closed-loop rows that differ only in the output length G (engine version, model,
dtype, GPU, TP, concurrency C, prompt), least squares of the measured TTFT on the measured request latency
L = TTFT + (G - 1) x TPOT: TTFT = a + b x L. C x b is the share of a request's latency spent waiting: 0 when
TTFT does not move with the output; 1 when, at every moment, one of the C requests waits for a slot (C - 1
admitted: by Little's law that one's wait is L / C on the mean). Beside it, the most requests topoplan's memory
model holds at that layout, each reserving its whole prompt + output of KV cache (TensorRT-LLM's default
GUARANTEED_NO_EVICT admission does the same), so whether memory could make requests wait.

    python benchmarks/ttft_output_slope.py             # the rows of tests/data/engine_measurements.json
    python benchmarks/ttft_output_slope.py --silicon   # served_validation.silicon_rows: the same runs at more
                                                       # concurrencies (needs pip install 'topoplan[aiconfigurator]')
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.served_validation import point, served_rows, silicon_rows  # noqa: E402


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of the least-squares line TTFT = a + b x L through (L, TTFT) points."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows that differ only in the output length, by (engine, model, dtype, gpu, tp, concurrency, prompt)."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[(r["engine"], r["model"], r["dtype"], r["gpu"], r["tp"], r["concurrency"], r["prompt"])].append(r)
    return {k: sorted(v, key=lambda r: r["gen"]) for k, v in out.items() if len({r["gen"] for r in v}) >= 3}


def waiting_share(rows: list[dict]) -> tuple[float, float]:
    """(a in ms, C x b) of a group (see the module docstring)."""
    a, b = slope([(r["ttft_ms"] + (r["gen"] - 1) * r["tpot_ms"], r["ttft_ms"]) for r in rows])
    return a, rows[0]["concurrency"] * b


WAITING = 0.5  # C x b at or above it: a request of the C waits for admission (1 when one always does)


def admission_waits(rows: list[dict]) -> set[tuple]:
    """The points (served_validation.point) of the rows whose group's measured TTFT grows with the request latency
    as a request waiting for admission does (C x b >= WAITING): a deployment effect the rows do not record, outside
    what a TTFT set before the request decodes can price (no fit uses them; reports show them apart)."""
    return {point(r) for group in groups(rows).values() if waiting_share(group)[1] >= WAITING for r in group}


def main() -> None:
    silicon = "--silicon" in sys.argv
    rows = silicon_rows() if silicon else served_rows()
    memory = {} if silicon else {(r["engine"], r["model"], r["dtype"], r["gpu"], r["tp"], r["concurrency"],
                                  r["prompt"], r["gen"]): r["max_batch"] for r in rows}
    print("| engine | model dtype GPU | TP | C | prompt | TTFT measured at each gen (ms) | a (ms) | C x b | "
          + ("" if silicon else "memory holds (requests, whole output reserved) | ") + "\n"
          + "|---" * (8 if silicon else 9) + "|")
    shares: dict[tuple, list[float]] = defaultdict(list)
    for key, mine in sorted(groups(rows).items()):
        engine, model, dtype, gpu, tp, c, prompt = key
        a, share = waiting_share(mine)
        shares[(engine, model, dtype, c)].append(share)
        ttfts = ", ".join(f"{r['ttft_ms']:.0f} @ {r['gen']}" for r in mine)
        held = "" if silicon else f" {min(memory[key + (r['gen'],)] for r in mine)} |"
        print(f"| {engine} | {model} {dtype} {gpu} | {tp} | {c} | {prompt} | {ttfts} | {a:.0f} | {share:.2f} |{held}")
    print("\n| engine | model dtype | C | groups (TP x prompt) | C x b: median | range |\n|---|---|---|---|---|---|")
    for (engine, model, dtype, c), values in sorted(shares.items()):
        values.sort()
        print(f"| {engine} | {model} {dtype} | {c} | {len(values)} | {values[len(values) // 2]:.2f} | "
              f"{values[0]:.2f} to {values[-1]:.2f} |")


if __name__ == "__main__":
    main()
