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

from topoplan.bench import datacheck
from topoplan.bench.definitions import PLACES, REDUCING, ROOTED, algbw_gbps, busbw_gbps, element_count
from topoplan.runner.shm import ShmChannels, ShmGroup

# torch 2.13 renamed the single-tensor forms (the old names warn); older torch has only the old names.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class Group:
    """The ranks an operation runs over, and this rank's place in them."""

    ranks: tuple[int, ...]
    handle: dist.ProcessGroup | None  # None: the default (world) group
    shm: ShmGroup | None = None  # all_reduce (sum), all_to_all through shared memory, as the runner's TP/EP groups
    ring: ShmChannels | None = None  # sendrecv through shared memory, as the runner's pipeline stages do

    @property
    def size(self) -> int:
        return len(self.ranks)

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


@dataclass(frozen=True)
class Case:
    """One op at one size on preallocated buffers: `call` runs it (allocation stays out of the timed loop);
    `fill` writes the data check's inputs (topoplan.bench.datacheck) and zeroes the outputs; after one call,
    `check` counts the elements of `result` (this rank's output; None where it receives nothing) that differ
    from `expected`."""

    call: Callable[[], object]
    fill: Callable[[], object]
    result: torch.Tensor | None
    expected: Callable[[], torch.Tensor]
    n: int

    def check(self) -> int:
        return 0 if self.result is None else datacheck.wrong(self.result, self.expected(), self.n)


def make_case(op: str, count: int, group: Group, rank: int, device: torch.device, dtype: torch.dtype, *,
              in_place: bool = False, redop: str = "sum", root: int = 0) -> Case:
    """`op` over `group` on `count` elements (the S-sized buffer); `root` is a place in the group.

    In place, all_gather's input is this rank's chunk of its output and reduce_scatter's output this rank's
    chunk of its input (NCCL's in-place convention); all_reduce, broadcast and reduce are always in place."""
    n, g, me = group.size, group.handle, group.local(rank)
    root_rank, red = group.ranks[root], REDUCE_OPS[redop]
    chunk = count // n if n else count
    data = redop if op in REDUCING else "sum"

    def buf(elements: int) -> torch.Tensor:
        return torch.ones(elements, dtype=dtype, device=device)

    def mine(start: int, elements: int, j: int = me) -> torch.Tensor:
        return datacheck.pattern(j, start, elements, n, data, device)

    def reduced(start: int, elements: int) -> Callable[[], torch.Tensor]:
        return lambda: datacheck.reduced(start, elements, n, data, device)

    def zeroed(*outputs: torch.Tensor, then: Callable[[], object]) -> Callable[[], None]:
        def fill() -> None:
            for t in outputs:
                t.zero_()
            then()
        return fill

    if op == "all_reduce":
        x = buf(count)
        shm = group.shm if group.shm is not None and redop == "sum" and group.shm.fits(x) else None
        call = (lambda: shm.all_reduce(x)) if shm is not None else (lambda: dist.all_reduce(x, op=red, group=g))
        return Case(call, lambda: x.copy_(mine(0, count)), x, reduced(0, count), n)
    if op == "broadcast":
        x = buf(count)
        return Case(lambda: dist.broadcast(x, src=root_rank, group=g),
                    zeroed(x, then=lambda: x.copy_(mine(0, count)) if me == root else None),
                    x, lambda: mine(0, count, root), n)
    if op == "reduce":
        x = buf(count)
        return Case(lambda: dist.reduce(x, dst=root_rank, op=red, group=g), lambda: x.copy_(mine(0, count)),
                    x if me == root else None, reduced(0, count), n)
    if op == "all_gather":
        out = buf(count)
        src = out[me * chunk:(me + 1) * chunk] if in_place else buf(chunk)
        return Case(lambda: ALL_GATHER(out, src, group=g), zeroed(out, then=lambda: src.copy_(mine(me * chunk, chunk))),
                    out, lambda: datacheck.gathered(chunk, n, device), n)
    if op == "reduce_scatter":
        src = buf(count)
        out = src[me * chunk:(me + 1) * chunk] if in_place else buf(chunk)
        return Case(lambda: REDUCE_SCATTER(out, src, op=red, group=g),
                    zeroed(out, then=lambda: src.copy_(mine(0, count))),
                    out, reduced(me * chunk, chunk), n)
    if op == "gather":
        src, whole = buf(chunk), buf(count) if me == root else None
        outs = list(whole.split(chunk)) if whole is not None else None  # views: the check reads `whole`
        return Case(lambda: dist.gather(src, outs, dst=root_rank, group=g),
                    zeroed(*(outs or []), then=lambda: src.copy_(mine(me * chunk, chunk))),
                    whole, lambda: datacheck.gathered(chunk, n, device), n)
    if op == "scatter":
        out = buf(chunk)
        ins = [buf(chunk) for _ in range(n)] if me == root else None

        def fill_scatter() -> None:
            for j, t in enumerate(ins or []):
                t.copy_(mine(j * chunk, chunk))
        return Case(lambda: dist.scatter(out, ins, src=root_rank, group=g), zeroed(out, then=fill_scatter),
                    out, lambda: mine(me * chunk, chunk, root), n)
    if op == "all_to_all":
        src, out = buf(count), buf(count)
        counts, rows = [[chunk] * n for _ in range(n)], src[:n * chunk, None]  # rows of one element
        if group.shm is not None and group.shm.all_to_all_fits(counts, rows):
            # as the runner's EP groups exchange tokens: through shared memory
            call = lambda: out[:n * chunk].copy_(group.shm.all_to_all(rows, counts)[:, 0])  # noqa: E731
        else:
            call = lambda: dist.all_to_all_single(out, src, group=g)  # noqa: E731
        return Case(call, zeroed(out, then=lambda: src.copy_(mine(0, count))),
                    out, lambda: datacheck.exchanged(me, chunk, n, device), n)
    if op == "sendrecv":  # nccl-tests' sendrecv: send to the next rank of the ring, receive from the previous
        src, out = buf(count), buf(count)
        nxt, prv = group.ranks[(me + 1) % n], group.ranks[(me - 1) % n]

        def sendrecv() -> None:
            if group.ring is not None:  # channel i carries member i's messages to member i + 1 (mod n)
                sent = None if group.ring.send(me, [count], src) else dist.isend(src, nxt, g)
                _, payload = group.ring.receive((me - 1) % n)
                if payload is None:  # above a slot: by gloo, as the runner's pipeline sends it
                    dist.recv(out, prv, g)
                else:
                    out.copy_(payload.view(out.dtype))
                if sent is not None:
                    sent.wait()
                return
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, src, nxt, g),
                                               dist.P2POp(dist.irecv, out, prv, g)]):
                req.wait()
        return Case(sendrecv, zeroed(out, then=lambda: src.copy_(mine(0, count))),
                    out, lambda: mine(0, count, (me - 1) % n), n)
    raise ValueError(f"unknown op {op!r}")


def support_error(op: str, group: Group, rank: int, device: torch.device, dtype: torch.dtype, *,
                  in_place: bool = False, redop: str = "sum", root: int = 0) -> str | None:
    """Run `op` once at a small size; the backend's error message if it cannot, else None.

    Detected at run time, not from a table: which primitives gloo implements changes between torch
    versions. Every rank tries, then all agree (a MIN over the world), so no rank waits for a missing op.
    """
    error = None
    if group.size < 2 and op == "sendrecv":
        error = "sendrecv needs at least 2 ranks"
    else:
        try:
            count = element_count(op, 64 * group.size, group.size, 1)  # 64 elements per rank
            make_case(op, count, group, rank, device, dtype, in_place=in_place, redop=redop, root=root).call()
            _sync(device)
        except (RuntimeError, ValueError, NotImplementedError, AttributeError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            what = f"{op}{' in place' if in_place else ''}{f' {redop}' if op in REDUCING else ''}"
            error = f"{dist.get_backend()} cannot run {what} on {str(dtype).removeprefix('torch.')}: {why}"
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
    in_place: bool
    redop: str  # the reduction, "none" for ops that reduce nothing (nccl-tests' redop column)
    root: int  # a place in the group, -1 for ops without a root (nccl-tests' root column)
    time_us: float  # mean over iterations (nccl-tests' figure); algbw and busbw use it
    median_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # elements wrong over every rank (bench -c); None: not checked


@dataclass(frozen=True)
class SweepOptions:
    """What each point runs: nccl-tests' -o (redop), -r (root) and -c (check)."""

    iters: int
    warmup: int
    redop: str = "sum"
    root: int = 0
    check: bool = False


def measure(op: str, size: int, in_place: bool, group: Group, rank: int, device: torch.device, dtype: torch.dtype,
            o: SweepOptions) -> Measurement:
    """Time one point, then (with o.check) fill, run once more and count what every rank got wrong."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = element_count(op, size, group.size, itemsize)
    case = make_case(op, count, group, rank, device, dtype, in_place=in_place, redop=o.redop, root=o.root)
    case.fill()
    mean, median = slowest(_mean_median(time_op(case.call, o.iters, o.warmup, device)), device)
    wrong = None
    if o.check:
        case.fill()
        case.call()
        _sync(device)
        wrong = int(total(case.check(), device))
    nbytes = count * itemsize
    return Measurement(op, nbytes, count, in_place, o.redop if op in REDUCING else "none",
                       o.root if op in ROOTED else -1, mean, median, algbw_gbps(nbytes, mean),
                       busbw_gbps(op, group.size, nbytes, mean), wrong)


def total(value: int, device: torch.device) -> int:
    """The sum of `value` over every rank."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t.item())


def sweep(ops: Sequence[str], sizes: Sequence[int], group: Group, rank: int, device: torch.device,
          dtype: torch.dtype, o: SweepOptions,
          on_point: Callable[[str, int], None] | None = None) -> tuple[list[Measurement], list[dict]]:
    """Every supported op at every size, out of place then in place where torch has the form (PLACES):
    (measurements, skipped forms with the reason). `on_point(op, n)`: n more points are done."""
    found, skipped = [], []
    for op in ops:
        places = [p for p, offered in zip((False, True), PLACES[op]) if offered]
        for in_place in places:
            reason = support_error(op, group, rank, device, dtype, in_place=in_place, redop=o.redop, root=o.root)
            if reason:
                skipped.append({"op": op, "in_place": in_place, "reason": reason})
                if on_point:
                    on_point(op, len(sizes))
                continue
            for size in sizes:
                found.append(measure(op, size, in_place, group, rank, device, dtype, o))
                if on_point:
                    on_point(op, 1)
    return found, skipped
