"""CPU lists written compactly, the way `taskset` and `topo -m` write them: `0-15,64-79`."""

from __future__ import annotations

from collections.abc import Iterable


def compact_cpus(cpus: Iterable[int] | None) -> str:
    """`[0, 1, 2, 3, 8]` -> `"0-3,8"`; None -> `"-"` (no affinity known)."""
    if cpus is None:
        return "-"
    ordered = sorted(set(cpus))
    if not ordered:
        return "-"
    ranges: list[tuple[int, int]] = []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
