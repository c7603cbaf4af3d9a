"""`bench -c`: the data every rank puts in, and what each rank must read back, as nccl-tests' data check.

Rank j's input at index i of the S-sized buffer is a small whole number, so sums, minima and maxima over
any group are exact in every dtype the bench moves (fp8 included up to 4 ranks' sums): 1 + (i + 3j) mod 4.
For `prod` exactly one rank holds a 2 at each index and the others 1 ((i + j) mod n == 0), so the product
is 2 whatever n is, without overflow. Outputs start at 0, which no input holds: an operation that writes
nothing is caught. A value is wrong when it differs from the expected one by more than n rounding steps of
its dtype (avg divides by n); NaN and inf are always wrong.
"""

from __future__ import annotations

import torch


def pattern(j: int, start: int, count: int, n: int, redop: str, device: torch.device) -> torch.Tensor:
    """Rank j's input at indices start..start+count (float64)."""
    i = torch.arange(start, start + count, device=device)
    if redop == "prod":
        return torch.where((i + j) % n == 0, 2.0, 1.0).to(torch.float64)
    return (1 + (i + 3 * j) % 4).to(torch.float64)


def reduced(start: int, count: int, n: int, redop: str, device: torch.device) -> torch.Tensor:
    """What reducing every rank's input with `redop` gives at indices start..start+count."""
    parts = torch.stack([pattern(j, start, count, n, redop, device) for j in range(n)])
    if redop == "sum":
        return parts.sum(0)
    if redop == "avg":
        return parts.sum(0) / n
    if redop == "prod":
        return parts.prod(0)
    if redop == "min":
        return parts.amin(0)
    if redop == "max":
        return parts.amax(0)
    raise ValueError(f"unknown reduction {redop!r}")


def gathered(chunk: int, n: int, device: torch.device) -> torch.Tensor:
    """all_gather and gather: chunk j of the result is rank j's own chunk (its input at j*chunk..)."""
    return torch.cat([pattern(j, j * chunk, chunk, n, "sum", device) for j in range(n)])


def exchanged(me: int, chunk: int, n: int, device: torch.device) -> torch.Tensor:
    """all_to_all: chunk j of rank me's result is chunk `me` of rank j's input."""
    return torch.cat([pattern(j, me * chunk, chunk, n, "sum", device) for j in range(n)])


def wrong(got: torch.Tensor, expected: torch.Tensor, n: int) -> int:
    """How many elements of `got` are not `expected`, within n rounding steps of got's dtype."""
    values = got.reshape(-1).to(torch.float64)
    tolerance = torch.finfo(got.dtype).eps * max(1, n) * expected.abs().clamp(min=1.0)
    close = (values - expected).abs() <= tolerance  # False for NaN: a NaN is wrong too
    return int((~close).sum().item())
