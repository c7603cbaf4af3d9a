"""Which GPUs a rank's process sees, in the runtime's own words: CUDA on NVIDIA, HIP/ROCr on AMD.

Both list the node's planned GPUs in local-rank order, so local rank i's `cuda:i` (PyTorch on ROCm keeps the
`cuda` device name) is the GPU the planner chose.
- NVIDIA: CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, which makes it count like
  nvidia-smi/NVML, the numbering the topology uses.
- AMD: HIP_VISIBLE_DEVICES, in the numbering rocm-smi and amd-smi print. ROCR_VISIBLE_DEVICES, which a scheduler
  may set, filters and renumbers GPUs before HIP applies its list, so it must be unset or list every GPU; setting
  both to the same list would select the wrong GPUs.
"""

from __future__ import annotations

from topoplan.launch.nccl_env import EnvVar

# The variable naming the visible GPUs, by vendor; a topology that does not say is treated as NVIDIA's.
VISIBLE_DEVICES = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES"}


def device_env(vendor: str | None, visible: str, node: int, local_rank: int, gpu_id: str) -> list[EnvVar]:
    """The variables that make the node's planned GPUs (`visible`, comma-separated indices) the rank's devices."""
    where = f"node {node}'s planned GPUs in local-rank order: local rank {local_rank} uses cuda:{local_rank} = {gpu_id}"
    if vendor == "amd":
        return [EnvVar("HIP_VISIBLE_DEVICES", visible, f"{where} (rocm-smi numbering; ROCR_VISIBLE_DEVICES must be "
                       "unset or list every GPU, it renumbers them first)")]
    return [EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "number GPUs like nvidia-smi/NVML (PCI bus order); "
                   "CUDA's default order is fastest-first"),
            EnvVar("CUDA_VISIBLE_DEVICES", visible, where)]
