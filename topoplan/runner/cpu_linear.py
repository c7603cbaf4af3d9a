"""The runner's matrix product on CPU: MKL (torch's F.linear) or oneDNN with the weight reordered once, whichever
this machine runs faster, measured on the rank's own weights.

Why measured: which kernel streams a decode step's few rows faster depends on the CPU. On the project's 2-core AMD
EPYC VM (torch 2.13, MKL 2024.2) MKL's skinny products were far off the memory limit (2 rows took twice as long
as 1, 2 threads streamed no faster than 1) and oneDNN (torch's `mkldnn` ops, the path torch.compile's freezing
and vLLM's CPU backend take), with each weight reordered into its blocked layout, was 1.3-3x faster at 2-8 rows;
on the 2-core Intel Xeon VM (AVX-512, AMX) of 2026-12-05 MKL was 12-17% faster at 1 and 2 rows and oneDNN
1.4-1.8x faster at 4 and 8 (benchmarks/cpu_linear.py). A rule fixed on one of them is wrong on the other, so
`prepack` times a pass of the rank's decode-sized products over its streamed weights (the first PROBE_BYTES of
them, so the probe's cost is bounded whatever the model's size) with each kernel and keeps the faster.

Which weights: float32 CPU weights of at least STREAMED_WEIGHT_BYTES (the planner's size at which a weight
streams from memory, topoplan.plan.cost) are the candidates; the reordered weight replaces the plain one (no
second copy is kept; if MKL wins they are reordered back, bit for bit). A weight under that size stays in a
core's cache, where oneDNN's fixed cost per call dominates (the 4-layer `tiny` decodes ~1.5x slower packed):
it is stored transposed instead ([in, out] contiguous, seen through its [out, in] transpose, so its shape and
name stay HF's), since there a call's fixed cost is what a product costs, and MKL's x @ W^T with W^T contiguous
costs half of F.linear's (~2.6 against ~5.4 us for `tiny`'s 384 x 128 on one thread; weights that stream cost
the same either way). `linear` takes all three forms.

`topoplan calibrate` probes with the same measured choice (topoplan.bench.probes), so the planner prices the
kernel that runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from topoplan.layout import STREAMED_WEIGHT_BYTES

TIMED_PASSES = 3  # per kernel, after an untimed one; the fastest counts (the others met a busier moment)
PROBE_BYTES = 256 << 20  # of streamed weights timed by `prepack`: 0.3-0.5 s of reordering and passes on the 2-core VM


def available() -> bool:
    """Whether this torch build has the oneDNN linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _nbytes(weight: torch.Tensor) -> int:
    return weight.numel() * weight.element_size()


def _cpu_float32(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def streams(weight: torch.Tensor) -> bool:
    """Whether `weight` is a candidate for oneDNN: a float32 CPU weight of STREAMED_WEIGHT_BYTES or more (one that
    streams from memory), in a build that has the ops."""
    return _cpu_float32(weight) and available() and _nbytes(weight) >= STREAMED_WEIGHT_BYTES


def transposes(weight: torch.Tensor) -> bool:
    """Whether `weight` [out, in] is kept as its contiguous transpose (module docstring): a float32 CPU weight that
    stays in a core's cache (under STREAMED_WEIGHT_BYTES)."""
    return _cpu_float32(weight) and weight.layout == torch.strided and _nbytes(weight) < STREAMED_WEIGHT_BYTES


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


def product_pass(weights: list[torch.Tensor], rows: int) -> Callable[[], None]:
    """A pass of `rows`-row products over every weight (plain or packed, as they are), in order: what a decode
    step of `rows` sequences spends in them."""
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}

    def run() -> None:
        for w in weights:
            linear(inputs[w.shape[1]], w)

    return run


def pass_ms(weights: list[torch.Tensor], rows: int) -> float:
    """ms of the fastest of TIMED_PASSES `product_pass`es, after an untimed one."""
    run, best = product_pass(weights, rows), float("inf")
    for timed in range(TIMED_PASSES + 1):
        start = time.perf_counter()
        run()
        if timed:
            best = min(best, time.perf_counter() - start)
    return 1000 * best


@dataclass(frozen=True)
class KernelChoice:
    """What `prepack` chose for the streamed weights, and the pass times it chose by (0: not measured)."""

    onednn: bool
    weights: int  # streamed weights the choice covers
    mkl_ms: float = 0.0
    onednn_ms: float = 0.0


def prepack(model: nn.Module, rows: int, layers: tuple[type[nn.Module], ...], onednn: bool | None = None
            ) -> KernelChoice:
    """Prepare, in place, the weight of every module of the given linear-layer types for products of `rows` rows
    (module docstring): the streamed ones packed for oneDNN when `onednn` says so, or when None when a timed pass
    over them is faster packed (setting each module's `packed`); the ones that stay in cache transposed (setting
    its `weight_t`). A weight another module shares (tied embeddings) is left as it is."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    streamed = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, layers) or weight is None or owners[id(weight)] != 1:
            continue
        if streams(weight):
            streamed.append(module)
        elif transposes(weight):
            module.weight = nn.Parameter(weight.detach().t().contiguous().t(), requires_grad=False)
            module.weight_t = module.weight.detach().t()  # a view of the same storage
    if not streamed:
        return KernelChoice(False, 0)
    mkl_ms = onednn_ms = 0.0
    if onednn is None:
        probed = _first_bytes(streamed, PROBE_BYTES)
        mkl_ms = pass_ms([m.weight for m in probed], rows)
        _set_packed(probed, True)
        onednn_ms = pass_ms([m.weight for m in probed], rows)
        onednn = onednn_ms < mkl_ms
        if not onednn:
            _set_packed(probed, False)
    if onednn:
        _set_packed([m for m in streamed if not m.packed], True)
    return KernelChoice(onednn, len(streamed), mkl_ms, onednn_ms)


def _first_bytes(modules: list[nn.Module], budget: int) -> list[nn.Module]:
    """The leading modules whose weights add up to `budget` bytes (at least one)."""
    out, total = [], 0
    for module in modules:
        total += _nbytes(module.weight)
        if out and total > budget:
            break
        out.append(module)
    return out


def _set_packed(modules: list[nn.Module], packed: bool) -> None:
    """Each module's weight reordered for oneDNN, or back to plain (exactly the loaded values), one at a time."""
    for module in modules:
        weight = pack(module.weight) if packed else module.weight.detach().to_dense()
        module.weight = nn.Parameter(weight, requires_grad=False)
        module.packed = packed


def faster_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` as the runner would multiply `rows` rows by it at this thread count: packed when a timed pass is
    faster so, for a streamed weight (for the probes of topoplan.bench.probes, which must price what runs)."""
    if not streams(weight):
        return weight
    packed = pack(weight)
    return packed if pass_ms([packed], rows) < pass_ms([weight], rows) else weight
