"""The GPU hardware catalog (data, one entry per product, each with its source) and lookups.

docs/hardware.md lists every figure with its source. Figures are dense (no sparsity) peak numbers.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from topoplan.errors import TopoplanError


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product."""

    key: str  # catalog name used on the command line: "a100-sxm4-80gb"
    aliases: tuple[str, ...]  # other accepted names: "a100-80gb", "a100"
    nvml_names: tuple[str, ...]  # exact names NVML reports, e.g. "NVIDIA A100-SXM4-80GB"
    arch: str  # "sm80": selects the NVLink/PCIe figures in topology.links
    memory_gb: float  # GB (10^9 bytes) as the vendor states it
    memory_bandwidth_gbps: float  # HBM/GDDR GB/s
    bf16_tflops: float  # dense BF16/FP16 tensor-core TFLOP/s
    fp8_tflops: float | None  # dense FP8; None where the GPU has no FP8 tensor cores
    nvlink_links: int  # NVLinks per GPU (0: none)
    pcie_gen: int
    source: str


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("a100-sxm4-80gb", ("a100-80gb", "a100"), ("NVIDIA A100-SXM4-80GB",), "sm80", 80, 2039, 312, None, 12, 4,
            "NVIDIA A100 datasheet (2021): 80GB SXM column"),
    GpuSpec("h100-sxm", ("h100", "h100-80gb"), ("NVIDIA H100 80GB HBM3",), "sm90", 80, 3350, 989, 1979, 18, 5,
            "NVIDIA H100 datasheet: SXM column, dense figures (half the sparsity figures)"),
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def find_gpu(name: str) -> GpuSpec:
    """A catalog entry by key, alias or NVML name (case and punctuation ignored); lists close names if none."""
    wanted = _norm(name)
    for spec in GPUS:
        if wanted in {_norm(n) for n in (spec.key, *spec.aliases, *spec.nvml_names)}:
            return spec
    names = [spec.key for spec in GPUS] + [a for spec in GPUS for a in spec.aliases]
    close = difflib.get_close_matches(wanted, names, n=4, cutoff=0.4)
    hint = f"; close: {', '.join(close)}" if close else f"; known: {', '.join(s.key for s in GPUS)}"
    raise TopoplanError(f"unknown GPU {name!r}{hint}")
