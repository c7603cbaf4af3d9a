"""The typed topology model: GPUs, NICs and NUMA nodes in one networkx graph, and the queries on it.

Every source (a `nvidia-smi topo -m` paste, NVML, a recording, an NCCL topology XML, `rocm-smi --showtopo` or
`amd-smi topology` text) ends in `build_topology`, so the planner, the launcher and the renderers see one shape
whatever the machine was read from. Each link keeps `evidence`: what its source said about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

import networkx as nx

from topoplan.errors import TopoplanError, printable
from topoplan.topology.links import LATENCY_US, LinkKind, cpu_links, estimate_bandwidth_gbps, parse_link_code

MAX_CLIQUES = 64  # NVLink cliques listed per machine: a DGX-1 has 2 quads (plus pairs), an NVSwitch box 1


@dataclass(frozen=True)
class Gpu:
    """One GPU as the source saw it. Fields a source cannot know stay None."""

    id: str  # "GPU3": nvidia-smi / NVML numbering (PCI bus order)
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    cpus: tuple[int, ...] | None = None  # CPU affinity, sorted; None when the source has none
    numa_node: int | None = None  # the NUMA node of its CPU affinity
    gpu_numa_id: int | None = None  # the memory-only NUMA node of the GPU's own memory (Grace systems)
    memory_bytes: int | None = None
    # Numbering (NVML and nvidia-smi count in PCI bus order; CUDA by default does not): the CUDA index
    # under CUDA_DEVICE_ORDER=PCI_BUS_ID, and under CUDA's default order when it can be told.
    cuda_index_pci_bus: int | None = None
    cuda_index_default: int | None = None
    visible: bool | None = None  # listed in CUDA_VISIBLE_DEVICES; None when that is unset (all visible)
    error: str | None = None  # why the source could not read this GPU fully; it is kept and marked
    # The multi-node NVLink domain (GB200/GB300 NVL72): NVML fabric info's "clusterUuid/cliqueId". GPUs with the
    # same domain reach each other over NVLink even on different nodes (trays); None when not in one.
    fabric_domain: str | None = None
    # Its NVLink/XGMI links to switches as an NCCL dump lists them: (tag, switch's PCI bus id, links), e.g.
    # ("nvlink", "0000:f3:00.0", 4). Empty when the source does not list switches (topo -m, NVML): kept so an NCCL
    # XML export writes the switches back instead of direct GPU-to-GPU links.
    switch_links: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class Nic:
    """One network device (an RDMA port such as `mlx5_0`, or a plain NIC)."""

    id: str  # "NIC2": column order in `topo -m`, whatever the header called it
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class Link:
    """The path between two devices: its `topo -m` code (or `XGMI<n>`) and its estimated speed."""

    a: str
    b: str
    code: str  # normalised: "NV12", "PIX", ..., "SYS" (never "SOC")
    kind: LinkKind
    nvlinks: int  # number of bonded NVLinks; 0 for PCIe paths
    bandwidth_gbps: float  # one direction, GB/s
    latency_us: float
    p2p: Mapping[str, str] | None = field(default=None, hash=False)  # {"r": "OK", "w": "CNS", ...}
    evidence: str | None = field(default=None, hash=False)  # what the source said ("rocm-smi: XGMI, weight 15")

    def other(self, device: str) -> str:
        return self.b if device == self.a else self.a


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def numa_id(node: int) -> str:
    """Graph node name of a NUMA node."""
    return f"NUMA{node}"


class Topology:
    """One machine: devices as graph nodes (attribute `kind`: gpu, nic, numa; `device`: the dataclass),
    GPU/NIC pairs as edges carrying a `Link` (`link`), GPU-to-NUMA affinity as edges of kind `affinity`.
    """

    def __init__(
        self,
        gpus: Sequence[Gpu],
        nics: Sequence[Nic],
        links: Iterable[Link],
        *,
        arch: str | None = None,
        gpu_name: str | None = None,
        source: str = "",
        notes: Sequence[str] = (),
        cpu: str | None = None,
        vendor: str | None = None,
    ):
        self.gpus: tuple[Gpu, ...] = tuple(gpus)
        self.nics: tuple[Nic, ...] = tuple(nics)
        self.arch = arch  # GPU generation used for bandwidth estimates ("sm80"), None if unknown
        self.gpu_name = gpu_name  # the source's name (NVML), a catalog key once topoplan.hardware resolved it
        self.source = source  # where it was read from, for messages
        self.notes: tuple[str, ...] = tuple(notes)  # what the reader recovered or inferred
        self.cpu = cpu  # CPU family (topology.links.CPU_LINKS) used for SYS estimates, None if unknown
        self.vendor = vendor  # "nvidia", "amd", or None when the source does not say (launch picks env names by it)
        self.graph = nx.Graph()
        for gpu in self.gpus:
            self.graph.add_node(gpu.id, kind="gpu", device=gpu)
        for nic in self.nics:
            self.graph.add_node(nic.id, kind="nic", device=nic)
        for link in links:
            self.graph.add_edge(link.a, link.b, kind="link", link=link)
        for gpu in self.gpus:
            if gpu.numa_node is not None:
                node = numa_id(gpu.numa_node)
                self.graph.add_node(node, kind="numa", numa=gpu.numa_node)
                self.graph.add_edge(gpu.id, node, kind="affinity")

    # --- lookups -------------------------------------------------------------------------------
    def gpu(self, key: str | int) -> Gpu:
        """A GPU by id (`"GPU3"`) or index (3)."""
        for gpu in self.gpus:
            if gpu.id == key or gpu.index == key:
                return gpu
        raise TopoplanError(f"no GPU {key!r} in this topology (it has {len(self.gpus)} GPUs)",
                            source=self.source or None)

    def link(self, a: str, b: str) -> Link:
        """The link between two distinct devices."""
        data = self.graph.get_edge_data(a, b)
        if not data or data.get("kind") != "link":
            raise TopoplanError(f"no link between {a} and {b} in this topology", source=self.source or None)
        return data["link"]

    def links(self) -> list[Link]:
        """Every device pair once, GPU pairs first, in index order."""
        order = {d.id: i for i, d in enumerate([*self.gpus, *self.nics])}
        found = [d["link"] for _, _, d in self.graph.edges(data=True) if d.get("kind") == "link"]
        return sorted(found, key=lambda l: tuple(sorted((order[l.a], order[l.b]))))

    def numa_nodes(self) -> list[int]:
        return sorted({g.numa_node for g in self.gpus if g.numa_node is not None})

    def gpus_of_numa(self, node: int) -> list[Gpu]:
        """GPUs whose CPU affinity is on NUMA node `node`."""
        name = numa_id(node)
        if name not in self.graph:
            return []
        return sorted((self.graph.nodes[n]["device"] for n in self.graph.neighbors(name)), key=lambda g: g.index)

    # --- NVLink structure -------------------------------------------------------------------------
    def nvlink_graph(self) -> nx.Graph:
        """GPUs as nodes, GPU fabric links (NVLink; XGMI on AMD) as edges (attributes `nvlinks`: the link
        count, `kind`: the LinkKind). Islands, cliques and meshes are the same notions on either fabric."""
        sub = nx.Graph()
        sub.add_nodes_from(g.id for g in self.gpus)
        for link in self.links():
            if link.kind.is_fabric and link.a in sub and link.b in sub:
                sub.add_edge(link.a, link.b, nvlinks=link.nvlinks, kind=link.kind)
        return sub

    def fabric_domains(self) -> dict[str, list[str]]:
        """Multi-node NVLink domains (NVML fabric info): domain id -> its GPUs on this node, in index order."""
        domains: dict[str, list[str]] = {}
        for gpu in self.gpus:
            if gpu.fabric_domain is not None:
                domains.setdefault(gpu.fabric_domain, []).append(gpu.id)
        return domains

    def nvlink_islands(self) -> list[list[str]]:
        """GPUs joined by NVLink paths (connected components), largest first; lone GPUs are omitted."""
        nv = self.nvlink_graph()
        index = {g.id: g.index for g in self.gpus}
        comps = [sorted(c, key=index.__getitem__) for c in nx.connected_components(nv) if len(c) > 1]
        return sorted(comps, key=lambda c: (-len(c), index[c[0]]))

    def nvlink_cliques(self, limit: int = MAX_CLIQUES) -> list[list[str]]:
        """Maximal sets of GPUs with a direct NVLink between every pair (e.g. the DGX-1's quads): the first
        `limit` found. A real machine has a handful; a crafted one can have exponentially many (48 GPUs
        missing only triangles: 3^16), so the search stops instead of running for minutes."""
        index = {g.id: g.index for g in self.gpus}
        found = islice(nx.find_cliques(self.nvlink_graph()), limit)
        cliques = [sorted(c, key=index.__getitem__) for c in found if len(c) > 1]
        return sorted(cliques, key=lambda c: (-len(c), [index[g] for g in c]))

    def is_full_mesh(self, gpu_ids: Sequence[str]) -> bool:
        """True when every pair of these GPUs has a direct NVLink."""
        nv = self.nvlink_graph().subgraph(gpu_ids)
        n = len(gpu_ids)
        return nv.number_of_edges() == n * (n - 1) // 2

    # --- NICs --------------------------------------------------------------------------------------
    def nearest_nics(self, gpu_id: str) -> list[Nic]:
        """The NICs at the smallest link distance from this GPU (all ties), in NIC order; [] if none known."""
        candidates = [(self.link(gpu_id, nic.id).kind.rank, nic.index, nic) for nic in self.nics
                      if self.graph.has_edge(gpu_id, nic.id)]
        if not candidates:
            return []
        best = min(rank for rank, _, _ in candidates)
        return [nic for rank, _, nic in sorted(candidates, key=lambda c: c[:2]) if rank == best]

    def nearest_gpus(self, nic_id: str) -> list[Gpu]:
        """The GPUs at the smallest link distance from this NIC (all ties), in GPU order; [] if none known."""
        candidates = [(self.link(nic_id, gpu.id).kind.rank, gpu) for gpu in self.gpus
                      if self.graph.has_edge(nic_id, gpu.id)]
        if not candidates:
            return []
        best = min(rank for rank, _ in candidates)
        return [gpu for rank, gpu in candidates if rank == best]

    # --- rings ---------------------------------------------------------------------------------
    def ring_bottleneck(self, gpu_ids: Sequence[str]) -> Link | None:
        """The slowest link of the ring gpu_ids[0] -> gpu_ids[1] -> ... -> gpu_ids[0]; None for one GPU.

        A ring collective moves data over every hop at once, so the slowest hop sets its bandwidth.
        """
        if len(gpu_ids) < 2:
            return None
        hops = [self.link(gpu_ids[i], gpu_ids[(i + 1) % len(gpu_ids)]) for i in range(len(gpu_ids))]
        return min(hops, key=lambda l: (l.bandwidth_gbps, -l.kind.rank))

    def with_notes(self, *notes: str) -> Topology:
        """The same machine with more notes on how it was read."""
        return Topology(self.gpus, self.nics, self.links(), arch=self.arch, gpu_name=self.gpu_name,
                        source=self.source, notes=(*self.notes, *notes), vendor=self.vendor, cpu=self.cpu)

    def with_arch(self, arch: str | None, gpu_name: str | None = None, vendor: str | None = None,
                  cpu: str | None = None) -> Topology:
        """The same machine with bandwidths re-estimated for GPU generation `arch` (and named `gpu_name`, made by
        `vendor`), and for CPU family `cpu` (None: the one it has)."""
        cpu = cpu or self.cpu
        links = [
            replace(l, bandwidth_gbps=estimate_bandwidth_gbps(l.kind, l.nvlinks, arch, cpu)) for l in self.links()
        ]
        return Topology(self.gpus, self.nics, links, arch=arch, gpu_name=gpu_name or self.gpu_name,
                        source=self.source, notes=self.notes, vendor=vendor or self.vendor, cpu=cpu)

    def with_cpu(self, cpu: str | None) -> Topology:
        """The same machine with SYS hops re-estimated for CPU family `cpu` (topology.links.CPU_LINKS)."""
        return self if cpu is None else self.with_arch(self.arch, cpu=cpu_links(cpu).family)


def build_topology(
    gpus: Sequence[Gpu],
    nics: Sequence[Nic],
    codes: Mapping[tuple[str, str], str],
    *,
    arch: str | None = None,
    gpu_name: str | None = None,
    p2p: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
    source: str = "",
    notes: Sequence[str] = (),
    evidence: Mapping[tuple[str, str], str] | None = None,
    vendor: str | None = None,
    cpu: str | None = None,
) -> Topology:
    """Make a Topology from per-pair link codes (`{("GPU0", "GPU1"): "NV12", ...}`, either order).

    Codes are normalised (`SOC` -> `SYS`, `XGMI` -> `XGMI1`); an unknown code is a TopoplanError. `p2p`
    attaches `nvidia-smi topo -p2p` statuses to GPU pairs, `evidence` what the source said about a pair.
    Names, notes and the source come from input: their control characters are escaped here, once (`printable`).
    """
    gpus = [replace(g, name=printable(g.name)) if g.name else g for g in gpus]
    nics = [replace(n, name=printable(n.name)) if n.name else n for n in nics]
    gpu_name, cpu = (printable(x) if x else x for x in (gpu_name, cpu))
    source, notes = printable(source), [printable(note) for note in notes]
    p2p_by_pair = {_pair(*k): dict(v) for k, v in (p2p or {}).items()}
    said = {_pair(*k): v for k, v in (evidence or {}).items()}
    links = []
    seen: set[tuple[str, str]] = set()
    for (a, b), raw in codes.items():
        pair = _pair(a, b)
        if pair in seen or a == b:
            continue
        seen.add(pair)
        parsed = parse_link_code(raw)
        if parsed is None:
            raise TopoplanError(f"unknown link code {raw!r} between {a} and {b}", source=source or None)
        code, kind, nvlinks = parsed
        links.append(Link(pair[0], pair[1], code, kind, nvlinks, estimate_bandwidth_gbps(kind, nvlinks, arch, cpu),
                          LATENCY_US[kind], p2p_by_pair.get(pair), said.get(pair)))
    return Topology(gpus, nics, links, arch=arch, gpu_name=gpu_name, source=source, notes=notes, vendor=vendor,
                    cpu=cpu)
