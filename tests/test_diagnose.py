"""Warnings on hand-built machines: each fires where it must and stays quiet where it must not.
(Real pastes are covered in test_inspect_cli.py.)"""

from topoplan.topology import Gpu, Nic, build_topology
from topoplan.topology.diagnose import diagnose


def _codes(topo):
    return [w.code for w in diagnose(topo)]


def _pcie_box(n, *, pair_code="PIX", **gpu_kwargs):
    gpus = [Gpu(f"GPU{i}", i, **gpu_kwargs) for i in range(n)]
    codes = {(f"GPU{i}", f"GPU{j}"): pair_code for i in range(n) for j in range(i + 1, n)}
    return gpus, codes


def test_quiet_machine_has_no_warnings():
    gpus, codes = _pcie_box(4, cpus=(0, 1), numa_node=0)
    assert diagnose(build_topology(gpus, [], codes)) == []


def test_p2p_not_ok_names_pair_capability_and_status():
    gpus, codes = _pcie_box(3, cpus=(0,), numa_node=0)
    p2p = {("GPU0", "GPU1"): {"r": "OK", "w": "OK", "n": "NS", "a": "NS", "p": "OK"},  # PCIe pair: n/a NS are fine
           ("GPU2", "GPU0"): {"r": "CNS", "w": "CNS", "p": "CNS"},
           ("GPU1", "GPU2"): {"r": "OK", "w": "OK", "p": "OK"}}
    [warning] = diagnose(build_topology(gpus, [], codes, p2p=p2p))
    assert warning.code == "p2p-not-ok"
    assert warning.devices == ("GPU0", "GPU2")
    assert "GPU0-GPU2: P2P CNS (chipset not supported), read CNS" in warning.message
    assert "GPU0-GPU1" not in warning.message


def test_nvlink_p2p_not_ok_only_counts_on_nvlink_pairs():
    gpus, codes = _pcie_box(2, cpus=(0,), numa_node=0, pair_code="NV4")
    [warning] = diagnose(build_topology(gpus, [], codes, p2p={("GPU0", "GPU1"): {"n": "DR", "r": "OK"}}))
    assert "NVLink P2P DR (disabled by regkey)" in warning.message


def test_gpus_without_cpu_affinity():
    gpus = [Gpu("GPU0", 0, cpus=(0, 1)), Gpu("GPU1", 1), Gpu("GPU2", 2, cpus=())]
    codes = {("GPU0", "GPU1"): "PIX", ("GPU0", "GPU2"): "PIX", ("GPU1", "GPU2"): "PIX"}
    [warning] = diagnose(build_topology(gpus, [], codes))
    assert (warning.code, warning.devices) == ("no-cpu-affinity", ("GPU1", "GPU2"))


def test_unequal_islands_include_gpus_without_nvlink():
    gpus, codes = _pcie_box(3, cpus=(0,), numa_node=0, pair_code="SYS")
    codes[("GPU0", "GPU1")] = "NV4"  # a bridged pair and a lone GPU
    [warning] = diagnose(build_topology(gpus, [], codes))
    assert warning.code == "nvlink-unequal-islands"
    assert warning.message == "NVLink islands of unequal size: GPU0, GPU1; without NVLink: GPU2"


def test_nic_across_sys_only_for_far_gpus():
    gpus = [Gpu(f"GPU{i}", i, cpus=(i,), numa_node=i // 2) for i in range(4)]
    codes = {(f"GPU{i}", f"GPU{j}"): "NODE" if i // 2 == j // 2 else "SYS" for i in range(4) for j in range(i + 1, 4)}
    codes |= {("GPU0", "NIC0"): "PXB", ("GPU1", "NIC0"): "PXB", ("GPU2", "NIC0"): "SYS", ("GPU3", "NIC0"): "SYS"}
    [warning] = diagnose(build_topology(gpus, [Nic("NIC0", 0, "mlx5_0")], codes))
    assert (warning.code, warning.devices) == ("nic-across-sys", ("GPU2", "GPU3"))
