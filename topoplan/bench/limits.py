"""Bounds on what `bench`, `calibrate` and `validate` may ask of this machine, checked before anything starts,
so a typo like `--ranks 100000` is one line of error rather than a machine brought to its knees."""

from __future__ import annotations

import os

from topoplan.cpuset import cpu_cores

RANKS_PER_CPU = 8  # each local rank is a whole Python process with torch loaded (~0.3 GB, seconds to start):
# beyond a few per CPU they only time-slice, and thousands would exhaust memory before measuring anything


def max_local_ranks() -> int:
    """The most ranks started on this machine (see RANKS_PER_CPU)."""
    return RANKS_PER_CPU * len(cpu_cores())


def physical_memory_bytes() -> int:
    """This machine's RAM, from sysconf (Linux, macOS)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
