"""PCIe Access Control Services (ACS) from a device's config space (`/sys/bus/pci/devices/ADDR/config`).

ACS lives in the extended config space (offset 0x100 and up), which Linux gives only to root: an ordinary
user reads the first 64 bytes. So the reader records the ACS Control register where it can read it, and
otherwise why not, and the check says "unknown" rather than guessing.

ACS Control bits (PCIe Base Specification, 7.7.8.3): a switch or root port with P2P Request Redirect or
P2P Completion Redirect set sends peer-to-peer traffic up to the root complex instead of across the switch,
which NCCL's troubleshooting guide names as a cause of hangs and slow GPU-to-GPU bandwidth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from topoplan.doctor.readings import unreadable

EXTENDED_START = 0x100  # the first extended capability header
CONFIG_SIZE = 0x1000  # PCIe config space: 4 KiB
ACS_CAP_ID = 0x000D
MAX_CAPABILITIES = 256  # a capability list longer than this loops: damaged hardware or a fake file
ACS_BITS = {0x01: "SrcValid", 0x02: "TransBlk", 0x04: "ReqRedir", 0x08: "CmpltRedir", 0x10: "UpstreamFwd",
            0x20: "EgressCtrl", 0x40: "DirectTrans"}
REDIRECTS = 0x04 | 0x08  # the bits that route peer-to-peer through the root complex


def acs_control(config: bytes) -> int | None:
    """The ACS Control register from a config-space dump, None when the device has no ACS capability."""
    offset, seen = EXTENDED_START, 0
    while offset and offset + 8 <= len(config) and seen < MAX_CAPABILITIES:
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[offset + 6:offset + 8], "little")
        offset, seen = (header >> 20) & 0xFFC, seen + 1
    return None


def read_acs(device: Path) -> Any:
    """What the recording keeps for one bridge: the ACS Control value, None (no ACS capability), or why the
    extended config space could not be read."""
    path = device / "config"
    try:
        with open(path, "rb") as handle:
            config = handle.read(CONFIG_SIZE)
    except OSError as error:
        return unreadable(f"{path}: {error.strerror or error}")
    if len(config) <= EXTENDED_START:
        return unreadable(f"the extended config space needs root: {len(config)} bytes of config readable "
                          f"(run `sudo topoplan doctor` or `sudo lspci -vvv | grep ACSCtl`)")
    return acs_control(config)


def describe(control: int) -> str:
    """`ReqRedir+ CmpltRedir+` style, as lspci prints ACSCtl (only the bits set)."""
    return " ".join(f"{name}+" for bit, name in ACS_BITS.items() if control & bit) or "all off"
