"""Bounds on what `bench`, `calibrate` and `validate` may ask of this machine, checked before anything starts,
so a typo like `--ranks 100000` is one line of error rather than a machine brought to its knees."""

from __future__ import annotations

import os


def physical_memory_bytes() -> int:
    """This machine's RAM, from sysconf (Linux, macOS)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
