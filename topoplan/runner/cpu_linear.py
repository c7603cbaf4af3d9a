"""The runner's matrix product on CPU: oneDNN with the weight reordered once, where it beats torch's default.

torch's F.linear on CPU calls MKL. On this project's 2-core AMD EPYC VM (torch 2.13, MKL 2024.2) MKL's
kernels for the few rows of a decode step are far off the memory limit: 2 rows take twice as long as 1,
and 2 threads stream a vector product no faster than 1. oneDNN (the `mkldnn` ops torch ships, the path
torch.compile's freezing and vLLM's CPU backend take) with the weight reordered into its blocked layout once
after loading reads the weights at the memory limit for 1-8 rows on 2 threads, and is faster for 2+ rows
on 1 thread; only one row on one thread is faster on MKL (benchmarks/cpu_linear.py measures both). A
weight that fits in a core's cache is the other exception: there oneDNN's fixed cost per call dominates
(the 4-layer `tiny` model decodes ~1.5x slower packed). So a rank packs each weight of at least
STREAMED_WEIGHT_BYTES (the planner's size at which a weight streams from memory, topoplan.plan.cost)
unless it decodes one row on one thread. The reordered weight replaces the plain one (no second copy);
`linear` takes either.

A weight under that size is stored transposed instead ([in, out] contiguous, seen through its [out, in]
transpose, so its shape and name stay HF's): there a call's fixed cost is what a product costs, and MKL's
x @ W^T with W^T contiguous costs half of F.linear's (~2.6 against ~5.4 us for `tiny`'s 384 x 128 on one
thread here; weights that stream cost the same either way).

`topoplan calibrate` probes with the same choice (topoplan.bench.probes), so the planner prices the kernel
that runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from topoplan.plan.cost import STREAMED_WEIGHT_BYTES


def available() -> bool:
    """Whether this torch build has the oneDNN linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packs(weight: torch.Tensor, rows: int, threads: int | None = None) -> bool:
    """Whether products of `rows` rows with `weight` run on oneDNN at `threads` threads (default: this
    process's): float32 CPU weights of STREAMED_WEIGHT_BYTES or more, unless one row on one thread (module
    docstring)."""
    threads = torch.get_num_threads() if threads is None else threads
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and available()
            and weight.numel() * weight.element_size() >= STREAMED_WEIGHT_BYTES and (rows > 1 or threads > 1))


def transposes(weight: torch.Tensor) -> bool:
    """Whether `weight` [out, in] is kept as its contiguous transpose (module docstring): a float32 CPU weight that
    stays in a core's cache (under STREAMED_WEIGHT_BYTES)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.layout == torch.strided
            and weight.numel() * weight.element_size() < STREAMED_WEIGHT_BYTES)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] in oneDNN's layout for `linear` (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


@torch.library.custom_op("topoplan::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product with a packed weight, as one opaque op: a compiled decode step (topoplan.runner.compiled)
    calls it as it is, where inductor would lower the mkldnn op to a plain matrix product that cannot read a
    packed weight."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: bool | None = None, weight_t: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias) for a plain or a packed weight. `packed` says which when known (a layer
    `prepack` packed): torch.compile traces a packed weight as a plain tensor, so it cannot be asked.
    `weight_t`: weight.T, contiguous, where `prepack` stored it so (a weight that stays in cache)."""
    if weight_t is not None:
        y = torch.matmul(x, weight_t)
        return y if bias is None else y + bias
    if not (weight.is_mkldnn if packed is None else packed):
        return F.linear(x, weight, bias)
    if torch.compiler.is_compiling():
        return packed_linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")  # eager: no custom-op dispatch


def prepack(model: nn.Module, rows: int, layers: tuple[type[nn.Module], ...]) -> int:
    """Pack, in place, the weight of every module of the given linear-layer types whose products of `rows`
    rows run on oneDNN, and set the module's `packed`; store the others that stay in cache transposed, and set
    the module's `weight_t` (module docstring). A weight another module shares (tied embeddings) is left as it
    is. Returns how many were packed."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, layers) or weight is None or owners[id(weight)] != 1:
            continue
        if packs(weight, rows):
            module.weight = nn.Parameter(pack(weight), requires_grad=False)
            module.packed = True
            count += 1
        elif transposes(weight):
            module.weight = nn.Parameter(weight.detach().t().contiguous().t(), requires_grad=False)
            module.weight_t = module.weight.detach().t()  # a view of the same storage
    return count
