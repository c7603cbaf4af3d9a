"""What a picture of the machine shows (DOT and Mermaid both draw this): devices grouped by NUMA node,
and only the links that tell the story, so an 8-GPU, 18-NIC box stays readable.

- GPU-GPU: a link is drawn when it is of the closest kind either of its GPUs has to any other GPU
  (NVLink on an NVLink box, NODE inside a socket on a PCIe box); farther links are left out.
- NIC-GPU: each NIC is drawn beside its nearest GPUs only. A NIC whose nearest GPU is across SYS is
  drawn on its own with no edges (it is equally far from everything).
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Link, Topology

# One colour per link kind, shared by the table (rich accepts hex) and the pictures.
KIND_COLOR = {
    LinkKind.NVLINK: "#76b900",
    LinkKind.PIX: "#1f77b4",
    LinkKind.PXB: "#17becf",
    LinkKind.PHB: "#9467bd",
    LinkKind.NODE: "#ff7f0e",
    LinkKind.SYS: "#d62728",
}


@dataclass(frozen=True)
class Picture:
    """Devices per NUMA node (key None: not placed on one), and the edges to draw."""

    groups: dict[int | None, list[str]]
    gpu_links: list[Link]
    nic_links: list[Link]
    lone_nics: list[str]  # NICs across SYS from every GPU: drawn without edges


def _best_gpu_links(topo: Topology) -> list[Link]:
    gpu_ids = {g.id for g in topo.gpus}
    gpu_links = [l for l in topo.links() if l.a in gpu_ids and l.b in gpu_ids]
    closest: dict[str, int] = {}
    for link in gpu_links:
        for end in (link.a, link.b):
            closest[end] = min(closest.get(end, len(LinkKind)), link.kind.rank)
    return [l for l in gpu_links if l.kind.rank in (closest[l.a], closest[l.b])]


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
    return Picture(groups, _best_gpu_links(topo), nic_links, lone)


def link_label(link: Link) -> str:
    """`NV12` with its estimated bandwidth: `NV12 240 GB/s`."""
    return f"{link.code} {link.bandwidth_gbps:g} GB/s"
