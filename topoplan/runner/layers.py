"""Tensor-parallel building blocks (Megatron-style), each a plain nn.Module holding only its local shard.

With a TP degree of 1 every layer is the ordinary single-device layer and no communication happens, so
model.py reads as a single-device Llama. Sharding, per weight (the global HF tensor is [out, in]):

  ColumnParallelLinear  weight rows `rows` (dim 0) and the same bias rows; output stays sharded, no comm.
  RowParallelLinear     weight columns `cols` (dim 1); partial outputs summed by one all-reduce, then the
                        full bias is added once.
  VocabParallelEmbedding  vocabulary rows `rows`; ids outside them look up zeros; one all-reduce.

`weight_slice` tells the loader which slice of which dimension to read for each parameter.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class TpComm(Protocol):
    """The two TP collectives the layers need (topoplan.runner.dist.Dist implements them)."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor: ...


class NoComm:
    """TP degree 1: nothing to reduce or gather."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def block(n: int, rank: int, size: int) -> range:
    """The rank's contiguous block of n items split evenly over size ranks."""
    per = n // size
    return range(rank * per, (rank + 1) * per)


def scaled(items: range, factor: int) -> range:
    """Rows of a weight for a range of heads (each head spans `factor` rows)."""
    return range(items.start * factor, items.stop * factor)


class ColumnParallelLinear(nn.Module):
    """y[..., rows] = x @ W[rows].T (+ b[rows]): this rank computes a block of the output features."""

    def __init__(self, in_features: int, out_features: int, rows: range, bias: bool):
        super().__init__()
        self.full_size, self.rows = out_features, rows
        self.weight = nn.Parameter(torch.empty(len(rows), in_features))
        self.bias = nn.Parameter(torch.empty(len(rows))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum over TP ranks of x[..., cols] @ W[:, cols].T, + b: one all-reduce per call."""

    def __init__(self, in_features: int, cols: range, out_features: int, bias: bool, comm: TpComm):
        super().__init__()
        self.full_size, self.cols = in_features, cols
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(out_features, len(cols)))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding rows `rows` of the vocabulary; the rank owning an id supplies it, the others add zeros."""

    def __init__(self, vocab_size: int, rows: range, dim: int, comm: TpComm):
        super().__init__()
        self.full_size, self.rows = vocab_size, rows
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(len(rows), dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if len(self.rows) == self.full_size:
            return F.embedding(ids, self.weight)
        mine = (ids >= self.rows.start) & (ids < self.rows.stop)
        local = torch.where(mine, ids - self.rows.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.comm.all_reduce(out)


def weight_slice(module: nn.Module, param_name: str) -> tuple[int, range, int] | None:
    """(dimension, index range, global size of that dimension) of the global tensor this parameter holds;
    None when it holds all of it."""
    if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
        return 0, module.rows, module.full_size
    if isinstance(module, RowParallelLinear) and param_name == "weight":
        return 1, module.cols, module.full_size
    return None
