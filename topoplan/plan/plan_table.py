"""The ranked plan as a rich table: one row per layout, its GPU groups and the one-line reason."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from topoplan.layout import Layout, RankGrid
from topoplan.plan.cost import LayoutCost
from topoplan.plan.rank import Plan, RankedLayout
from topoplan.plan.served import ServedCost
from topoplan.terminal import inert


def gpu_groups(entry: RankedLayout) -> str:
    """Node 0's groups: TP groups in brackets, PP stages joined by '>', DP replicas by '|'."""
    layout, order = entry.cost.layout, entry.order
    grid, k = RankGrid(layout), len(order)  # node 0 runs ranks 0..k-1, local rank i on order[i]
    replicas: dict[int, list[str]] = {}
    for group in grid.tp_groups:
        here = [order[rank].removeprefix("GPU") for rank in group if rank < k]
        if here:
            replicas.setdefault(grid.coords(group[0]).dp_rank, []).append(f"[{','.join(here)}]")
    return " | ".join(">".join(stages) for stages in replicas.values())


def layout_label(layout: Layout) -> str:
    return f"tp{layout.tp} pp{layout.pp} dp{layout.dp}" + (f" ep{layout.ep}" if layout.ep > 1 else "")


def headline(entry: RankedLayout) -> str:
    """The reason that explains the row best: no fit, else the TP/PP link finding, else the roofline; and
    the line on `inspect`'s advice when the layout goes against it (it follows the link finding)."""
    first, advice = entry.cost.reasons[0], entry.cost.advice
    return f"{first}; {advice}" if advice and advice != first else first


def phrases(reason: str) -> str:
    """A reason one phrase per line (its `; ` breaks): a narrow column then wraps between phrases, not inside."""
    return "\n".join(part.strip() for part in reason.split("; "))


def served_cells(cost: LayoutCost, served: ServedCost | None = None) -> tuple[str, str, str]:
    """TTFT, TPOT and delivered output tokens/s per GPU of the machine, served (topoplan.plan.served; `served`:
    another estimator's figures); the static batch's prefill, decode step and decode-phase rate where the layout
    was not served (CPU plans)."""
    served = served or cost.served
    if served is None:
        return f"{cost.prefill_ms:.1f}", f"{cost.decode_ms_per_token:.2f}", f"{cost.tokens_per_s_per_gpu:.1f}"
    r = served.replica
    return f"{r.ttft_ms:.1f}", f"{r.tpot_ms:.2f}", f"{served.output_tokens_per_s_per_gpu:.1f}"


def builtin_cells(cost: LayoutCost) -> tuple[str, ...]:
    """The built-in estimator's TTFT, TPOT and tok/s/GPU beside aiconfigurator's (`--estimator aiconfigurator`)."""
    served = cost.estimates.get("builtin")
    return served_cells(cost, served) if served else ("", "", "")


def builtin_line(cost: LayoutCost) -> str:
    """The same as a line under the row, for the narrow table (no room for three more columns at 80)."""
    ttft, tpot, rate = builtin_cells(cost)
    return f"built-in: TTFT {ttft} ms, TPOT {tpot} ms, {rate} tok/s/GPU\n" if ttft else ""


def plan_table(result: Plan, top: int | None, width: int | None = None) -> RenderableType:
    """The table with every column when `width` (None: unlimited) holds it whole, its reasons one phrase per
    line; else compact, each row's groups and reason under it."""
    wide = _table(result, top, narrow=False)
    if width is None or Console(width=10_000).measure(wide).maximum <= width:
        return wide
    return _table(result, top, narrow=True)


def _table(result: Plan, top: int | None, narrow: bool) -> RenderableType:
    w = result.workload
    batch = ("requests in flight searched per layout" if result.batch_searched
             else f"{w.batch} request(s) in flight per replica")
    kv = f", KV {w.kv.short}" if w.kv is not w.weights else ""
    title = (f"{result.model.name} ({w.dtype}{kv}) on {result.nodes} x {len(result.topology.gpus)} "
             f"{result.device.name}: {batch}, prompt {w.prompt_len}, generate {w.gen_len}; ranked by "
             f"{result.objective} for {result.engine}")
    hidden = len(result.hidden)
    both = any(entry.cost.estimates for entry in result.layouts)
    legend = ("conc: requests in flight per replica; TTFT, TPOT and delivered output tok/s per GPU of the machine: "
              "served under the engine's scheduler"
              + ("" if narrow else "; step ms: one decode step of the batch alone")
              + ("; kernels from aiconfigurator, links from topoplan (built-in: topoplan's own kernel model at the "
                 "same concurrency)" if both else ""))
    hidden_note = (f"{hidden} layout(s) hidden: a layout with the same tp and pp but more DP replicas is as fast "
                   "(--json lists them under \"hidden\")" if hidden else "")
    caption = "\n".join(part for part in (legend if result.serving else "", hidden_note) if part) or None
    table = Table(title=inert(title), title_justify="left", caption=None if narrow else caption, caption_justify="left",
                  box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, pad_edge=not narrow)
    for name in ("#", "layout", "fits", "conc", "GiB/GPU", "TTFT ms", "TPOT ms", "tok/s/GPU",
                 *(("built-in TTFT", "built-in TPOT", "built-in tok/s/GPU") if both and not narrow else ()),
                 *(() if narrow else ("step ms",))):
        table.add_column(name, justify="left" if name == "layout" else "right", no_wrap=True)
    groups = "GPU groups" + (" (per node)" if result.nodes > 1 else "")
    if not narrow:
        table.add_column(groups, overflow="fold")
        table.add_column("why", ratio=1)
    shown = result.layouts[:top] if top else result.layouts
    for i, entry in enumerate(shown, 1):
        c = entry.cost
        table.add_row(str(i), layout_label(c.layout), "yes" if c.fits else "[red]no",
                      str(c.batch) + ("[red]*" if c.slo_miss else ""), f"{c.memory_per_gpu / 2**30:.1f}",
                      *served_cells(c), *(builtin_cells(c) if both and not narrow else ()),
                      *(() if narrow else (f"{c.decode_ms_per_token:.2f}", gpu_groups(entry),
                                           phrases(headline(entry)))))
    if not narrow:
        return table
    notes = Table.grid(padding=(0, 1))  # the row number, then its groups and reason indented under them
    notes.add_column(no_wrap=True)
    notes.add_column(overflow="fold")
    for i, entry in enumerate(shown, 1):
        notes.add_row(f"#{i}", Text(f"{gpu_groups(entry)}\n{builtin_line(entry.cost)}{phrases(headline(entry))}"))
    return Group(table, Text(f"{groups}, then why:"), notes, *([Text(caption)] if caption else []))
