"""What the checks share: the evidence paths they quote and the parsers of the readings they judge."""

from __future__ import annotations

import re
from typing import Any

from topoplan.cpuset import parse_cpu_list
from topoplan.doctor.readings import is_unreadable, why_unreadable

PCI_DEVICES = "/sys/bus/pci/devices"
_NUMBER = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)")


def pci_file(address: str, name: str) -> str:
    return f"{PCI_DEVICES}/{address}/{name}"


def number(reading: Any) -> float | None:
    """The leading number of a reading (`16.0 GT/s PCIe` -> 16.0, `400 Gb/sec (4X NDR)` -> 400.0); None when it
    is unreadable or starts with none (`Unknown`)."""
    if is_unreadable(reading):
        return None
    match = _NUMBER.match(reading)
    return float(match.group(1)) if match else None


def cpus(reading: Any) -> tuple[int, ...] | None:
    """A cpulist reading as CPU numbers; None when unreadable or not a CPU list."""
    if is_unreadable(reading):
        return None
    try:
        return parse_cpu_list(reading)
    except ValueError:
        return None


def unknown_reason(reading: Any, what: str) -> str:
    """Why `reading` gives no answer: the read failure, or the text that did not parse as `what`."""
    return why_unreadable(reading) or f"{reading!r} is not {what}"


def devices(recording: dict[str, Any], role: str) -> list[tuple[str, dict[str, Any]]]:
    """The recording's PCI devices of one role (gpu, nic, bridge), in address order."""
    return sorted((a, e) for a, e in recording["pci"].items() if e["role"] == role)


def gib(n: float) -> str:
    """A size as people read it: `64 MiB` below a GiB, `23.5 GiB` above."""
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"
