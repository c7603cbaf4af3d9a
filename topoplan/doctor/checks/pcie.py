"""PCIe links of GPUs and NICs: a device whose link trained below its maximum (x8 instead of x16, Gen3 instead
of Gen5: a bad riser, a dirty slot, a BIOS setting) moves its data at a fraction of the speed the plan priced.

Width below the maximum slows every transfer. Speed below the maximum slows a NIC; a GPU's link drops to Gen1
when idle to save power and comes back under load, so for a GPU it is a note to re-check under load.
"""

from __future__ import annotations

from typing import Any

from topoplan.doctor.checks.evidence import devices, number, pci_file, unknown_reason
from topoplan.doctor.finding import Finding
from topoplan.doctor.readings import is_unreadable

CHECK = "pcie-link"


def _one(address: str, entry: dict[str, Any]) -> Finding:
    role = entry["role"]
    group = "peer-to-peer" if role == "gpu" else "network"
    subject = f"{role.upper()} {address}"
    values = {f: number(entry[f]) for f in ("current_link_speed", "max_link_speed", "current_link_width",
                                            "max_link_width")}
    missing = [f for f, v in values.items() if v is None]
    if missing:
        reading = entry[missing[0]]
        why = unknown_reason(reading, "a link speed or width")
        if is_unreadable(reading) and "No such file" in why:
            why += " (no PCIe link attributes: a virtual device or not PCI Express)"
        return Finding(CHECK, group, "unknown", subject, "PCIe link not known", why)
    evidence = (f"{pci_file(address, 'current_link_speed')} = {entry['current_link_speed']} "
                f"(max {entry['max_link_speed']}); current_link_width = x{entry['current_link_width']} "
                f"(max x{entry['max_link_width']})")
    fix = ("reseat the card or move it to a full-width slot; check the BIOS PCIe settings and the riser "
           "(`sudo lspci -vv -s " + address + " | grep LnkSta`)")
    if values["current_link_width"] < values["max_link_width"]:
        return Finding(CHECK, group, "slows", subject,
                       f"link trained at x{entry['current_link_width']} of x{entry['max_link_width']}", evidence, fix)
    if values["current_link_speed"] < values["max_link_speed"]:
        if role == "gpu":
            return Finding(CHECK, group, "note", subject, "link below its top speed: GPUs drop the link speed when "
                           "idle; re-check while it works", evidence,
                           "read it under load: `nvidia-smi -q -d PCI` (or rocm-smi) while a job runs")
        return Finding(CHECK, group, "slows", subject, "link trained below its top speed", evidence, fix)
    return Finding(CHECK, group, "ok", subject, "link at its maximum speed and width", evidence)


def check(recording: dict[str, Any]) -> list[Finding]:
    return [_one(a, e) for role in ("gpu", "nic") for a, e in devices(recording, role)]
