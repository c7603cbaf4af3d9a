"""What a bench measures, as nccl-tests defines it (NVIDIA/nccl-tests doc/PERFORMANCE.md), and its sizes.

  * S, the size of an operation, is the largest buffer it touches on one rank: the whole buffer for
    all_reduce, broadcast, reduce and sendrecv; the gathered (n x chunk) buffer for all_gather, gather,
    reduce_scatter, scatter and all_to_all.
  * t is the average time of one operation; algbw = S / t.
  * busbw = algbw x factor(n), the factor that makes the figure comparable to the hardware's link speed
    whatever the rank count: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather and
    scatter (n-1)/n; broadcast, reduce and sendrecv 1. At one rank the (n-1) factors are 0: nothing
    crosses a link, and nccl-tests prints busbw 0 there.
  * Each op runs out of place (separate input and output buffers) and in place (the output is, or holds,
    the input), as nccl-tests' two column groups; torch.distributed has only the in-place form of
    all_reduce, broadcast and reduce, and only the out-of-place form of gather, scatter, all_to_all and
    send/recv (PLACES).
  * The reducing ops take a reduction (`-o`: sum, prod, min, max, avg); the rooted ones a root (`-r`, a
    rank of the group); nccl-tests prints `none` and -1 for the others.
Sizes are written as nccl-tests writes them (`4K`, `256M`: powers of 1024). Imports no torch, so the CLI
checks `--ops` and `--sizes` before starting any rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from topoplan.errors import TopoplanError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all",
       "sendrecv")
CHUNKED = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")  # S is n chunks of S/n
REDUCING = ("all_reduce", "reduce", "reduce_scatter")  # take a reduction op (nccl-tests' -o)
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # take a root (nccl-tests' -r)
REDOPS = ("sum", "prod", "min", "max", "avg")  # nccl-tests' -o names (avg: NCCL >= 2.10 only; gloo lacks it)

# busbw / algbw as a function of n (nccl-tests doc/PERFORMANCE.md "Summary"; gather and scatter as its
# src/gather.cu and src/scatter.cu, sendrecv as src/sendrecv.cu)
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}

# (out of place, in place) forms torch.distributed offers: True where the op has that form
PLACES = {
    "all_reduce": (False, True),
    "broadcast": (False, True),
    "reduce": (False, True),
    "all_gather": (True, True),  # in place: the input is this rank's chunk of the output
    "reduce_scatter": (True, True),  # in place: the output is this rank's chunk of the input
    "gather": (True, False),
    "scatter": (True, False),
    "all_to_all": (True, False),
    "sendrecv": (True, False),
}

# `topoplan bench`'s defaults, written once: topoplan.bench.request.BenchRequest and the CLI read them
DEFAULT_OPS = ",".join(OPS)
DEFAULT_SIZES = "4K:64M"
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_DTYPE = "float32"


def parse_ops(text: str) -> list[str]:
    """`all_reduce,sendrecv` -> the list; unknown names are a TopoplanError naming the known ones."""
    ops = [op.strip() for op in text.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise TopoplanError(f"--ops: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(OPS)}")
    return ops


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for `op` over `n` ranks (0 at one rank for the ops whose factor has n-1)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    return BUS_FACTORS[op](n)


def parse_redop(text: str) -> str:
    if text not in REDOPS:
        raise TopoplanError(f"--redop {text!r}: expected one of {', '.join(REDOPS)}")
    return text


def point_count(ops: Sequence[str], sizes: int) -> int:
    """Points a sweep measures: every size of every form (PLACES) of every op."""
    return sum(sum(PLACES[op]) for op in ops) * sizes


def avg_busbw(rows: Iterable[dict]) -> dict[str, float]:
    """nccl-tests' closing "Avg bus bandwidth": per op, the mean busbw over every size, out of place and in
    place alike."""
    by_op: dict[str, list[float]] = {}
    for row in rows:
        by_op.setdefault(row["op"], []).append(row["busbw_gbps"])
    return {op: sum(values) / len(values) for op, values in by_op.items()}


def one_per_point(rows: Iterable[dict]) -> list[dict]:
    """One row per (op, size), in sweep order: the out-of-place one where both forms ran (nccl-tests' first
    column group), for the chart and the calibration fit, which draw one line per op."""
    rows = list(rows)
    outside = {(r["op"], r["size_bytes"]) for r in rows if not r.get("in_place")}
    return [r for r in rows if not (r.get("in_place") and (r["op"], r["size_bytes"]) in outside)]


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """S / t in GB/s (10^9 bytes per second, as nccl-tests prints)."""
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_gbps(op: str, n: int, size_bytes: int, time_us: float) -> float:
    return algbw_gbps(size_bytes, time_us) * bus_factor(op, n)


def element_count(op: str, size_bytes: int, n: int, itemsize: int) -> int:
    """Elements in the S-sized buffer: whole elements, and a whole number of n-sized chunks where S is n chunks."""
    count = max(1, size_bytes // itemsize)
    if op in CHUNKED:
        count = max(n, count - count % n)
    return count


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


MAX_SIZE = 64 << 30  # 64 GiB: a message larger than a whole H100's memory is a typo
MAX_SIZES = 64  # sizes per sweep: 4 bytes to 64 GiB in powers of two is 35


def parse_size(text: str) -> int:
    """`4K` -> 4096, `256M` -> 268435456, `100` -> 100."""
    match = re.fullmatch(r"\s*(\d{1,12})\s*([KMG]?)(?:I?B)?\s*", text.upper())
    size = int(match.group(1)) * _UNITS[match.group(2)] if match else 0
    if not 1 <= size <= MAX_SIZE:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise TopoplanError(f"size {shown!r}: expected a byte count from 1 to 64G, like 4096, 4K, 256M or 1G")
    return size


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
    parts = [part for part in text.split(",") if part.strip()]
    if len(parts) > MAX_SIZES:
        raise TopoplanError(f"--sizes lists {len(parts)} sizes; expected at most {MAX_SIZES}")
    sizes = sorted({parse_size(part) for part in parts})
    if not sizes:
        raise TopoplanError(f"--sizes {text!r}: expected LO:HI (e.g. 4K:256M) or a list (4K,1M)")
    return sizes


def human_size(nbytes: int) -> str:
    """4096 -> `4K` (the inverse of parse_size for exact multiples)."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)
