"""A /sys tree in a temporary folder, built from the `sysfs` part of a recording: PCI device folders under
`devices/` with their `numa_node` files, and the symlinks `class/*/NAME/device` and `bus/pci/devices/ADDR`
that the kernel makes. Lets sysfs_nics.read_sysfs run against files, not mocks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def build_sysfs(root: Path, sysfs: dict[str, Any], extra_links: dict[str, str] | None = None) -> Path:
    """Make the tree under `root`; `extra_links` adds more `class/...` links (link path -> PCI address, or
    "" for a virtual device whose `device` link is missing)."""
    for address, place in sysfs["pci"].items():
        folder = root.joinpath("devices", *place["path"])
        folder.mkdir(parents=True, exist_ok=True)
        node = place["numa_node"]
        (folder / "numa_node").write_text(f"{-1 if node is None else node}\n")
        _link(root / "bus" / "pci" / "devices" / address, folder)
    for nic in sysfs["nics"]:
        place = sysfs["pci"][nic["pci_address"]]
        _link(root / "class" / nic["class"] / nic["name"] / "device", root.joinpath("devices", *place["path"]))
    for link, address in (extra_links or {}).items():
        folder = root / link
        if address:
            _link(folder / "device", root.joinpath("devices", *sysfs["pci"][address]["path"]))
        else:
            folder.mkdir(parents=True, exist_ok=True)
    return root


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        os.symlink(os.path.relpath(target, link.parent), link)
