"""Which CUDA index each GPU gets, and which GPUs CUDA_VISIBLE_DEVICES leaves visible.

NVML and nvidia-smi number GPUs in PCI bus order. CUDA numbers them by CUDA_DEVICE_ORDER: PCI_BUS_ID is
PCI bus order; the default, FASTEST_FIRST, puts the fastest GPU first and leaves the rest "unspecified"
(CUDA C Programming Guide, environment variables). On a box of identical GPUs that is PCI bus order in
practice; on a mixed box it cannot be predicted, and we say so rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuIdentity:
    """What CUDA's numbering depends on, for one GPU as NVML listed it (None where the GPU did not say)."""

    bus_id: str | None
    uuid: str | None
    name: str | None


def _bus_key(bus_id: str) -> tuple[int, ...]:
    domain, bus, rest = bus_id.lower().split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def pci_bus_order(gpus: Sequence[GpuIdentity]) -> list[int | None]:
    """The CUDA index of each GPU under CUDA_DEVICE_ORDER=PCI_BUS_ID; None for a GPU without a bus id."""
    known = sorted((i for i, g in enumerate(gpus) if g.bus_id), key=lambda i: _bus_key(gpus[i].bus_id or ""))
    index = {gpu: cuda for cuda, gpu in enumerate(known)}
    return [index.get(i) for i in range(len(gpus))]


def default_order(gpus: Sequence[GpuIdentity]) -> list[int | None] | None:
    """The CUDA index of each GPU under the default order, or None when it cannot be told (mixed GPUs or a
    GPU that did not say what it is)."""
    names = {g.name for g in gpus}
    if len(names) != 1 or None in names:
        return None
    return pci_bus_order(gpus)


def visible_gpus(cuda_visible_devices: str | None, order: Sequence[int | None] | None,
                 gpus: Sequence[GpuIdentity]) -> tuple[list[bool | None], list[str]]:
    """Per GPU, whether CUDA_VISIBLE_DEVICES lists it (all None when it is unset), and notes.

    Entries are CUDA indexes in `order` (the numbering CUDA_DEVICE_ORDER selects) or GPU UUIDs, a unique
    prefix being enough; like CUDA, the first entry that names no GPU ends the list.
    """
    if cuda_visible_devices is None:
        return [None] * len(gpus), []
    visible = [False] * len(gpus)
    notes: list[str] = []
    by_cuda = {cuda: i for i, cuda in enumerate(order or []) if cuda is not None}
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.lstrip("-").isdigit():
            if order is None:
                notes.append(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} counts GPUs in CUDA's default order, "
                             "which is unpredictable on this mix of GPUs; set CUDA_DEVICE_ORDER=PCI_BUS_ID")
                return [None] * len(gpus), notes
            gpu = by_cuda.get(int(entry))
        else:
            matches = [i for i, g in enumerate(gpus) if g.uuid and entry and
                       (g.uuid.startswith(entry) or g.uuid.startswith(f"GPU-{entry}"))]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None:
            if entry:
                notes.append(f"CUDA_VISIBLE_DEVICES entry {entry!r} names no GPU here; CUDA ignores it and "
                             "every entry after it")
            break
        visible[gpu] = True
    return visible, notes
