"""Graph queries on hand-built topologies (the parser tests cover reading real pastes)."""

import pytest

from topoplan.errors import TopoplanError
from topoplan.topology import Gpu, LinkKind, Nic, build_topology


def _two_bridged_pairs():
    """Two NVLink-bridged pairs on two sockets, one NIC on socket 0 (like an RTX/A40 workstation)."""
    gpus = [Gpu(f"GPU{i}", i, cpus=(i,), numa_node=i // 2) for i in range(4)]
    nics = [Nic("NIC0", 0, "mlx5_0")]
    codes = {("GPU0", "GPU1"): "NV4", ("GPU2", "GPU3"): "NV4", ("GPU0", "GPU2"): "SYS", ("GPU0", "GPU3"): "SOC",
             ("GPU1", "GPU2"): "SYS", ("GPU1", "GPU3"): "SYS", ("GPU0", "NIC0"): "PIX", ("GPU1", "NIC0"): "PXB",
             ("NIC0", "GPU2"): "SYS", ("GPU3", "NIC0"): "SYS"}
    return build_topology(gpus, nics, codes, arch="sm86")


def test_codes_normalised_and_priced():
    topo = _two_bridged_pairs()
    assert topo.link("GPU3", "GPU0").code == "SYS"  # SOC is the old name of SYS
    nv = topo.link("GPU1", "GPU0")
    assert (nv.kind, nv.nvlinks, nv.bandwidth_gbps) == (LinkKind.NVLINK, 4, 48.0)  # 4 x 12 GB/s (SM86)
    assert topo.link("GPU0", "NIC0").bandwidth_gbps == 24.0  # PCIe Gen4 x16
    assert topo.link("GPU0", "GPU2").bandwidth_gbps == 10.0  # inter-socket


def test_islands_nics_numa_and_ring():
    topo = _two_bridged_pairs()
    assert topo.nvlink_islands() == [["GPU0", "GPU1"], ["GPU2", "GPU3"]]
    assert [n.id for n in topo.nearest_nics("GPU1")] == ["NIC0"]
    assert [g.id for g in topo.gpus_of_numa(1)] == ["GPU2", "GPU3"]
    assert topo.ring_bottleneck(["GPU0", "GPU1"]).code == "NV4"
    assert topo.ring_bottleneck(["GPU0", "GPU1", "GPU2", "GPU3"]).kind is LinkKind.SYS
    assert topo.ring_bottleneck(["GPU0"]) is None


def test_with_arch_reprices_nvlink():
    topo = _two_bridged_pairs().with_arch("sm80")
    assert topo.link("GPU0", "GPU1").bandwidth_gbps == 80.0  # 4 x 20 GB/s


def test_unknown_code_is_a_user_error():
    with pytest.raises(TopoplanError, match="unknown link code 'XYZ'"):
        build_topology([Gpu("GPU0", 0), Gpu("GPU1", 1)], [], {("GPU0", "GPU1"): "XYZ"})


def test_nearest_gpus_of_a_nic():
    topo = _two_bridged_pairs()
    assert [g.id for g in topo.nearest_gpus("NIC0")] == ["GPU0"]  # PIX beats GPU1's PXB
    lone = build_topology([Gpu("GPU0", 0), Gpu("GPU1", 1)], [Nic("NIC0", 0)],
                          {("GPU0", "GPU1"): "PIX", ("GPU0", "NIC0"): "SYS", ("GPU1", "NIC0"): "SYS"})
    assert [g.id for g in lone.nearest_gpus("NIC0")] == ["GPU0", "GPU1"]  # all ties
