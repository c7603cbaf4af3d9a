"""The GPU hardware catalog (data, one entry per product, each with its source) and lookups.

docs/hardware.md lists every figure with its source. Figures are dense (no sparsity) peak numbers; for
GeForce cards the BF16/FP8 figure is the one with FP32 accumulation (what PyTorch matmuls use), which
NVIDIA's Ada/Blackwell whitepapers list at half the FP16-accumulate rate.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from topoplan.errors import TopoplanError
from topoplan.topology.links import LinkKind
from topoplan.topology.model import Topology

# Most memory_mib figures: the total nvidia-smi prints (`0MiB / 81920MiB`) for that product in public logs
# found with the search tool (2026-12), listed in docs/hardware.md; the exceptions say so in memory_source.
NVIDIA_SMI_LOGS = "nvidia-smi memory.total in public logs of this product"
# AMD parts: no amd-smi/rocm-smi log of the total was seen; the vendor's GB read as GiB (HBM stacks come in
# binary sizes), an upper bound on what ROCm reports.
AMD_GIB = "the data sheet's GB read as GiB (no amd-smi log seen): an upper bound"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product."""

    key: str  # catalog name used on the command line: "a100-sxm4-80gb"
    aliases: tuple[str, ...]  # other accepted names: "a100-80gb", "a100"
    nvml_names: tuple[str, ...]  # exact names NVML reports, e.g. "NVIDIA A100-SXM4-80GB"
    arch: str  # "sm80": selects the NVLink/PCIe figures in topology.links
    memory_mib: int  # MiB (2^20 bytes) NVML reports (nvidia-smi's memory.total): what CUDA can allocate from
    memory_bandwidth_gbps: float  # HBM/GDDR GB/s
    bf16_tflops: float  # dense BF16/FP16 tensor-core TFLOP/s (V100: FP16, it has no BF16)
    fp8_tflops: float | None  # dense FP8; None where the GPU has no FP8 tensor cores
    nvlink_links: int  # NVLinks per GPU (0: none); bridged PCIe cards: links across the bridge(s)
    pcie_gen: int
    source: str
    nvlink_gen: int = 0  # NVLink generation (0: none); NVML's nvmlDeviceGetNvLinkVersion says the same
    memory_type: str = ""  # "HBM3", "GDDR6X", ...
    memory_source: str = NVIDIA_SMI_LOGS  # where memory_mib comes from
    fp32_tflops: float | None = None  # FP32 on CUDA cores where there is no TF32 (before sm80); None: TF32
    vendor: str = "nvidia"  # "nvidia" or "amd": which runtime (CUDA/NCCL or ROCm/RCCL) a launch sets up
    nvlink_domain_gpus: int = 0  # GPUs in one multi-node NVLink domain (GB200 NVL72: 72); 0: the node is the domain

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20


_HOPPER = "NVIDIA H100/H200 datasheets, dense column (half the 'with sparsity' figures)"

GPUS: tuple[GpuSpec, ...] = (
    # --- Pascal (sm60): no tensor cores (FP16 at twice the FP32 rate), NVLink 1 -----------------------------
    GpuSpec("p100-sxm2-16gb", ("p100-sxm2", "p100"), ("Tesla P100-SXM2-16GB",), "sm60", 16280, 732, 21.2, None,
            4, 3, "NVIDIA Tesla P100 datasheet (2016): SXM2 21.2 TFLOPS FP16, 10.6 FP32, 732 GB/s, 4 NVLinks = "
            "160 GB/s bidirectional", nvlink_gen=1, memory_type="HBM2", fp32_tflops=10.6),
    GpuSpec("p100-pcie-16gb", ("p100-pcie",), ("Tesla P100-PCIE-16GB",), "sm60", 16280, 732, 18.7, None,
            0, 3, "NVIDIA Tesla P100 datasheet (2016): PCIe 16GB 18.7 TFLOPS FP16, 9.3 FP32, 732 GB/s",
            memory_type="HBM2", fp32_tflops=9.3),
    # --- Volta (sm70): NVLink 2, 25 GB/s per link per direction; no BF16, no FP8 -------------------------
    GpuSpec("v100-sxm2-16gb", ("v100-16gb", "v100-sxm2"), ("Tesla V100-SXM2-16GB",), "sm70", 16160, 900, 125, None,
            6, 3, "NVIDIA V100 datasheet (2020): SXM2 column, 125 TFLOPS FP16 tensor, 15.7 FP32; 6 NVLinks = 300 GB/s",
            nvlink_gen=2, memory_type="HBM2", fp32_tflops=15.7),
    GpuSpec("v100-sxm2-32gb", ("v100-32gb", "v100"), ("Tesla V100-SXM2-32GB",), "sm70", 32768, 900, 125, None,
            6, 3, "NVIDIA V100 datasheet (2020): SXM2 column", nvlink_gen=2, memory_type="HBM2", fp32_tflops=15.7),
    GpuSpec("v100-pcie-16gb", ("v100-pcie",), ("Tesla V100-PCIE-16GB",), "sm70", 16160, 900, 112, None,
            0, 3, "NVIDIA V100 datasheet (2020): PCIe column, 112 TFLOPS FP16 tensor, 14 FP32, no NVLink",
            memory_type="HBM2", fp32_tflops=14.0),
    GpuSpec("v100-pcie-32gb", (), ("Tesla V100-PCIE-32GB",), "sm70", 32768, 900, 112, None,
            0, 3, "NVIDIA V100 datasheet (2020): PCIe column", memory_type="HBM2", fp32_tflops=14.0,
            memory_source="assumed equal to the SXM2 32GB figure (32768 MiB); no PCIe log seen"),
    # --- Turing (sm75): FP16 tensor cores, no BF16, no FP8 ---------------------------------------------------
    GpuSpec("t4", ("tesla-t4",), ("Tesla T4",), "sm75", 15360, 320, 65, None, 0, 3,
            "NVIDIA T4 datasheet: 65 TFLOPS FP16 mixed precision (tensor), 8.1 FP32, 320 GB/s GDDR6, PCIe Gen3 x16",
            memory_type="GDDR6", fp32_tflops=8.1),
    GpuSpec("rtx-2080-ti", ("2080ti", "2080-ti"), ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"), "sm75",
            11264, 616, 53.8, None, 2, 3, "NVIDIA Turing (TU102) whitepaper, appendix: RTX 2080 Ti reference FP16 "
            "tensor with FP32 accumulate 53.8 TFLOPS (107.6 with FP16 accumulate), 13.4 FP32, 616 GB/s; NVLink "
            "bridge 2 links, 100 GB/s bidirectional", nvlink_gen=2, memory_type="GDDR6", fp32_tflops=13.4),
    # --- Ampere datacenter (sm80): NVLink 3, 25 GB/s per link per direction -------------------------------
    GpuSpec("a100-sxm4-40gb", ("a100-40gb",), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"), "sm80", 40960, 1555, 312,
            None, 12, 4, "NVIDIA A100 datasheet (2021): 40GB SXM column; 12 NVLinks = 600 GB/s",
            nvlink_gen=3, memory_type="HBM2"),
    GpuSpec("a100-sxm4-80gb", ("a100-80gb", "a100"), ("NVIDIA A100-SXM4-80GB",), "sm80", 81920, 2039, 312, None, 12, 4,
            "NVIDIA A100 datasheet (2021): 80GB SXM column", nvlink_gen=3, memory_type="HBM2e"),
    GpuSpec("a100-pcie-40gb", ("a100-pcie",), ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"), "sm80", 40960, 1555, 312,
            None, 12, 4, "NVIDIA A100 datasheet (2021): 40GB PCIe column; NVLink bridge for 2 GPUs, 600 GB/s",
            nvlink_gen=3, memory_type="HBM2"),
    GpuSpec("a100-pcie-80gb", ("a100-80gb-pcie",), ("NVIDIA A100 80GB PCIe",), "sm80", 81920, 1935, 312, None, 12, 4,
            "NVIDIA A100 datasheet (2021): 80GB PCIe column; NVLink bridge 600 GB/s", nvlink_gen=3,
            memory_type="HBM2e"),
    GpuSpec("a30", (), ("NVIDIA A30",), "sm80", 24576, 933, 165, None, 4, 4,
            "NVIDIA A30 datasheet: 165 TFLOPS BF16 (330 sparse); NVLink bridge 200 GB/s = 4 links", nvlink_gen=3,
            memory_type="HBM2"),
    # --- Ampere GA10x (sm86) -------------------------------------------------------------------------------
    GpuSpec("a10", (), ("NVIDIA A10",), "sm86", 23028, 600, 125, None, 0, 4,
            "NVIDIA A10 datasheet: 125 TFLOPS BF16 (250 sparse), PCIe Gen4, no NVLink", memory_type="GDDR6"),
    GpuSpec("a40", (), ("NVIDIA A40",), "sm86", 46068, 696, 149.7, None, 4, 4,
            "NVIDIA A40 datasheet: 149.7 TFLOPS BF16 (299.4 sparse); NVLink bridge 112.5 GB/s bidirectional",
            nvlink_gen=3, memory_type="GDDR6"),
    GpuSpec("rtx-3090", ("3090",), ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"), "sm86", 24576, 936, 71, None,
            4, 4, "NVIDIA Ampere GA102 whitepaper: RTX 3090 FP16 tensor with FP32 accumulate 71 TFLOPS dense "
            "(142 with FP16 accumulate); NVLink bridge 112.5 GB/s (4 x4 links)", nvlink_gen=3, memory_type="GDDR6X"),
    # --- Ada (sm89): no NVLink -----------------------------------------------------------------------------
    GpuSpec("l4", (), ("NVIDIA L4",), "sm89", 23034, 300, 121, 242.5, 0, 4,
            "NVIDIA L4 datasheet: 242 TFLOPS BF16 / 485 FP8 with sparsity, halved for dense", memory_type="GDDR6"),
    GpuSpec("l40s", (), ("NVIDIA L40S",), "sm89", 46068, 864, 362.05, 733, 0, 4,
            "NVIDIA L40S datasheet: BF16 362.05 (733 sparse), FP8 733 (1466 sparse), PCIe Gen4 x16",
            memory_type="GDDR6"),
    GpuSpec("rtx-4090", ("4090",), ("NVIDIA GeForce RTX 4090",), "sm89", 24564, 1008, 165.2, 330.3, 0, 4,
            "NVIDIA Ada Lovelace whitepaper: RTX 4090 FP16/BF16 tensor with FP32 accumulate 165.2 dense, FP8 with "
            "FP32 accumulate 330.3 dense (twice that with FP16 accumulate)", memory_type="GDDR6X"),
    GpuSpec("rtx-6000-ada", ("rtx6000-ada", "6000-ada"), ("NVIDIA RTX 6000 Ada Generation",), "sm89", 49140, 960,
            364.2, 728.5, 0, 4, "NVIDIA RTX 6000 Ada datasheet: 1457 TFLOPS FP8 with sparsity -> 728.5 dense FP8, "
            "364.2 dense BF16", memory_type="GDDR6"),
    # --- Hopper (sm90): NVLink 4, 25 GB/s per link per direction -------------------------------------------
    GpuSpec("h100-sxm", ("h100", "h100-80gb"), ("NVIDIA H100 80GB HBM3",), "sm90", 81559, 3350, 989, 1979, 18, 5,
            "NVIDIA H100 datasheet: SXM column, dense figures (half the sparsity figures)", nvlink_gen=4,
            memory_type="HBM3"),
    GpuSpec("h100-pcie", (), ("NVIDIA H100 PCIe",), "sm90", 81559, 2000, 756, 1513, 12, 5,
            f"{_HOPPER}: H100 PCIe column (1513 BF16 / 3026 FP8 sparse); NVLink bridge 600 GB/s",
            nvlink_gen=4, memory_type="HBM2e"),
    GpuSpec("h100-nvl", (), ("NVIDIA H100 NVL",), "sm90", 95830, 3900, 835, 1671, 12, 5,
            f"{_HOPPER}: H100 NVL column (1671 BF16 / 3341 FP8 sparse); NVLink bridge 600 GB/s",
            nvlink_gen=4, memory_type="HBM3"),
    GpuSpec("h20", (), ("NVIDIA H20",), "sm90", 97871, 4000, 148, 296, 18, 5,
            "NVIDIA H20 (China export part) as quoted publicly: 96 GB HBM3, 4.0 TB/s, 148 TFLOPS BF16, "
            "296 FP8, NVLink 900 GB/s", nvlink_gen=4, memory_type="HBM3"),
    GpuSpec("h200", ("h200-sxm",), ("NVIDIA H200",), "sm90", 143771, 4800, 989, 1979, 18, 5,
            f"{_HOPPER}: H200 SXM column (1979 BF16 / 3958 FP8 sparse); NVLink 900 GB/s", nvlink_gen=4,
            memory_type="HBM3e"),
    GpuSpec("gh200", ("gh200-480gb", "grace-hopper"), ("NVIDIA GH200 480GB",), "sm90", 97871, 4000, 989, 1979, 18, 5,
            "NVIDIA GH200 Grace Hopper datasheet: 96 GB HBM3 variant, 4 TB/s, same Hopper GPU figures as H100 SXM; "
            "NVLink-C2C 900 GB/s to Grace", nvlink_gen=4, memory_type="HBM3"),
    GpuSpec("gh200-144gb", (), ("NVIDIA GH200 144G HBM3e",), "sm90", 147456, 4900, 989, 1979, 18, 5,
            "NVIDIA GH200 Grace Hopper datasheet: 144 GB HBM3e variant, 4.9 TB/s", nvlink_gen=4, memory_type="HBM3e",
            memory_source="no nvidia-smi log seen: 144 GiB, an upper bound (the 96 GB part reports 97871 MiB, "
            "not 98304)"),
    # --- Blackwell datacenter (sm100): NVLink 5, 50 GB/s per link per direction ----------------------------
    GpuSpec("b200", ("b200-sxm",), ("NVIDIA B200",), "sm100", 183359, 7700, 2250, 4500, 18, 5,
            "NVIDIA HGX B200 spec table: 180 GB HBM3e, 7.7 TB/s, FP16/BF16 4.5 PF and FP8 9 PF with sparsity "
            "(halved: dense); NVLink 5 1.8 TB/s", nvlink_gen=5, memory_type="HBM3e"),
    # B300 is sm103; it shares sm100's NVLink 5 and PCIe figures in topology.links
    GpuSpec("b300", ("b300-sxm", "b300-sxm6"), ("NVIDIA B300 SXM6 AC",), "sm100", 275040, 8000, 2250, 4500, 18, 6,
            "NVIDIA HGX B300 spec table: 2.3 TB HBM3e per 8 GPUs (288 GB each), up to 8 TB/s, FP16/BF16 36 PF and "
            "FP8 72 PF per 8 GPUs with sparsity (halved, per GPU: 2250 / 4500 dense); NVLink 5 1.8 TB/s; "
            "NVML name as in fixtures/topo/01's source", nvlink_gen=5, memory_type="HBM3e"),
    # --- Blackwell GB20x (sm120): no NVLink ----------------------------------------------------------------
    GpuSpec("rtx-5090", ("5090",), ("NVIDIA GeForce RTX 5090",), "sm120", 32607, 1792, 209.5, 419, 0, 5,
            "NVIDIA RTX Blackwell whitepaper: RTX 5090 838 TFLOPS FP16 / 1676 FP8 sparse with FP16 accumulate; "
            "dense with FP32 accumulate is a quarter: 209.5 BF16, 419 FP8", memory_type="GDDR7"),
    # --- Grace Blackwell rack systems (sm100): NVL72 joins 72 GPUs over NVLink switch trays ---------------
    GpuSpec("gb200", ("gb200-nvl72",), ("NVIDIA GB200",), "sm100", 189471, 8000, 2500, 5000, 18, 5,
            "NVIDIA GB200 NVL72 spec table, divided by its 72 GPUs: 13.4 TB HBM3e (186 GB), 576 TB/s (8 TB/s), "
            "FP16/BF16 360 PF and FP8 720 PF with sparsity (2.5 / 5 PF dense per GPU), NVLink 130 TB/s (1.8 TB/s)",
            nvlink_gen=5, memory_type="HBM3e", nvlink_domain_gpus=72),
    GpuSpec("gb300", ("gb300-nvl72",), ("NVIDIA GB300",), "sm100", 284208, 8000, 2500, 5000, 18, 5,
            "NVIDIA GB300 NVL72 spec table, divided by its 72 GPUs: up to 20.1 TB HBM3e (279 GB), 576 TB/s (8 TB/s), "
            "FP8 720 PF with sparsity (5 PF dense), NVLink 130 TB/s (1.8 TB/s); BF16 as GB200 (not restated there)",
            nvlink_gen=5, memory_type="HBM3e", nvlink_domain_gpus=72),
    GpuSpec("rtx-pro-6000-blackwell", ("rtx-pro-6000", "rtx-6000-pro"),
            ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
             "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"), "sm120", 97887, 1792, 503.8, 1007.6, 0, 5,
            "NVIDIA RTX PRO 6000 Blackwell datasheet: 4000 AI TOPS (FP4 sparse); full-rate FP32 accumulate: "
            "503.8 BF16, 1007.6 FP8 dense (Workstation/Server; Max-Q is 300 W and lower)", memory_type="GDDR7"),
    # ======== AMD (readers branch, issue 15): begin ==========================================================
    # `nvlink_links` holds the GPU's XGMI (Infinity Fabric) links to other GPUs; `arch` the gfx target, which
    # selects the XGMI/PCIe figures in topology.links. nvml_names: the marketing names rocm-smi/amd-smi print.
    GpuSpec("mi250x", ("mi250x-gcd",), ("AMD Instinct MI250X",), "gfx90a", 65536, 1638.4, 191.5, None, 8, 4,
            "AMD Instinct MI250X data sheet, per GCD (ROCm shows each of its two GCDs as a GPU): 128 GB HBM2e and "
            "3.2768 TB/s per card, 383 TFLOPS FP16/BF16 matrix per card, no FP8; Infinity Fabric 50 GB/s per link "
            "per direction (ROCm MI250 microarchitecture page); PCIe Gen4", vendor="amd",
            memory_source=AMD_GIB, memory_type="HBM2e"),
    GpuSpec("mi300x", ("mi300",), ("AMD Instinct MI300X", "AMD Instinct MI300X OAM"), "gfx942", 196608, 5300, 1307.4,
            2614.9, 7, 5, "AMD Instinct MI300X data sheet: 192 GB HBM3, 5.3 TB/s, FP16/BF16 1307.4 and FP8 2614.9 "
            "TFLOPS dense; 7 Infinity Fabric links of 128 GB/s; PCIe Gen5", vendor="amd",
            memory_source=AMD_GIB, memory_type="HBM3"),
    GpuSpec("mi325x", (), ("AMD Instinct MI325X", "AMD Instinct MI325X OAM"), "gfx942", 262144, 6000, 1307.4, 2614.9,
            7, 5, "AMD Instinct MI325X data sheet: 256 GB HBM3E, 6 TB/s, compute as MI300X (1307.4 FP16 / 2614.9 FP8 "
            "dense); 7 Infinity Fabric links; PCIe Gen5", vendor="amd",
            memory_source=AMD_GIB, memory_type="HBM3e"),
    GpuSpec("mi355x", ("mi355",), ("AMD Instinct MI355X",), "gfx950", 294912, 8000, 2516.6, 5033.2, 7, 5,
            "AMD Instinct MI355X data sheet: 288 GB HBM3E, 8 TB/s, FP16/BF16 2.5 PF and FP8 5.0 PF dense; 7 Infinity "
            "Fabric links, 1075 GB/s aggregate; PCIe Gen5", vendor="amd",
            memory_source=AMD_GIB, memory_type="HBM3e"),
    GpuSpec("mi300a", ("mi300a-apu",), ("AMD Instinct MI300A",), "gfx942", 131072, 5300, 980.6, 1961.2, 4, 5,
            "AMD Instinct MI300A data sheet: APU, 128 GB HBM3 shared with its 24 Zen 4 cores, 5.3 TB/s, FP16/BF16 "
            "980.6 and FP8 1961.2 TFLOPS dense; 4 x16 Infinity Fabric links (a 4-APU node is a full mesh)",
            vendor="amd", memory_source=AMD_GIB, memory_type="HBM3"),
    GpuSpec("rx-7900-xtx", ("7900xtx", "7900-xtx"), ("Radeon RX 7900 XTX", "AMD Radeon RX 7900 XTX"), "gfx1100", 24576,
            960, 122.8, None, 0, 4, "AMD Radeon RX 7900 XTX specifications: 24 GB GDDR6, 960 GB/s, 122.8 TFLOPS peak "
            "FP16 (WMMA); no FP8, no Infinity Fabric link between cards; PCIe Gen4 x16", vendor="amd",
            memory_source=AMD_GIB,
            memory_type="GDDR6"),
    GpuSpec("radeon-pro-w7900", ("w7900",), ("AMD Radeon PRO W7900",), "gfx1100", 49152, 864, 122.6, None, 0, 4,
            "AMD Radeon PRO W7900 specifications: 48 GB GDDR6, 864 GB/s, 122.6 TFLOPS peak FP16; no FP8, no Infinity "
            "Fabric link; PCIe Gen4 x16", vendor="amd",
            memory_source=AMD_GIB, memory_type="GDDR6"),
    # ======== AMD (readers branch, issue 15): end ============================================================
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _names(spec: GpuSpec) -> set[str]:
    return {_norm(n) for n in (spec.key, *spec.aliases, *spec.nvml_names)}


def lookup_gpu(name: str) -> GpuSpec | None:
    """A catalog entry by key, alias or NVML name (case and punctuation ignored), or None."""
    wanted = _norm(name)
    return next((spec for spec in GPUS if wanted in _names(spec)), None)


def find_gpu(name: str) -> GpuSpec:
    """A catalog entry by key, alias or NVML name (case and punctuation ignored); lists close names if none."""
    spec = lookup_gpu(name)
    if spec is not None:
        return spec
    wanted = _norm(name)
    names = [spec.key for spec in GPUS] + [a for spec in GPUS for a in spec.aliases]
    close = difflib.get_close_matches(wanted, names, n=4, cutoff=0.4)
    hint = f"; close: {', '.join(close)}" if close else f"; known: {', '.join(s.key for s in GPUS)}"
    raise TopoplanError(f"unknown GPU {name!r}{hint}")


# --- inferring a GPU family from a `topo -m` link pattern ---------------------------------------------------


@dataclass(frozen=True)
class LinkPattern:
    """A GPU-to-GPU NVLink pattern that points at one GPU family.

    `shape`: "full-mesh" (3+ GPUs, NVLink between every pair), "pairs" (every NVLink island is two GPUs),
    "mesh" (any other NVLink layout). `gpu_counts` empty: any number of GPUs. `kind`: the fabric (XGMI on AMD).
    """

    nvlink_counts: frozenset[int]  # the NV# values seen between GPU pairs
    shape: str
    gpu_counts: frozenset[int]
    arch: str
    family: str  # what it most likely is, and what else shows the same pattern
    seen_on: str  # a machine that shows it (fixtures/topo where we have one)
    kind: LinkKind = LinkKind.NVLINK


def _pattern(counts, shape, gpus, arch, family, seen_on, kind=LinkKind.NVLINK) -> LinkPattern:
    return LinkPattern(frozenset(counts), shape, frozenset(gpus), arch, family, seen_on, kind)


# First match wins; where two families share a pattern the older/slower arch is listed, so estimates err low.
LINK_PATTERNS: tuple[LinkPattern, ...] = (
    _pattern({18}, "full-mesh", (), "sm90", "H100/H200 SXM class behind NVSwitch (B200/B300 boards also show NV18)",
             "fixtures/topo/01 (B300, NV18 on every pair)"),
    _pattern({18}, "pairs", (2,), "sm90", "H100/H200 SXM class (two GPUs of an NVSwitch board, e.g. a VM's share)",
             "as the NV18 row above, cut to two GPUs"),
    _pattern({12}, "full-mesh", (), "sm80", "A100 SXM4 class behind NVSwitch (DGX/HGX A100, or a share of one)",
             "fixtures/topo/00, 04, 26"),
    _pattern({4}, "full-mesh", (), "sm80", "A100 SXM4 class, HGX A100 4-GPU (direct NV4 between every pair)",
             "fixtures/topo/30"),
    _pattern({6}, "full-mesh", (), "sm70", "V100 SXM3 class behind NVSwitch (DGX-2/HGX-2)",
             "DGX-2 system architecture whitepaper (6 NVLinks per V100 to 6 NVSwitches)"),
    _pattern({12}, "pairs", (), "sm80", "A100 PCIe class with NVLink bridges (H100 NVL pairs look the same)",
             "fixtures/topo/18 (A100 80GB PCIe), 17 (H100 NVL)"),
    _pattern({4}, "pairs", (), "sm86", "RTX 3090 / A40 / RTX A6000 class with an NVLink bridge",
             "fixtures/topo/14 (2x RTX 3090, NV4)"),
    _pattern({1, 2}, "mesh", (8,), "sm70", "V100 SXM2 class, DGX-1 hybrid cube-mesh (P100 DGX-1 is NV1-only)",
             "fixtures/topo/07 (DGX-1 V100)"),
    _pattern({2}, "pairs", (), "sm60", "P100 SXM2 class in NVLink pairs (RTX 2080 Ti bridges also show NV2)",
             "fixtures/topo/20 (POWER8 Minsky, P100)"),
    # rocm-smi/amd-smi give no XGMI link counts: every XGMI pair reads XGMI1.
    _pattern({1}, "full-mesh", (8,), "gfx942", "MI300X/MI325X class (8 OAM GPUs in one XGMI full mesh; MI355X "
             "boards look the same)", "fixtures/amd rocm-smi-mi300, amd-smi-8gpu", LinkKind.XGMI),
    _pattern({1}, "full-mesh", (2, 4), "gfx90a", "MI210/MI250 class (an XGMI bridge or package joining 2-4 GPUs)",
             "fixtures/amd rocm-smi-mi210 (ARCHER2)", LinkKind.XGMI),
)


def _nvlink_shape(topology: Topology) -> str:
    n = len(topology.gpus)
    nv = topology.nvlink_graph()
    islands = topology.nvlink_islands()
    if n >= 2 and nv.number_of_edges() == n * (n - 1) // 2 and (n >= 3 or _fabric_kind(topology) is LinkKind.XGMI):
        return "full-mesh"
    if islands and all(len(island) == 2 for island in islands):
        return "pairs"
    return "mesh"


def _fabric_kind(topology: Topology) -> LinkKind | None:
    """The one fabric the GPUs are joined by (NVLink or XGMI); None when none, or both."""
    kinds = {kind for _, _, kind in topology.nvlink_graph().edges(data="kind")}
    return kinds.pop() if len(kinds) == 1 else None


def infer_gpu_family(topology: Topology) -> tuple[str, str] | None:
    """(arch, reason) guessed from the NVLink pattern between GPUs, or None when it says nothing.

    `topo -m` text carries no GPU names; the link pattern narrows the family, which is enough to pick
    per-link bandwidths. The reason says it was inferred and from what, for the user's warning.
    """
    counts = frozenset(nvlinks for _, _, nvlinks in topology.nvlink_graph().edges(data="nvlinks"))
    kind = _fabric_kind(topology)
    if not counts or kind is None:
        return None
    shape = _nvlink_shape(topology)
    n = len(topology.gpus)
    for p in LINK_PATTERNS:
        if (p.kind, p.nvlink_counts, p.shape) == (kind, counts, shape) and (not p.gpu_counts or n in p.gpu_counts):
            prefix = "NV" if kind is LinkKind.NVLINK else "XGMI"
            codes = "/".join(f"{prefix}{c}" for c in sorted(counts))
            return p.arch, (f"GPU generation inferred from the link pattern ({codes}, {shape}, {n} GPUs): "
                            f"{p.family}; pass --gpu NAME to set it")
    return None


def catalog_gpu(topology: Topology) -> Topology:
    """The topology with the GPU its source named (NVML's spelling) replaced by the catalog's key, and the
    catalog's generation where the source gave none; a name the catalog lacks is dropped, with a note."""
    reported = topology.gpu_name
    if reported is None or any(spec.key == reported for spec in GPUS):
        return topology
    spec = lookup_gpu(reported)
    if spec is None:
        note = f"{reported!r} is not in topoplan's GPU catalog (docs/hardware.md)"
        return Topology(topology.gpus, topology.nics, topology.links(), arch=topology.arch, gpu_name=None,
                        source=topology.source, notes=(*topology.notes, note), vendor=topology.vendor,
                        cpu=topology.cpu)
    return topology.with_arch(topology.arch or spec.arch, spec.key, spec.vendor)


def apply_gpu(topology: Topology, name: str | None = None) -> Topology:
    """The topology priced for GPU `name` (`--gpu`, any catalog name or alias); without one, for the GPU the
    source named (catalog_gpu), or when the source did not say the generation (`topo -m` text), for the
    family its NVLink pattern suggests, with a note saying it was inferred."""
    topology = catalog_gpu(topology)
    notes: tuple[str, ...] = ()
    if name is not None:
        spec = find_gpu(name)
        if topology.gpu_name not in (None, spec.key):
            notes = (f"--gpu {name} ({spec.key}) overrides the {topology.gpu_name} the source named",)
        arch, gpu_name, vendor = spec.arch, spec.key, spec.vendor
    elif topology.arch is None and (inferred := infer_gpu_family(topology)) is not None:
        (arch, reason), gpu_name = inferred, None
        vendor = "amd" if arch.startswith("gfx") else None
        notes = (reason,)
    else:
        return topology
    return topology.with_arch(arch, gpu_name, vendor).with_notes(*notes)
