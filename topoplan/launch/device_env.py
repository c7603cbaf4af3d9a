"""Which GPUs a rank's process sees, in the runtime's own words (topoplan.vendors: CUDA on NVIDIA, HIP on AMD).

Both list the node's planned GPUs in local-rank order, so local rank i's `cuda:i` (PyTorch on ROCm keeps the
`cuda` device name) is the GPU the planner chose.
"""

from __future__ import annotations

from topoplan.launch.nccl_env import EnvVar
from topoplan.vendors import vendor_of


def device_env(vendor: str | None, visible: str, where: str) -> list[EnvVar]:
    """The variables that make `visible` (comma-separated indices, local-rank order) a process's devices;
    `where` says whose GPUs they are, for the reason."""
    v = vendor_of(vendor)
    order = [EnvVar(*v.device_order)] if v.device_order else []
    note = f" ({v.visible_note})" if v.visible_note else ""
    return [*order, EnvVar(v.visible_devices, visible, where + note)]
