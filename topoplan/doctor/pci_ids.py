"""PCI vendor and class codes, as sysfs writes them (`/sys/bus/pci/devices/ADDR/vendor`, `class`): which devices
the reader records as GPUs and NICs, and which vendor's notes a check applies."""

from __future__ import annotations

NVIDIA = "0x10de"
AMD = "0x1002"
GPU_VENDORS = (NVIDIA, AMD)
GPU_CLASSES = ("0x03", "0x12")  # display controllers (NVIDIA cards, MI-series as 0x0380) and accelerators (0x1200)
NIC_CLASS = "0x02"  # network controllers: Ethernet 0x0200, InfiniBand 0x0207
