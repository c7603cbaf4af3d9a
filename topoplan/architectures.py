"""What differs between GPU generations, written once: one row per architecture (`sm80`, `gfx942`) with its link
figures, the dtypes it computes in, and the NIC speed of its reference systems.

Read by the topology (link estimates: topoplan.topology.links.estimate_bandwidth_gbps; the PCIe speed an NCCL XML
export writes), the planner's device (dtypes and the default NIC: topoplan.plan.device) and the catalog's checks,
so an architecture fact is never spelled in two places. A GPU's catalog entry (topoplan.hardware) names its row.
Sources:
- NVLink per-link figures are NCCL's SMxx_NVLINK_BW (src/graph/topo.h, as of NCCL v2.30.7; SM90 has been 20.6
  since v2.20, SM100 40.1 since v2.27.5). PCIe figures are NCCL's formula for a PCIe link in topo.cc,
  width x per-lane speed (x100 Mbit/s) / 80 -> GB/s: x16 Gen3 = 16 x 60 / 80 = 12, Gen4 = 24, Gen5 = 48.
- Dtypes: minimum compute capabilities as vLLM's quantisation configs state them (get_min_capability): GPTQ 60,
  AWQ 75, FP8 80 (weight-only "FP8 Marlin" below 89, W8A8 from 89); BF16 needs Ampere (sm80) tensor cores. fp8 KV
  cache: vLLM's `--kv-cache-dtype fp8` on CUDA, dequantised in the attention kernels (Ampere and later here: the
  Marlin/FlashInfer paths it relies on start at sm80).
- NIC: per-NIC bandwidth (GB/s, one direction) assumed when --nic-gbps is not given: the InfiniBand rate of the
  generation's reference systems, one NIC per GPU. DGX-1 datasheet (4x EDR 100 Gb/s for 8 GPUs: 6.25 GB/s per
  GPU), DGX A100 (8x HDR 200 Gb/s), DGX H100 / B200 (8x NDR 400 Gb/s); other generations: DEFAULT_NIC_GBPS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeSupport:
    """What a GPU generation does with each `plan --dtype` / `--kv-dtype` (names of topoplan.dtypes)."""

    native: tuple[str, ...]  # weights and GEMMs in this dtype (tensor cores, or CUDA cores for fp32)
    weight_only: tuple[str, ...]  # stored in it, dequantised to the activation dtype for the GEMMs
    kv: tuple[str, ...]  # KV-cache dtypes
    source: str


@dataclass(frozen=True)
class Architecture:
    """One GPU generation: link figures (GB/s, one direction), dtypes, reference NIC."""

    arch: str
    nvlink_gbps_per_link: float  # one NVLink; 0: none
    pcie_gbps: float  # the GPU's PCIe x16 link
    link_source: str
    dtypes: DtypeSupport | None  # None: no catalog GPU of this generation to plan for (link figures only)
    nic_gbps: float | None = None  # its reference systems' per-GPU NIC; None: DEFAULT_NIC_GBPS
    xgmi_gbps_per_link: float = 0.0  # AMD: one XGMI (Infinity Fabric) link


DEFAULT_NIC_GBPS = 25.0  # HDR 200 Gb/s, the most common data-centre rate when the generation is unknown

_PRE_AMPERE = DtypeSupport(("fp32", "fp16"), ("int4",), ("fp32", "fp16"),
                           "no BF16, no FP8 tensor cores; int4 as GPTQ (vLLM min capability 60; AWQ needs 75)")
_AMPERE = DtypeSupport(("fp32", "bf16", "fp16"), ("fp8", "int4", "mxfp4"), ("fp32", "bf16", "fp16", "fp8"),
                       "BF16 tensor cores, no FP8: fp8 checkpoints run weight-only (vLLM FP8 Marlin), GEMMs in bf16; "
                       "mxfp4 weight-only (vLLM MXFP4 Marlin)")
_FP8 = DtypeSupport(("fp32", "bf16", "fp16", "fp8"), ("int4", "mxfp4"), ("fp32", "bf16", "fp16", "fp8"),
                    "FP8 tensor cores (W8A8); int4 AWQ/GPTQ and mxfp4 weight-only (no FP4 rate in the catalog)")
_AMD_NO_FP8 = DtypeSupport(("fp32", "bf16", "fp16"), ("int4",), ("fp32", "bf16", "fp16"),
                           "BF16/FP16 matrix cores, no FP8 (MI250X, RX 7900 XTX, W7900 data sheets)")
_AMD_FP8 = DtypeSupport(("fp32", "bf16", "fp16", "fp8"), ("int4",), ("fp32", "bf16", "fp16", "fp8"),
                        "FP8 matrix cores (MI300X/MI325X/MI355X data sheets); int4 AWQ/GPTQ weight-only")

ARCHITECTURES: dict[str, Architecture] = {
    a.arch: a
    for a in (
        Architecture("sm60", 18.0, 12.0, "NCCL SM60_NVLINK_BW; P100 is PCIe Gen3", _PRE_AMPERE, 6.25),
        Architecture("sm70", 20.0, 12.0, "NCCL SM70_NVLINK_BW; V100 is PCIe Gen3", _PRE_AMPERE, 6.25),
        Architecture("sm75", 20.0, 12.0, "NCCL uses SM70_NVLINK_BW below sm80 (2080 Ti bridges); Turing is PCIe "
                     "Gen3", _PRE_AMPERE),
        Architecture("sm80", 20.0, 24.0, "NCCL SM80_NVLINK_BW; A100 is PCIe Gen4", _AMPERE, 25.0),
        Architecture("sm86", 12.0, 24.0, "NCCL SM86_NVLINK_BW (GA10x bridges); PCIe Gen4", _AMPERE),
        Architecture("sm89", 0.0, 24.0, "Ada has no NVLink; PCIe Gen4", _FP8),
        Architecture("sm90", 20.6, 48.0, "NCCL SM90_NVLINK_BW; H100/H200 are PCIe Gen5", _FP8, 50.0),
        Architecture("sm100", 40.1, 48.0, "NCCL SM100_NVLINK_BW; B200 is PCIe Gen5", _FP8, 50.0),
        Architecture("sm120", 0.0, 48.0, "GB20x (RTX 5090, RTX PRO 6000 Blackwell) has no NVLink; PCIe Gen5", _FP8),
        # --- AMD (gfx targets) ---------------------------------------------------------------------------
        Architecture("gfx90a", 0.0, 24.0, "ROCm docs, MI250 microarchitecture: an Infinity Fabric link runs at 25 "
                     "GT/s x16 = 50 GB/s per direction; PCIe Gen4", _AMD_NO_FP8, xgmi_gbps_per_link=50.0),
        Architecture("gfx942", 0.0, 48.0, "AMD Instinct MI300X/MI325X data sheets: 7 Infinity Fabric links of 128 "
                     "GB/s (both directions) = 64 GB/s per direction; PCIe Gen5", _AMD_FP8, xgmi_gbps_per_link=64.0),
        Architecture("gfx950", 0.0, 48.0, "AMD Instinct MI355X data sheet: 7 Infinity Fabric links, 1075 GB/s "
                     "aggregate = 153.6 GB/s per link, 76.8 per direction; PCIe Gen5", _AMD_FP8,
                     xgmi_gbps_per_link=76.8),
        Architecture("gfx1100", 0.0, 24.0, "Radeon RX 7900 XTX / PRO W7900 (RDNA 3): no XGMI; PCIe Gen4 x16",
                     _AMD_NO_FP8),
        Architecture("gfx1201", 0.0, 48.0, "Radeon AI PRO R9700 (RDNA 4): no XGMI; PCIe Gen5 x16", None),
    )
}

# When the GPU generation is unknown (a `topo -m` paste without --gpu, and no family could be inferred):
# NCCL's own defaults, PCI_BW = 12 (Gen3 x16) and 20 GB/s per NVLink; XGMI the oldest figure (MI250, 50 GB/s),
# so estimates err low. Also the fallback for a link a generation has no figure for.
UNKNOWN_ARCH = Architecture("unknown", 20.0, 12.0, "NCCL defaults: PCI_BW (Gen3 x16); SM80_NVLINK_BW, its fallback",
                            None, xgmi_gbps_per_link=50.0)


def architecture(arch: str | None) -> Architecture:
    """The row of a generation (`sm80`), or UNKNOWN_ARCH (NCCL's defaults) when it is None or has none."""
    return ARCHITECTURES.get(arch or "", UNKNOWN_ARCH)
