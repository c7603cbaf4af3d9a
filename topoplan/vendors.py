"""What differs between GPU vendors for a launch, written once: the runtime, its collective library, the variable
that selects GPUs (and the one that fixes their numbering), and the Kubernetes resource that requests them.

Read by the launcher (per-rank lines and serving engines' node lines alike), the runner (which variable it checks)
and the Kubernetes writer, so a vendor fact is never spelled in two places. A topology that does not say which
vendor made its GPUs is NVIDIA's (every `nvidia-smi` source).
- NVIDIA: CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, which makes it count like
  nvidia-smi/NVML, the numbering the topology uses.
- AMD: HIP_VISIBLE_DEVICES, in the numbering rocm-smi and amd-smi print. ROCR_VISIBLE_DEVICES, which a scheduler
  may set, filters and renumbers GPUs before HIP applies its list, so it must be unset or list every GPU; setting
  both to the same list would select the wrong GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Vendor:
    name: str  # as Topology.vendor and the GPU catalog say it: "nvidia", "amd"
    runtime: str  # the GPU runtime under torch's `cuda` device
    collectives: str  # the library under torch's `nccl` backend (same NCCL_* variables on both)
    visible_devices: str  # the variable listing the GPUs a process sees, in local-rank order
    visible_note: str  # what to know about that variable, beyond the device order ("": nothing)
    device_order: tuple[str, str, str] | None  # (variable, value, reason) making the runtime count like the topology
    k8s_gpu_resource: str  # the extended resource its device plugin advertises


NVIDIA = Vendor("nvidia", "CUDA", "NCCL", "CUDA_VISIBLE_DEVICES", "",
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "number GPUs like nvidia-smi/NVML (PCI bus order); CUDA's default "
                 "order is fastest-first"), "nvidia.com/gpu")
AMD = Vendor("amd", "ROCm", "RCCL", "HIP_VISIBLE_DEVICES", "rocm-smi numbering; ROCR_VISIBLE_DEVICES must be unset or "
             "list every GPU, it renumbers them first", None, "amd.com/gpu")
VENDORS = {v.name: v for v in (NVIDIA, AMD)}
TORCH_RUNTIMES = {"cuda": NVIDIA, "rocm": AMD}  # torch.version.hip set: a ROCm build


def vendor_of(name: str | None) -> Vendor:
    """The vendor a topology names; NVIDIA when it names none (every nvidia-smi source)."""
    return VENDORS.get(name or "nvidia", NVIDIA)
