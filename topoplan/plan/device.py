"""The device the cost model prices: memory, memory bandwidth, peak FLOP/s per dtype.

Kept apart from the GPU catalog so any device with these three figures (a CPU socket, a future
accelerator) can be planned for; `from_gpu` adapts a catalog GpuSpec.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.hardware import GpuSpec

# Per-NIC bandwidth (GB/s, one direction) assumed when --nic-gbps is not given, by GPU generation: the
# InfiniBand rate of the reference systems, one NIC per GPU. Source: DGX-1 datasheet (4x EDR 100 Gb/s
# for 8 GPUs: 6.25 GB/s per GPU), DGX A100 (8x HDR 200 Gb/s), DGX H100 / B200 (8x NDR 400 Gb/s).
NIC_GBPS_BY_ARCH = {"sm60": 6.25, "sm70": 6.25, "sm80": 25.0, "sm90": 50.0, "sm100": 50.0}
DEFAULT_NIC_GBPS = 25.0  # HDR 200 Gb/s, the most common data-centre rate when the generation is unknown


@dataclass(frozen=True)
class DeviceSpec:
    """What one accelerator offers the roofline: capacity, bytes/s, FLOP/s."""

    name: str
    memory_bytes: float
    memory_bandwidth_gbps: float  # GB/s
    tflops: dict[str, float]  # dense peak TFLOP/s by dtype
    nic_gbps: float  # per-NIC network bandwidth, GB/s
    nvlink_domain_gpus: int = 0  # GPUs one multi-node NVLink domain holds (GB200 NVL72: 72); 0: none known

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, nic_gbps: float | None = None) -> DeviceSpec:
        # FP8 runs on FP8 tensor cores where the GPU has them, else at the BF16 rate (weight-only FP8);
        # FP32 is priced at the TF32 tensor-core rate, half the BF16 figure on every generation listed.
        tflops = {"bf16": gpu.bf16_tflops, "fp16": gpu.bf16_tflops, "fp8": gpu.fp8_tflops or gpu.bf16_tflops,
                  "fp32": gpu.bf16_tflops / 2}
        nic = nic_gbps if nic_gbps is not None else NIC_GBPS_BY_ARCH.get(gpu.arch, DEFAULT_NIC_GBPS)
        return cls(gpu.key, gpu.memory_gb * 1e9, gpu.memory_bandwidth_gbps, tflops, nic, gpu.nvlink_domain_gpus)
