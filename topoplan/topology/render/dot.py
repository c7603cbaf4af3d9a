"""Graphviz DOT of a topology: GPUs in one cluster per NUMA node, NVLink edges thick (width grows with the
link count), an all-to-all NVLink island as one hub, NICs beside their nearest GPUs. `render/image.py` turns it
into SVG/PNG."""

from __future__ import annotations

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Link, Topology
from topoplan.topology.render.picture import KIND_COLOR, Hub, group_cpus, link_label, picture


def quote(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node(topo: Topology, device: str, lone: bool) -> str:
    kind = topo.graph.nodes[device]["kind"]
    item = topo.graph.nodes[device]["device"]
    if kind == "gpu":
        label = "\n".join(x for x in (device, item.name) if x)
        return f"{quote(device)} [label={quote(label)}, shape=box, fillcolor=\"#e8f5d0\"];"
    label = "\n".join(x for x in (device, item.name, "SYS to every GPU" if lone else None) if x)
    return f"{quote(device)} [label={quote(label)}, shape=ellipse, fillcolor=\"#dde8f7\"];"


def _style(link: Link) -> str:
    """Colour by kind; fabric links (NVLink, XGMI) solid and thicker with more links, PCIe paths dashed."""
    color = f'color="{KIND_COLOR[link.kind]}"'
    if link.kind.is_fabric:
        return f"{color}, penwidth={min(1 + link.nvlinks / 2, 8.0):g}"
    return f"{color}, penwidth=1, style=dashed"


def _edge(link: Link) -> str:
    return f"{quote(link.a)} -- {quote(link.b)} [label={quote(link_label(link))}, {_style(link)}];"


def _hub(hub: Hub) -> list[str]:
    fabric = "NVLink" if hub.link.kind is LinkKind.NVLINK else "XGMI"
    label = f"{fabric} all-to-all\n{link_label(hub.link)} per pair"
    lines = [f'{quote(hub.id)} [label={quote(label)}, shape=hexagon, fillcolor="#f4f9ea"];']
    lines += [f"{quote(gpu)} -- {quote(hub.id)} [{_style(hub.link)}];" for gpu in hub.gpus]
    return lines


def render_dot(topo: Topology) -> str:
    """The DOT source (an undirected graph)."""
    pic = picture(topo)
    lone = set(pic.lone_nics)
    lines = [
        "graph topology {",
        '  graph [fontname="Helvetica", fontsize=11, labelloc=t, nodesep=0.4];',
        '  node [fontname="Helvetica", fontsize=10, style=filled];',
        '  edge [fontname="Helvetica", fontsize=8];',
    ]
    if topo.source:
        lines.append(f"  label={quote(topo.source)};")
    for numa, devices in pic.groups.items():
        nodes = [f"    {_node(topo, d, d in lone)}" for d in devices]
        if numa is None:
            lines.extend(n[2:] for n in nodes)
            continue
        cpus = group_cpus(topo, devices)
        cpu_note = f"\nCPUs {cpus}" if cpus else ""
        lines.append(f"  subgraph cluster_numa{numa} {{")
        lines.append(f'    label={quote(f"NUMA node {numa}{cpu_note}")}; style="rounded,dashed"; color="#888888";')
        lines.extend(nodes)
        lines.append("  }")
    lines.extend(f"  {line}" for hub in pic.hubs for line in _hub(hub))
    lines.extend(f"  {_edge(l)}" for l in [*pic.gpu_links, *pic.nic_links])
    lines.append("}")
    return "\n".join(lines) + "\n"
