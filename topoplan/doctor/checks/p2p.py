"""Peer-to-peer through PCIe: ACS redirection on the bridges above the GPUs and NICs, and the IOMMU mode.

NCCL's troubleshooting guide: with ACS P2P redirect set on a PCIe switch, GPU-to-GPU (and GPU-to-NIC,
GPUDirect RDMA) traffic is sent up to the root complex, which either drops it (a hang) or crawls; and an IOMMU
translating every DMA (the kernel's `DMA`/`DMA-FQ` group types) slows the same traffic: `iommu=pt` puts
devices in passthrough (`identity`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from topoplan.doctor.acs import REDIRECTS, describe
from topoplan.doctor.checks.evidence import devices, pci_file
from topoplan.doctor.finding import Finding
from topoplan.doctor.readings import is_unreadable, why_unreadable

ACS_FIX = ("disable ACS redirect on the switch ports (BIOS: 'ACS' / 'PCIe ACS control' off; at run time "
           "`sudo setpci -s ADDR ECAP_ACS+0x6.w=0000`), or keep it on and set NCCL_P2P_DISABLE=1 in VMs that need it")
TRANSLATED = ("DMA", "DMA-FQ")  # /sys/kernel/iommu_groups/N/type of a translating IOMMU domain


def check_acs(recording: dict[str, Any]) -> list[Finding]:
    """One finding per bridge above a GPU or NIC: blocks where it redirects P2P above two or more GPUs."""
    gpus = devices(recording, "gpu")
    above: dict[str, list[str]] = defaultdict(list)
    for role in ("gpu", "nic"):
        for address, entry in devices(recording, role):
            for bridge in entry["bridges"]:
                above[bridge].append(f"{role.upper()} {address}")
    findings, unknown = [], defaultdict(list)
    if not above and (gpus or devices(recording, "nic")):
        findings.append(Finding("acs", "peer-to-peer", "ok", "PCIe bridges", "no bridge above any GPU or NIC: "
                                "nothing to redirect", "/sys/bus/pci/devices: GPUs and NICs sit on the root complex"))
    for bridge in sorted(above):
        entry = recording["pci"].get(bridge, {})
        control = entry.get("acs_control")
        under = ", ".join(above[bridge])
        if entry.get("role") != "bridge":
            unknown[f"no bridge entry for it in the recording's pci part (above {under})"].append(bridge)
            continue
        if is_unreadable(control):
            unknown[why_unreadable(control)].append(bridge)
            continue
        evidence = f"{pci_file(bridge, 'config')} ACS Control = " + ("no ACS capability" if control is None
                                                                       else f"0x{control:04x} ({describe(control)})")
        if control is not None and control & REDIRECTS:
            severity = "blocks" if len(gpus) >= 2 and any(g.startswith("GPU") for g in above[bridge]) else "slows"
            findings.append(Finding("acs", "peer-to-peer", severity, f"bridge {bridge}",
                                    f"ACS redirects peer-to-peer to the root complex for {under}", evidence,
                                    ACS_FIX.replace("ADDR", bridge)))
        else:
            findings.append(Finding("acs", "peer-to-peer", "ok", f"bridge {bridge}",
                                    f"no ACS redirect above {under}", evidence))
    for why, bridges in unknown.items():
        listed = ", ".join(bridges[:4]) + (" ..." if len(bridges) > 4 else "")
        findings.append(Finding("acs", "peer-to-peer", "unknown", f"{len(bridges)} bridge(s) above GPUs/NICs",
                                "ACS not known", f"{listed}: {why}"))
    return findings


def check_iommu(recording: dict[str, Any]) -> list[Finding]:
    """Translated IOMMU domains of GPUs and NICs: slows; passthrough or no IOMMU: ok."""
    iommu = recording["iommu"]
    args = iommu["iommu_args"]
    cmdline = ("kernel command line: " + (" ".join(args) or "no iommu option")) if not is_unreadable(args) \
        else why_unreadable(args)
    if is_unreadable(iommu["groups"]):
        return [Finding("iommu", "peer-to-peer", "unknown", "IOMMU", "IOMMU mode not known",
                        why_unreadable(iommu["groups"]))]
    if iommu["groups"] == 0:
        return [Finding("iommu", "peer-to-peer", "ok", "IOMMU", "no IOMMU groups: DMA is not translated",
                        f"/sys/kernel/iommu_groups: 0 groups; /sys/class/iommu: {len(iommu['units'])} unit(s); "
                        f"{cmdline}")]
    by_type: dict[str, list[str]] = defaultdict(list)
    for role in ("gpu", "nic"):
        for address, entry in devices(recording, role):
            group = entry["iommu_group"]
            kind = "none" if group is None else (why_unreadable(group["type"]) and "unreadable") or group["type"]
            by_type[kind].append(f"{role.upper()} {address}")
    findings = []
    for kind, members in sorted(by_type.items()):
        subject = ", ".join(members[:3]) + (f" (+{len(members) - 3})" if len(members) > 3 else "")
        evidence = f"/sys/kernel/iommu_groups/*/type = {kind}; {cmdline}"
        if kind in TRANSLATED:
            findings.append(Finding("iommu", "peer-to-peer", "slows", subject,
                                    "IOMMU translates every DMA (translated mode): peer-to-peer and RDMA slow down",
                                    evidence, "boot with iommu=pt (Intel: intel_iommu=on iommu=pt; AMD: iommu=pt), "
                                    "or turn the IOMMU off in the BIOS where nothing needs it"))
        elif kind == "unreadable":
            findings.append(Finding("iommu", "peer-to-peer", "unknown", subject, "IOMMU group type not known",
                                    evidence))
        elif kind == "unmanaged":
            findings.append(Finding("iommu", "peer-to-peer", "note", subject, "owned by VFIO (given to a VM), not "
                                    "by this host's driver", evidence))
        else:
            findings.append(Finding("iommu", "peer-to-peer", "ok", subject,
                                    "IOMMU in passthrough" if kind == "identity" else "not in an IOMMU group",
                                    evidence))
    return findings
