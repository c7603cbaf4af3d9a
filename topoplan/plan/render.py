"""The ranked plan as a rich table: one row per layout, its GPU groups and the one-line reason."""

from __future__ import annotations

from rich.table import Table

from topoplan.plan.rank import Plan, RankedLayout


def gpu_groups(entry: RankedLayout) -> str:
    """Node 0's groups: TP groups in brackets, PP stages joined by '>', DP replicas by '|'."""
    layout, order = entry.cost.layout, entry.order
    tp, rep = min(layout.tp, len(order)), min(layout.tp * layout.pp, len(order))
    index = [g.removeprefix("GPU") for g in order]
    replicas = []
    for r in range(0, len(index), rep):
        stages = [f"[{','.join(index[s:s + tp])}]" for s in range(r, r + rep, tp)]
        replicas.append(">".join(stages))
    return " | ".join(replicas)


def headline(entry: RankedLayout) -> str:
    """The reason that explains the row best: no fit, else the TP/PP link finding, else the roofline."""
    return entry.cost.reasons[0]


def plan_table(result: Plan, top: int | None) -> Table:
    w = result.workload
    title = (f"{result.model.name} ({w.dtype}) on {result.nodes} x {len(result.topology.gpus)} {result.device.name}: "
             f"batch {w.batch}, prompt {w.prompt_len}, generate {w.gen_len}; ranked by {result.objective}")
    hidden = len(result.hidden)
    caption = (f"{hidden} layout(s) hidden: a layout with the same tp and pp but more DP replicas is as fast "
               "(--json lists them under \"hidden\")" if hidden else None)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for name in ("#", "layout", "fits", "GB/GPU", "TTFT ms", "TPOT ms", "tok/s/GPU"):
        table.add_column(name, justify="left" if name == "layout" else "right", no_wrap=True)
    table.add_column("GPU groups" + (" (per node)" if result.nodes > 1 else ""), overflow="fold")
    table.add_column("why", ratio=1)
    for i, entry in enumerate(result.layouts[:top] if top else result.layouts, 1):
        c = entry.cost
        table.add_row(str(i), f"tp{c.layout.tp} pp{c.layout.pp} dp{c.layout.dp}", "yes" if c.fits else "[red]no",
                      f"{c.memory_per_gpu / 1e9:.1f}", f"{c.prefill_ms:.1f}", f"{c.decode_ms_per_token:.2f}",
                      f"{c.tokens_per_s_per_gpu:.1f}", gpu_groups(entry), headline(entry))
    return table
