"""Alpha-beta prices of the collectives a layout runs, over the GPUs it actually placed them on.

All-reduce (ring, as NCCL runs it for these sizes): 2(n-1) steps, each moving S/n bytes over every hop
at once, so the slowest hop sets the bandwidth and the step latency grows with the ring:
    t = base + 2(n-1) * alpha_step + 2(n-1)/n * S / bw_bottleneck
All-gather (ring): n-1 steps, each moving S/n bytes (S = the gathered buffer):
    t = base + (n-1) * alpha_step + (n-1)/n * S / bw_bottleneck
Point-to-point (a pipeline hand-off): t = base + alpha + S / bw.
All-to-all (MoE dispatch and combine, S bytes sent per rank, an even share to every member): each rank
exchanges with n-1 peers, so t = base + (n-1) * alpha + max over the links of the bytes each must carry /
its bandwidth: (n-1)/n * S over the slowest GPU pair inside a node (nccl-tests' alltoall busbw
= algbw * (n-1)/n), and on a group spanning nodes each node's m ranks push m * S * (n-m)/n through its rails
(nodes of one multi-node NVLink domain count as one: their pairs are NVLink hops).
Engines with their own all-reduce kernels (topoplan.engines AllReducePath: vLLM, SGLang, TensorRT-LLM) use
them on a full NVLink mesh below a message size; there each rank reads its peers' buffers directly:
    one-shot: t = one_shot_us + (n-1) * S / bw       (every peer's whole buffer, through this GPU's NVLink)
    two-shot: t = two_shot_us + 2(n-1)/n * S / bw    (reduce-scatter then all-gather, as a ring moves)
A hop between nodes goes through the GPUs' nearest NICs; NCCL spreads a ring's channels over all the
rails (NICs) the group's GPUs sit next to, so a crossing gets nic_gbps x rails. Nodes in one multi-node
NVLink domain (GB200/GB300 NVL72 trays: every GPU's NVML fabric info names the same cluster and clique) reach
each other over NVLink instead: such a hop is priced as the GPU's own NVLink connection (its switch links),
for as many nodes as the domain holds (`domain_nodes`); beyond that, the network again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from topoplan.engines.engine import AllReducePath
from topoplan.plan.calibration import NET, Calibration
from topoplan.topology.model import Topology

Slot = tuple[int, str]  # (node, GPU id)


@dataclass(frozen=True)
class Hop:
    """One link a collective crosses, as priced."""

    code: str  # "NV12", "PIX", ..., "SYS", or "NET" between nodes
    link_class: str  # calibration key: nvlink, pix, ..., sys, net
    bandwidth_gbps: float  # effective bus bandwidth, GB/s
    alpha_us: float
    across_nodes: bool = False  # an NVLink hop between two nodes of one NVLink domain

    def describe(self) -> str:
        where = " across nodes (NVLink domain)" if self.across_nodes else ""
        return f"{self.code}{where} {self.bandwidth_gbps:.0f} GB/s"


@dataclass(frozen=True, eq=False)
class Ring:
    """A TP group's GPUs in ring (tp_rank) order. Nodes are counted from the ring's first node, `base`;
    `shape` names the relative layout, so the same group on another identical node shares every price."""

    base: int
    slots: tuple[Slot, ...]  # (node - base, GPU id)
    shape: Hashable

    @classmethod
    def of(cls, slots: Sequence[Slot]) -> Ring:
        base = slots[0][0]
        relative = tuple((node - base, gpu) for node, gpu in slots)
        return cls(base, relative, relative)

    def __len__(self) -> int:
        return len(self.slots)


class LinkPricer:
    """Prices hops and collectives on one topology (all nodes identical) under one calibration."""

    def __init__(self, topology: Topology, calibration: Calibration, nic_gbps: float, domain_gpus: int = 0,
                 allreduce: AllReducePath | None = None):
        self.allreduce_path = allreduce or AllReducePath(custom=False)  # NCCL only (the bundled runner)
        self.topology = topology
        self.calibration = calibration
        self.nic_gbps = nic_gbps
        self.domain_nodes = nvlink_domain_nodes(topology, domain_gpus)
        self._fabric: dict[str, Hop | None] = {}
        self._hops: dict[tuple[str, str], Hop] = {}
        self._rings: dict[Hashable, list[Hop]] = {}
        self._net: dict[int, Hop] = {}
        self._nvlink = topology.nvlink_graph()
        self._meshes: dict[Hashable, bool] = {}
        self._handoffs: dict[tuple[Hashable, Hashable, int], tuple[float, float]] = {}
        self._nearest_nics = {g.id: [(NET, n.id) for n in topology.nearest_nics(g.id)] for g in topology.gpus}
        self._rails: dict[frozenset[str], int] = {}

    def _intra(self, a: str, b: str) -> Hop:
        key = (a, b) if a <= b else (b, a)
        hop = self._hops.get(key)
        if hop is None:
            link = self.topology.link(a, b)
            cal = self.calibration.link(link.kind.value)
            bw = cal.bandwidth_gbps or link.bandwidth_gbps * self.calibration.bus_efficiency
            hop = self._hops[key] = Hop(link.code, link.kind.value, bw, cal.alpha_us)
        return hop

    def rails(self, gpus: Sequence[str]) -> int:
        """NICs a group's GPUs on one node can drive at once: a maximum matching of GPUs to their nearest
        NICs (a DGX A100 pair shares a switch with two NICs: two rails); one per GPU if no NIC is known."""
        if not self.topology.nics:
            return len(gpus)
        key = frozenset(gpus)
        if key not in self._rails:
            graph = nx.Graph()
            graph.add_nodes_from(key)
            graph.add_edges_from((g, nic) for g in key for nic in self._nearest_nics[g])
            matching = nx.bipartite.maximum_matching(graph, top_nodes=key)
            self._rails[key] = max(len(matching) // 2, 1)
        return self._rails[key]

    def net(self, rails: int) -> Hop:
        if rails not in self._net:
            self._net[rails] = self._net_hop(rails)
        return self._net[rails]

    def _net_hop(self, rails: int) -> Hop:
        cal = self.calibration.link(NET)
        per_nic = cal.bandwidth_gbps or self.nic_gbps * self.calibration.bus_efficiency
        return Hop("NET", NET, per_nic * max(rails, 1), cal.alpha_us)

    def hop(self, a: Slot, b: Slot, rails: int = 1, base: int = 0) -> Hop:
        """The hop between two slots whose nodes count from `base` (the ring's first node)."""
        if a[0] == b[0]:
            return self._intra(a[1], b[1])
        if self._domain(base + a[0]) == self._domain(base + b[0]):
            fabric = self._fabric_hop(a[1])
            if fabric is not None:
                return fabric
        return self.net(rails)

    def _domain(self, node: int) -> int:
        """Which NVLink domain a node is in: every node its own unless the GPUs share a multi-node domain."""
        return node // self.domain_nodes if self.domain_nodes else 0

    def _fabric_hop(self, gpu: str) -> Hop | None:
        """A GPU's NVLink connection to a GPU on another node of its domain: its fastest NVLink on its own node
        (on an NVL72 tray, NV18: every link goes to the rack's switches), marked as crossing nodes."""
        if gpu not in self._fabric:
            links = [self._intra(gpu, peer) for peer in self._nvlink.neighbors(gpu)] if gpu in self._nvlink else []
            best = max(links, key=lambda h: h.bandwidth_gbps, default=None)
            self._fabric[gpu] = None if best is None else replace(best, across_nodes=True)
        return self._fabric[gpu]

    def _domains(self, base: int, slots: Sequence[Slot]) -> tuple[int, ...]:
        """The slots' NVLink domains, counted from the first slot's: rings with the same shape and the same
        domain pattern cost the same wherever they start. Without a multi-node domain every node is its own,
        which the shape already says: ()."""
        if self.domain_nodes == 1 or not slots:
            return ()
        first = self._domain(base + slots[0][0])
        return tuple(self._domain(base + node) - first for node, _ in slots)

    def ring_hops(self, ring: Ring) -> list[Hop]:
        """The hops of the ring slots[0] -> slots[1] -> ... -> slots[0] (memoised by shape and domains)."""
        key = (ring.shape, self._domains(ring.base, ring.slots))
        if key not in self._rings:
            self._rings[key] = self._ring_hops(ring.slots, ring.base)
        return self._rings[key]

    def _ring_hops(self, ring: tuple[Slot, ...], base: int) -> list[Hop]:
        if len(ring) < 2:
            return []
        if len({slot[0] for slot in ring}) == 1:
            return [self._intra(ring[i][1], ring[(i + 1) % len(ring)][1]) for i in range(len(ring))]
        per_node: dict[int, list[str]] = {}
        for node, gpu in ring:
            per_node.setdefault(node, []).append(gpu)
        rails = min(self.rails(gpus) for gpus in per_node.values())
        return [self.hop(ring[i], ring[(i + 1) % len(ring)], rails, base) for i in range(len(ring))]

    def _ring_us(self, ring: Ring, nbytes: float, steps: int) -> float:
        """A ring collective of `steps` steps, each moving nbytes/n over every hop at once."""
        n = len(ring)
        if n < 2:
            return 0.0
        hops = self.ring_hops(ring)
        bottleneck = min(h.bandwidth_gbps for h in hops)
        alpha = max(h.alpha_us for h in hops)
        return self.calibration.collective_base_us + steps * alpha + steps / n * nbytes / (bottleneck * 1e3)

    def allreduce_kernel(self, ring: Ring, nbytes: float) -> str:
        """"one-shot", "two-shot" (the engine's own kernels) or "nccl" for this all-reduce."""
        if len(ring) < 2:
            return "nccl"
        return self.allreduce_path.kernel(len(ring), nbytes, self.is_nvlink_mesh(ring))

    def allreduce_us(self, ring: Ring, nbytes: float) -> float:
        kernel, n = self.allreduce_kernel(ring, nbytes), len(ring)
        if kernel == "nccl":
            return self._ring_us(ring, nbytes, 2 * (n - 1))
        bw = min(h.bandwidth_gbps for h in self.ring_hops(ring)) * 1e3  # bytes per us
        if kernel == "one-shot":
            return self.allreduce_path.one_shot_us + (n - 1) * nbytes / bw
        return self.allreduce_path.two_shot_us + 2 * (n - 1) / n * nbytes / bw

    def allgather_us(self, ring: Ring, nbytes: float) -> float:
        """All-gather into an nbytes buffer (each rank contributes nbytes/n)."""
        return self._ring_us(ring, nbytes, len(ring) - 1)

    def _by_domain(self, group: Ring) -> dict[int, list[Slot]]:
        """The group's slots per NVLink domain (a node, unless nodes share a multi-node NVLink domain)."""
        domains: dict[int, list[Slot]] = {}
        for slot in group.slots:
            domains.setdefault(self._domain(group.base + slot[0]), []).append(slot)
        return domains

    def _leaving(self, group: Ring) -> tuple[Hop, int]:
        """The network hop a group spanning NVLink domains crosses (its nodes' common rails) and the most ranks
        one node pushes through it."""
        per_node: dict[int, list[str]] = {}
        for node, gpu in group.slots:
            per_node.setdefault(node, []).append(gpu)
        return self.net(min(self.rails(gpus) for gpus in per_node.values())), max(map(len, per_node.values()))

    def alltoall_us(self, group: Ring, nbytes: float) -> float:
        """All-to-all over `group` (any member order) with `nbytes` sent by each rank, an even share per peer."""
        n = len(group)
        if n < 2:
            return 0.0
        domains = self._by_domain(group)
        hops = [self.hop(a, b, 1, group.base) for members in domains.values()
                for i, a in enumerate(members) for b in members[i + 1:]]
        local = max(map(len, domains.values()))
        seconds = [(local - 1) / n * nbytes / (min(h.bandwidth_gbps for h in hops) * 1e3)] if hops else []
        if len(domains) > 1:
            net, per_node = self._leaving(group)
            hops.append(net)
            seconds.append(per_node * nbytes * (n - local) / n / (net.bandwidth_gbps * 1e3))
        return self.calibration.collective_base_us + (n - 1) * max(h.alpha_us for h in hops) + max(seconds)

    def group_bottleneck(self, group: Ring) -> Hop | None:
        """The slowest link an all-to-all over `group` crosses (the network when it spans NVLink domains)."""
        domains = self._by_domain(group)
        if len(domains) > 1:
            return self._leaving(group)[0]
        slots = group.slots
        hops = [self.hop(a, b, 1, group.base) for i, a in enumerate(slots) for b in slots[i + 1:]]
        return min(hops, key=lambda h: (h.bandwidth_gbps, h.code)) if hops else None

    def handoff_us(self, src: Ring, dst: Ring, nbytes: float) -> float:
        """Stage-to-stage hand-off: each TP rank sends nbytes/tp to its partner (same tp_rank), all at once;
        sends leaving a node share its NIC. The slowest pair sets the time."""
        shift = dst.base - src.base
        pairs = [(a, (b[0] + shift, b[1])) for a, b in zip(src.slots, dst.slots)]
        key = (src.shape, dst.shape, shift, self._domains(src.base, [s for pair in pairs for s in pair]))
        terms = self._handoffs.get(key)
        if terms is None:
            hops = [self.hop(a, b, 1, src.base) for a, b in pairs]
            leaving = sum(1 for (a, b), h in zip(pairs, hops) if a[0] != b[0] and h.link_class == NET)
            hops = [(h, leaving if h.link_class == NET else 1) for h in hops]
            terms = self._handoffs[key] = (max(h.alpha_us for h, _ in hops),
                                           max(flows / (h.bandwidth_gbps * 1e3) for h, flows in hops) / len(src))
        alpha, us_per_byte = terms
        return self.calibration.collective_base_us + alpha + nbytes * us_per_byte

    def boundary(self, src: Ring, dst: Ring) -> Hop:
        """The link between two stages' first ranks (where the hand-off of tp_rank 0 runs)."""
        return self.hop(src.slots[0], (dst.slots[0][0] + dst.base - src.base, dst.slots[0][1]), 1, src.base)

    def is_nvlink_mesh(self, ring: Ring) -> bool:
        """All on one node with a direct NVLink between every pair (where one-shot all-reduce applies)."""
        if ring.shape not in self._meshes:
            n, slots = len(ring), ring.slots
            self._meshes[ring.shape] = (len({node for node, _ in slots}) == 1 and self._nvlink.subgraph(
                [g for _, g in slots]).number_of_edges() == n * (n - 1) // 2)
        return self._meshes[ring.shape]

    def bottleneck(self, ring: Ring) -> Hop | None:
        hops = self.ring_hops(ring)
        return min(hops, key=lambda h: (h.bandwidth_gbps, h.code)) if hops else None


def nvlink_domain_nodes(topology: Topology, domain_gpus: int = 0) -> int:
    """How many identical nodes of this topology one NVLink domain joins: 1 (each node its own) unless every GPU
    names the same multi-node domain (NVML fabric info); then the catalog's domain size over the GPUs per node
    (GB200 NVL72: 72 / 4 = 18 trays), or 0 (no limit known: every planned node) when the catalog has none."""
    domains = topology.fabric_domains()
    if len(domains) != 1 or len(next(iter(domains.values()))) != len(topology.gpus):
        return 1
    return domain_gpus // len(topology.gpus) if domain_gpus else 0
