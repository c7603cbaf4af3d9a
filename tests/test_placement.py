"""Placement on the real `topo -m` fixtures: TP groups on NVLink pairs / quads, never across a SYS hop
when a better choice exists, replicas spread over NUMA nodes, and the rank order the launcher relies on."""

from itertools import combinations, permutations
from pathlib import Path

import pytest
import torch

from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankGrid
from topoplan.plan.placement import NodePlacer, cuda_visible_devices, place
from topoplan.topology.links import LinkKind
from topoplan.topology.model import build_topology
from topoplan.topology.read import read_topology

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"


def fixture(prefix: str):
    (path,) = [p for p in TOPO.glob(f"{prefix}*.txt") if ".p2p" not in p.name and ".measured" not in p.name]
    return read_topology(str(path))


def groups_of(placements, layout):
    by_rank = {p.rank: p.gpu for p in placements}
    return [[by_rank[r] for r in group] for group in RankGrid(layout).tp_groups]


def test_nvlink_bridged_pairs_become_tp_groups_h100_nvl():
    topo = fixture("17_")  # NV12 pairs (0,1) (2,3) (4,5) (6,7); NODE within a socket, SYS across
    layout = Layout(tp=2, dp=4)
    groups = groups_of(place(topo, layout), layout)
    assert sorted(sorted(g) for g in groups) == [["GPU0", "GPU1"], ["GPU2", "GPU3"], ["GPU4", "GPU5"],
                                                 ["GPU6", "GPU7"]]
    # two replicas of TP2 on 8 GPUs: one NVLink pair per socket (NUMA 0 and NUMA 1)
    layout = Layout(tp=2, dp=2)
    assert sorted(sorted(g) for g in groups_of(place(topo, layout), layout)) == [["GPU0", "GPU1"], ["GPU4", "GPU5"]]


def test_nvlink_bridged_pairs_become_tp_groups_azure_a100():
    topo = fixture("18_")  # 4 A100 PCIe, NV12 pairs (0,1) (2,3), one NUMA node each
    layout = Layout(tp=2, dp=2)
    assert sorted(sorted(g) for g in groups_of(place(topo, layout), layout)) == [["GPU0", "GPU1"], ["GPU2", "GPU3"]]


@pytest.mark.parametrize("prefix, layout", [("22_", Layout(tp=4, dp=2)), ("22_", Layout(tp=2, dp=4)),
                                            ("22_", Layout(tp=2, pp=2, dp=2)), ("40_", Layout(tp=2)),
                                            ("40_", Layout(tp=3)), ("17_", Layout(tp=4, dp=2))])
def test_tp_groups_do_not_straddle_sys_when_avoidable(prefix, layout):
    topo = fixture(prefix)
    for group in groups_of(place(topo, layout), layout):
        kinds = {topo.link(a, b).kind for a, b in combinations(group, 2)}
        assert LinkKind.SYS not in kinds, group


def test_dgx1_cube_mesh_picks_nvlink_connected_quads():
    topo = fixture("07_")
    for layout in (Layout(tp=4), Layout(tp=4, dp=2), Layout(tp=4, pp=2)):
        for group in groups_of(place(topo, layout), layout):
            assert topo.is_full_mesh(group), group
    # TP8 on the cube mesh: a ring that uses NVLink on every hop exists, and is the one chosen
    order = [p.gpu for p in place(topo, Layout(tp=8))]
    assert topo.ring_bottleneck(order).kind is LinkKind.NVLINK
    # TP2: a double (NV2) link
    assert topo.link(*groups_of(place(topo, Layout(tp=2)), Layout(tp=2))[0]).nvlinks == 2


def _best_partition_bottleneck(topo, gpus, size):
    """Brute force reference: the best achievable worst-group ring bottleneck over all partitions."""
    def ring_best(group):
        first, rest = group[0], group[1:]
        return max(topo.ring_bottleneck([first, *p]).bandwidth_gbps for p in permutations(rest))

    def best(remaining):
        if not remaining:
            return float("inf")
        first = remaining[0]
        return max(min(ring_best((first, *others)), best([g for g in remaining if g not in others and g != first]))
                   for others in combinations(remaining[1:], size - 1))

    return best(list(gpus))


@pytest.mark.parametrize("prefix", ["07_", "11_", "17_", "18_", "22_", "40_", "30_", "20_"])
def test_tp_groups_match_brute_force_optimum(prefix):
    topo = fixture(prefix)
    ids = [g.id for g in topo.gpus]
    for tp in (2, 4):
        if tp >= len(ids):
            continue
        layout = Layout(tp=tp, dp=len(ids) // tp)
        got = min(topo.ring_bottleneck(g).bandwidth_gbps for g in groups_of(place(topo, layout), layout))
        assert got == _best_partition_bottleneck(topo, ids, tp), (prefix, tp)


@pytest.mark.parametrize("layout, nodes", [(Layout(2, 2, 2), 1), (Layout(4, 1, 2), 1), (Layout(1, 1, 8), 1),
                                           (Layout(8, 2, 2), 4), (Layout(16, 1, 1), 2), (Layout(2, 4, 2), 2)])
def test_placement_follows_the_standard_rank_order(layout, nodes):
    topo = fixture("00_")
    placements = place(topo, layout, nodes)
    grid = torch.arange(layout.world).view(layout.dp, layout.pp, layout.tp)  # the runner's rank order
    k = layout.world // nodes
    for p in placements:
        assert p.rank == int(grid[p.dp_rank, p.pp_rank, p.tp_rank])
        c = RankGrid(layout).coords(p.rank)
        assert (c.tp_rank, c.pp_rank, c.dp_rank) == (p.tp_rank, p.pp_rank, p.dp_rank)
        assert p.node == p.rank // k
    for node in range(nodes):
        on_node = [p for p in placements if p.node == node]
        assert len({p.gpu for p in on_node}) == k  # a GPU runs one rank
        visible = cuda_visible_devices(placements, node).split(",")
        for p in on_node:  # local rank i = rank - node*k lands on the i-th visible GPU
            assert f"GPU{visible[p.rank - node * k]}" == p.gpu


def test_identical_nodes_get_the_same_order():
    placements = place(fixture("17_"), Layout(tp=2, pp=2, dp=4), nodes=2)
    assert cuda_visible_devices(placements, 0) == cuda_visible_devices(placements, 1) == "0,1,2,3,4,5,6,7"


def test_more_gpus_than_present_is_an_error():
    with pytest.raises(TopoplanError, match="needs 16 GPUs per node; the topology has 8"):
        place(fixture("17_"), Layout(tp=16))
    with pytest.raises(TopoplanError, match="do not split evenly over 3 nodes"):
        place(fixture("17_"), Layout(tp=8), nodes=3)


def test_topology_without_gpus_is_an_error():
    with pytest.raises(TopoplanError, match="no GPUs"):
        NodePlacer(build_topology([], [], {}))
