"""Every doctor check against the recordings in fixtures/doctor/: the healthy node passes every check, and each
failure recording (one failure put in by hand, see its `built_by_hand`) triggers exactly its check, with the
severity, subject and evidence written here from the fixture's description."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from topoplan.doctor.checks import run_checks
from topoplan.doctor.checks.host import shm_finding
from topoplan.doctor.finding import exit_code, worst
from topoplan.doctor.readings import unreadable
from topoplan.doctor.readings_file import load_recording

FIXTURES = Path(__file__).parent.parent / "fixtures" / "doctor"
HEALTHY = "healthy-h100-nvl-8gpu"


def load(name: str) -> dict:
    return load_recording(FIXTURES / f"{name}.json")


def not_ok(findings) -> list[tuple[str, str, str]]:
    return sorted((f.check, f.subject, f.severity) for f in findings if f.severity != "ok")


def test_every_fixture_says_how_it_was_built():
    for path in FIXTURES.glob("*.json"):
        built = load_recording(path)["built_by_hand"]
        if path.stem.startswith("this-machine"):
            assert built is False  # a real `doctor --save`
        else:
            assert isinstance(built, str) and "fixtures/doctor/build.py" in built


def test_healthy_node_passes_every_check():
    findings = run_checks(load(HEALTHY))
    assert not_ok(findings) == []
    assert exit_code(findings) == 0
    checks = {f.check for f in findings}
    assert checks == {"pcie-link", "acs", "iommu", "persistence", "nvlink", "nvml-pcie", "retired-pages", "p2p",
                      "rdma-port", "net-link", "memlock", "numa-balancing", "shm", "cpufreq", "cpuset",
                      "gpu-affinity"}
    by_subject = {(f.check, f.subject): f for f in findings}
    assert by_subject[("pcie-link", "GPU 0000:18:00.0")].evidence.startswith(
        "/sys/bus/pci/devices/0000:18:00.0/current_link_speed = 32.0 GT/s PCIe (max 32.0 GT/s PCIe)")
    assert by_subject[("acs", "bridge 0000:15:01.0")].evidence.endswith("ACS Control = 0x0000 (all off)")
    assert by_subject[("nvlink", "GPU0")].message == "all 18 NVLinks active"
    assert by_subject[("p2p", "28 GPU pairs")].message == "P2P read OK between every pair"
    assert by_subject[("shm", "/dev/shm")].evidence == "statvfs(/dev/shm): 1008.0 GiB total, 1008.0 GiB free"


# fixture -> the one (check, subject, severity) it triggers that the healthy node does not, and words of the message
TRIGGERED = {
    "pcie-gpu-x8": ([("pcie-link", "GPU 0000:3a:00.0", "slows")], "link trained at x8 of x16"),
    "pcie-nic-gen3": ([("pcie-link", "NIC 0000:9a:00.0", "slows")], "below its top speed"),
    "acs-redirect": ([("acs", "bridge 0000:15:01.0", "blocks")], "ACS redirects peer-to-peer to the root complex "
                                                                 "for GPU 0000:18:00.0, GPU 0000:19:00.0"),
    "iommu-translated": ([("iommu", "GPU 0000:18:00.0, GPU 0000:19:00.0, GPU 0000:3a:00.0 (+7)", "slows")],
                         "translated mode"),
    "ib-ports-down": ([("rdma-port", "mlx5_0 port 1", "slows"), ("rdma-port", "mlx5_1 port 1", "slows")],
                      "port not ACTIVE"),
    "ib-rate-low": ([("rdma-port", "mlx5_1 port 1", "slows")], "rate 200 Gb/sec (4X HDR) below the best port's 400"),
    "net-down": ([("net-link", "eno1", "note")], "interface down"),
    "memlock-low": ([("memlock", "ulimit -l", "slows")], "only 65536 bytes may be pinned"),
    "numa-balancing-amd": ([("numa-balancing", "NUMA balancing", "blocks")], "MI300X"),
    "numa-balancing-on": ([("numa-balancing", "NUMA balancing", "slows")], "migrates pages"),
    "shm-docker-64m": ([("shm", "/dev/shm", "blocks")], "64 MiB free, below the 1.0 GiB topoplan needs"),
    "governor-powersave": ([("cpufreq", "CPUs 0-255", "slows")], "governor powersave"),
    "persistence-off": ([("persistence", "GPU3", "slows")], "persistence mode off"),
    "nvlink-down": ([("nvlink", "GPU5", "slows")], "2 of 18 NVLinks inactive (links 4, 5)"),
    "retired-pending": ([("retired-pages", "GPU6", "slows")], "pages wait for retirement"),
    "p2p-missing": ([("p2p", "GPU0-GPU1", "note")], "no peer-to-peer (CNS)"),
}


@pytest.mark.parametrize("name", sorted(TRIGGERED))
def test_each_failure_recording_triggers_its_check(name: str):
    expected, words = TRIGGERED[name]
    findings = run_checks(load(name))
    assert not_ok(findings) == sorted(expected)
    assert all(words in f.message for f in findings if f.severity != "ok")
    assert all(f.fix for f in findings if f.severity in ("slows", "blocks"))
    assert exit_code(findings) == {"note": 0, "slows": 3, "blocks": 4}[worst(findings)]


def test_narrow_cpuset_leaves_far_gpus_without_their_cpus():
    findings = run_checks(load("cpuset-narrow"))
    far = {"GPU 0000:98:00.0", "GPU 0000:99:00.0", "GPU 0000:ba:00.0", "GPU 0000:bb:00.0"}
    near = {"GPU 0000:18:00.0", "GPU 0000:19:00.0", "GPU 0000:3a:00.0", "GPU 0000:3b:00.0"}
    severity = {f.subject: f.severity for f in findings if f.check == "gpu-affinity"}
    assert {s for s, v in severity.items() if v == "slows"} == far  # CPUs 64-127,192-255: none in 0-15
    assert {s for s, v in severity.items() if v == "note"} == near  # 16 of their 128 CPUs
    cpuset = next(f for f in findings if f.check == "cpuset")
    assert (cpuset.severity, cpuset.message) == ("note", "this process may use 16 of 256 online CPUs (a cgroup "
                                                 "cpuset or taskset)")


# --- unreadable sources: "unknown" with the reason, never a guess ----------------------------------------------
def test_unreadable_readings_are_unknown_with_their_reason():
    recording = copy.deepcopy(load(HEALTHY))
    recording["pci"]["0000:18:00.0"]["max_link_width"] = unreadable("/sys/x/max_link_width: Permission denied")
    recording["pci"]["0000:15:01.0"]["acs_control"] = unreadable("the extended config space needs root")
    recording["numa_balancing"] = unreadable("/proc/sys/kernel/numa_balancing: No such file or directory")
    recording["shm"] = unreadable("statvfs(/dev/shm): No such file or directory")
    recording["cpus"]["governors"] = {"0": unreadable("/sys/.../scaling_governor: No such file or directory")}
    recording["nvml"] = {"skipped": "NVML could not start (Driver Not Loaded): no NVIDIA driver loaded here"}
    unknown = {(f.check, f.subject): f.evidence for f in run_checks(recording) if f.severity == "unknown"}
    assert unknown == {
        ("pcie-link", "GPU 0000:18:00.0"): "/sys/x/max_link_width: Permission denied",
        ("acs", "1 bridge(s) above GPUs/NICs"): "0000:15:01.0: the extended config space needs root",
        ("numa-balancing", "NUMA balancing"): "/proc/sys/kernel/numa_balancing: No such file or directory",
        ("shm", "/dev/shm"): "statvfs(/dev/shm): No such file or directory",
        ("cpufreq", "CPU governor"): "/sys/.../scaling_governor: No such file or directory",
        ("nvml", "NVML"): "NVML could not start (Driver Not Loaded): no NVIDIA driver loaded here",
    }


def test_text_that_does_not_parse_is_unknown_not_zero():
    recording = copy.deepcopy(load(HEALTHY))
    recording["pci"]["0000:9a:00.0"]["current_link_speed"] = "Unknown"  # what sysfs says of a link it cannot read
    finding = next(f for f in run_checks(recording) if f.subject == "NIC 0000:9a:00.0")
    assert (finding.severity, finding.evidence) == ("unknown", "'Unknown' is not a link speed or width")


def test_gpu_speed_below_max_is_a_note_while_width_slows():
    recording = copy.deepcopy(load(HEALTHY))
    recording["pci"]["0000:18:00.0"]["current_link_speed"] = "2.5 GT/s PCIe"  # idle power saving
    finding = next(f for f in run_checks(recording) if f.subject == "GPU 0000:18:00.0" and f.check == "pcie-link")
    assert finding.severity == "note" and "idle" in finding.message


def test_managed_powersave_is_a_note_and_rdma_free_memlock_is_fine():
    recording = copy.deepcopy(load("governor-powersave"))
    recording["cpus"]["scaling_driver"] = "intel_pstate"
    recording["infiniband"] = {}
    recording["memlock"] = {"soft": 65536, "hard": 65536}
    findings = {f.check: f for f in run_checks(recording)}
    assert findings["cpufreq"].severity == "note" and "intel_pstate" in findings["cpufreq"].message
    assert (findings["memlock"].severity, findings["rdma-port"].severity) == ("ok", "note")


def test_shm_need_depends_on_the_engine():
    recording = load(HEALTHY)
    recording["shm"] = {"total_bytes": 24 * 2**30, "free_bytes": 24 * 2**30}
    assert shm_finding(recording, "vllm").severity == "ok"
    sglang = shm_finding(recording, "sglang")
    assert sglang.severity == "blocks" and "--shm-size=32g" in sglang.fix


def test_iommu_passthrough_and_no_iommu_pass():
    recording = copy.deepcopy(load(HEALTHY))
    iommu = next(f for f in run_checks(recording) if f.check == "iommu")
    assert iommu.message == "IOMMU in passthrough"
    assert iommu.evidence == ("/sys/kernel/iommu_groups/*/type = identity; kernel command line: intel_iommu=on "
                              "iommu=pt")
    recording["iommu"] = {"groups": 0, "units": [], "iommu_args": []}
    for entry in recording["pci"].values():
        entry.pop("iommu_group", None) if entry["role"] == "bridge" else entry.update(iommu_group=None)
    iommu = next(f for f in run_checks(recording) if f.check == "iommu")
    assert (iommu.severity, iommu.message) == ("ok", "no IOMMU groups: DMA is not translated")


# --- fuzz: a recording damaged anywhere is refused in one TopoplanError or judged, never a traceback -------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from topoplan.doctor.readings_file import SHAPE  # noqa: E402
from topoplan.doctor.schema import check_shape  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402

DAMAGE_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.text(max_size=8), st.just("32.0 GT/s PCIe"),
                 st.just("0-3,x"), st.lists(st.integers(-1, 3), max_size=3), st.builds(dict),
                 st.builds(lambda: {"unreadable": "no"}), st.builds(lambda: {"nvml_error": "GPU_IS_LOST"}))


def _spots(node, path=()):
    """Every path in a JSON tree (containers included), the root left out."""
    if path:
        yield path
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _spots(child, (*path, key))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DAMAGE_FIXTURES), picks=st.lists(st.tuples(st.integers(0, 10**6), JUNK), min_size=1,
                                                              max_size=3))
def test_damaged_recordings_never_traceback(name, picks):
    data = load(name)
    for pick, junk in picks:
        spots = list(_spots(data))
        *parent, key = spots[pick % len(spots)]
        node = data
        for step in parent:
            node = node[step]
        node[key] = junk
    try:
        check_shape(data, SHAPE, "fuzz.json")
    except TopoplanError as error:
        assert str(error).startswith("fuzz.json: damaged doctor recording: ") and "\n" not in str(error)
        return
    findings = run_checks(data)
    assert exit_code(findings) in (0, 3, 4)


def test_nvml_pcie_link_and_roce_port():
    recording = copy.deepcopy(load(HEALTHY))
    recording["nvml"]["gpus"][2]["pcie"]["current_width"] = 8
    recording["nvml"]["gpus"][4]["pcie"]["current_generation"] = 1  # idle GPUs step down
    recording["infiniband"]["mlx5_1"]["ports"]["1"]["link_layer"] = "Ethernet"
    found = {(f.check, f.subject): f for f in run_checks(recording)}
    assert (found[("nvml-pcie", "GPU2")].severity, found[("nvml-pcie", "GPU2")].evidence) == (
        "slows", "NVML PCIe generation 5 (max 5), width x8 (max x16)")
    assert found[("nvml-pcie", "GPU4")].severity == "note"
    assert found[("nvml-pcie", "GPU0")].severity == "ok"
    roce = found[("rdma-port", "mlx5_1 port 1")]
    assert (roce.severity, roce.fix) == ("note", "set NCCL_IB_GID_INDEX to the RoCE v2 GID (`show_gids`)")


def test_layout_nic_down_with_another_up_slows_and_unknown_nic_is_unknown():
    from topoplan.doctor.for_layout import layout_findings
    from topoplan.layout import Layout
    from topoplan.machine import load_topology

    topology = load_topology(str(Path(__file__).parent.parent / "fixtures/topo/17_h100-nvl-8gpu-nv12-pairs-2nic.txt"))
    recording = copy.deepcopy(load("ib-ports-down"))
    recording["infiniband"]["mlx5_1"]["ports"]["1"]["state"] = "4: ACTIVE"  # one rail left
    nics = {f.subject.split()[0]: f for f in layout_findings(recording, topology, Layout.parse("tp=8"), 2)
            if f.check == "layout-nic"}
    assert (nics["mlx5_0"].severity, nics["mlx5_1"].severity) == ("slows", "ok")
    assert nics["mlx5_0"].message == "down: its GPUs' traffic between nodes shares their other nearest NICs"
    del recording["infiniband"]["mlx5_1"]
    nics = {f.subject.split()[0]: f for f in layout_findings(recording, topology, Layout.parse("tp=8"), 2)
            if f.check == "layout-nic"}
    assert (nics["mlx5_1"].severity, nics["mlx5_1"].evidence) == (
        "unknown", "mlx5_1 is in neither /sys/class/infiniband nor /sys/class/net of this machine")
    assert nics["mlx5_0"].severity == "slows"  # down, but mlx5_1 is not known to be down: not guessed
    # tp=8 over 2 nodes puts 4 ranks on each: this node's GPU0-GPU3
    assert nics["mlx5_0"].message == ("down; whether GPU0, GPU1, GPU2, GPU3 have another nearest NIC up is not known "
                                      "(see their rows)")
