"""Collective sweeps with nccl-tests' definitions of size, time, algbw and busbw.

Definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md):
  * S, the size of an operation, is the largest buffer it touches on one rank: the whole buffer for
    all_reduce, broadcast, reduce and sendrecv; the gathered (n x chunk) buffer for all_gather, gather,
    reduce_scatter, scatter and all_to_all.
  * t is the average time of one operation; algbw = S / t.
  * busbw = algbw x factor(n), the factor that makes the figure comparable to the hardware's link speed
    whatever the rank count: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather and
    scatter (n-1)/n; broadcast, reduce and sendrecv 1.
Timing: on CPU ranks start together at a barrier, run `iters` operations back to back and read
perf_counter; on GPU CUDA events bracket the loop on the current stream. The reported time is the
slowest rank's (the operation is done when the last rank is done), like nccl-tests' max over ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all",
       "sendrecv")


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for `op` over `n` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    if n < 2 or op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """S / t in GB/s (10^9 bytes per second, as nccl-tests prints)."""
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_gbps(op: str, n: int, size_bytes: int, time_us: float) -> float:
    return algbw_gbps(size_bytes, time_us) * bus_factor(op, n)


def element_count(op: str, size_bytes: int, n: int, itemsize: int) -> int:
    """Elements in the S-sized buffer: a whole number of elements, and of n-sized chunks where S is n chunks."""
    count = max(1, size_bytes // itemsize)
    if op in ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all"):
        count = max(n, count - count % n)
    return count


@dataclass(frozen=True)
class Group:
    """The ranks an operation runs over, and this rank's place in them."""

    ranks: tuple[int, ...]
    handle: dist.ProcessGroup | None  # None: the default (world) group

    @property
    def size(self) -> int:
        return len(self.ranks)

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


def make_call(op: str, count: int, group: Group, rank: int, device: torch.device,
              dtype: torch.dtype) -> Callable[[], None]:
    """A no-argument closure running one `op` on preallocated buffers (allocation stays out of the loop)."""
    n, g, me = group.size, group.handle, group.local(rank)
    root = group.ranks[0]
    chunk = count // n if n else count

    def buf(elements: int) -> torch.Tensor:
        return torch.ones(elements, dtype=dtype, device=device)

    if op == "all_reduce":
        x = buf(count)
        return lambda: dist.all_reduce(x, group=g)
    if op == "all_gather":
        src, out = buf(chunk), buf(count)
        return lambda: dist.all_gather_into_tensor(out, src, group=g)
    if op == "reduce_scatter":
        src, out = buf(count), buf(chunk)
        return lambda: dist.reduce_scatter_tensor(out, src, group=g)
    if op == "broadcast":
        x = buf(count)
        return lambda: dist.broadcast(x, src=root, group=g)
    if op == "reduce":
        x = buf(count)
        return lambda: dist.reduce(x, dst=root, group=g)
    if op == "gather":
        src = buf(chunk)
        outs = [buf(chunk) for _ in range(n)] if rank == root else None
        return lambda: dist.gather(src, outs, dst=root, group=g)
    if op == "scatter":
        out = buf(chunk)
        ins = [buf(chunk) for _ in range(n)] if rank == root else None
        return lambda: dist.scatter(out, ins, src=root, group=g)
    if op == "all_to_all":
        src, out = buf(count), buf(count)
        return lambda: dist.all_to_all_single(out, src, group=g)
    if op == "sendrecv":  # nccl-tests' sendrecv: send to the next rank of the ring, receive from the previous
        src, out = buf(count), buf(count)
        nxt, prv = group.ranks[(me + 1) % n], group.ranks[(me - 1) % n]

        def sendrecv() -> None:
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, src, nxt, g),
                                               dist.P2POp(dist.irecv, out, prv, g)]):
                req.wait()
        return sendrecv
    raise ValueError(f"unknown op {op!r}")


def support_error(op: str, group: Group, rank: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """Run `op` once at a small size; the backend's error message if it cannot, else None.

    Detected at run time, not from a table: which primitives gloo implements changes between torch
    versions. Every rank tries, then all agree (a MIN over the world), so no rank waits for a missing op.
    """
    error = None
    if group.size < 2 and op == "sendrecv":
        error = "sendrecv needs at least 2 ranks"
    else:
        try:
            make_call(op, element_count(op, 64 * group.size, group.size, 4), group, rank, device, dtype)()
            _sync(device)
        except (RuntimeError, ValueError, NotImplementedError, AttributeError) as exc:
            error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    ok = torch.tensor([0 if error else 1], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if error is None and not ok.item():
        error = "not supported on another rank"
    return error


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(call: Callable[[], None], iters: int, warmup: int, device: torch.device) -> float:
    """Average microseconds per call on this rank, started together with every other rank."""
    for _ in range(warmup):
        call()
    _sync(device)
    dist.barrier()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters
    begin = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - begin) * 1e6 / iters


def slowest(value: float, device: torch.device) -> float:
    """The maximum of `value` over every rank."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


@dataclass(frozen=True)
class Measurement:
    op: str
    size_bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def sweep(ops: Sequence[str], sizes: Sequence[int], group: Group, rank: int, device: torch.device,
          dtype: torch.dtype, iters: int, warmup: int,
          on_point: Callable[[str, int], None] | None = None) -> tuple[list[Measurement], list[dict[str, str]]]:
    """Every supported op at every size: (measurements, skipped ops with the reason)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    found, skipped = [], []
    for op in ops:
        reason = support_error(op, group, rank, device, dtype)
        if reason:
            skipped.append({"op": op, "reason": reason})
            if on_point:
                on_point(op, len(sizes))
            continue
        for size in sizes:
            count = element_count(op, size, group.size, itemsize)
            call = make_call(op, count, group, rank, device, dtype)
            t = slowest(time_op(call, iters, warmup, device), device)
            nbytes = count * itemsize
            found.append(Measurement(op, nbytes, count, t, algbw_gbps(nbytes, t),
                                     busbw_gbps(op, group.size, nbytes, t)))
            if on_point:
                on_point(op, 1)
    return found, skipped
