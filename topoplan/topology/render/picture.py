"""What a picture of the machine shows (DOT and Mermaid both draw this): devices grouped by NUMA node,
and only the links that tell the story, so an 8-GPU, 18-NIC box stays readable.

- GPU-GPU: a link is drawn when it is of the closest kind either of its GPUs has to any other GPU
  (NVLink on an NVLink box, NODE inside a socket on a PCIe box); farther links are left out.
- An NVLink island of 4 or more GPUs where every pair has the same NVLink code (an NVSwitch box such as a
  DGX A100/H100) is drawn as one hub node with an edge to each GPU instead of n(n-1)/2 crossing edges.
- NIC-GPU: each NIC is drawn beside its nearest GPUs only. A NIC whose nearest GPU is across SYS is
  drawn on its own with no edges (it is equally far from everything).
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.cpuset import compact_cpus
from topoplan.topology.links import LinkKind
from topoplan.topology.model import Link, Topology

# One colour per link kind, shared by the table (rich accepts hex) and the pictures.
KIND_COLOR = {
    LinkKind.NVLINK: "#76b900",
    LinkKind.XGMI: "#ed1c24",
    LinkKind.PIX: "#1f77b4",
    LinkKind.PXB: "#17becf",
    LinkKind.PHB: "#9467bd",
    LinkKind.NODE: "#ff7f0e",
    LinkKind.SYS: "#d62728",
}


HUB_MIN_GPUS = 4


@dataclass(frozen=True)
class Hub:
    """An all-to-all NVLink island drawn as one node: `link` is the (identical) link of each of its pairs."""

    id: str  # "NVL0"
    gpus: list[str]
    link: Link


@dataclass(frozen=True)
class Picture:
    """Devices per NUMA node in node order (key None, last: not placed on one), and the edges to draw."""

    groups: dict[int | None, list[str]]
    gpu_links: list[Link]
    nic_links: list[Link]
    lone_nics: list[str]  # NICs across SYS from every GPU: drawn without edges
    hubs: list[Hub]


def _hubs(topo: Topology) -> list[Hub]:
    hubs = []
    for island in topo.nvlink_islands():
        if len(island) < HUB_MIN_GPUS or not topo.is_full_mesh(island):
            continue
        links = [topo.link(a, b) for i, a in enumerate(island) for b in island[i + 1:]]
        if len({l.code for l in links}) == 1:
            hubs.append(Hub(f"NVL{len(hubs)}", island, links[0]))
    return hubs


def _best_gpu_links(topo: Topology, hubs: list[Hub]) -> list[Link]:
    gpu_ids = {g.id for g in topo.gpus}
    gpu_links = [l for l in topo.links() if l.a in gpu_ids and l.b in gpu_ids]
    closest: dict[str, int] = {}
    for link in gpu_links:
        for end in (link.a, link.b):
            closest[end] = min(closest.get(end, len(LinkKind)), link.kind.rank)
    in_hub = {frozenset((a, b)) for hub in hubs for a in hub.gpus for b in hub.gpus}
    return [l for l in gpu_links if l.kind.rank in (closest[l.a], closest[l.b]) and frozenset((l.a, l.b)) not in in_hub]


def _nic_numa(topo: Topology, nic_id: str, nearest: list[str]) -> int | None:
    """The NIC's own NUMA node if known, else that of its nearest GPUs when they share one."""
    nic = next(n for n in topo.nics if n.id == nic_id)
    if nic.numa_node is not None:
        return nic.numa_node
    nodes = {topo.gpu(g).numa_node for g in nearest}
    return nodes.pop() if len(nodes) == 1 else None


def picture(topo: Topology) -> Picture:
    """Choose what to draw for this topology."""
    groups: dict[int | None, list[str]] = {}
    for gpu in topo.gpus:
        groups.setdefault(gpu.numa_node, []).append(gpu.id)
    nic_links: list[Link] = []
    lone: list[str] = []
    for nic in topo.nics:
        nearest = [g.id for g in topo.nearest_gpus(nic.id)]
        if not nearest or topo.link(nic.id, nearest[0]).kind is LinkKind.SYS:
            lone.append(nic.id)
            groups.setdefault(nic.numa_node, []).append(nic.id)
            continue
        nic_links.extend(topo.link(nic.id, g) for g in nearest)
        groups.setdefault(_nic_numa(topo, nic.id, nearest), []).append(nic.id)
    hubs = _hubs(topo)
    ordered = dict(sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))  # NUMA order, None last
    return Picture(ordered, _best_gpu_links(topo, hubs), nic_links, lone, hubs)


def group_cpus(topo: Topology, devices: list[str]) -> str | None:
    """The CPU list shared by the GPUs of a NUMA group, compact (`48-63,176-191`); None if they differ."""
    cpus = {topo.gpu(d).cpus for d in devices if topo.graph.nodes[d]["kind"] == "gpu"}
    return compact_cpus(next(iter(cpus))) if len(cpus) == 1 and None not in cpus else None


def link_label(link: Link) -> str:
    """`NV12` with its estimated bandwidth: `NV12 240 GB/s`."""
    return f"{link.code} {link.bandwidth_gbps:g} GB/s"
