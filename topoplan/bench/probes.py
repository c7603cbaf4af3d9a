"""Hardware probes: memory bandwidth, GEMV (decode's weight streaming), GEMM (prefill's FLOP rate), and the
fixed per-layer and per-step costs of the runner's decode step at negligible size.

Each probe runs its kernel `repeats` times and keeps the median (a shared machine has stalls; the median
describes the typical run, which is what the runner will see). A noisy probe, whose interquartile spread
exceeds NOISY of its median, is repeated, up to MAX_ROUNDS times as many runs; the spread it ended with is
reported beside the figure (`noise`). On GPU, CUDA events time the kernel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from topoplan.models import CATALOG
from topoplan.runner import cpu_linear
from topoplan.runner.cpu_linear import linear

MiB = 1 << 20
NOISY = 0.2  # interquartile spread / median above which a probe runs again
MAX_ROUNDS = 3  # at most this many times the runs asked for


def spread(values: list[float]) -> float:
    """(third quartile - first quartile) / median: 0 for a steady probe, robust to one stall."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    middle = statistics.median(values)
    return (q3 - q1) / middle if middle > 0 else 0.0


def robust_median(sample: Callable[[], float], repeats: int, noise: list[float] | None = None) -> float:
    """The median of `repeats` samples, with `repeats` more while the spread exceeds NOISY (at most MAX_ROUNDS
    rounds); the final spread is appended to `noise` when given."""
    values = [sample() for _ in range(repeats)]
    while spread(values) > NOISY and len(values) < MAX_ROUNDS * repeats:
        values += [sample() for _ in range(repeats)]
    if noise is not None:
        noise.append(spread(values))
    return statistics.median(values)


def median_us(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2,
              noise: list[float] | None = None) -> float:
    """Median microseconds of one fn() call (repeated while noisy, robust_median)."""
    for _ in range(warmup):
        fn()

    def once() -> float:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e6

    return robust_median(once, repeats, noise)


def stream_gbps(device: torch.device, nbytes: int = 256 * MiB, repeats: int = 7,
                noise: list[float] | None = None) -> float:
    """Read bandwidth: a sum over a buffer far larger than any cache (fp32, so the read is the whole cost)."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return nbytes / median_us(lambda: x.sum(), device, repeats, noise=noise) / 1e3


def gemv_gbps(device: torch.device, dtype: torch.dtype, nbytes: int = 256 * MiB, cols: int = 4096,
              repeats: int = 7, noise: list[float] | None = None) -> float:
    """Weight bytes per second of y = W x at batch 1: how fast decode can stream a layer's weights."""
    rows = nbytes // (cols * dtype.itemsize)
    w = torch.randn(rows, cols, device=device).to(dtype)
    x = torch.randn(1, cols, device=device).to(dtype)
    real = w.numel() * w.element_size()
    w = runner_weight(w, 1)
    return real / median_us(lambda: linear(x, w), device, repeats, noise=noise) / 1e3


CALL_ROWS = (1, 2)  # the runner's kernel may differ between 1 row and more (measured: topoplan.runner.cpu_linear)


CALL_SIZES_MIB = (2, 4, 8, 16)  # the weights of small models' layers and of MoE experts


def matmul_call_us(device: torch.device, dtype: torch.dtype, rows: int = 1, sizes: tuple[int, ...] = CALL_SIZES_MIB,
                   reference: int = 256 * MiB, cols: int = 2048, pool: int = 128 * MiB, repeats: int = 7,
                   noise: list[float] | None = None) -> float:
    """Microseconds one product of `rows` rows costs beyond streaming its weight at the GEMV rate, with the
    kernel the runner picks for that many rows.

    The planner prices a decode step's products as their bytes at `gemv_gbps` (one large weight) plus this
    per product, so it is measured in those terms. A decode step of a small model or an MoE layer runs
    products of a few MB, which on this project's 2-core VM run at 16-22 GB/s where one 256 MiB weight
    streams at 25-30. In each sample a `reference`-byte weight (the GEMV rate at that moment) and pools of
    weights of each of `sizes` MiB (each pool `pool` bytes, so every product streams from memory) are timed
    back to back, so a drift of the machine's bandwidth between samples cancels; a sample's figure is the
    median over the sizes of a product's time beyond its bytes at that rate, and the median over samples is
    kept. (An intercept of t = fixed + bytes / rate through two sizes, the first version of this probe, swung
    between 1 and 80 us from run to run: the excess is not a constant plus a rate.)"""
    size = dtype.itemsize

    def weight(nbytes: int) -> torch.Tensor:
        return runner_weight(torch.randn(nbytes // (cols * size), cols, device=device).to(dtype), rows)

    big, pools = weight(reference), {mib: [weight(mib * MiB) for _ in range(max(1, pool // (mib * MiB)))]
                                     for mib in sizes}
    x = torch.randn(rows, cols, device=device).to(dtype)
    for w in (big, *(ws[0] for ws in pools.values())):  # warm-up: oneDNN builds its kernels on first use
        linear(x, w)

    def per_call(ws: list[torch.Tensor]) -> float:
        return median_us(lambda: [linear(x, w) for w in ws], device, 1, warmup=0) / len(ws)

    def excess() -> float:
        us_per_byte = per_call([big]) / reference
        return statistics.median(per_call(ws) - mib * MiB * us_per_byte for mib, ws in pools.items())

    return max(0.0, robust_median(excess, repeats, noise))


MATMUL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # tokens per matmul: decode batches up to prefill chunks


def matmul_tflops(device: torch.device, dtype: torch.dtype, rows: tuple[int, ...] = MATMUL_ROWS,
                  nbytes: int = 64 * MiB, repeats: int = 5, noise: list[float] | None = None) -> dict[str, float]:
    """FLOP rate of y = x W^T for x of `m` rows and a weight larger than the cache, per m.

    A decode step multiplies a few rows by every weight; CPU kernels for such skinny products are far
    slower than for square ones (MKL in torch 2.13 on this VM: 2 rows took twice as long as 1; the
    runner's oneDNN choice narrows that), so one GEMM figure cannot price both decode and prefill. The
    curve can. The weight is plain, as the runner holds it here: on a GPU or in another dtype than float32 on a
    CPU it has no other form (in float32 on a CPU calibrate times each kernel, matmul_tflops_by_kernel)."""
    w = _matmul_weight(device, dtype, nbytes)
    return {str(m): _tflops(w, w, m, device, repeats, noise) for m in rows}


def matmul_tflops_by_kernel(rows: tuple[int, ...] = MATMUL_ROWS, nbytes: int = 64 * MiB, repeats: int = 5,
                            noise: list[float] | None = None) -> dict[str, dict[str, float]]:
    """matmul_tflops in float32 on CPU for each kernel the runner may hold its weights for: "mkl" (F.linear on
    the plain weight) and, where the build has it, "onednn" (the packed weight).

    A runner rank keeps every weight in the one form faster at its decode step's rows (topoplan.runner.
    cpu_linear), and multiplies its prefill's and its experts' rows with that form too: the planner prices
    those at that kernel's rate, which the faster-at-each-rows curve overstates (oneDNN ~1.2x MKL at 64 rows
    on the Intel VM, where a decode step of 1-2 rows runs MKL)."""
    cpu = torch.device("cpu")
    w = _matmul_weight(cpu, torch.float32, nbytes)
    kernels = {"mkl": w, **({"onednn": cpu_linear.pack(w)} if cpu_linear.streams(w) else {})}
    return {name: {str(m): _tflops(w, used, m, cpu, repeats, noise) for m in rows} for name, used in kernels.items()}


def _matmul_weight(device: torch.device, dtype: torch.dtype, nbytes: int, cols: int = 4096) -> torch.Tensor:
    return torch.randn(nbytes // (cols * dtype.itemsize), cols, device=device).to(dtype)


def _tflops(w: torch.Tensor, used: torch.Tensor, rows: int, device: torch.device, repeats: int,
            noise: list[float] | None) -> float:
    """TFLOP/s of `rows` rows times `w` (held as `used`: plain or packed)."""
    x = torch.randn(rows, w.shape[1], device=device).to(w.dtype)
    return 2 * rows * w.numel() / median_us(lambda: linear(x, used), device, repeats, noise=noise) / 1e6


def runner_weight(w: torch.Tensor, rows: int) -> torch.Tensor:
    """The weight as the runner multiplies `rows` rows by it at this thread count (topoplan.runner.cpu_linear:
    the faster kernel, timed): the probes measure the kernel that runs."""
    return cpu_linear.faster_weight(w, rows)


def gemm_tflops(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5,
                noise: list[float] | None = None) -> float:
    """FLOP rate of an n x n x n matrix product (prefill's large GEMMs)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / median_us(lambda: a @ b, device, repeats, noise=noise) / 1e6


PROBE_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


STREAMED_PROBE_MODEL = {key: CATALOG["small"][key] for key in PROBE_MODEL}  # `small`'s layer: 45 MiB in fp32


def _probe_stage(device: torch.device, dtype: torch.dtype, shape: dict[str, Any], layers: int) -> torch.nn.Module:
    """The runner's model for the built-in `tiny` config with `shape`'s keys and `layers` layers, random weights,
    prepared for one-row decode as the runner prepares it."""
    from topoplan.runner.config import parse_hf_config
    from topoplan.runner.model import Shard, build_stage
    from topoplan.runner.tiny import BUILTIN

    raw = {**BUILTIN["tiny"], **shape, "num_hidden_layers": layers}
    model = build_stage(parse_hf_config(raw, source="<probe>"), Shard(), device, dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.pack_for_decode(1)
    return model


def layer_bytes(shape: dict[str, Any], dtype: torch.dtype) -> int:
    """Bytes of one decoder layer's weight matrices for a probe `shape`, as the planner counts a layer's."""
    from topoplan.models import spec_from_config
    from topoplan.runner.tiny import BUILTIN

    spec = spec_from_config({**BUILTIN["tiny"], **shape}, "<probe>", "<probe>")
    return round(spec.layer_params_per_rank()) * dtype.itemsize


def _decode_step_us(model: torch.nn.Module, steps: int) -> float:
    from topoplan.runner.generate import generate

    gen = generate(model, [[1, 2, 3, 4, 5, 6, 7, 8]], steps + 1)
    return gen.decode_s / gen.decode_steps * 1e6


def _layer_slope_us(device: torch.device, dtype: torch.dtype, shape: dict[str, Any], steps: int,
                    layer_counts: tuple[int, int], repeats: int, noise: list[float] | None) -> tuple[float, float]:
    """(per-layer, per-step) microseconds of the runner's decode step for the built-in `tiny` config with
    `shape`'s keys at negligible size: decode timed with few and with more layers, the slope and intercept."""
    times = []
    for layers in layer_counts:
        model = _probe_stage(device, dtype, {**PROBE_MODEL, **shape}, layers)
        times.append(robust_median(lambda model=model: _decode_step_us(model, steps), repeats, noise))
    (l0, l1), (t0, t1) = layer_counts, times
    per_layer = max(0.0, (t1 - t0) / (l1 - l0))
    return per_layer, max(0.0, t0 - l0 * per_layer)


def runner_overheads_us(device: torch.device, dtype: torch.dtype, steps: int = 40,
                       layer_counts: tuple[int, int] = (1, 5), repeats: int = 3,
                       noise: list[float] | None = None) -> tuple[float, float]:
    """(per-layer, per-step) fixed cost of the runner's own decode step, at negligible size.

    The runner's model (topoplan.runner) at hidden 64 is timed decoding with few and with more layers:
    the slope is what each layer's kernels cost to launch while everything stays in cache (the planner's
    layer_overhead_us; streamed_layer_overhead_us is the same for layers that stream), the intercept what
    a step costs outside the layers (embedding, head, mask, sampling, Python)."""
    return _layer_slope_us(device, dtype, {}, steps, layer_counts, repeats, noise)


def streamed_layer_overhead_us(device: torch.device, dtype: torch.dtype, steps: int = 24,
                               layer_counts: tuple[int, int] = (1, 3), repeats: int = 5,
                               noise: list[float] | None = None) -> float:
    """Microseconds a decode layer costs beyond streaming its weights, when they do stream: for a model whose
    layers are larger than the caches.

    runner_overheads_us times a model whose weights stay in cache. A real model's layer streams tens of MB
    through the caches between its small kernels (norms, rotary, attention, activation, adds), which then run
    on cold caches: on this project's 2-core Intel VM, one `small`-sized layer (45 MiB) at two rows cost 380-440
    us beyond its products where the cached probe's cost 110-120 (docs/bench.md). Here decode steps of a
    `small`-layer model with few and with more layers are each timed back to back with a pass of the same
    products alone (its weights in order, as the runner holds them); per layer, the slope of the step's time
    beyond the pass. It holds the cold small kernels and whatever the products lose between them."""
    from topoplan.runner.layers import LINEAR_LAYERS

    models = {n: _probe_stage(device, dtype, STREAMED_PROBE_MODEL, n) for n in layer_counts}
    passes = {n: cpu_linear.product_pass([m.weight for m in model.layers.modules()
                                          if isinstance(m, LINEAR_LAYERS)], 1)
              for n, model in models.items()}

    def slope() -> float:
        beyond = [_decode_step_us(models[n], steps) - median_us(passes[n], device, 5) for n in layer_counts]
        (l0, l1), (b0, b1) = layer_counts, beyond
        return (b1 - b0) / (l1 - l0)

    for model in models.values():  # warm-up: kernels' first-call set-up
        _decode_step_us(model, 2)
    return max(0.0, robust_median(slope, repeats, noise))


MOE_PROBE_EXPERTS = (2, 6)  # experts every token runs (top-k of k): the probe's touched count is exact


def moe_overheads_us(device: torch.device, dtype: torch.dtype, dense_layer_us: float, steps: int = 40,
                     layer_counts: tuple[int, int] = (1, 5), repeats: int = 3,
                     noise: list[float] | None = None) -> tuple[float, float]:
    """(per MoE layer, per expert it runs) fixed cost of the runner's MoE layer beyond a dense layer's
    (`dense_layer_us`, runner_overheads_us), at negligible size.

    A decode step's MoE layer runs the router, sorts the (token, expert) pairs, and for every expert it
    runs slices the rows, calls the expert's two products and its activation, then adds the weighted
    outputs back: dozens of small kernels a dense layer does not launch, a cost that does not shrink with
    the model (on this project's 2-core VM ~1.5 ms of a 14 ms step of a 4-layer test Mixtral). Mixtral-
    shaped probes with n experts of which every token runs all n (top-n of n, so exactly n run) give the
    layer's slope at two n: the difference per expert, the rest per layer. The expert's products at this
    size are small kernels; in a real model they stream their weights, priced by bytes and matmul_call_us."""
    extra = []
    for n in MOE_PROBE_EXPERTS:
        shape = {"model_type": "mixtral", "num_local_experts": n, "num_experts_per_tok": n}
        extra.append(_layer_slope_us(device, dtype, shape, steps, layer_counts, repeats, noise)[0] - dense_layer_us)
    (n0, n1), (e0, e1) = MOE_PROBE_EXPERTS, extra
    per_expert = max(0.0, (e1 - e0) / (n1 - n0))
    return max(0.0, e0 - n0 * per_expert), per_expert
