"""Byte sizes as nccl-tests writes them (`4K`, `256M`: powers of 1024) and the sweep between two of them.

Imports no torch: the CLI parses `--sizes` before starting any rank.
"""

from __future__ import annotations

import re

from topoplan.errors import TopoplanError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`4K` -> 4096, `256M` -> 268435456, `100` -> 100."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not match or int(match.group(1)) < 1:
        raise TopoplanError(f"size {text!r}: expected a positive byte count like 4096, 4K, 256M or 1G")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """`4K:256M` -> 4K, 8K, ... 256M (times `factor` each step, like nccl-tests' -b/-e/-f); `4K,1M` -> a list."""
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo > hi:
            raise TopoplanError(f"--sizes {text!r}: the first size must not exceed the last")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
    if not sizes:
        raise TopoplanError(f"--sizes {text!r}: expected LO:HI (e.g. 4K:256M) or a list (4K,1M)")
    return sizes


def human_size(nbytes: int) -> str:
    """4096 -> `4K` (the inverse of parse_size for exact multiples)."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)
