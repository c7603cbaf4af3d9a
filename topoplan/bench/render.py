"""Rich tables for `bench` and `validate` (rendering only; the numbers come from the sweep and the runs)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from topoplan.bench.definitions import human_size
from topoplan.bench.plot import series, sparkline


def bench_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"{result['backend']} on {result['device']}, groups of {result['group_size']} "
                        f"({result['group']}), {result['dtype']}, {result['iters']} iters")
    for name in ("op", "size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        table.add_column(name, justify="left" if name == "op" else "right")
    for row in result["results"]:
        table.add_row(row["op"], human_size(row["size_bytes"]), str(row["count"]), f"{row['time_us']:.1f}",
                      f"{row['algbw_gbps']:.3f}", f"{row['busbw_gbps']:.3f}")
    return table


def print_bench(result: dict[str, Any], console: Console) -> None:
    console.print(bench_table(result))
    data = series(result["results"])
    top = max((bw for pts in data.values() for _, bw in pts), default=0.0)
    if data:
        console.print(f"busbw vs size (full block = {top:.3f} GB/s):")
        width = max(len(op) for op in data)
        for op, pts in data.items():
            console.print(f"  {op:<{width}}  {sparkline(pts, top)}  {human_size(pts[0][0])}..{human_size(pts[-1][0])}")
    for skip in result["skipped"]:
        console.print(f"[yellow]skipped[/yellow] {skip['op']}: {skip['reason']}", highlight=False)


def validate_table(result: dict[str, Any]) -> Table:
    engine = f"{result['engine']} {result['engine_version']}, " if "engine" in result else ""
    table = Table(title=f"predicted vs measured: {engine}{result['model']}, batch {result['batch']}, prompt "
                        f"{result['prompt_len']}, {result['gen_len']} new tokens")
    for name in ("layout", "threads/rank", "layers ran | priced", "pred prefill ms", "meas prefill ms", "prefill err",
                 "pred decode ms/tok", "meas decode ms/tok", "decode err"):
        table.add_column(name, justify="left" if name == "layout" else "right")
    best_p, best_m = result["best_predicted"], result["best_measured"]
    for row in result["rows"]:
        name = f"tp={row['tp']},pp={row['pp']},dp={row['dp']}"
        marks = ("P" if _same(row, best_p) else "") + ("M" if _same(row, best_m) else "")
        table.add_row(f"{name} {marks}".strip(), str(row["threads_per_rank"]), _splits(row),
                      f"{row['predicted_prefill_ms']:.2f}",
                      f"{row['measured_prefill_ms']:.2f}", f"{row['prefill_error']:+.0%}",
                      f"{row['predicted_decode_ms']:.3f}", f"{row['measured_decode_ms']:.3f}", f"{row['error']:+.0%}")
    return table


def _splits(row: dict[str, Any]) -> str:
    """Layers per stage the runner ran and the planner priced, `2/1/1 | 2/1/1` (a mismatch is flagged)."""
    ran, priced = ("/".join(str(s["layers"]) for s in row[key]) for key in ("stages_run", "stages_priced"))
    if not row["stages_run"]:  # an engine that splits layers itself and does not report it (vLLM)
        return f"? | {priced}"
    return f"{ran} | {priced}" if row["stages_run"] == row["stages_priced"] else f"[red]{ran} | {priced} DIFFER"


def _same(row: dict[str, Any], best: dict[str, Any] | None) -> bool:
    return best is not None and all(row[k] == best[k] for k in ("tp", "pp", "dp"))


def print_validate(result: dict[str, Any], console: Console) -> None:
    console.print(validate_table(result))
    console.print(f"load average {result['load_average'][0]:.2f} before, {result['load_average'][1]:.2f} after "
                  f"({result['cores']} cores).", highlight=False)
    console.print("P: the planner's best (lowest predicted decode ms/token); M: the measured best. "
                  f"Order {'matches' if result['order_matches'] else 'DIFFERS'}: predicted "
                  f"{' < '.join(result['predicted_order'])}; measured {' < '.join(result['measured_order'])}.",
                  highlight=False)
