"""Rich tables for `bench` and `validate` (rendering only; the numbers come from the sweep and the runs)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from topoplan.bench.definitions import human_size
from topoplan.bench.plot import series, sparkline
from topoplan.terminal import emit, inert

GROUP_COLUMNS = ("time", "algbw", "busbw", "#wrong")  # nccl-tests' per-form columns (time in us, GB/s)


def _time(us: float) -> str:
    """nccl-tests' precision: tenths below 10 ms, whole microseconds above (the column stays narrow)."""
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def _wrong(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    return "N/A" if row.get("wrong") is None else str(row["wrong"])


FORM_LABELS = {False: ("out-of-place", "out"), True: ("in-place", "in")}  # nccl-tests' group labels, then short


def op_table(op: str, rows: list[dict[str, Any]], with_count: bool, short: bool = False) -> Table:
    """One op's sweep as nccl-tests prints it: size, count, then time/algbw/busbw/#wrong out of place and in
    place (the forms the op has); its reduction and root in the title. `short`: the forms labelled out/in."""
    first = rows[0]
    title = op + (f", redop {first['redop']}" if first["redop"] != "none" else "") + (
        f", root {first['root']}" if first["root"] >= 0 else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("size\n(B)", justify="right", overflow="fold")
    if with_count:
        table.add_column("count\n(elts)", justify="right", overflow="fold")
    forms = [place for place in (False, True) if any(r["in_place"] == place for r in rows)]
    for place in forms:
        for i, name in enumerate(GROUP_COLUMNS):
            label = FORM_LABELS[place][short] if i == 0 else ""
            table.add_column(f"{label}\n{name}", justify="right", overflow="fold")
    by_size: dict[int, dict[bool, dict[str, Any]]] = {}
    for row in rows:
        by_size.setdefault(row["size_bytes"], {})[row["in_place"]] = row
    for size, forms_at in by_size.items():
        cells = [human_size(size)] + ([str(next(iter(forms_at.values()))["count"])] if with_count else [])
        for place in forms:
            row = forms_at.get(place)
            cells += ([_time(row["time_us"]), f"{row['algbw_gbps']:.2f}", f"{row['busbw_gbps']:.2f}"]
                      if row else ["", "", ""]) + [_wrong(row)]
        table.add_row(*cells)
    return table


def bench_tables(result: dict[str, Any], console: Console) -> list[Table]:
    """One table per op: the element count and the long form labels where the console's width holds them."""
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in result["results"]:
        by_op.setdefault(row["op"], []).append(row)
    tables = []
    for op, rows in by_op.items():
        choices = [op_table(op, rows, count, short) for count, short in ((True, False), (False, False), (False, True))]
        tables.append(next((t for t in choices if natural_width(t, console) <= console.width), choices[-1]))
    return tables


def natural_width(table: Table, console: Console) -> int:
    """The width `table` takes when nothing limits it (console.measure clamps to the console's width)."""
    return console.measure(table, options=console.options.update_width(10_000)).maximum


def print_bench(result: dict[str, Any], console: Console) -> None:
    """The header line, a table per op, the chart, what was skipped and nccl-tests' closing lines."""
    via = " (all_reduce, all_to_all, sendrecv through shared memory)" if result.get("shared_memory") else ""
    head = (f"{result['backend']}{via} on {result['device']}, groups of {result['group_size']} ({result['group']}), "
            f"{result['dtype']}, {result['iters']} iters")
    lines: list[Any] = [Text(head), Text("time in us, bandwidths in GB/s; out: out of place, in: in place"),
                        *bench_tables(result, console)]
    data = series(result["results"])
    top = max((bw for pts in data.values() for _, bw in pts), default=0.0)
    if data:
        lines.append(Text(f"busbw vs size (full block = {top:.3f} GB/s):"))
        width = max(len(op) for op in data)
        for op, pts in data.items():
            lines.append(Text(f"  {op:<{width}}  {sparkline(pts, top)}  "
                              f"{human_size(pts[0][0])}..{human_size(pts[-1][0])}"))
    for skip in result["skipped"]:
        form = " (in place)" if skip.get("in_place") else ""
        lines.append(Text.assemble(("skipped", "yellow"), f" {skip['op']}{form}: {skip['reason']}"))
    if not result["results"]:
        lines.append(Text("nothing measured: every op was skipped (see the reasons above)", style="bold"))
    if result.get("check"):
        wrong = sum(r["wrong"] or 0 for r in result["results"])
        lines.append(Text(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"))
    for op, value in result.get("avg_busbw_gbps", {}).items():
        lines.append(Text(f"# Avg bus bandwidth    : {value:.4f} ({op})"))
    emit(console, *lines)


def validate_table(result: dict[str, Any], with_layers: bool = True) -> Table:
    """Predicted vs measured per layout: times in ms (decode per token), errors relative to the measurement."""
    engine = f"{result['engine']} {result['engine_version']}, " if "engine" in result else ""
    table = Table(title=inert(f"predicted vs measured: {engine}{result['model']}, batch {result['batch']}, prompt "
                              f"{result['prompt_len']}, {result['gen_len']} new tokens"),  # a model path from input
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("layout", no_wrap=True)
    table.add_column("threads\n/rank", justify="right", overflow="fold")
    if with_layers:
        table.add_column("layers\nran | priced", justify="right", overflow="fold")
    for phase in ("prefill", "decode"):
        for what in ("pred", "meas", "err"):
            table.add_column(f"{phase}\n{what}", justify="right", overflow="fold")
    best_p, best_m = result["best_predicted"], result["best_measured"]
    for row in result["rows"]:
        marks = ("P" if _same(row, best_p) else "") + ("M" if _same(row, best_m) else "")
        table.add_row(f"{_layout(row)} {marks}".strip(), str(row["threads_per_rank"]),
                      *((_splits(row),) if with_layers else ()),
                      f"{row['predicted_prefill_ms']:.2f}", f"{row['measured_prefill_ms']:.2f}",
                      f"{row['prefill_error']:+.0%}",
                      f"{row['predicted_decode_ms']:.3f}", f"{row['measured_decode_ms']:.3f}", f"{row['error']:+.0%}")
    return table


def _layout(row: dict[str, Any]) -> str:
    return f"tp{row['tp']} pp{row['pp']} dp{row['dp']}"


def _splits(row: dict[str, Any]) -> str:
    """Layers per stage the runner ran and the planner priced, `2/1/1 | 2/1/1` (a mismatch is flagged)."""
    ran, priced = ("/".join(str(s["layers"]) for s in row[key]) for key in ("stages_run", "stages_priced"))
    if not row["stages_run"]:  # an engine that splits layers itself and does not report it (vLLM)
        return f"? | {priced}"
    return f"{ran} | {priced}" if row["stages_run"] == row["stages_priced"] else f"[red]{ran} | {priced} DIFFER[/]"


def _same(row: dict[str, Any], best: dict[str, Any] | None) -> bool:
    return best is not None and all(row[k] == best[k] for k in ("tp", "pp", "dp"))


def print_validate(result: dict[str, Any], console: Console) -> None:
    """The table at the console's width: the layers column moves under it when the width cannot hold it."""
    table = validate_table(result)
    lines: list[Any] = []
    if natural_width(table, console) > console.width:
        table = validate_table(result, with_layers=False)
        differ = [f"{_layout(r)}: {_splits(r)}" for r in result["rows"] if r["stages_run"] != r["stages_priced"]]
        lines.append(Text.from_markup("layers per stage ran | priced: " + ("; ".join(differ) if differ else
                                                                           "as priced for every layout")))
    lines += [Text(f"load average {result['load_average'][0]:.2f} before, {result['load_average'][1]:.2f} after "
                   f"({result['cores']} cores)."),
              Text("Times in ms, decode per token; err: (predicted - measured) / measured."),
              Text("P: the planner's best (lowest predicted decode ms/token); M: the measured best."),
              Text(f"Order {'matches' if result['order_matches'] else 'DIFFERS'}: predicted "
                   f"{' < '.join(result['predicted_order'])}; measured {' < '.join(result['measured_order'])}.")]
    speed = result["drift"]
    lines.append(Text(f"WARNING: {speed['warning']}." if speed["warning"] else
                      f"Memory bandwidth {speed['gemv_gbps_before']:.1f} / {speed['gemv_gbps_after']:.1f} GB/s "
                      f"before / after, {speed['gemv_gbps_calibrated']:.1f} calibrated."))
    emit(console, table, *lines)


def kv_transfer_table(result: dict[str, Any], compact: bool = False) -> Table:
    """Measured vs priced per path, mode and prompt: ms (median), GB/s, the price by the path's own fit and, with
    a calibration file, by its `node` link; ratio = measured / priced; `*` marks a size inside the fit's range.
    `compact`: without the message count and GB/s columns (a narrow console)."""
    table = Table(title=inert(f"KV transfer, prefill rank -> decode rank: {result['model']}, {result['dtype']}, "
                              f"{result['iters']} iters"),
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    with_calibration = "calibration" in result["links"]
    names = ("path", "mode", "prompt", "KV", *(() if compact else ("msgs",)), "meas\nms",
             *(() if compact else ("meas\nGB/s",)), "priced\nms", "ratio",
             *(("calib\nms", "ratio") if with_calibration else ()), "#wrong")
    for name in names:
        table.add_column(name, justify="left" if name in ("path", "mode") else "right", no_wrap=True)
    for row in result["rows"]:
        cells = [row["path"], row["mode"], str(row["prompt_tokens"]),
                 human_size(row["kv_bytes"]) + ("" if row["held_out"] else "*"),
                 *(() if compact else (str(row["messages"]),)), f"{row['measured_ms']:.3f}",
                 *(() if compact else (f"{row['gbps']:.2f}" if row["gbps"] else "-",)),
                 f"{row['priced_ms']:.3f}", f"{row['priced_ratio']:.2f}"]
        if with_calibration:
            cells += [f"{row['calibration_ms']:.3f}", f"{row['calibration_ratio']:.2f}"]
        table.add_row(*cells, str(row["wrong"]))
    return table


def print_kv_transfer(result: dict[str, Any], console: Console) -> None:
    """The table, then each link's constants and where they come from, and the load average."""
    table = kv_transfer_table(result)
    lines: list[Any] = [table if natural_width(table, console) <= console.width else kv_transfer_table(result, True)]
    for name, link in result["links"].items():
        fit = f", fit error {link['rel_rms']:.0%} rms" if link.get("rel_rms") is not None else ""
        lines.append(Text(f"{name}: alpha {link['alpha_us']:.1f} us, {link['bandwidth_gbps']:.2f} GB/s{fit} "
                          f"({link['source']})"))
    load = result["load_average"]
    lines.append(Text(f"load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after; times are "
                      "medians; ratio = measured / priced; * = inside the fit's sizes (not held out)"))
    emit(console, *lines)
