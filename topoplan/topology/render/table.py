"""The human view of a topology (`topoplan inspect`'s default): rich tables for the GPU link matrix
(coloured by kind), the link kinds present with their estimated speed, each GPU's CPUs/NUMA node/nearest
NICs, each NIC's links to the GPUs, the NVLink islands, warnings and the reader's notes."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from topoplan.cpuset import compact_cpus
from topoplan.terminal import inert
from topoplan.topology.diagnose import Warning
from topoplan.topology.model import Topology
from topoplan.topology.render.picture import KIND_COLOR


def _matrix(topo: Topology) -> Table:
    """GPU against GPU, like the GPU block of `topo -m` (NICs get their own table, which stays narrow)."""
    table = Table(title="GPU links", title_justify="left", box=None, padding=(0, 1))
    table.add_column("", style="bold", no_wrap=True)
    for gpu in topo.gpus:
        table.add_column(gpu.id, justify="center", no_wrap=True)
    for row in topo.gpus:
        cells: list[Text] = []
        for col in topo.gpus:
            if col.id == row.id:
                cells.append(Text("X", style="dim"))
            elif topo.graph.has_edge(row.id, col.id):
                link = topo.link(row.id, col.id)
                cells.append(Text(link.code, style=KIND_COLOR[link.kind]))
            else:
                cells.append(Text("?", style="dim"))
        table.add_row(row.id, *cells)
    return table


def _nics(topo: Topology) -> Table:
    """One row per NIC: its links to the GPUs grouped by code, closest first (`PXB: GPU0, GPU1  SYS: ...`)."""
    table = Table(title="NIC links", title_justify="left")
    table.add_column("NIC", style="bold", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("GPUs by link, closest first")
    for nic in topo.nics:
        by_code: dict[str, list] = {}
        for gpu in topo.gpus:
            if topo.graph.has_edge(nic.id, gpu.id):
                link = topo.link(nic.id, gpu.id)
                by_code.setdefault(link.code, [link, []])[1].append(gpu.id)
        text = Text()
        for code, (link, gpus) in sorted(by_code.items(), key=lambda kv: (kv[1][0].kind.rank, -kv[1][0].nvlinks)):
            text.append(f"{'  ' if text else ''}{code}", style=KIND_COLOR[link.kind]).append(f": {', '.join(gpus)}")
        table.add_row(nic.id, inert(nic.name or "-"), text)
    return table


def _kinds(topo: Topology) -> Table:
    """One row per link code present: its kind, estimated GB/s and latency, and how many pairs use it."""
    table = Table(title=inert(f"Link estimates ({topo.arch or 'unknown GPU generation: NCCL defaults'})"),
                  title_justify="left")
    for name, justify in (("code", "left"), ("kind", "left"), ("GB/s (one way)", "right"),
                          ("latency us", "right"), ("pairs", "right")):
        table.add_column(name, justify=justify)
    seen: dict[str, list] = {}
    for link in topo.links():
        seen.setdefault(link.code, [link, 0])[1] += 1
    for link, pairs in sorted(seen.values(), key=lambda lp: (lp[0].kind.rank, -lp[0].nvlinks)):
        table.add_row(Text(link.code, style=KIND_COLOR[link.kind]), link.kind.value, f"{link.bandwidth_gbps:g}",
                      f"{link.latency_us:g}", str(pairs))
    return table


def _gpus(topo: Topology) -> Table:
    island_of = {g: i for i, island in enumerate(topo.nvlink_islands()) for g in island}
    show_name = any(g.name for g in topo.gpus)
    show_mem_numa = any(g.gpu_numa_id is not None for g in topo.gpus)
    table = Table(title="GPUs", title_justify="left")
    table.add_column("GPU", style="bold")
    if show_name:
        table.add_column("name")
    table.add_column("CPUs")
    table.add_column("NUMA", justify="right")
    if show_mem_numa:
        table.add_column("GPU NUMA ID", justify="right")
    table.add_column("nearest NIC")
    table.add_column("NVLink island", justify="right")
    for gpu in topo.gpus:
        nics = topo.nearest_nics(gpu.id)
        nearest = ", ".join(n.name or n.id for n in nics)
        if nics:
            kind = topo.link(gpu.id, nics[0].id)
            nearest_text = Text(f"{nearest} ", style="").append(kind.code, style=KIND_COLOR[kind.kind])
        else:
            nearest_text = Text("-")
        row: list[Text | str] = [gpu.id]
        if show_name:
            row.append(inert(gpu.name or "-"))
        row += [compact_cpus(gpu.cpus), "-" if gpu.numa_node is None else str(gpu.numa_node)]
        if show_mem_numa:
            row.append("-" if gpu.gpu_numa_id is None else str(gpu.gpu_numa_id))
        island = island_of.get(gpu.id)
        row += [nearest_text, "-" if island is None else str(island)]
        table.add_row(*row)
    return table


def _islands(topo: Topology) -> Text:
    islands = topo.nvlink_islands()
    text = Text("NVLink islands: ", style="bold")
    if not islands:
        return text.append("none (no NVLink between GPUs)", style="")
    return text.append("; ".join(f"{i}: {', '.join(island)}" for i, island in enumerate(islands)), style="")


def _domains(topo: Topology) -> list[Text]:
    """One line per multi-node NVLink domain (NVML fabric info): GPUs of other nodes in it are NVLink peers."""
    return [Text("NVLink domain: ", style="bold").append(f"{domain} (cluster/clique): {', '.join(gpus)}; other nodes "
                                                         "of this domain reach them over NVLink", style="")
            for domain, gpus in topo.fabric_domains().items()]


def _warnings(warnings: list[Warning]) -> Table | Text:
    if not warnings:
        return Text("No warnings.", style="green")
    table = Table(title="Warnings", title_justify="left", show_lines=True)
    table.add_column("warning", style="bold yellow", no_wrap=True)
    table.add_column("what")
    table.add_column("what to do")
    for w in warnings:
        table.add_row(w.code, inert(w.message), inert(w.advice))
    return table


def render_table(topo: Topology, warnings: list[Warning]) -> Group:
    """Everything, as one rich renderable to print."""
    parts = []
    if topo.source:
        parts.append(Text(f"{topo.source}: {_count(len(topo.gpus), 'GPU')}, {_count(len(topo.nics), 'NIC')}",
                          style="bold"))
    parts += [_matrix(topo), Text(""), _kinds(topo), _gpus(topo)]
    if topo.nics:
        parts.append(_nics(topo))
    parts += [_islands(topo), *_domains(topo), _warnings(warnings)]
    if topo.notes:
        parts.append(Text("Notes from reading the input:", style="bold"))
        parts += [Text(f"- {note}") for note in topo.notes]
    return Group(*parts)


def _count(n: int, noun: str) -> str:
    """`1 GPU`, `8 GPUs`, `0 NICs`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
