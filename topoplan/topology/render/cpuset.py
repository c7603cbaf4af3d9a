"""CPU lists written compactly, the way `taskset` and `topo -m` write them: `0-15,64-79`."""

from __future__ import annotations

from collections.abc import Iterable


def format_cpu_list(cpus: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 8]` -> `"0-3,8"`, the form numactl and taskset accept; no CPUs -> `""`."""
    ranges: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def compact_cpus(cpus: Iterable[int] | None) -> str:
    """`format_cpu_list` for a table cell: None or no CPUs -> `"-"` (no affinity known)."""
    return format_cpu_list(cpus or ()) or "-"
