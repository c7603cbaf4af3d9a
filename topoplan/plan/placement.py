"""Which physical GPU each rank runs on: TP groups on the best-connected GPUs, PP stages chained over the
cheapest boundaries, DP replicas spread over NUMA nodes and NICs.

Not a search over permutations. One node is solved once (all nodes are identical) by greedy
partitioning on the link graph:
  1. cut the node's GPUs into replica-sized blocks, each grown from a seed by adding the GPU with the
     strongest weakest link to the block (NVLink cliques and islands first, then PIX, ..., SYS);
  2. keep the best blocks, breaking ties by spreading them over NUMA nodes and NICs;
  3. cut each block into TP groups the same way, order the groups as a pipeline along the strongest
     boundaries, order each group as the ring with the best bottleneck link, and turn each ring so
     that stage-to-stage partners (same tp_rank) sit on good links.
Expert parallelism over pipelined replicas (ep > tp, pp > 1, several replicas on a node) inverts steps 1-3:
an EP group (one stage of every replica) carries two all-to-alls per MoE layer, far more than a pipeline
hand-off, so the node is cut into one best-connected block per stage, each holding that stage's TP group
of every local replica.
The order found is the node's CUDA_VISIBLE_DEVICES; local rank i then lands on its i-th GPU.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankGrid, RankPlacement, check_nodes
from topoplan.topology.model import Topology

_DFS_BUDGET = 20_000  # ring search steps per threshold before falling back (only reached on odd graphs)


def local_share(layout: Layout, nodes: int) -> int:
    """GPUs each node runs (ranks are node-major: node n holds ranks n*k .. n*k+k-1)."""
    check_nodes(nodes)
    if layout.world % nodes:
        raise TopoplanError(f"{layout} has {layout.world} ranks, which do not split evenly over {nodes} nodes")
    return layout.world // nodes


def node_blocks(layout: Layout, k: int) -> tuple[int, int]:
    """(TP chunk, replica chunk) sizes on one node holding k ranks; groups must not straddle nodes unevenly."""
    tp_chunk, rep_chunk = min(layout.tp, k), min(layout.tp * layout.pp, k)
    for size, what in ((layout.tp, "tp"), (layout.tp * layout.pp, "tp*pp")):
        if (size <= k and k % size) or (size > k and size % k):
            raise TopoplanError(f"{layout}: {what}={size} does not tile {k} GPUs per node")
    return tp_chunk, rep_chunk


class NodePlacer:
    """Solves the per-node GPU order for one topology; caches by block shape so many layouts are cheap."""

    def __init__(self, topology: Topology):
        if not topology.gpus:
            raise TopoplanError("the topology has no GPUs", source=topology.source or None)
        self.topology = topology
        self.ids = [g.id for g in topology.gpus]
        n = len(self.ids)
        self.bw = [[0.0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                data = topology.graph.get_edge_data(self.ids[i], self.ids[j]) or {}
                link = data.get("link")
                self.bw[i][j] = self.bw[j][i] = link.bandwidth_gbps if link else 0.0
        self.home = [self._home(g.id) for g in topology.gpus]
        self.order = lru_cache(maxsize=None)(self._order)
        self._partitions: dict[tuple[frozenset[int], int], list[list[int]]] = {}

    def _home(self, gpu_id: str) -> tuple[int | None, str | None]:
        """(NUMA node, nearest NIC) of a GPU: what DP replicas should not share."""
        nics = self.topology.nearest_nics(gpu_id)
        return self.topology.gpu(gpu_id).numa_node, nics[0].id if nics else None

    # --- ring order -----------------------------------------------------------------------------
    def ring_bottleneck(self, ring: Sequence[int]) -> float:
        if len(ring) < 2:
            return float("inf")
        return min(self.bw[ring[i]][ring[(i + 1) % len(ring)]] for i in range(len(ring)))

    def best_ring(self, members: Sequence[int]) -> list[int]:
        """The members ordered as the ring whose slowest hop is fastest (bottleneck travelling salesman)."""
        members = sorted(members)
        if len(members) <= 3:
            return members
        for threshold in sorted({self.bw[a][b] for a in members for b in members if a < b}, reverse=True):
            ring = self._hamiltonian_cycle(members, threshold)
            if ring:
                return ring
        return members

    def _hamiltonian_cycle(self, members: list[int], threshold: float) -> list[int] | None:
        adjacent = {a: sorted((b for b in members if b != a and self.bw[a][b] >= threshold),
                              key=lambda b: (-self.bw[a][b], b)) for a in members}
        if any(len(v) < 2 for v in adjacent.values()):
            return None
        start, path, seen, budget = members[0], [members[0]], {members[0]}, [_DFS_BUDGET]

        def extend() -> bool:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            if len(path) == len(members):
                return start in adjacent[path[-1]]
            for nxt in adjacent[path[-1]]:
                if nxt not in seen:
                    path.append(nxt)
                    seen.add(nxt)
                    if extend():
                        return True
                    seen.discard(path.pop())
            return False

        return path if extend() else None

    # --- grouping -------------------------------------------------------------------------------
    def _grow(self, seed: int, free: set[int], size: int) -> list[int]:
        """Greedy group from `seed`: add the GPU whose weakest (then total) link to the group is strongest.
        Each candidate's weakest and total are kept up to date, so a group costs O(size x GPUs), not O(size^2 x
        GPUs): 64 GPUs plan in seconds, not minutes."""
        group = [seed]
        weakest = {c: self.bw[c][seed] for c in free if c != seed}
        total = dict(weakest)
        while len(group) < size:
            best = max(weakest, key=lambda c: (weakest[c], total[c], -c))
            group.append(best)
            del weakest[best], total[best]
            for c in weakest:
                weakest[c] = min(weakest[c], self.bw[c][best])
                total[c] += self.bw[c][best]
        return group

    def quality(self, ring: Sequence[int]) -> tuple[float, float, float]:
        """Higher is better: ring bottleneck, weakest pair, total pair bandwidth."""
        pairs = [self.bw[a][b] for i, a in enumerate(ring) for b in ring[i + 1:]]
        return (self.ring_bottleneck(ring), min(pairs, default=float("inf")), sum(pairs))

    def partition(self, gpus: Sequence[int], size: int) -> list[list[int]]:
        """Cut `gpus` into as many groups of `size` as fit, best group first, each ring-ordered."""
        key = (frozenset(gpus), size)
        if key not in self._partitions:
            self._partitions[key] = self._partition(key[0], size)
        return [list(g) for g in self._partitions[key]]

    def _partition(self, gpus: frozenset[int], size: int) -> list[list[int]]:
        free, groups = set(gpus), []
        while len(free) >= size:
            rings = [self.best_ring(self._grow(seed, free, size)) for seed in sorted(free)]
            best = max(rings, key=lambda r: (self.quality(r), -min(r)))
            groups.append(best)
            free.difference_update(best)
        return groups

    def _spread(self, blocks: list[list[int]], count: int) -> list[list[int]]:
        """`count` blocks: best quality first, ties to the NUMA node / NIC used least so far."""
        numa_use: Counter = Counter()
        nic_use: Counter = Counter()
        chosen: list[list[int]] = []
        remaining = list(blocks)
        while len(chosen) < count:
            def key(block: list[int]) -> tuple:
                homes = [self.home[g] for g in block]
                return (self.quality(block), -sum(numa_use[h[0]] for h in homes if h[0] is not None),
                        -sum(nic_use[h[1]] for h in homes if h[1] is not None), -min(block))
            block = max(remaining, key=key)
            remaining.remove(block)
            chosen.append(block)
            numa_use.update(h[0] for g in block for h in [self.home[g]] if h[0] is not None)
            nic_use.update(h[1] for g in block for h in [self.home[g]] if h[1] is not None)
        return chosen

    def _chain(self, groups: list[list[int]]) -> list[list[int]]:
        """Order TP groups as pipeline stages along strong boundaries, each ring turned to align partners."""
        def affinity(a: list[int], b: list[int]) -> tuple[float, float]:
            pairs = [self.bw[x][y] for x in a for y in b]
            return max(pairs), sum(pairs)

        if len(groups) < 2:
            return groups
        best_chain, best_score = groups, None
        for start in range(len(groups)):
            chain, rest = [groups[start]], [g for i, g in enumerate(groups) if i != start]
            while rest:
                nxt = max(rest, key=lambda g: affinity(chain[-1], g))
                rest.remove(nxt)
                chain.append(nxt)
            score = (min(affinity(a, b) for a, b in zip(chain, chain[1:])), -start)
            if best_score is None or score > best_score:
                best_chain, best_score = chain, score
        aligned = [best_chain[0]]
        for group in best_chain[1:]:
            turns = [group[i:] + group[:i] for i in range(len(group))]
            turns += [list(reversed(t)) for t in turns]
            prev = aligned[-1]
            aligned.append(max(turns, key=lambda t: (min(self.bw[p][q] for p, q in zip(prev, t)),
                                                     sum(self.bw[p][q] for p, q in zip(prev, t)))))
        return aligned

    def _order(self, tp_chunk: int, rep_chunk: int, k: int) -> tuple[str, ...]:
        blocks = self._spread(self.partition(range(len(self.ids)), rep_chunk), k // rep_chunk)
        order: list[int] = []
        for block in blocks:
            for group in self._chain(self.partition(block, tp_chunk)):
                order.extend(group)
        return tuple(self.ids[i] for i in order)

    def local_order(self, layout: Layout, nodes: int = 1) -> tuple[str, ...]:
        """GPU ids for local ranks 0..k-1 on every node (the CUDA_VISIBLE_DEVICES order, as ids)."""
        k = local_share(layout, nodes)
        if k > len(self.ids):
            raise TopoplanError(f"{layout} over {nodes} node(s) needs {k} GPUs per node; the topology has "
                                f"{len(self.ids)}", source=self.topology.source or None)
        tp_chunk, rep_chunk = node_blocks(layout, k)
        if layout.ep > layout.tp and layout.pp > 1 and rep_chunk == layout.tp * layout.pp and k > rep_chunk:
            return self.ep_order(layout.tp, layout.pp, k)
        return self.plain_if_as_good(self.order(tp_chunk, rep_chunk, k), tp_chunk, rep_chunk)

    def _links(self, order: Sequence[int], tp_chunk: int, rep_chunk: int) -> tuple:
        """What an order gives the layout: the quality of each TP group and of each stage-to-stage boundary."""
        groups = [list(order[i:i + tp_chunk]) for i in range(0, len(order), tp_chunk)]
        per_block = rep_chunk // tp_chunk
        bounds = [min(self.bw[p][q] for p, q in zip(a, b)) for i, (a, b) in enumerate(zip(groups, groups[1:]))
                  if (i + 1) % per_block]
        return tuple(sorted(self.quality(g) for g in groups)), tuple(sorted(bounds))

    def plain_if_as_good(self, order: tuple[str, ...], tp_chunk: int, rep_chunk: int) -> tuple[str, ...]:
        """The same GPUs in nvidia-smi order when that serves every TP group and stage boundary as well: a
        permuted CUDA_VISIBLE_DEVICES then gains nothing (a full NVSwitch or XGMI mesh) and only makes the
        engines' own GPU-to-NUMA/NIC mapping and anyone reading the lines work harder."""
        index = {g: i for i, g in enumerate(self.ids)}
        found = [index[g] for g in order]
        plain = sorted(found)
        if plain != found and self._links(plain, tp_chunk, rep_chunk) == self._links(found, tp_chunk, rep_chunk):
            return tuple(self.ids[i] for i in plain)
        return order

    def ep_order(self, tp: int, pp: int, k: int) -> tuple[str, ...]:
        """The node's order when EP groups come first: block s holds stage s of every local replica."""
        blocks = self._spread(self.partition(range(len(self.ids)), k // pp), pp)
        stages = [self.partition(block, tp) for block in blocks]
        order = [gpu for replica in range(k // (tp * pp)) for groups in stages for gpu in groups[replica]]
        return tuple(self.ids[i] for i in order)


def expand(layout: Layout, nodes: int, order: Sequence[str], ranks: int | None = None) -> list[RankPlacement]:
    """Every rank's placement from the per-node order (ranks are node-major); the first `ranks` only if given."""
    k, grid = len(order), RankGrid(layout)
    placements = []
    for rank in range(layout.world if ranks is None else min(ranks, layout.world)):
        c = grid.coords(rank)
        placements.append(RankPlacement(rank, rank // k, order[rank % k], c.tp_rank, c.pp_rank, c.dp_rank))
    return placements


def place(topology: Topology, layout: Layout, nodes: int = 1) -> list[RankPlacement]:
    """Placement of every rank of `layout` over `nodes` identical nodes of this topology."""
    return expand(layout, nodes, NodePlacer(topology).local_order(layout, nodes))


def _gpu_index(gpu_id: str) -> int:
    match = re.search(r"(\d+)$", gpu_id)
    if not match:
        raise TopoplanError(f"GPU id {gpu_id!r} has no index")
    return int(match.group(1))


def cuda_visible_devices(placements: Sequence[RankPlacement], node: int) -> str:
    """CUDA_VISIBLE_DEVICES for `node`: local rank i (i-th lowest rank there) gets the i-th listed GPU."""
    on_node = sorted((p for p in placements if p.node == node), key=lambda p: p.rank)
    if not on_node:
        raise TopoplanError(f"no ranks are placed on node {node}")
    return ",".join(str(_gpu_index(p.gpu)) for p in on_node)
