"""Read this machine into a recording: one plain dict of raw readings from sysfs, procfs, statvfs, getrlimit
and NVML. Nothing here judges; topoplan.doctor.checks does, from the dict alone.

`root` is the file-system root the paths are read under ("/" live; a hand-built tree in tests), so every
reading is reproducible from files. RLIMIT_MEMLOCK is the one reading of this process rather than of a file.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from types import ModuleType
from typing import Any

from topoplan.doctor.acs import read_acs
from topoplan.doctor.nvml import SKIPPED, read_nvml
from topoplan.doctor.pci_ids import GPU_CLASSES, GPU_VENDORS, NIC_CLASS, NVIDIA
from topoplan.doctor.readings import is_unreadable, read_text, unreadable
from topoplan.doctor.readings_file import FORMAT, SCHEMA_VERSION
from topoplan.topology.sysfs_nics import natural_key, pci_path

LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
PORT_FILES = ("state", "phys_state", "rate", "link_layer")
MAX_DEVICES = 4096  # PCI functions read; a real machine has a few hundred


def _role(vendor: Any, pci_class: Any) -> str | None:
    if is_unreadable(vendor) or is_unreadable(pci_class):
        return None
    if vendor in GPU_VENDORS and pci_class.startswith(GPU_CLASSES):
        return "gpu"
    return "nic" if pci_class.startswith(NIC_CLASS) else None


def _iommu_group(device: Path, root: Path) -> dict[str, Any] | None:
    link = device / "iommu_group"
    if not link.is_symlink():
        return None
    group = os.readlink(link).rsplit("/", 1)[-1]
    return {"group": group, "type": read_text(root / "sys/kernel/iommu_groups" / group / "type")}


def read_pci(root: Path) -> dict[str, dict[str, Any]]:
    """GPUs (NVIDIA, AMD) and NICs on the PCI bus with their links, NUMA node, CPU affinity and IOMMU group,
    and every bridge above them with its ACS Control register."""
    bus = root / "sys/bus/pci/devices"
    devices_root = (root / "sys/devices").resolve()
    names = sorted(os.listdir(bus))[:MAX_DEVICES] if bus.is_dir() else []
    pci: dict[str, dict[str, Any]] = {}
    for name in names:
        device = bus / name
        vendor, pci_class = read_text(device / "vendor"), read_text(device / "class")
        role = _role(vendor, pci_class)
        if role is None:
            continue
        chain = pci_path(device, devices_root) or [name]
        pci[name] = {"role": role, "vendor": vendor, "class": pci_class,
                     **{f: read_text(device / f) for f in LINK_FILES},
                     "numa_node": read_text(device / "numa_node"),
                     "local_cpulist": read_text(device / "local_cpulist"),
                     "iommu_group": _iommu_group(device, root),
                     "bridges": chain[1:-1]}  # chain[0] is the root complex (pci0000:00), not a device
    for name in sorted({b for entry in list(pci.values()) for b in entry["bridges"]}):
        pci.setdefault(name, {"role": "bridge", "acs_control": read_acs(bus / name)})
    return pci


def read_infiniband(root: Path) -> dict[str, Any]:
    """Every RDMA device's ports: state, physical state, rate and link layer (InfiniBand or Ethernet: RoCE)."""
    base = root / "sys/class/infiniband"
    if not base.is_dir():
        return {}
    devices: dict[str, Any] = {}
    for name in sorted(os.listdir(base), key=natural_key):
        ports = base / name / "ports"
        numbers = sorted(os.listdir(ports), key=natural_key) if ports.is_dir() else []
        devices[name] = {"ports": {n: {f: read_text(ports / n / f) for f in PORT_FILES} for n in numbers}}
    return devices


def read_net(root: Path) -> dict[str, Any]:
    """Network interfaces but loopback: state, speed (Mb/s), and the PCI device behind it (None: virtual)."""
    base = root / "sys/class/net"
    if not base.is_dir():
        return {}
    devices_root = (root / "sys/devices").resolve()
    out: dict[str, Any] = {}
    for name in sorted(os.listdir(base), key=natural_key):
        if name == "lo":
            continue
        path = pci_path(base / name / "device", devices_root)
        out[name] = {"operstate": read_text(base / name / "operstate"), "speed": read_text(base / name / "speed"),
                     "pci_address": path[-1] if path else None}
    return out


def read_shm(root: Path) -> dict[str, Any]:
    try:
        fs = os.statvfs(root / "dev/shm")
    except OSError as error:
        return unreadable(f"statvfs(/dev/shm): {error.strerror or error}")
    return {"total_bytes": fs.f_blocks * fs.f_frsize, "free_bytes": fs.f_bavail * fs.f_frsize}


def read_memlock() -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {k: ("unlimited" if v == resource.RLIM_INFINITY else v) for k, v in (("soft", soft), ("hard", hard))}


def read_cpus(root: Path) -> dict[str, Any]:
    """Online CPUs, this process's cpuset (Cpus_allowed_list), and each CPU's cpufreq governor and driver."""
    status = read_text(root / "proc/self/status")
    allowed: Any = unreadable("proc/self/status has no Cpus_allowed_list line")
    if is_unreadable(status):
        allowed = status
    else:
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key == "Cpus_allowed_list":
                allowed = value.strip()
    cpu_dir = root / "sys/devices/system/cpu"
    cpus = sorted((p for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit()), key=lambda p: int(p.name[3:]))
    return {"online": read_text(cpu_dir / "online"), "cpus_allowed_list": allowed,
            "governors": {p.name[3:]: read_text(p / "cpufreq/scaling_governor") for p in cpus},
            "scaling_driver": read_text(cpus[0] / "cpufreq/scaling_driver") if cpus
            else unreadable(f"{cpu_dir}: no cpuN folders")}


def read_iommu(root: Path) -> dict[str, Any]:
    groups = root / "sys/kernel/iommu_groups"
    units = root / "sys/class/iommu"
    return {"groups": len(os.listdir(groups)) if groups.is_dir() else unreadable(f"{groups}: missing"),
            "units": sorted(os.listdir(units)) if units.is_dir() else [],
            "iommu_args": _iommu_args(read_text(root / "proc/cmdline"))}


def _iommu_args(cmdline: Any) -> Any:
    """The kernel command line's IOMMU words only (iommu=pt, intel_iommu=on, amd_iommu=off ...): the rest of
    a command line is none of a bug report's business."""
    if is_unreadable(cmdline):
        return cmdline
    return [word for word in cmdline.split() if "iommu" in word.split("=", 1)[0]]


def read_machine(root: str | Path = "/", nvml: ModuleType | None = None) -> dict[str, Any]:
    """The whole recording of the machine under `root`. NVML is asked only when an NVIDIA GPU is on the PCI
    bus (`nvml` replaces the pynvml module, for tests)."""
    root = Path(root)
    pci = read_pci(root)
    has_nvidia = any(e["role"] == "gpu" and e["vendor"] == NVIDIA for e in pci.values())
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "built_by_hand": False,
            "pci": pci, "iommu": read_iommu(root), "infiniband": read_infiniband(root), "net": read_net(root),
            "numa_balancing": read_text(root / "proc/sys/kernel/numa_balancing"), "shm": read_shm(root),
            "memlock": read_memlock(), "cpus": read_cpus(root),
            "nvml": read_nvml(nvml) if has_nvidia else {SKIPPED: "no NVIDIA GPU on the PCI bus"}}
