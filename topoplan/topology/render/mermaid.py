"""Mermaid flowchart of a topology (pastes into GitHub issues and Markdown docs): the same picture as the
DOT, with NUMA nodes as subgraphs, NVLink edges thick and PCIe edges dotted."""

from __future__ import annotations

import re

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Link, Topology
from topoplan.topology.render.picture import KIND_COLOR, Hub, group_cpus, link_label, picture


def _text(text: str) -> str:
    """Mermaid label text: inside double quotes, where `"` must be written as `#quot;`."""
    return text.replace('"', "#quot;")


def _node_id(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", device)


def _node(topo: Topology, device: str, lone: bool) -> str:
    item = topo.graph.nodes[device]["device"]
    if topo.graph.nodes[device]["kind"] == "gpu":
        label = " ".join(x for x in (device, item.name) if x)
        return f'{_node_id(device)}["{_text(label)}"]:::gpu'
    label = " ".join(x for x in (device, item.name, "(SYS to every GPU)" if lone else None) if x)
    return f'{_node_id(device)}(["{_text(label)}"]):::nic'


def _edge(link: Link) -> str:
    arrow = "===" if link.kind.is_fabric else "-.-"
    return f'{_node_id(link.a)} {arrow}|"{_text(link_label(link))}"| {_node_id(link.b)}'


def _hub_node(hub: Hub) -> str:
    fabric = "NVLink" if hub.link.kind is LinkKind.NVLINK else "XGMI"
    return f'{hub.id}{{{{"{_text(f"{fabric} all-to-all: {link_label(hub.link)} per pair")}"}}}}'


def render_mermaid(topo: Topology) -> str:
    """The Mermaid source (`flowchart LR`)."""
    pic = picture(topo)
    lone = set(pic.lone_nics)
    lines = ["flowchart LR"]
    for numa, devices in pic.groups.items():
        nodes = [f"    {_node(topo, d, d in lone)}" for d in devices]
        if numa is None:
            lines.extend(n[2:] for n in nodes)
            continue
        cpus = group_cpus(topo, devices)
        cpu_note = f" · CPUs {cpus}" if cpus else ""
        lines.append(f'  subgraph numa{numa}["{_text(f"NUMA node {numa}{cpu_note}")}"]')
        lines.extend(nodes)
        lines.append("  end")
    lines.extend(f"  {_hub_node(hub)}" for hub in pic.hubs)
    edges = [(f"{_node_id(gpu)} === {hub.id}", hub.link) for hub in pic.hubs for gpu in hub.gpus]  # (line, link)
    edges += [(_edge(l), l) for l in [*pic.gpu_links, *pic.nic_links]]
    lines.extend(f"  {line}" for line, _ in edges)
    lines.extend(f"  linkStyle {i} stroke:{KIND_COLOR[link.kind]}" for i, (_, link) in enumerate(edges))
    lines.append("  classDef gpu fill:#e8f5d0,stroke:#4a7a00")
    lines.append("  classDef nic fill:#dde8f7,stroke:#1f4e8c")
    return "\n".join(lines) + "\n"
