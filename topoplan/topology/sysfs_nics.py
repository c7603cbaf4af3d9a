"""NICs and PCI locality from Linux sysfs: the `sysfs` part of a recording, and the PCIe distance between
two devices from their places in the PCI tree.

NVML knows GPUs only; it has no answer for a GPU and a NIC. sysfs does: every PCI device's directory sits
under its bridges (`/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/...`), so the deepest bridge two
devices share says what `nvidia-smi topo -m` would print: PIX, PXB, PHB, NODE or SYS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def sysfs_address(bus_id: str) -> str:
    """NVML's `00000000:18:00.0` as sysfs writes it, `0000:18:00.0` (4-digit domain, lower case)."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def pci_path(device: Path, devices_root: Path) -> list[str] | None:
    """The chain `[root complex, bridge, ..., device]` above a PCI device, or None when sysfs has no such
    device or it is not on PCI (a virtual interface)."""
    try:
        parts = device.resolve(strict=True).relative_to(devices_root).parts
    except (OSError, ValueError):
        return None
    last_pci = max((i for i, part in enumerate(parts) if _PCI_ADDRESS.match(part)), default=None)
    return list(parts[: last_pci + 1]) if last_pci is not None else None


def _numa_node(pci_dir: Path) -> int | None:
    try:
        node = int((pci_dir / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None  # -1: the platform does not say


def natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def read_sysfs(gpu_bus_ids: Iterable[str], root: str | Path = "/sys") -> dict[str, Any]:
    """NICs (RDMA devices from /sys/class/infiniband, then PCI network interfaces from /sys/class/net not
    already listed) and the PCI path and NUMA node of every GPU and NIC."""
    root = Path(root)
    devices_root = (root / "devices").resolve()
    pci: dict[str, dict[str, Any]] = {}

    def place(device_link: Path) -> str | None:
        path = pci_path(device_link, devices_root)
        if path is None:
            return None
        address = path[-1]
        pci.setdefault(address, {"path": path, "numa_node": _numa_node(devices_root.joinpath(*path))})
        return address

    nics: list[dict[str, Any]] = []
    for cls in ("infiniband", "net"):
        class_dir = root / "class" / cls
        names = sorted((p.name for p in class_dir.iterdir()), key=natural_key) if class_dir.is_dir() else []
        for name in names:
            address = place(class_dir / name / "device")
            if address is not None and address not in {nic["pci_address"] for nic in nics}:
                nics.append({"name": name, "class": cls, "pci_address": address})
    for bus_id in gpu_bus_ids:
        place(root / "bus" / "pci" / "devices" / sysfs_address(bus_id))
    return {"nics": nics, "pci": pci}


def pci_link_code(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """The `topo -m` code between two PCI devices (`{"path": [...], "numa_node": n}` each), or None when
    sysfs did not place both, or they sit under different root complexes with a NUMA node unknown.

    Under one root complex: the deepest shared bridge is a switch both reach through at most one more
    bridge -> PIX; through more -> PXB; only the root complex shared -> PHB. Different root complexes:
    NODE on the same NUMA node, SYS across nodes.
    """
    path_a, path_b = (a or {}).get("path"), (b or {}).get("path")
    if not (path_a and path_b):
        return None
    if path_a[0] == path_b[0]:
        shared = _shared_prefix(path_a, path_b)
        if shared == 1:
            return "PHB"
        below = max(len(path_a), len(path_b)) - shared - 1  # bridges between the shared one and a device
        return "PIX" if below <= 1 else "PXB"
    numa_a, numa_b = a.get("numa_node"), b.get("numa_node")
    if numa_a is None or numa_b is None:
        return None
    return "NODE" if numa_a == numa_b else "SYS"


def _shared_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
