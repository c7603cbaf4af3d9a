"""Link kinds as `nvidia-smi topo -m` names them (plus AMD's XGMI), and the per-link bandwidth/latency estimates
(the per-GPU-generation figures are topoplan.architectures' rows).

Every figure here is an *estimate* used before anything is measured; `topoplan calibrate` replaces them
with measured ones. docs/topology.md gives the source of each number. Bandwidths are GB/s in one
direction, the convention NCCL's topology code uses (src/graph/topo.h).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from topoplan.architectures import UNKNOWN_ARCH, architecture
from topoplan.errors import TopoplanError


class LinkKind(str, Enum):
    """How two devices are connected, closest first (the order of `nvidia-smi topo -m`'s legend)."""

    NVLINK = "nvlink"  # NV#: a bonded set of # NVLinks (direct, or through NVSwitch)
    XGMI = "xgmi"  # XGMI# (AMD Infinity Fabric between GPUs): # links; rocm-smi/amd-smi say XGMI without a count
    PIX = "pix"  # at most one PCIe bridge
    PXB = "pxb"  # several PCIe bridges, no host bridge
    PHB = "phb"  # through a PCIe host bridge (the CPU's root complex)
    NODE = "node"  # across host bridges inside one NUMA node
    SYS = "sys"  # across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI); old drivers said SOC

    @property
    def rank(self) -> int:
        """0 for the closest kind; larger is farther. Used to pick nearest NICs and to order links."""
        return list(LinkKind).index(self)

    @property
    def is_fabric(self) -> bool:
        """A GPU-to-GPU fabric link (NVLink, XGMI), as opposed to a PCIe path."""
        return self in (LinkKind.NVLINK, LinkKind.XGMI)


_NV_CODE = re.compile(r"^NV(\d{1,3})$")  # at most 18 links join two GPUs (B200)
_XGMI_CODE = re.compile(r"^XGMI(\d{0,3})$")
_PLAIN_CODES = {
    "PIX": LinkKind.PIX,
    "PXB": LinkKind.PXB,
    "PHB": LinkKind.PHB,
    "NODE": LinkKind.NODE,
    "SYS": LinkKind.SYS,
    "SOC": LinkKind.SYS,  # drivers before ~384 printed SOC ("socket") where newer ones print SYS
}


def parse_link_code(code: str) -> tuple[str, LinkKind, int] | None:
    """Normalise one matrix cell: `("NV12", NVLINK, 12)`, `("SYS", SYS, 0)` for `SOC`, `("XGMI1", XGMI, 1)`
    for `XGMI` (one link when the source gives no count); None if unknown."""
    code = code.strip().upper()
    match = _NV_CODE.match(code)
    if match and int(match.group(1)) > 0:
        return code, LinkKind.NVLINK, int(match.group(1))
    match = _XGMI_CODE.match(code)
    if match and (match.group(1) == "" or int(match.group(1)) > 0):
        count = int(match.group(1) or 1)
        return f"XGMI{count}", LinkKind.XGMI, count
    kind = _PLAIN_CODES.get(code)
    if kind is None:
        return None
    return kind.name, kind, 0


# NVLink version as NVML reports it (nvmlDeviceGetNvLinkVersion, values of nvmlNvlinkVersion_t in nvidia-ml-py:
# 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0) -> the generation whose figures apply. Used
# only when the GPU's compute capability has no row in topoplan.architectures (a newer part): the version is a
# weaker witness, some drivers have been seen reporting 5.0 on Hopper.
NVLINK_VERSION_ARCH = {1: "sm60", 2: "sm70", 3: "sm70", 4: "sm80", 5: "sm86", 6: "sm90", 7: "sm100"}


@dataclass(frozen=True)
class CpuLinks:
    """The SMP interconnect between NUMA nodes (what a SYS hop crosses) of one CPU family."""

    family: str  # `--cpu` name
    inter_socket_gbps: float  # GB/s one direction; a SYS hop is priced at min(this, the GPU's PCIe figure)
    source: str


# NCCL picks the figure by CPU vendor and model (src/graph/topo.cc, ncclTopoGetInterCpuBw; the constants in
# src/graph/topo.h). For AMD we do not take NCCL's AMD_BW = 16: a 4-GPU all_gather measured on an AMD EPYC
# box (fixtures/topo/18...measured.txt, Azure NC96ads A100 v4, 4 NUMA nodes) reaches 25.9 GB/s bus bandwidth
# across its SYS hops, above 16 and at the PCIe Gen4 rate: the xGMI / Infinity Fabric crossing is not the
# bottleneck there, so AMD's figure is one xGMI-2 link (x16 at 16 GT/s, ~32 GB/s per direction; 2-socket
# EPYC boards have 3 or 4) and the GPU's PCIe link limits the hop.
CPU_LINKS: dict[str, CpuLinks] = {
    c.family: c
    for c in (
        CpuLinks("intel-broadwell", 6.0, "NCCL BDW_QPI_BW (Broadwell and older Intel QPI)"),
        CpuLinks("intel-skylake", 10.0, "NCCL SKL_QPI_BW (Skylake to Ice Lake UPI)"),
        CpuLinks("intel-sapphire-rapids", 22.0, "NCCL SRP_QPI_BW (Sapphire Rapids UPI 2.0)"),
        CpuLinks("intel-emerald-rapids", 40.0, "NCCL ERP_QPI_BW (Emerald Rapids)"),
        CpuLinks("amd-zen", 32.0, "one xGMI-2 link (x16, 16 GT/s); measured: fixtures/topo/18 all_gather "
                 "25.9 GB/s busbw across SYS (NCCL's AMD_BW = 16 is below that)"),
        CpuLinks("power9", 32.0, "NCCL P9_BW (POWER9 X-bus)"),
        CpuLinks("arm", 6.0, "NCCL ARM_BW"),
    )
}
# A `topo -m` paste does not name the CPU and NVML does not report it: without `--cpu` or the CPU model a
# recording keeps (/proc/cpuinfo, `cpu_family_of`), a SYS hop is priced for Intel Skylake-class UPI.
DEFAULT_CPU = CPU_LINKS["intel-skylake"]

# CPU model names (/proc/cpuinfo "model name", lscpu "Model name") -> family; first match wins. Xeon Scalable
# model numbers carry the generation in their second digit (Intel's naming: Platinum 8180/8280/8380 are the
# 1st-3rd generations, Skylake to Ice Lake; 8480 the 4th, Sapphire Rapids; 8580 the 5th, Emerald Rapids);
# Xeon E5/E7 v1-v4 are Sandy Bridge to Broadwell, which NCCL prices as BDW. Anything else: unknown (None).
_XEON_SCALABLE = re.compile(r"Xeon.*\b(?:Platinum|Gold|Silver|Bronze) [3-9]([1-5])\d\d")
_XEON_GENERATION = {"1": "intel-skylake", "2": "intel-skylake", "3": "intel-skylake", "4": "intel-sapphire-rapids",
                    "5": "intel-emerald-rapids"}
CPU_MODELS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bAMD (?:EPYC|Ryzen Threadripper)"), "amd-zen"),
    (re.compile(r"Xeon.*\bE[57]-\d{4}\w* v[1-4]\b"), "intel-broadwell"),
    (re.compile(r"\bPOWER9\b"), "power9"),
)


def cpu_family_of(model_name: str) -> str | None:
    """The CPU_LINKS family of a CPU model name, or None when it is not one we can place."""
    match = _XEON_SCALABLE.search(model_name)
    if match:
        return _XEON_GENERATION[match.group(1)]
    return next((family for pattern, family in CPU_MODELS if pattern.search(model_name)), None)

# Per-hop latency, microseconds: NCCL's hwLat for the ring algorithm with the LL protocol
# (src/graph/tuning.cc): 0.6 us over NVLink, 1.0 us over PCI. SYS adds the SMP hop, which NCCL does
# not price separately; we keep the PCI figure.
LATENCY_US = {
    LinkKind.NVLINK: 0.6,
    LinkKind.XGMI: 0.6,  # RCCL keeps NCCL's hwLat table; XGMI takes the NVLink row (a direct GPU link)
    LinkKind.PIX: 1.0,
    LinkKind.PXB: 1.0,
    LinkKind.PHB: 1.0,
    LinkKind.NODE: 1.0,
    LinkKind.SYS: 1.0,
}


def cpu_links(family: str | None) -> CpuLinks:
    """The figures for a `--cpu` family (None: the default); a one-line error listing the families."""
    if family is None:
        return DEFAULT_CPU
    if family not in CPU_LINKS:
        raise TopoplanError(f"unknown --cpu {family!r}: expected one of {', '.join(CPU_LINKS)}")
    return CPU_LINKS[family]


def estimate_bandwidth_gbps(kind: LinkKind, nvlinks: int, arch: str | None, cpu: str | None = None) -> float:
    """Estimated one-direction bandwidth of a link of this kind between GPUs of generation `arch` in a
    machine whose CPUs are of family `cpu` (None: unknown)."""
    figures = architecture(arch)
    if kind is LinkKind.NVLINK:
        per_link = figures.nvlink_gbps_per_link or UNKNOWN_ARCH.nvlink_gbps_per_link
        return per_link * nvlinks
    if kind is LinkKind.XGMI:
        return (figures.xgmi_gbps_per_link or UNKNOWN_ARCH.xgmi_gbps_per_link) * nvlinks
    if kind is LinkKind.SYS:
        return min(figures.pcie_gbps, cpu_links(cpu).inter_socket_gbps)
    return figures.pcie_gbps  # NODE crosses host bridges inside one socket: NCCL prices it as PCIe too
