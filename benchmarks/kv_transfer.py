"""Check the KV-transfer price: measured on this machine, and against published P/D measurements.

Asserts nothing, exits 0 (2 on bad input, one line).

Default: `topoplan bench --kv-transfer`'s measurement (topoplan.bench.kv_bench: one request's KV cache from a
prefill rank to a decode rank, shared memory and gloo, whole and per layer, each path's link fitted on smaller
held-out sizes) run --repeats times; per (path, mode, prompt) the KV bytes, the measured median ms, GB/s, the
priced ms and the ratio measured / priced, each as a range (min-max) over the repeats, and the 1-minute load
average before and after every repeat.

--published: the table of docs/disagg-validation.md, from fixtures/validation/pd_transfer.json (or --file):
each published measurement, its price by topoplan.plan.kv_transfer.price_transfer and the error.

    python benchmarks/kv_transfer.py                                   # Llama-3.1-8B bf16, 1K..8K tokens, 3 repeats
    python benchmarks/kv_transfer.py --model tiny --prompt-len 256,4K --iters 5     # seconds
    python benchmarks/kv_transfer.py --calibration calibration.json    # also price with calibrate's CPU link
    python benchmarks/kv_transfer.py --published                       # the docs table
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from topoplan.errors import TopoplanError

MIN_REPEATS = 3


def span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """`lo-hi` over the repeats (one figure when they agree at the shown precision)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def measured_table(args: argparse.Namespace) -> None:
    from topoplan.bench.definitions import human_size
    from topoplan.bench.kv_bench import kv_transfer_bench
    from topoplan.bench.kv_request import KvBenchRequest

    request = KvBenchRequest.from_options(model=args.model, prompt_len=args.prompt_len, dtype=args.dtype,
                                          iters=args.iters, warmup=args.warmup, calibration=args.calibration)
    results = []
    for i in range(args.repeats):
        result = kv_transfer_bench(request, echo=False)
        load = result["load_average"]
        print(f"repeat {i + 1}/{args.repeats}: load average {load['before'][0]:.2f} before, "
              f"{load['after'][0]:.2f} after ({os.cpu_count()} CPUs)", flush=True)
        results.append(result)
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for result in results:
        for row in result["rows"]:
            by_key.setdefault((row["path"], row["mode"], row["prompt_tokens"]), []).append(row)
    first = results[0]
    calib = "calibration" in first["links"]
    print(f"\n{first['model']}, KV {first['dtype']}, {first['iters']} iters a point, {args.repeats} repeats; "
          "times are medians over the iters, each cell the range over the repeats\n")
    print("| path | mode | prompt | KV bytes | msgs | measured ms | GB/s | priced ms | measured/priced |"
          + (" calibration ms | measured/calibration |" if calib else ""))
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if calib else ""))
    two = lambda v: f"{v:.2f}"  # noqa: E731
    three = lambda v: f"{v:.3f}"  # noqa: E731
    for (path, mode, prompt), rows in by_key.items():
        held = "" if rows[0]["held_out"] else " (fit range)"
        cells = [path, mode, str(prompt), human_size(rows[0]["kv_bytes"]) + held, str(rows[0]["messages"]),
                 span([r["measured_ms"] for r in rows], three), span([r["gbps"] for r in rows], two),
                 span([r["priced_ms"] for r in rows], three), span([r["priced_ratio"] for r in rows], two)]
        if calib:
            cells += [span([r["calibration_ms"] for r in rows], three),
                      span([r["calibration_ratio"] for r in rows], two)]
        print("| " + " | ".join(cells) + " |")
    print()
    for name in first["links"]:
        links = [r["links"][name] for r in results]
        print(f"{name}: alpha {span([v['alpha_us'] for v in links], lambda v: f'{v:.0f}')} us, "
              f"{span([v['bandwidth_gbps'] for v in links], two)} GB/s ({links[0]['source']})")


def published_table(path: str | None) -> None:
    from topoplan.bench.published_pd import DEFAULT_FILE, published_rows

    rows = published_rows(path or DEFAULT_FILE)
    print("| case | measured | KV (stated) | topoplan bytes | priced ms | priced GB/s | error | priced path |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        measured = ", ".join(f"{v:g} {unit}" for unit, v in (("ms", r["measured_ms"]), ("GB/s", r["measured_gbps"]))
                             if v is not None)
        if "error" not in r:
            print(f"| {r['id']} | {measured} | {r['stated_kv'] or '-'} | - | - | - | not priced | {r['not_priced']} |")
            continue
        print(f"| {r['id']} | {measured} | {r['stated_kv'] or '-'} | {r['priced_bytes'] / 1e6:.0f} MB | "
              f"{r['priced_ms']:.2f} | {r['priced_gbps']:.1f} | {100 * r['error']:+.0f}% ({r['compared']}) | "
              f"{r['priced_path']} |")
    print("\nerror = (priced - measured) / measured, on the time where the source states one, else on GB/s")
    for source in dict.fromkeys(r["source"] for r in rows):
        print(f"- {source}: {', '.join(r['id'] for r in rows if r['source'] == source)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--published", action="store_true", help="Print the published-measurements table.")
    parser.add_argument("--file", help="--published: the data file (default fixtures/validation/pd_transfer.json).")
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--prompt-len", default="1K:8K")
    parser.add_argument("--dtype", default="bfloat16", help="The KV cache's dtype (torch spelling).")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"At least {MIN_REPEATS}.")
    parser.add_argument("--calibration", help="A `topoplan calibrate` file: also price with its CPU link.")
    args = parser.parse_args(argv)
    try:
        if args.published:
            published_table(args.file)
        else:
            if args.repeats < MIN_REPEATS:
                raise TopoplanError(f"--repeats {args.repeats}: expected at least {MIN_REPEATS} (ranges need them)")
            measured_table(args)
    except TopoplanError as error:
        print(f"topoplan: error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
