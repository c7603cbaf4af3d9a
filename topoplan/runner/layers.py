"""Tensor-parallel building blocks (Megatron-style), each a plain nn.Module holding only its local shard.

With a TP degree of 1 every layer is the ordinary single-device layer and no communication happens, so
model.py reads as a single-device Llama. Sharding, per weight (the global HF tensor is [out, in]):

  ColumnParallelLinear  weight rows (dim 0) and the same bias rows; output stays sharded, no comm. One
                        layer may stack the rows of several HF weights (q/k/v, gate/up: one matmul
                        instead of three or two, as gpt-fast does); `Part` names each.
  RowParallelLinear     weight columns `cols` (dim 1); partial outputs summed by one all-reduce, then the
                        full bias is added once.
  VocabParallelEmbedding  vocabulary rows `rows`; ids outside them look up zeros; one all-reduce.

`sources` tells the loader which slice of which HF tensor fills each parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from topoplan.runner.cpu_linear import linear


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


@dataclass(frozen=True)
class Part:
    """One HF weight's share of a column-parallel layer: its module name next to the layer's ("q_proj"; ""
    for the layer's own name), its full row count, and the rows this rank holds."""

    name: str
    full_size: int
    rows: range


class ColumnParallelLinear(nn.Module):
    """y = x @ W.T (+ b), W stacking this rank's rows of each part: a block of each part's output features.
    `sizes` splits the output back into parts."""

    packed = False  # the weight is oneDNN-packed (topoplan.runner.cpu_linear.prepack)
    weight_t: torch.Tensor | None = None  # or kept transposed, this its contiguous [in, out] view (prepack)

    def __init__(self, in_features: int, parts: Sequence[Part], bias: bool):
        super().__init__()
        self.parts = tuple(parts)
        self.sizes = [len(part.rows) for part in parts]
        self.weight = nn.Parameter(torch.empty(sum(self.sizes), in_features))
        self.bias = nn.Parameter(torch.empty(sum(self.sizes))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed, self.weight_t)


class RowParallelLinear(nn.Module):
    """y = sum over TP ranks of x[..., cols] @ W[:, cols].T, + b: one all-reduce per call."""

    packed = False  # as ColumnParallelLinear.packed
    weight_t: torch.Tensor | None = None  # as ColumnParallelLinear.weight_t

    def __init__(self, in_features: int, cols: range, out_features: int, bias: bool, comm: TpComm):
        super().__init__()
        self.full_size, self.cols = in_features, cols
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(out_features, len(cols)))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.comm.all_reduce(linear(x, self.weight, packed=self.packed, weight_t=self.weight_t))
        return y + self.bias if self.bias is not None else y


LINEAR_LAYERS = (ColumnParallelLinear, RowParallelLinear)  # the layers whose weights a decode step streams


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


@dataclass(frozen=True)
class Source:
    """A slice of one global tensor that fills (part of) a local parameter.

    `name` is the tensor's name in our naming (HF's without the `model.` prefix); `dim` the sliced
    dimension (None: the whole tensor) of global size `full_size`; `offset` where the slice starts along
    dim 0 of the local parameter (stacked parts)."""

    name: str
    dim: int | None = None
    index: range | None = None
    full_size: int | None = None
    offset: int = 0


def sources(module_name: str, module: nn.Module, param_name: str) -> list[Source]:
    """Where each piece of parameter `param_name` of `module` (called `module_name`) comes from."""
    own = f"{module_name}.{param_name}"
    if isinstance(module, ColumnParallelLinear):
        parent = module_name.rpartition(".")[0]
        out, offset = [], 0
        for part in module.parts:
            base = f"{parent}.{part.name}".lstrip(".") if part.name else module_name
            out.append(Source(f"{base}.{param_name}", 0, part.rows, part.full_size, offset))
            offset += len(part.rows)
        return out
    if isinstance(module, VocabParallelEmbedding):
        return [Source(own, 0, module.rows, module.full_size)]
    if isinstance(module, RowParallelLinear) and param_name == "weight":
        return [Source(own, 1, module.cols, module.full_size)]
    return [Source(own)]
