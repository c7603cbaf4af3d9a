"""Collective sweeps over torch.distributed, measured as nccl-tests measures (see topoplan.bench.definitions).

Timing: ranks start together at a barrier and run `iters` operations back to back. On CPU each call is
bracketed by perf_counter; on GPU CUDA events bracket the loop on the current stream. A point's time is
the slowest rank's (an operation is done when its last rank is done): the mean over iterations, as
nccl-tests reports and as the calibration fit uses (a workload pays the stalls too, topoplan.bench.fit),
and the median, which shows how much of the mean those stalls are on a shared machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from topoplan.bench.definitions import algbw_gbps, busbw_gbps, element_count

# torch 2.13 renamed the single-tensor forms (the old names warn); older torch has only the old names.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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
        return lambda: ALL_GATHER(out, src, group=g)
    if op == "reduce_scatter":
        src, out = buf(count), buf(chunk)
        return lambda: REDUCE_SCATTER(out, src, group=g)
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
            make_call(op, element_count(op, 64 * group.size, group.size, 1), group, rank, device, dtype)()  # 64/rank
            _sync(device)
        except (RuntimeError, ValueError, NotImplementedError, AttributeError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            error = f"{dist.get_backend()} cannot run {op} on {str(dtype).removeprefix('torch.')}: {why}"
    ok = torch.tensor([0 if error else 1], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if error is None and not ok.item():
        error = "not supported on another rank"
    return error


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(call: Callable[[], None], iters: int, warmup: int, device: torch.device) -> list[float]:
    """Microseconds of each call on this rank, all ranks having started together at a barrier.

    On GPU the loop is bracketed by CUDA events (one figure, the mean, repeated per call): events around
    every call would serialise what the stream overlaps."""
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
        return [start.elapsed_time(end) * 1e3 / iters] * iters
    times = []
    clock = time.perf_counter
    for _ in range(iters):
        begin = clock()
        call()
        times.append(clock() - begin)
    return [t * 1e6 for t in times]


def slowest(values: Sequence[float], device: torch.device) -> list[float]:
    """The element-wise maximum of `values` over every rank."""
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _mean_median(times: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(times), statistics.median(times)


@dataclass(frozen=True)
class Measurement:
    op: str
    size_bytes: int
    count: int
    time_us: float  # mean over iterations (nccl-tests' figure); algbw and busbw use it
    median_us: float
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
            mean, median = slowest(_mean_median(time_op(call, iters, warmup, device)), device)
            nbytes = count * itemsize
            found.append(Measurement(op, nbytes, count, mean, median, algbw_gbps(nbytes, mean),
                                     busbw_gbps(op, group.size, nbytes, mean)))
            if on_point:
                on_point(op, 1)
    return found, skipped
