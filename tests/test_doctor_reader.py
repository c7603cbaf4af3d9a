"""The doctor's reader on hand-built file trees (sysfs, procfs, /dev/shm under tmp_path) and a fake pynvml: the
recording holds exactly the files' words, unreadable files carry their reason, and the ACS register is found
in a config-space dump by walking the capability list."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fake_pynvml import fake_pynvml

from topoplan.doctor.acs import acs_control, describe, read_acs
from topoplan.doctor.checks import run_checks
from topoplan.doctor.nvml import read_nvml
from topoplan.doctor.reader import read_machine
from topoplan.doctor.readings_file import SHAPE
from topoplan.doctor.schema import check_shape

NVML_FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvml"
GPU, NIC, BRIDGE, HOST = "0000:18:00.0", "0000:1a:00.0", "0000:15:01.0", "0000:00:00.0"


def config_with_acs(control: int) -> bytes:
    """4 KiB of config space: AER at 0x100 pointing to ACS at 0x148 (ACS Control at 0x14e)."""
    data = bytearray(4096)
    data[0x100:0x104] = (0x0001 | (1 << 16) | (0x148 << 20)).to_bytes(4, "little")
    data[0x148:0x14C] = (0x000D | (1 << 16)).to_bytes(4, "little")
    data[0x14E:0x150] = control.to_bytes(2, "little")
    return bytes(data)


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def pci_device(root: Path, chain: list[str], files: dict[str, str | bytes]) -> Path:
    folder = root.joinpath("sys/devices", *chain)
    for name, text in files.items():
        write(folder / name, text)
    link = root / "sys/bus/pci/devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(folder, link.parent), link)
    return folder


def build_tree(root: Path) -> Path:
    link = {"current_link_speed": "16.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe", "current_link_width": "16",
            "max_link_width": "16", "numa_node": "0", "local_cpulist": "0-1"}
    pci_device(root, ["pci0000:15", BRIDGE], {"vendor": "0x8086", "class": "0x060400",
                                              "config": config_with_acs(0x001D)})
    gpu = pci_device(root, ["pci0000:15", BRIDGE, GPU], {"vendor": "0x10de", "class": "0x030200", **link})
    nic = pci_device(root, ["pci0000:15", BRIDGE, NIC], {"vendor": "0x15b3", "class": "0x020700", **link})
    pci_device(root, ["pci0000:00", HOST], {"vendor": "0x8086", "class": "0x060000"})  # a host bridge: not read
    write(root / "sys/kernel/iommu_groups/20/type", "DMA-FQ\n")
    os.symlink("../../../../kernel/iommu_groups/20", gpu / "iommu_group")
    (root / "sys/class/iommu/dmar0").mkdir(parents=True)
    ports = root / "sys/class/infiniband/mlx5_0/ports/1"
    for name, text in {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "400 Gb/sec (4X NDR)",
                       "link_layer": "InfiniBand"}.items():
        write(ports / name, text + "\n")
    write(root / "sys/class/net/ib0/operstate", "down\n")
    write(root / "sys/class/net/ib0/speed", "400000\n")
    os.symlink(os.path.relpath(nic, root / "sys/class/net/ib0"), root / "sys/class/net/ib0/device")
    write(root / "sys/class/net/veth0/operstate", "up\n")  # virtual: no device link, speed unreadable
    write(root / "sys/class/net/lo/operstate", "unknown\n")
    write(root / "proc/sys/kernel/numa_balancing", "1\n")
    write(root / "proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on quiet\n")
    write(root / "proc/self/status", "Name:\tpython3\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n")
    cpu = root / "sys/devices/system/cpu"
    write(cpu / "online", "0-3\n")
    for n in range(3):
        write(cpu / f"cpu{n}/cpufreq/scaling_governor", "powersave\n")
        write(cpu / f"cpu{n}/cpufreq/scaling_driver", "acpi-cpufreq\n")
    (cpu / "cpu3").mkdir()  # offline or no cpufreq: its governor is unreadable
    (root / "dev/shm").mkdir(parents=True)
    return root


def no_driver():
    """pynvml as on a machine with the GPU on the bus but no driver loaded (never this host's real NVML)."""
    return fake_pynvml({"nvml": {}}, init_error="DRIVER_NOT_LOADED")


def docker_shm(monkeypatch, root: Path) -> None:
    """statvfs answers for root/dev/shm as in a Docker container (64 MiB, 60 MiB free); a real file system's free
    space moves under a test while other jobs write to it."""
    real = os.statvfs

    def statvfs(path):
        if Path(path) == root / "dev/shm":
            return os.statvfs_result((4096, 4096, 16384, 15360, 15360, 0, 0, 0, 0, 255))
        return real(path)

    monkeypatch.setattr("topoplan.doctor.reader.os.statvfs", statvfs)


def test_reader_records_the_files_words(tmp_path: Path, monkeypatch):
    docker_shm(monkeypatch, tmp_path)
    recording = read_machine(build_tree(tmp_path), no_driver())
    check_shape(recording, SHAPE, "live")  # what the reader writes is what --file accepts
    assert sorted(recording["pci"]) == [BRIDGE, GPU, NIC]  # the host bridge is no GPU, NIC or bridge above one
    gpu = recording["pci"][GPU]
    assert gpu == {"role": "gpu", "vendor": "0x10de", "class": "0x030200", "current_link_speed": "16.0 GT/s PCIe",
                   "max_link_speed": "32.0 GT/s PCIe", "current_link_width": "16", "max_link_width": "16",
                   "numa_node": "0", "local_cpulist": "0-1", "iommu_group": {"group": "20", "type": "DMA-FQ"},
                   "bridges": [BRIDGE]}
    assert recording["pci"][NIC]["role"] == "nic" and recording["pci"][NIC]["iommu_group"] is None
    assert recording["pci"][BRIDGE] == {"role": "bridge", "acs_control": 0x001D}
    assert recording["iommu"] == {"groups": 1, "units": ["dmar0"], "iommu_args": ["intel_iommu=on"]}
    assert recording["infiniband"] == {"mlx5_0": {"ports": {"1": {
        "state": "1: DOWN", "phys_state": "3: Disabled", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}}}}
    assert recording["net"]["ib0"] == {"operstate": "down", "speed": "400000", "pci_address": NIC}
    assert recording["net"]["veth0"]["pci_address"] is None and "lo" not in recording["net"]
    assert "No such file or directory" in recording["net"]["veth0"]["speed"]["unreadable"]
    assert recording["numa_balancing"] == "1"
    assert recording["shm"] == {"total_bytes": 64 * 2**20, "free_bytes": 60 * 2**20}
    cpus = recording["cpus"]
    assert (cpus["online"], cpus["cpus_allowed_list"], cpus["scaling_driver"]) == ("0-3", "0-1", "acpi-cpufreq")
    assert [cpus["governors"][c] for c in "012"] == ["powersave"] * 3
    assert "cpu3/cpufreq/scaling_governor" in cpus["governors"]["3"]["unreadable"]
    assert recording["nvml"] == {"skipped": "NVML could not start (Driver Not Loaded): no NVIDIA driver loaded here"}
    json.dumps(recording)  # plain data, nothing else


def test_checks_on_the_tree(tmp_path: Path, monkeypatch):
    docker_shm(monkeypatch, tmp_path)
    findings = {(f.check, f.subject): f for f in run_checks(read_machine(build_tree(tmp_path), no_driver()))}
    acs = findings[("acs", f"bridge {BRIDGE}")]
    assert (acs.severity, acs.evidence) == ("slows", f"/sys/bus/pci/devices/{BRIDGE}/config ACS Control = 0x001d "
                                            "(SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+)")  # one GPU: no P2P pair
    assert findings[("iommu", f"GPU {GPU}")].severity == "slows"
    assert findings[("iommu", f"NIC {NIC}")].message == "not in an IOMMU group"
    assert findings[("pcie-link", f"GPU {GPU}")].severity == "note"  # 16 of 32 GT/s on a GPU: maybe idle
    assert findings[("pcie-link", f"NIC {NIC}")].severity == "slows"
    assert findings[("rdma-port", "mlx5_0 port 1")].severity == "slows"
    assert findings[("net-link", "ib0")].severity == "note"
    assert findings[("numa-balancing", "NUMA balancing")].severity == "slows"
    assert findings[("cpufreq", "CPUs 0-2")].severity == "slows"
    assert findings[("cpuset", "cpuset")].message == "this process may use 2 of 4 online CPUs (a cgroup cpuset or " \
                                                     "taskset)"
    assert findings[("gpu-affinity", f"GPU {GPU}")].severity == "ok"
    shm = findings[("shm", "/dev/shm")]
    assert (shm.severity, shm.evidence) == ("blocks", "statvfs(/dev/shm): 64 MiB total, 60 MiB free")


def test_acs_walks_the_capability_list():
    assert acs_control(config_with_acs(0x0011)) == 0x0011
    assert describe(0x0011) == "SrcValid+ UpstreamFwd+" and describe(0) == "all off"
    no_acs = bytearray(4096)
    no_acs[0x100:0x104] = (0x0001 | (1 << 16)).to_bytes(4, "little")  # AER, next 0: the list ends
    assert acs_control(bytes(no_acs)) is None
    looping = bytearray(4096)
    looping[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # points at itself
    assert acs_control(bytes(looping)) is None


def test_acs_without_root_says_why(tmp_path: Path):
    write(tmp_path / "config", bytes(64))  # what Linux gives a non-root reader
    assert read_acs(tmp_path) == {"unreadable": "the extended config space needs root: 64 bytes of config readable "
                                                "(run `sudo topoplan doctor` or `sudo lspci -vvv | grep ACSCtl`)"}
    assert "No such file or directory" in read_acs(tmp_path / "missing")["unreadable"]


def test_nvml_part_adds_the_doctor_fields():
    recording = json.loads((NVML_FIXTURES / "a100-pcie-4gpu-bridged-pairs.json").read_text())
    for index, gpu in enumerate(recording["nvml"]["gpus"]):
        gpu.update(persistence_mode=index % 2,
                   pcie={"current_generation": 4, "max_generation": 4, "current_width": 8 if index == 2 else 16,
                         "max_width": 16},
                   retired_pages={"single_bit_ecc": 0, "double_bit_ecc": 3 if index == 1 else 0,
                                  "pending": {"nvml_error": "NOT_SUPPORTED"} if index == 3 else 0})
    nvml = read_nvml(fake_pynvml(recording))
    assert [g["persistence_mode"] for g in nvml["gpus"]] == [0, 1, 0, 1]
    assert nvml["gpus"][2]["pcie"] == {"current_generation": 4, "max_generation": 4, "current_width": 8,
                                       "max_width": 16}
    assert nvml["gpus"][1]["retired_pages"] == {"single_bit_ecc": 0, "double_bit_ecc": 3, "pending": 0}
    assert nvml["gpus"][3]["retired_pages"]["pending"] == {"nvml_error": "NOT_SUPPORTED"}
    assert len(nvml["pairs"]) == 6


def test_nvml_part_without_a_driver_says_why():
    module = fake_pynvml({"nvml": {}}, init_error="DRIVER_NOT_LOADED")
    assert read_nvml(module) == {"skipped": "NVML could not start (Driver Not Loaded): no NVIDIA driver loaded here"}


def test_nvml_part_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert read_nvml(None) == {"skipped": "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"}
