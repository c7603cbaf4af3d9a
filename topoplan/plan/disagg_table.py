"""`plan --disagg` as rich tables: the workers (role, layout, node, GPUs, CPUs, NICs), the priced KV transfer, the
served figures beside the best aggregated layout, the verdict, and the placed candidates numbered as `launch --disagg
--rank N` takes them."""

from __future__ import annotations

import re

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from topoplan.cpuset import compact_cpus
from topoplan.plan.disagg import DisaggResult
from topoplan.plan.plan_table import layout_label
from topoplan.terminal import inert


def disagg_table(result: DisaggResult) -> RenderableType:
    plan, base = result.chosen, result.plan
    w, (p, d) = base.workload, plan.ratio
    title = (f"{base.model.name} ({w.dtype}) disaggregated on {base.nodes} x {len(base.topology.gpus)} "
             f"{base.device.name}: {p} prefill ({layout_label(plan.prefill)}) : {d} decode "
             f"({layout_label(plan.decode)}), prompt {w.prompt_len}, generate {w.gen_len}, {base.engine}")
    workers = Table(title=inert(title), title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("worker", "layout", "node", "GPUs", "CPUs", "NUMA", "KV NICs (GPU order), path"):
        workers.add_column(name, overflow="fold", no_wrap=name in ("worker", "layout", "node", "NUMA"))
    for worker in plan.workers:
        nodes = f"{worker.node}" + (f"-{worker.node + worker.nodes - 1}" if worker.nodes > 1 else "")
        nics = " ".join(_runs([r.nic_name or r.nic or "none" for r in worker.routes]))
        links = "/".join(sorted({r.link for r in worker.routes if r.link}))
        workers.add_row(worker.name, layout_label(worker.layout), nodes,
                        ", ".join(_runs([g.removeprefix("GPU") for g in worker.gpus])),
                        _wrappable(compact_cpus(worker.cpus)), ",".join(map(str, worker.numa_nodes)) or "?",
                        inert(f"{nics} ({links})" if links else nics))
    t = plan.transfer
    transfer = Text(f"KV transfer: {t.bytes_per_request / 2**20:.1f} MiB a request over {t.path}: {t.ms:.2f} ms, "
                    f"{t.exposed_ms:.2f} ms in the TTFT ({t.connector} connector)")
    served = Table(box=box.SIMPLE_HEAD)
    for name in ("deployment", "TTFT ms", "TPOT ms", "tok/s/GPU", "in flight"):
        served.add_column(name, justify="left" if name == "deployment" else "right")
    s = plan.served
    served.add_row(f"{p}P:{d}D" + (" [red]*" if result.slo_miss else ""), f"{s.ttft_ms:.1f}", f"{s.tpot_ms:.2f}",
                   f"{s.output_tokens_per_s_per_gpu:.1f}", f"P {s.prefill_concurrency} / D {s.decode_concurrency}")
    agg = result.aggregated
    if agg is not None:
        served.add_row(f"aggregated {layout_label(agg.layout)}" + (" [red]*" if agg.slo_miss else ""),
                       f"{agg.ttft_ms:.1f}", f"{agg.tpot_ms:.2f}", f"{agg.output_tokens_per_s_per_gpu:.1f}",
                       f"{agg.concurrency} per replica")
    ranked = Table(title="placed candidates, best first: `launch --disagg --rank N` launches #N (--json: candidates)",
                   title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("#", "P:D", "prefill", "decode", "TTFT ms", "TPOT ms", "tok/s/GPU"):
        ranked.add_column(name, justify="left" if name in ("P:D", "prefill", "decode") else "right")
    for n, c in enumerate(result.candidates, start=1):
        ranked.add_row(f"{n}", f"{c.ratio[0]}:{c.ratio[1]}" + (" [red]*" if c.slo_miss else ""),
                       layout_label(c.prefill.layout), layout_label(c.decode.layout), f"{c.served.ttft_ms:.1f}",
                       f"{c.served.tpot_ms:.2f}", f"{c.served.output_tokens_per_s_per_gpu:.1f}")
    lines = [Text(inert(result.verdict), style="bold")]
    if result.slo_miss:
        lines.append(Text(f"* misses {result.slo_miss} even at one request in flight"))
    lines.append(Text(f"searched {result.searched} (prefill layout, decode layout, P:D) combinations; "
                      f"tok/s/GPU over all {base.nodes * len(base.topology.gpus)} GPUs"))
    return Group(workers, transfer, served, *lines, ranked, *(Text(inert(f"- {note}")) for note in plan.notes))


def _runs(names: list[str]) -> list[str]:
    """Names in their order, each run of one stem with consecutive numbers written once: mlx5_0 .. mlx5_7 ->
    `mlx5_{0-7}`, GPU numbers 0 .. 7 -> `0-7` (a table cell of 8 NICs, not 8 lines); the order is kept (the
    workers' rank order)."""
    out: list[tuple[str, int, int]] = []  # (stem, first, last)
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match and out and out[-1][0] == match.group(1) and out[-1][2] + 1 == int(match.group(2)):
            out[-1] = (out[-1][0], out[-1][1], int(match.group(2)))
        elif match:
            out.append((match.group(1), int(match.group(2)), int(match.group(2))))
        else:
            out.append((name, -1, -1))
    return [stem if first < 0 else f"{stem}{first}" if first == last else f"{first}-{last}" if not stem
            else f"{stem}{{{first}-{last}}}" for stem, first, last in out]


def _wrappable(text: str) -> str:
    """A comma list a narrow table may break after a comma, not inside a number."""
    return text.replace(",", ", ")
