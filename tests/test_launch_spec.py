"""The launch spec on every shared fixture (no GPUs needed) and on hand-made corner cases.

Properties that must hold on every machine: each rank's CPUs lie inside its GPU's affinity, no two ranks
of a node share a CPU, whole cores go out before SMT threads are split, NCCL_IB_HCA names the node's
GPU-facing NICs (the nearest NIC of some GPU),
the memory node has CPUs, and CUDA_VISIBLE_DEVICES puts every TP group on its planned GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_support import DGX_A100, EXPECTED, FIXTURES, block_placements, expected_topology

from topoplan.cpuset import CpuFacts, assumed_cores, parse_cpu_list, split_cpus
from topoplan.errors import TopoplanError
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout, RankGrid, RankPlacement
from topoplan.topology.links import LinkKind
from topoplan.topology.model import Gpu, build_topology
from topoplan.topology.read import read_topology

CMD = ["python", "-m", "topoplan.runner"]
PASTES = sorted(p for p in FIXTURES.glob("*.txt") if ".p2p" not in p.name and ".measured" not in p.name)


def layouts_for(gpus: int) -> list[Layout]:
    """Every layout that fills some or all of a node's GPUs."""
    return [Layout(tp, pp, dp) for tp in (1, 2, 4, 8) for pp in (1, 2) for dp in (1, 2, 4)
            if tp * pp * dp <= gpus]


def interleaved(gpu_ids: list[str]) -> list[str]:
    """A placement order that is not the identity: even GPUs first, then odd ones."""
    return gpu_ids[0::2] + gpu_ids[1::2]


def nearest_by_hand(topo, gpu_id: str) -> list[str]:
    rows = [(topo.link(gpu_id, n.id).kind, n) for n in topo.nics if topo.graph.has_edge(gpu_id, n.id)]
    best = min((list(LinkKind).index(k) for k, _ in rows), default=None)
    return [n.name for k, n in rows if list(LinkKind).index(k) == best]


def facing_by_hand(topo) -> list[str | None]:
    """Names of the NICs that are the nearest NIC of at least one GPU, in NIC order."""
    near = {name for g in topo.gpus for name in nearest_by_hand(topo, g.id)}
    return [n.name for n in topo.nics if n.name in near]


def check_invariants(topo, layout: Layout, placements: list[RankPlacement], spec) -> None:
    memory_only = {g.gpu_numa_id for g in topo.gpus if g.gpu_numa_id is not None}
    for r in spec.ranks:
        gpu = topo.gpu(r.gpu)
        env = r.env_dict()
        assert all(reason.strip() for reason in r.reasons().values()), r.reasons()
        if gpu.cpus:
            assert set(r.cpus) <= set(gpu.cpus)
            assert env["OMP_NUM_THREADS"] == str(r.physical_cores) and r.physical_cores >= 1
        assert "GOMP_SPINCOUNT" not in env  # measured for CPU ranks only
        assert r.mem_node is None or r.mem_node not in memory_only
        if gpu.numa_node is not None and gpu.numa_node not in memory_only:
            assert r.mem_node == gpu.numa_node
        names = [name for name in facing_by_hand(topo) if name]
        if names:
            assert env["NCCL_IB_HCA"] == "=" + ",".join(names)
        else:
            assert "NCCL_IB_HCA" not in env
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        # local rank i uses cuda:i, which CUDA_VISIBLE_DEVICES maps to the planned GPU
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[r.cuda_index] == str(gpu.index)
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(r.rank), str(layout.world))
        c = RankGrid(layout).coords(r.rank)
        assert (r.tp_rank, r.pp_rank, r.dp_rank) == (c.tp_rank, c.pp_rank, c.dp_rank)
    for node in spec.nodes:
        cpus = [c for rank in node.ranks for c in (spec.ranks[rank].cpus or ())]
        assert len(cpus) == len(set(cpus)), f"ranks of node {node.index} share CPUs"
        for rank in node.ranks:  # whole cores first: no core split while there are enough cores
            r, gpu = spec.ranks[rank], topo.gpu(spec.ranks[rank].gpu)
            sharing = sum(topo.gpu(spec.ranks[o].gpu).cpus == gpu.cpus for o in node.ranks)
            if gpu.cpus and sharing <= len(assumed_cores(gpu.cpus)):
                assert all(set(core) <= set(r.cpus) or not set(core) & set(r.cpus) for core in assumed_cores(gpu.cpus))
    planned = {p.rank: p.gpu for p in placements}
    for group in RankGrid(layout).tp_groups:
        got = []
        for rank in group:
            r = spec.ranks[rank]
            visible = spec.nodes[r.node].cuda_visible_devices.split(",")
            got.append(topo.gpu(int(visible[r.cuda_index])).id)
        assert got == [planned[rank] for rank in group]


@pytest.mark.parametrize("paste", PASTES, ids=lambda p: p.name[:2])
def test_invariants_on_every_fixture(paste: Path):
    topo = read_topology(str(paste))
    ids = [g.id for g in topo.gpus]
    for layout in layouts_for(len(ids)):
        for order in (ids, interleaved(ids)):
            placements = block_placements(layout, order)
            check_invariants(topo, layout, placements, build_spec(topo, layout, placements, command=CMD))


@pytest.mark.parametrize("expected", EXPECTED, ids=lambda p: p.name[:2])
def test_invariants_on_expected_topologies_two_nodes(expected: Path):
    topo = expected_topology(expected)
    ids = [g.id for g in topo.gpus]
    layout = Layout(tp=len(ids), dp=2)
    placements = block_placements(layout, interleaved(ids), nodes=2)
    spec = build_spec(topo, layout, placements, command=CMD, hosts=["a", "b"])
    check_invariants(topo, layout, placements, spec)
    assert spec.ranks[len(ids)].node == 1 and spec.ranks[len(ids)].local_rank == 0


def test_dgx_a100_by_hand():
    topo = read_topology(str(FIXTURES / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"))
    spec = build_spec(topo, Layout(tp=8), block_placements(Layout(tp=8), [g.id for g in topo.gpus]), command=CMD)
    r0, r1, r6 = spec.ranks[0], spec.ranks[1], spec.ranks[6]
    # GPU0 and GPU1 share 48-63 + SMT siblings 176-191: 8 whole cores each, a core's two threads together
    assert r0.cpus == (*range(48, 56), *range(176, 184)) and r0.physical_cores == 8
    assert r1.cpus == (*range(56, 64), *range(184, 192))
    assert r6.cpus == (*range(80, 88), *range(208, 216)) and r6.mem_node == 5
    # one node-wide list: the 8 GPU-facing NICs; mlx5_8/mlx5_9 are the nearest NIC of no GPU (storage)
    hcas = {r.env_dict()["NCCL_IB_HCA"] for r in spec.ranks}
    assert hcas == {"=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"}
    assert "left out mlx5_8, mlx5_9" in r0.reasons()["NCCL_IB_HCA"]
    # default memory policy: preferred (spills instead of failing); --mem-policy bind is strict
    assert r0.binding_argv() == ["numactl", "--physcpubind=48-55,176-183", "--preferred=3", "--"]
    strict = build_spec(topo, Layout(tp=8), block_placements(Layout(tp=8), [g.id for g in topo.gpus]), command=CMD,
                        mem_policy="bind")
    assert strict.ranks[0].binding_argv() == ["numactl", "--physcpubind=48-55,176-183", "--membind=3", "--"]
    free = build_spec(topo, Layout(tp=8), block_placements(Layout(tp=8), [g.id for g in topo.gpus]), command=CMD,
                      mem_policy="none")
    # --mem-policy none: no numactl at all (issue 33): taskset binds the CPUs, the kernel places memory
    assert free.ranks[0].binding_argv() == ["taskset", "-c", "48-55,176-183"]
    assert "NCCL_P2P_LEVEL" not in r0.env_dict()


def test_exact_nic_names_on_b300():
    topo = read_topology(str(FIXTURES / "01_b300-sxm6-8gpu-nv18-9nic-sglang.txt"))
    spec = build_spec(topo, Layout(tp=8), block_placements(Layout(tp=8), [g.id for g in topo.gpus]), command=CMD)
    hca = spec.ranks[0].env_dict()["NCCL_IB_HCA"]
    # "=" so that mlx5_1 cannot also select mlx5_10..mlx5_17; the bond (nearest NIC of no GPU) is left out
    assert hca == "=" + ",".join(f"mlx5_{i}" for i in range(10, 18))


def test_grace_memory_node_is_never_the_gpu_memory_node():
    topo = read_topology(str(FIXTURES / "23_gh200-480gb-1gpu-4nic-bf3-gpunumaid1.txt"))
    spec = build_spec(topo, Layout(), block_placements(Layout(), ["GPU0"]), command=CMD)
    r = spec.ranks[0]
    assert (r.mem_node, topo.gpus[0].gpu_numa_id) == (0, 1)
    assert r.cpus == tuple(range(72)) and r.env_dict()["OMP_NUM_THREADS"] == "72"  # one run: no SMT assumed
    assert r.env_dict()["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"


def test_memory_only_numa_affinity_falls_back_to_localalloc():
    gpus = [Gpu("GPU0", 0, cpus=(0, 1, 2, 3), numa_node=4, gpu_numa_id=5),
            Gpu("GPU1", 1, cpus=(4, 5, 6, 7), numa_node=5, gpu_numa_id=4)]  # a damaged paste: node 5 is GPU memory
    topo = build_topology(gpus, [], {("GPU0", "GPU1"): "NV18"})
    spec = build_spec(topo, Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]), command=CMD)
    assert spec.ranks[0].mem_node is None and spec.ranks[0].binding_argv()[-2:] == ["--localalloc", "--"]
    assert "memory-only" in spec.ranks[0].mem_reason


def test_lxc_cpuset_split_without_overlap():
    topo = read_topology(str(FIXTURES / "14_rtx3090-2gpu-nv4-lxc-cpuset.txt"),
                         str(FIXTURES / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt"))
    spec = build_spec(topo, Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]), command=CMD)
    assert [r.cpus for r in spec.ranks] == [(4, 6, 9), (15, 17)]
    assert "NCCL_P2P_LEVEL" not in spec.ranks[0].env_dict()  # the p2p matrix says OK everywhere
    assert "NCCL_IB_HCA" not in spec.ranks[0].env_dict()


def test_p2p_level_only_when_p2p_fails():
    gpus = [Gpu(f"GPU{i}", i, cpus=(i,), numa_node=0) for i in range(3)]
    codes = {("GPU0", "GPU1"): "NV4", ("GPU0", "GPU2"): "PHB", ("GPU1", "GPU2"): "PHB"}
    p2p = {("GPU0", "GPU1"): {"r": "OK"}, ("GPU0", "GPU2"): {"r": "CNS"}, ("GPU1", "GPU2"): {"r": "CNS"}}
    topo = build_topology(gpus, [], codes, p2p=p2p)
    three = build_spec(topo, Layout(tp=3), block_placements(Layout(tp=3), ["GPU0", "GPU1", "GPU2"]), command=CMD)
    var = [v for v in three.ranks[0].env if v.name == "NCCL_P2P_LEVEL"]
    assert [v.value for v in var] == ["PXB"] and "CNS" in var[0].reason
    two = build_spec(topo, Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]), command=CMD)
    assert "NCCL_P2P_LEVEL" not in two.ranks[0].env_dict()  # the failing GPU is not used


def test_smt_assumption():
    assert assumed_cores(parse_cpu_list("48-51,176-179")) == [(48, 176), (49, 177), (50, 178), (51, 179)]
    assert assumed_cores(parse_cpu_list("0-3")) == [(0,), (1,), (2,), (3,)]
    assert assumed_cores(parse_cpu_list("0,8,16,24")) == [(0,), (8,), (16,), (24,)]
    assert assumed_cores(parse_cpu_list("0-3,8-10")) == [(c,) for c in (0, 1, 2, 3, 8, 9, 10)]


def test_sysfs_siblings_decide_whole_cores(tmp_path):
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():
        d = tmp_path / "cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(siblings + "\n")
    for node, cpus in {0: "0-3", 1: ""}.items():
        d = tmp_path / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    facts = CpuFacts.read_sysfs(tmp_path)
    shares = split_cpus({0: (0, 1, 2, 3), 1: (0, 1, 2, 3)}, facts, where="node 0")
    assert (shares[0].cpus, shares[1].cpus) == ((0, 2), (1, 3))  # siblings 0+2 together, not 0+1
    gpus = [Gpu("GPU0", 0, cpus=(0, 1, 2, 3), numa_node=1)]  # topology claims node 1, which has no CPUs
    spec = build_spec(build_topology(gpus, [], {}), Layout(), block_placements(Layout(), ["GPU0"]), command=CMD,
                      facts=facts)
    assert spec.ranks[0].mem_node == 0


def test_damaged_sysfs_cpulist_names_the_file(tmp_path):
    node = tmp_path / "node" / "node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-3,x\n")
    with pytest.raises(TopoplanError, match=r"node0/cpulist: expected a CPU list such as 0-3,8, got 'x'"):
        CpuFacts.read_sysfs(tmp_path)


def test_more_ranks_than_cores_splits_threads_then_fails():
    two = split_cpus({0: (0, 8), 1: (0, 8)}, None, where="node 0")  # one core, two threads
    assert (two[0].cpus, two[1].cpus) == ((0,), (8,))
    with pytest.raises(TopoplanError, match="3 ranks share CPU affinity 0-1"):
        split_cpus({0: (0, 1), 1: (0, 1), 2: (0, 1)}, None, where="node 0")


def test_partly_overlapping_affinity_sets_are_shared_fairly():
    shares = split_cpus({0: tuple(range(8)), 1: (0, 1, 2, 3)}, None, where="node 0")
    assert set(shares[1].cpus) <= {0, 1, 2, 3} and not set(shares[0].cpus) & set(shares[1].cpus)
    assert len(shares[0].cpus) == 6 and len(shares[1].cpus) == 2


def test_expected_and_parsed_topologies_give_the_same_spec():
    parsed = read_topology(str(FIXTURES / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"))
    layout = Layout(tp=4, dp=2)
    a = build_spec(parsed, layout, block_placements(layout, [g.id for g in parsed.gpus]), command=CMD)
    b = build_spec(expected_topology(DGX_A100), layout, block_placements(layout, [g.id for g in parsed.gpus]),
                   command=CMD)
    assert [(r.cpus, r.mem_node, r.env) for r in a.ranks] == [(r.cpus, r.mem_node, r.env) for r in b.ranks]


def test_rendezvous_is_where_rank_0_runs_and_no_node_is_empty():
    topo = expected_topology(DGX_A100)
    layout = Layout(tp=2, dp=2)
    flipped = [RankPlacement(p.rank, 1 - p.node, p.gpu, p.tp_rank, p.pp_rank, p.dp_rank)
               for p in block_placements(layout, ["GPU0", "GPU1"], nodes=2)]
    spec = build_spec(topo, layout, flipped, command=CMD, hosts=["a", "b"])
    assert spec.master_addr == "b" and spec.ranks[3].env_dict()["MASTER_ADDR"] == "b"
    with pytest.raises(TopoplanError, match="node 2 runs no rank"):
        build_spec(topo, layout, flipped, command=CMD, nodes=3, hosts=["a", "b", "c"])


def test_extra_hosts_are_refused():
    topo = expected_topology(DGX_A100)
    layout = Layout(tp=2)
    with pytest.raises(TopoplanError, match="names 3 host\\(s\\), but the plan uses 1 node"):
        build_spec(topo, layout, block_placements(layout, ["GPU0", "GPU1"]), command=CMD, hosts=["a", "b", "c"])


def fake_sysfs(root: Path, online: str) -> Path:
    """A /sys/devices/system with two single-thread CPUs on node 0 and the given online list."""
    for cpu in (0, 1):
        (root / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(f"{cpu}\n")
    (root / "cpu" / "online").write_text(online)
    (root / "node" / "node0").mkdir(parents=True)
    (root / "node" / "node0" / "cpulist").write_text("0-1\n")
    return root


def test_online_cpus_are_read_and_checked(tmp_path):
    facts = CpuFacts.read_sysfs(fake_sysfs(tmp_path, "0-1\n"))
    assert facts.online == (0, 1)
    facts.check_online([0, 1], "paste.txt")
    with pytest.raises(TopoplanError, match="paste.txt: the topology's GPUs are near CPUs 2-3,7, which are not online "
                                            "on this machine \\(online: 0-1\\)"):
        facts.check_online([0, 2, 3, 7], "paste.txt")
