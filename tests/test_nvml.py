"""The NVML source, end to end through a fake pynvml that replays the constructed recordings in
fixtures/nvml/ and a /sys tree built from them. Expectations are written by hand from each fixture's
description (its `constructed` field), never taken from the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_pynvml import fake_pynvml, install
from fake_sysfs import build_sysfs

from topoplan.errors import TopoplanError
from topoplan.hardware import catalog_gpu
from topoplan.topology import LinkKind
from topoplan.topology.nvml_query import query_nvml
from topoplan.topology.nvml_reader import read_nvml_topology, record_machine
from topoplan.topology.read import detect_format
from topoplan.topology.recording import parse_recording, topology_from_recording
from topoplan.topology.sysfs_nics import read_sysfs

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvml"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def replay(name: str):
    """A saved recording read as the CLI reads it: the topology, then its GPU from the catalog."""
    path = FIXTURES / f"{name}.json"
    return catalog_gpu(topology_from_recording(parse_recording(path.read_text(), str(path)), str(path)))


def live(name: str, tmp_path: Path, monkeypatch, save: Path | None = None):
    """The live path on a machine that answers like the recording: fake pynvml, a /sys tree, its env."""
    recording = load(name)
    module = fake_pynvml(recording)
    install(monkeypatch, module)
    for key, value in recording["environment"].items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    sysfs = build_sysfs(tmp_path / "sys", recording["sysfs"])
    cpuinfo = tmp_path / "cpuinfo"  # the recording's CPU model, or none (not this host's)
    if recording.get("cpu", {}).get("model_name"):
        cpuinfo.write_text(f"model name\t: {recording['cpu']['model_name']}\n")
    return catalog_gpu(read_nvml_topology(save=save, sysfs_root=sysfs, cpuinfo=cpuinfo)), module


def codes(topo) -> dict[tuple[str, str], str]:
    return {(l.a, l.b): l.code for l in topo.links()}


def snapshot(topo):
    """Everything a topology says, except where it was read from."""
    return topo.gpus, topo.nics, topo.links(), topo.arch, topo.gpu_name, topo.notes


def test_there_are_recordings_for_every_case_the_issue_names():
    assert NAMES == ["a100-pcie-4gpu-bridged-pairs", "a100-sxm-4gpu-one-lost", "gb200-nvl72-tray-4gpu",
                     "gh200-grace-1gpu", "hgx-h100-8gpu-nvswitch", "l40s-8gpu-2socket-p2p-cns"]
    for name in NAMES:
        assert load(name)["constructed"].startswith("CONSTRUCTED, not captured.")


@pytest.mark.parametrize("name", NAMES)
def test_the_query_asks_exactly_what_was_recorded(name):
    """Querying the fake reproduces the recording's answers: every recorded answer was asked for, and the
    fake, which fails on any question it has no answer to, was asked nothing else."""
    recording = load(name)
    assert query_nvml(fake_pynvml(recording)) == recording["nvml"]


@pytest.mark.parametrize("name", NAMES)
def test_sysfs_reader_reads_back_the_recorded_tree(name, tmp_path):
    recording = load(name)
    root = build_sysfs(tmp_path / "sys", recording["sysfs"])
    bus_ids = [g["pci_bus_id"] for g in recording["nvml"]["gpus"] if isinstance(g.get("pci_bus_id"), str)]
    assert read_sysfs(bus_ids, root) == recording["sysfs"]


@pytest.mark.parametrize("name", NAMES)
def test_replay_equals_live(name, tmp_path, monkeypatch):
    saved = tmp_path / "machine.json"
    topo, _ = live(name, tmp_path, monkeypatch, save=saved)
    text = saved.read_text()
    assert detect_format(text) == "recording"
    again = catalog_gpu(topology_from_recording(parse_recording(text, str(saved)), str(saved)))
    assert snapshot(again) == snapshot(topo)
    assert snapshot(replay(name)) == snapshot(topo)
    written = json.loads(text)
    original = load(name)
    assert (written["nvml"], written["sysfs"], written["environment"]) == \
        (original["nvml"], original["sysfs"], original["environment"])
    assert written["cpu"] == original.get("cpu", {"model_name": None})
    assert written["nvml"]["driver_version"] == original["nvml"]["driver_version"]
    assert set(written["timings"]) == {"nvml_s", "sysfs_s"}


def test_every_nvml_query_is_exercised(tmp_path, monkeypatch):
    called = set()
    for name in NAMES:
        _, module = live(name, tmp_path / name, monkeypatch)
        called |= set(module.calls)
    assert called == {
        "nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
        "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetCpuAffinityWithinScope", "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetGpuFabricInfoV",
    }


def test_nvswitch_board_connects_every_pair_with_all_18_links():
    topo = replay("hgx-h100-8gpu-nvswitch")
    assert (topo.arch, topo.gpu_name) == ("sm90", "h100-sxm")
    for a in range(8):
        for b in range(a + 1, 8):
            link = topo.link(f"GPU{a}", f"GPU{b}")
            assert (link.code, link.nvlinks) == ("NV18", 18)
            assert link.bandwidth_gbps == pytest.approx(18 * 20.6)
            assert link.p2p == {"r": "OK", "w": "OK", "n": "OK", "a": "OK", "p": "OK"}
    assert topo.nvlink_islands() == [[f"GPU{i}" for i in range(8)]]
    # one ConnectX-7 under each GPU's PCIe switch; the storage NIC pair shares one card
    for i in range(8):
        assert [n.name for n in topo.nearest_nics(f"GPU{i}")] == [f"mlx5_{i}"]
        assert topo.link(f"GPU{i}", f"NIC{i}").code == "PIX"
    assert topo.link("GPU0", "NIC1").code == "NODE" and topo.link("GPU0", "NIC4").code == "SYS"
    assert topo.link("NIC8", "NIC9").code == "PIX" and topo.link("GPU5", "NIC8").code == "SYS"
    gpu0 = topo.gpu(0)
    assert gpu0.cpus == tuple(range(0, 56)) + tuple(range(112, 168))
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpu0.name == "NVIDIA H100 80GB HBM3" and gpu0.pci_bus_id == "00000000:1B:00.0"
    assert gpu0.memory_bytes == 81559 * 2**20 and gpu0.gpu_numa_id is None and gpu0.error is None
    assert topo.notes == ()


def test_bridged_pairs_and_nothing_else():
    topo = replay("a100-pcie-4gpu-bridged-pairs")
    assert (topo.arch, topo.gpu_name) == ("sm80", "a100-pcie-80gb")
    found = codes(topo)
    assert found[("GPU0", "GPU1")] == "NV12" and found[("GPU2", "GPU3")] == "NV12"
    for pair in [("GPU0", "GPU2"), ("GPU0", "GPU3"), ("GPU1", "GPU2"), ("GPU1", "GPU3")]:
        assert found[pair] == "SYS"
        assert topo.link(*pair).p2p["n"] == "NS"
    assert topo.link("GPU0", "GPU1").bandwidth_gbps == 12 * 20.0
    assert topo.nvlink_islands() == [["GPU0", "GPU1"], ["GPU2", "GPU3"]]
    assert [g.numa_node for g in topo.gpus] == [0, 1, 2, 3]
    assert topo.gpu(3).cpus == tuple(range(72, 96))
    # the NIC is on NUMA node 0 but its own PCI domain: NODE to GPU0, SYS to the rest
    assert [found[(f"GPU{i}", "NIC0")] for i in range(4)] == ["NODE", "SYS", "SYS", "SYS"]


def test_p2p_not_supported_across_sockets():
    topo = replay("l40s-8gpu-2socket-p2p-cns")
    assert (topo.arch, topo.gpu_name) == ("sm89", "l40s")
    assert topo.link("GPU0", "GPU3").code == "NODE" and topo.link("GPU0", "GPU3").p2p["r"] == "OK"
    across = topo.link("GPU2", "GPU5")
    assert across.code == "SYS" and across.p2p == {"r": "CNS", "w": "CNS", "n": "NS", "a": "NS", "p": "CNS"}
    assert topo.nvlink_islands() == []
    # sysfs gives the NIC no NUMA node, so nothing places it: SYS, and said so
    assert {topo.link(f"GPU{i}", "NIC0").code for i in range(8)} == {"SYS"}
    assert len(topo.notes) == 1 and "GPU0-NIC0" in topo.notes[0] and "GPU7-NIC0" in topo.notes[0]


def test_grace_gpu_memory_is_its_own_numa_node():
    topo = replay("gh200-grace-1gpu")
    gpu = topo.gpu(0)
    assert (gpu.numa_node, gpu.gpu_numa_id, gpu.cpus) == (0, 1, tuple(range(72)))
    assert (topo.arch, topo.gpu_name) == ("sm90", "gh200")
    assert [l.code for l in topo.links()] == ["NODE", "NODE", "NODE", "NODE", "PIX", "NODE", "NODE", "NODE",
                                              "NODE", "PIX"]  # GPU0-NIC0..3, then NIC0-NIC1 ... NIC2-NIC3
    assert topo.nvlink_islands() == []


def test_a_gpu_that_errors_is_marked_not_fatal():
    topo = replay("a100-sxm-4gpu-one-lost")
    lost, odd = topo.gpu(2), topo.gpu(3)
    assert lost.error == "NVML could not read it (handle: GPU_IS_LOST)"
    assert (lost.name, lost.uuid, lost.pci_bus_id, lost.cuda_index_pci_bus) == (None, None, None, None)
    assert odd.error == "NVML could not read it (memory_total: UNKNOWN)"
    assert odd.memory_bytes is None and odd.name == "NVIDIA A100-SXM4-40GB"
    assert topo.gpu(0).error is None and topo.gpu(1).error is None
    found = codes(topo)
    assert found[("GPU0", "GPU1")] == found[("GPU0", "GPU3")] == found[("GPU1", "GPU3")] == "NV4"
    assert found[("GPU0", "GPU2")] == found[("GPU1", "GPU2")] == found[("GPU2", "GPU3")] == "SYS"
    assert any("GPU2: NVML could not read it" in n for n in topo.notes)
    assert any("GPU0-GPU2, GPU1-GPU2, GPU2-GPU3" in n for n in topo.notes)
    # CUDA never sees the lost GPU: GPU3 is CUDA device 2 in PCI bus order
    assert [g.cuda_index_pci_bus for g in topo.gpus] == [0, 1, None, 2]
    # CUDA_VISIBLE_DEVICES="GPU-...403,0" under PCI_BUS_ID: GPU3 by UUID, GPU0 by index
    assert [g.visible for g in topo.gpus] == [True, False, False, True]


def test_no_driver_is_one_clear_error(monkeypatch):
    install(monkeypatch, fake_pynvml(load("gh200-grace-1gpu"), init_error="LIBRARY_NOT_FOUND"))
    with pytest.raises(TopoplanError, match=r"^NVML could not start \(NVML Shared Library Not Found\): "
                                            r"no NVIDIA driver or GPU here$"):
        record_machine()


def test_no_nvidia_ml_py_is_one_clear_error(monkeypatch):
    install(monkeypatch, None)
    with pytest.raises(TopoplanError, match="nvidia-ml-py package is not installed"):
        record_machine()


def test_bandwidth_follows_the_generation_table():
    topo = replay("a100-sxm-4gpu-one-lost")
    assert topo.link("GPU0", "GPU1").kind is LinkKind.NVLINK
    assert topo.link("GPU0", "GPU1").bandwidth_gbps == 4 * 20.0  # NCCL SM80_NVLINK_BW


def test_warnings_from_nvml_answers():
    from topoplan.topology.diagnose import diagnose
    from topoplan.topology.export import topology_dict

    errors = [w for w in diagnose(replay("a100-sxm-4gpu-one-lost")) if w.code == "gpu-error"]
    assert [w.devices for w in errors] == [("GPU2",), ("GPU3",)]
    assert "GPU_IS_LOST" in errors[0].message and "memory_total: UNKNOWN" in errors[1].message
    l40s = {w.code: w for w in diagnose(replay("l40s-8gpu-2socket-p2p-cns"))}
    assert "p2p-not-ok" in l40s and "GPU0" in l40s["p2p-not-ok"].devices
    gpu2 = topology_dict(replay("a100-sxm-4gpu-one-lost"))["gpus"][2]
    assert (gpu2["error"], gpu2["visible"], gpu2["cuda_index_pci_bus"]) == (
        "NVML could not read it (handle: GPU_IS_LOST)", False, None)


def test_nvlink_version_prices_a_generation_the_table_lacks():
    """A newer part (compute capability 10.3, not in architectures.ARCHITECTURES) reporting NVLink 5.0 (enum value 7)
    gets the sm100 figures, with a note; the compute capability wins whenever the table knows it. A name the
    catalog lacks is dropped with a note (the B300 itself is catalogued: sm100 figures, its own memory)."""
    recording = load("hgx-h100-8gpu-nvswitch")
    for gpu in recording["nvml"]["gpus"]:
        gpu["cuda_compute_capability"] = [10, 3]
        gpu["name"] = "NVIDIA B300 SXM6 AC"
        for link in gpu["nvlinks"][:-1]:
            link["version"] = 7
    raw = topology_from_recording(recording, "b300")
    assert raw.gpu_name == "NVIDIA B300 SXM6 AC"  # the topology layer keeps NVML's name; the catalog maps it
    topo = catalog_gpu(raw)
    assert topo.arch == "sm100" and topo.gpu_name == "b300"
    assert topo.link("GPU0", "GPU7").bandwidth_gbps == pytest.approx(18 * 40.1)
    assert any("sm103 has no link figures; NVLink version [7] -> sm100" in n for n in topo.notes)
    for gpu in recording["nvml"]["gpus"]:
        gpu["name"] = "NVIDIA B400 SXM7"  # a part no catalog has yet
    unknown = catalog_gpu(topology_from_recording(recording, "b400"))
    assert unknown.arch == "sm100" and unknown.gpu_name is None
    assert any("'NVIDIA B400 SXM7' is not in topoplan's GPU catalog" in n for n in unknown.notes)


def test_not_supported_marks_a_gpu_only_where_every_gpu_answers():
    recording = load("gh200-grace-1gpu")
    recording["nvml"]["gpus"][0]["numa_node_id"] = {"nvml_error": "NOT_SUPPORTED"}  # x86 boards say this
    recording["nvml"]["gpus"][0]["cpu_affinity"] = {"nvml_error": "NOT_SUPPORTED"}
    recording["nvml"]["gpus"][0]["cpu_affinity_any_scope"] = {"nvml_error": "NOT_SUPPORTED"}
    gpu = topology_from_recording(recording, "x").gpu(0)
    assert (gpu.error, gpu.gpu_numa_id, gpu.cpus) == (None, None, None)
    recording["nvml"]["gpus"][0]["uuid"] = {"nvml_error": "NOT_SUPPORTED"}  # every GPU has a UUID
    assert topology_from_recording(recording, "x").gpu(0).error == "NVML could not read it (uuid: NOT_SUPPORTED)"


def test_an_older_nvidia_ml_py_without_a_call_is_not_a_crash():
    recording = load("gh200-grace-1gpu")
    module = fake_pynvml(recording)
    del module.nvmlDeviceGetNumaNodeId
    answers = query_nvml(module)
    assert answers["gpus"][0]["numa_node_id"] == {"nvml_error": "FUNCTION_NOT_FOUND"}
    recording["nvml"] = answers
    gpu = topology_from_recording(recording, "old").gpu(0)
    assert (gpu.error, gpu.gpu_numa_id, gpu.numa_node) == (None, None, 0)


@pytest.mark.parametrize(("recording", "layout", "level"), [
    ("l40s-8gpu-2socket-p2p-cns", "tp=4", None),  # GPU0-3 share a socket: reads and writes work (NVLink, atomics: NS)
    ("l40s-8gpu-2socket-p2p-cns", "tp=8", "PHB"),  # across the sockets reads and writes are CNS: up to PHB only
    ("a100-pcie-4gpu-bridged-pairs", "tp=4", None),  # NVLink NS between the bridged pairs; reads and writes OK
])
def test_p2p_level_follows_reads_and_writes_only(recording, layout, level):
    """NCCL_P2P_LEVEL comes from peer read/write failures alone: NVLink or atomics 'not supported' on a PCIe box
    used to set PXB (L40S) or PHB (A100 PCIe), turning off P2P that works."""
    from topoplan.launch.spec import build_spec
    from topoplan.layout import Layout
    from topoplan.plan.placement import place

    topo = replay(recording)
    chosen = Layout.parse(layout)
    spec = build_spec(topo, chosen, place(topo, chosen, 1), command=["x"])
    assert {r.env_dict().get("NCCL_P2P_LEVEL") for r in spec.ranks} == {level}

