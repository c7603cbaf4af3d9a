"""The device the cost model prices: memory, memory bandwidth, peak FLOP/s per dtype, the dtypes it runs.

Kept apart from the GPU catalog so any device with these figures (a CPU socket, a future accelerator) can be
planned for; `from_gpu` adapts a catalog GpuSpec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from topoplan.architectures import ARCHITECTURES, DEFAULT_NIC_GBPS
from topoplan.dtypes import DType
from topoplan.errors import TopoplanError
from topoplan.hardware import GpuSpec


@dataclass(frozen=True)
class DeviceSpec:
    """What one accelerator offers the roofline: capacity, bytes/s, FLOP/s, and which dtypes it runs."""

    name: str
    memory_bytes: float
    memory_bandwidth_gbps: float  # GB/s
    tflops: dict[str, float]  # dense peak TFLOP/s by dtype it computes in (natively)
    nic_gbps: float  # per-NIC network bandwidth, GB/s
    weight_only: tuple[str, ...] = ()  # weight dtypes it stores but dequantises to the activation dtype
    kv_dtypes: tuple[str, ...] | None = None  # KV-cache dtypes it takes; None: any
    dtype_note: str = ""  # why (the support table's source), for the error and the reasons
    nvlink_domain_gpus: int = 0  # GPUs one multi-node NVLink domain holds (GB200 NVL72: 72); 0: none known
    # (rows, TFLOP/s) of a product of that many rows against a weight larger than the cache (a CPU's probes,
    # topoplan.plan.cpu_entry): the rate of products with other rows than the phase's (an MoE layer's experts each
    # get a fraction of the tokens); empty: `tflops` at any rows
    tflops_by_rows: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, nic_gbps: float | None = None) -> DeviceSpec:
        # FP32 is priced at the TF32 tensor-core rate (half the BF16 figure) from Ampere on, else at the
        # CUDA-core FP32 figure; fp16 at the BF16/FP16 tensor figure. Only what the GPU computes in is listed.
        row = ARCHITECTURES[gpu.arch]
        support = row.dtypes
        if support is None:  # every catalog GPU's row has its dtypes (tests/test_hardware.py)
            raise TopoplanError(f"{gpu.key} ({gpu.arch}): no dtype support known for this generation")
        rate = {"bf16": gpu.bf16_tflops, "fp16": gpu.bf16_tflops, "fp8": gpu.fp8_tflops,
                "fp32": gpu.fp32_tflops or gpu.bf16_tflops / 2}
        tflops = {d: rate[d] for d in support.native if rate.get(d)}
        nic = nic_gbps if nic_gbps is not None else row.nic_gbps or DEFAULT_NIC_GBPS
        return cls(gpu.key, gpu.memory_bytes, gpu.memory_bandwidth_gbps, tflops, nic, support.weight_only,
                   support.kv, f"{gpu.key} ({gpu.arch}): {support.source}", gpu.nvlink_domain_gpus)

    def tflops_at(self, dtype: str, rows: float | None) -> float:
        """TFLOP/s of products of `rows` rows: `tflops_by_rows` interpolated when known, else `tflops[dtype]`."""
        if rows is None or not self.tflops_by_rows:
            return self.tflops[dtype]
        return log_interpolate(self.tflops_by_rows, rows)

    def _supported(self) -> str:
        weight_only = f"; weight-only: {', '.join(self.weight_only)}" if self.weight_only else ""
        return f"it computes in {', '.join(self.tflops)}{weight_only}"

    def activation_dtype(self, weights: DType) -> str:
        """The dtype activations travel and GEMMs run in: bf16 for quantised weights, fp16 on GPUs
        without bf16 (vLLM runs AWQ/GPTQ in fp16 there)."""
        act = weights.activations.short
        return "fp16" if act == "bf16" and act not in self.tflops and "fp16" in self.tflops else act

    def compute_dtype(self, weights: DType) -> str:
        """The tflops key a GEMM on `weights` runs at, or a one-line error naming what this device supports."""
        if weights.short in self.tflops:
            return weights.short
        if weights.short in self.weight_only and self.activation_dtype(weights) in self.tflops:
            return self.activation_dtype(weights)
        raise TopoplanError(f"--dtype {weights.short}: {self.name} has no {weights.short}; {self._supported()} "
                            f"({self.dtype_note})")

    def check_kv(self, kv: DType) -> None:
        """Refuse a KV-cache dtype the device cannot hold, naming those it can."""
        if self.kv_dtypes is not None and kv.short not in self.kv_dtypes:
            raise TopoplanError(f"--kv-dtype {kv.short}: {self.name} keeps the KV cache in "
                                f"{', '.join(self.kv_dtypes)} ({self.dtype_note})")


def log_interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    """The value at `x` from sorted (x, value) points (a rate by rows): linear in log2(x) between them, the end
    values beyond them."""
    return _interpolate(points, x, math.log2)


def linear_interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    """The same, linear in x (an overhead by bytes)."""
    return _interpolate(points, x, float)


def _interpolate(points: tuple[tuple[int, float], ...], x: float, scale: Callable[[float], float]) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, v0), (x1, v1) in zip(points, points[1:]):
        if x <= x1:
            f = (scale(x) - scale(x0)) / (scale(x1) - scale(x0))
            return v0 + f * (v1 - v0)
    return points[-1][1]
