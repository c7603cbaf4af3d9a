"""Hardware probes: memory bandwidth, GEMV (decode's weight streaming), GEMM (prefill's FLOP rate), and the
fixed per-layer cost of a Llama decoder layer's kernels at negligible size.

Each probe runs its kernel `repeats` times and keeps the median (a shared machine has stalls; the median
describes the typical run, which is what the runner will see). On GPU, CUDA events time the kernel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MiB = 1 << 20


def median_us(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median microseconds of one fn() call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e6)
    return statistics.median(times)


def stream_gbps(device: torch.device, nbytes: int = 256 * MiB, repeats: int = 7) -> float:
    """Read bandwidth: a sum over a buffer far larger than any cache (fp32, so the read is the whole cost)."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    return nbytes / median_us(lambda: x.sum(), device, repeats) / 1e3


def gemv_gbps(device: torch.device, dtype: torch.dtype, nbytes: int = 256 * MiB, cols: int = 4096,
              repeats: int = 7) -> float:
    """Weight bytes per second of y = W x at batch 1: how fast decode can stream a layer's weights."""
    rows = nbytes // (cols * torch.empty((), dtype=dtype).element_size())
    w = torch.randn(rows, cols, device=device).to(dtype)
    x = torch.randn(1, cols, device=device).to(dtype)
    real = w.numel() * w.element_size()
    return real / median_us(lambda: F.linear(x, w), device, repeats) / 1e3


def gemm_tflops(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """FLOP rate of an n x n x n matrix product (prefill's large GEMMs)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / median_us(lambda: a @ b, device, repeats) / 1e6


def layer_overhead_us(device: torch.device, dtype: torch.dtype, repeats: int = 200) -> float:
    """One decode step of a Llama decoder layer (RMSNorm, q/k/v, RoPE, attention over a short cache, o,
    RMSNorm, gate/up, SiLU, down, residuals) at hidden 64: the cost of launching its kernels, which a
    small model pays per layer whatever its size."""
    hidden, heads, ctx = 64, 4, 16
    head_dim = hidden // heads
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    x, norm = t(1, 1, hidden), t(hidden)
    wq, wk, wv, wo = t(hidden, hidden), t(hidden, hidden), t(hidden, hidden), t(hidden, hidden)
    wg, wu, wd = t(3 * hidden, hidden), t(3 * hidden, hidden), t(hidden, 3 * hidden)
    k_cache, v_cache = t(1, heads, ctx, head_dim), t(1, heads, ctx, head_dim)
    cos, sin = t(1, 1, 1, head_dim), t(1, 1, 1, head_dim)

    def rms(v: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5) * norm

    def rope(v: torch.Tensor) -> torch.Tensor:
        half = v.shape[-1] // 2
        return v * cos + torch.cat((-v[..., half:], v[..., :half]), dim=-1) * sin

    @torch.inference_mode()
    def layer() -> torch.Tensor:
        h = rms(x)
        q = rope(F.linear(h, wq).view(1, 1, heads, head_dim).transpose(1, 2))
        k = rope(F.linear(h, wk).view(1, 1, heads, head_dim).transpose(1, 2))
        v = F.linear(h, wv).view(1, 1, heads, head_dim).transpose(1, 2)
        k_cache[:, :, -1:] = k
        v_cache[:, :, -1:] = v
        a = F.scaled_dot_product_attention(q, k_cache, v_cache)
        h = x + F.linear(a.transpose(1, 2).reshape(1, 1, hidden), wo)
        m = rms(h)
        return h + F.linear(F.silu(F.linear(m, wg)) * F.linear(m, wu), wd)

    return median_us(layer, device, repeats, warmup=20)
