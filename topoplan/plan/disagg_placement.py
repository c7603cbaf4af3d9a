"""Where a disaggregated deployment's workers go: prefill and decode workers on disjoint GPUs, each worker on
well-connected GPUs of one node, each GPU's KV traffic through its nearest NIC, each worker bound to its GPUs'
NUMA nodes.

Per node, the larger role's workers are placed first, packed together (same NUMA node first), the other role's
after, on the GPUs whose nearest NICs and NUMA nodes the first role uses least: on a two-socket box with a NIC
per GPU, prefill and decode then use disjoint NIC sets and sockets. Blocks come from NodePlacer.partition (the
best-connected groups of the free GPUs); inside its block a worker's TP groups are partitioned the same way, one
per pipeline stage, each in its best ring order. Workers are spread over the nodes evenly (each node a similar
P:D mix, so more KV transfers stay on NVLink); a worker spans nodes only when its layout needs more GPUs than a
node has (whole nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.plan.disagg_types import KvRoute, Worker
from topoplan.plan.kv_transfer import kv_routes
from topoplan.plan.placement import NodePlacer
from topoplan.topology.model import Topology

# GPU -> NIC path codes that stay on the GPU's own PCIe switch, and those that stay on its socket
OWN_SWITCH = ("PIX", "PXB")
OWN_SOCKET = ("PIX", "PXB", "PHB", "NODE")


@dataclass(frozen=True)
class RolePlan:
    """`count` workers of one role, each running `layout` (dp > 1 only for an MoE worker's attention DP)."""

    role: str
    layout: Layout
    count: int


@dataclass
class _Node:
    free: set[int]  # GPU indexes (topology order) not yet given to a worker
    nics: dict[str, set[str]] = field(default_factory=dict)  # role -> nearest NICs its GPUs use here
    numa: dict[str, set[int]] = field(default_factory=dict)  # role -> NUMA nodes its GPUs use here


class WorkerPlacer:
    """Places roles on `nodes` identical nodes of `topology`; caches per-block orders so the search can place
    many candidate deployments cheaply."""

    def __init__(self, topology: Topology, nodes: int):
        self.topology, self.nodes = topology, nodes
        self.placer = NodePlacer(topology)
        self.k = len(topology.gpus)
        self.ids = [g.id for g in topology.gpus]
        self.routes = kv_routes(topology)
        self.near = {g.id: {n.id for n in topology.nearest_nics(g.id)} for g in topology.gpus}
        self._orders: dict[tuple[frozenset[int], Layout], tuple[str, ...]] = {}
        self._placed: dict[tuple[RolePlan, RolePlan], tuple[Worker, ...]] = {}

    def place(self, prefill: RolePlan, decode: RolePlan) -> tuple[Worker, ...]:
        """Every worker, prefill first then decode, each by index; a one-line error when they do not fit."""
        key = (prefill, decode)
        if key not in self._placed:
            self._placed[key] = self._place(prefill, decode)
        return self._placed[key]

    def _place(self, prefill: RolePlan, decode: RolePlan) -> tuple[Worker, ...]:
        need = prefill.count * prefill.layout.world + decode.count * decode.layout.world
        if need > self.k * self.nodes:
            raise TopoplanError(f"too few GPUs: {prefill.count} prefill x {prefill.layout.world} + {decode.count} "
                                f"decode x {decode.layout.world} GPUs = {need}; {self.nodes} node(s) x {self.k} "
                                f"GPUs have {self.k * self.nodes} (pass more --nodes or a smaller --pd)")
        nodes = [_Node(set(range(self.k))) for _ in range(self.nodes)]
        placed: dict[str, list[Worker]] = {prefill.role: [], decode.role: []}
        next_node = 0
        for role in (prefill, decode):  # workers larger than a node take whole nodes first
            span = -(-role.layout.world // self.k)
            for _ in range(role.count if span > 1 else 0):
                if role.layout.world % self.k or next_node + span > self.nodes:
                    raise self._short(role, span)
                order = self.placer.local_order(role.layout, span)
                placed[role.role].append(self._worker(role, len(placed[role.role]), next_node, order, span))
                for n in range(next_node, next_node + span):
                    nodes[n].free.clear()
                next_node += span
        small = [r for r in (prefill, decode) if r.layout.world <= self.k]
        counts = self._spread(small, nodes[next_node:])
        for offset, share in enumerate(counts):
            node = nodes[next_node + offset]
            for role in sorted(small, key=lambda r: -r.layout.world):
                for _ in range(share[role.role]):
                    block = self._block(node, role, other=next(r.role for r in (prefill, decode) if r is not role))
                    order = self._order(frozenset(block), role.layout)
                    placed[role.role].append(self._worker(role, len(placed[role.role]), next_node + offset, order, 1))
        return (*placed[prefill.role], *placed[decode.role])

    def _short(self, role: RolePlan, span: int) -> TopoplanError:
        return TopoplanError(f"too few GPUs: a {role.role} worker of {role.layout} needs {role.layout.world} GPUs, "
                             f"{span} whole node(s) of {self.k}; {self.nodes} node(s) cannot hold {role.count} of "
                             "them beside the other role")

    def _spread(self, roles: Sequence[RolePlan], nodes: Sequence[_Node]) -> list[dict[str, int]]:
        """How many workers of each role each node gets: an even share of each role per node (larger workers
        first), then what is left wherever it still fits (first fit)."""
        left = {r.role: r.count for r in roles}
        rooms = [len(node.free) for node in nodes]
        shares: list[dict[str, int]] = [dict.fromkeys(left, 0) for _ in nodes]
        ordered = sorted(roles, key=lambda r: -r.layout.world)
        for i in range(len(nodes)):
            for r in ordered:
                take = min(-(-left[r.role] // (len(nodes) - i)), rooms[i] // r.layout.world)
                shares[i][r.role] += take
                left[r.role] -= take
                rooms[i] -= take * r.layout.world
        for i in range(len(nodes)):
            for r in ordered:
                take = min(left[r.role], rooms[i] // r.layout.world)
                shares[i][r.role] += take
                left[r.role] -= take
                rooms[i] -= take * r.layout.world
        missing = next((r for r in ordered if left[r.role]), None)
        if missing is not None:
            raise TopoplanError(f"too few GPUs: {left[missing.role]} {missing.role} worker(s) of "
                                f"{missing.layout.world} GPU(s) do not fit on {self.nodes} node(s) x {self.k} GPUs "
                                "beside the other workers (a worker stays on one node)")
        return shares

    def _block(self, node: _Node, role: RolePlan, other: str) -> list[int]:
        """The best-connected free block for a worker of `role`: packed with its own role (its NUMA nodes), away
        from the `other` role's NICs and NUMA nodes."""
        blocks = self.placer.partition(sorted(node.free), role.layout.world)
        own_numa, other_nics, other_numa = node.numa.get(role.role, set()), node.nics.get(other, set()), \
            node.numa.get(other, set())

        def key(block: list[int]) -> tuple:
            numa = [self.topology.gpus[i].numa_node for i in block]
            nics = set().union(*(self.near[self.ids[i]] for i in block))
            return (self.placer.quality(block), -len(nics & other_nics), -sum(n in other_numa for n in numa),
                    sum(n in own_numa for n in numa), -min(block))

        block = max(blocks, key=key)
        node.free.difference_update(block)
        node.nics.setdefault(role.role, set()).update(*(self.near[self.ids[i]] for i in block))
        node.numa.setdefault(role.role, set()).update(
            n for i in block if (n := self.topology.gpus[i].numa_node) is not None)
        return block

    def _order(self, block: frozenset[int], layout: Layout) -> tuple[str, ...]:
        """The worker's GPUs in rank order: the block cut into TP groups (NodePlacer.partition: the best-connected
        group first, each in its best ring order), one per pipeline stage."""
        key = (block, layout)
        if key not in self._orders:
            groups = self.placer.partition(sorted(block), layout.tp)
            self._orders[key] = tuple(self.ids[i] for group in groups for i in group)
        return self._orders[key]

    def _worker(self, role: RolePlan, index: int, node: int, order: Sequence[str], span: int) -> Worker:
        gpus = [self.topology.gpu(g) for g in order]
        cpus = sorted({c for g in gpus for c in g.cpus or ()})  # the affinity the topology lists (launch's
        # binding fills an empty one from the NUMA node's CPUs where it can: topoplan.launch.binding.cpu_source)
        numa = sorted({g.numa_node for g in gpus if g.numa_node is not None})
        return Worker(role.role, index, node, role.layout, tuple(order), tuple(cpus), tuple(numa),
                      tuple(self.routes[g] for g in order), span)


def route_warnings(workers: Sequence[Worker]) -> tuple[str, ...]:
    """GPUs whose KV traffic leaves through a NIC off their own PCIe switch (PHB/NODE: across host bridges) or
    off their socket (SYS: across the socket link too), and GPUs with no NIC at all; one line per kind."""
    far: dict[str, list[KvRoute]] = {}
    for route in {r.gpu: r for w in workers for r in w.routes}.values():
        if route.nic is None:
            far.setdefault("none", []).append(route)
        elif route.link not in OWN_SOCKET:
            far.setdefault("socket", []).append(route)
        elif route.link not in OWN_SWITCH:
            far.setdefault("switch", []).append(route)
    said = {
        "none": "no NIC listed for {}: their KV cache cannot leave the node",
        "socket": "no NIC on the socket of {}: their KV traffic crosses the socket link to reach a NIC",
        "switch": "no NIC on the PCIe switch of {}: their KV traffic crosses the host bridge",
    }
    return tuple(said[kind].format(", ".join(f"{r.gpu}" + (f" (nearest {r.nic_name or r.nic} at {r.link})"
                                                             if r.nic else "") for r in routes))
                 for kind, routes in far.items())
