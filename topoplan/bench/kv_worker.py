"""One rank of `topoplan bench --kv-transfer`: rank 0 is the prefill worker that holds a request's KV cache,
rank 1 the decode worker that receives it, on this machine.

Each path is a stand-in for a P/D connector's link: `shm` the runner's shared-memory channel between ranks of
one host (topoplan.runner.shm.ShmChannels; vLLM's CPU backend also moves data between local ranks through
shared memory), the cache cut into slot-sized messages the receiver copies straight into its own cache; `gloo`
torch.distributed send/recv over loopback TCP, as between hosts without RDMA. Each mode is how a connector
sends: `whole` the cache at once, `per-layer` one message per layer (as a layer-wise connector streams it).

Timing: from the prefill rank's first send to the decode rank's last byte, both on the host's CLOCK_MONOTONIC
(`timed`); an empty acknowledgement from the decode rank paces the iterations. A point's figures are the mean,
median and minimum over `iters`.
After timing, the decode rank zeroes its cache, receives once more and counts the bytes that differ from the
sender's pattern (`wrong`) and the bytes it received (`bytes_moved`): what the transfer really carried.

Before the KV sizes, one-way transfers of FIT_SIZES (whole) on each path give the link constants the parent
prices with (topoplan.bench.kv_bench): fitted on those sizes, checked on the KV sizes.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from topoplan.bench.definitions import parse_sizes
from topoplan.bench.kv_request import FIT_SIZES, MODES, PATHS, KvBenchRequest
from topoplan.errors import TopoplanError
from topoplan.rank_env import RankEnv
from topoplan.runner.dist import join_world
from topoplan.runner.process import rank_main
from topoplan.runner.shm import ShmChannels, usable

PREFILL, DECODE = 0, 1
SLOT_BYTES = 4 << 20  # bytes per shared-memory message: a layer of 8B at 1K tokens (bf16) is one; larger ones cut
SLOTS = 4  # messages in flight: the sender fills the next slots while the receiver copies out the first


class Path:
    """A one-way link from the prefill to the decode rank, and the way back for acknowledgements."""

    name: str

    def send(self, part: torch.Tensor) -> int:
        """Send `part` (bytes); the messages it took."""
        raise NotImplementedError

    def receive(self, part: torch.Tensor) -> int:
        """Receive into `part` (bytes); the bytes that arrived."""
        raise NotImplementedError

    def ack(self) -> None:
        raise NotImplementedError

    def wait_ack(self) -> None:
        raise NotImplementedError


class GlooPath(Path):
    """torch.distributed send/recv on the gloo backend: TCP over loopback between two processes."""

    name = "gloo"

    def __init__(self) -> None:
        self._flag = torch.zeros(1, dtype=torch.uint8)

    def send(self, part: torch.Tensor) -> int:
        dist.send(part, DECODE)
        return 1

    def receive(self, part: torch.Tensor) -> int:
        dist.recv(part, PREFILL)
        return part.numel()

    def ack(self) -> None:
        dist.send(self._flag, PREFILL)

    def wait_ack(self) -> None:
        dist.recv(self._flag, DECODE)


class ShmPath(Path):
    """The runner's shared-memory channels: channel 0 carries the cache (SLOT_BYTES a message), channel 1 the
    acknowledgements."""

    name = "shm"

    def __init__(self, timeout_s: float):
        self._channels = ShmChannels(dist.group.WORLD, [(PREFILL, DECODE), (DECODE, PREFILL)], timeout_s,
                                     slots=SLOTS, capacity=SLOT_BYTES)

    def send(self, part: torch.Tensor) -> int:
        chunks = part.split(SLOT_BYTES)
        for chunk in chunks:
            self._channels.send(0, [chunk.numel()], chunk)
        return len(chunks)

    def receive(self, part: torch.Tensor) -> int:
        got = 0
        for chunk in part.split(SLOT_BYTES):
            _, payload = self._channels.receive(0, out=chunk)
            got += 0 if payload is None else payload.numel()
        return got

    def ack(self) -> None:
        self._channels.send(1, [0], None)

    def wait_ack(self) -> None:
        self._channels.receive(1)


def parts_of(cache: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """What a connector sends in `mode`: the cache [layers, layer bytes] as one buffer, or each layer."""
    return [cache.view(-1)] if mode == "whole" else list(cache.unbind(0))


PERIOD = 251  # a prime: no slot, layer or chunk size is a multiple, so a misplaced chunk reads as wrong bytes
CHECK_BYTES = 64 << 20  # the pattern is written and compared this many bytes at a time (no cache-sized temporary)


def pattern(offset: int, n: int) -> torch.Tensor:
    """Bytes offset .. offset + n of the prefill rank's cache: 0, 1, .. 250, 0, 1, .. over the whole cache."""
    start = offset % PERIOD
    return torch.arange(PERIOD, dtype=torch.uint8).repeat(-(-(start + n) // PERIOD))[start:start + n]


def chunks(cache: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """(offset, bytes) of the cache, CHECK_BYTES at a time."""
    flat = cache.view(-1)
    for offset in range(0, flat.numel(), CHECK_BYTES):
        yield offset, flat[offset:offset + CHECK_BYTES]


def new_cache(rank: int, layers: int, layer_bytes: int) -> torch.Tensor:
    """A cache [layers, layer bytes]: the pattern on the prefill rank, zeros on the decode rank."""
    cache = torch.zeros(layers, layer_bytes, dtype=torch.uint8)
    if rank == PREFILL:
        for offset, chunk in chunks(cache):
            chunk.copy_(pattern(offset, chunk.numel()))
    return cache


def wrong_bytes(cache: torch.Tensor) -> int:
    return sum(int((chunk != pattern(offset, chunk.numel())).sum()) for offset, chunk in chunks(cache))


@dataclass(frozen=True)
class Point:
    path: str
    mode: str
    prompt_tokens: int  # 0 for the link-constant points (FIT_SIZES)
    layers: int
    layer_bytes: int
    bytes_moved: int  # what the decode rank received in the checked transfer
    messages: int  # messages the prefill rank sent per transfer
    time_us: float  # mean over iters
    median_us: float
    min_us: float
    wrong: int  # bytes of the decode rank's cache that differ from the prefill rank's after the checked transfer


def timed(path: Path, parts: list[torch.Tensor], rank: int, iters: int, warmup: int) -> tuple[list[float], int]:
    """Seconds of each transfer (on the prefill rank; [] on the decode rank) and the messages one took.

    A transfer runs from the prefill rank's first send to the decode rank's last byte, both read on
    CLOCK_MONOTONIC (time.monotonic), which every process of one host shares: one-way, with no round trip to
    take off. The acknowledgement only paces the iterations (the next send starts once the cache is in), outside
    the timed span."""
    stamps, messages = [], 0
    for i in range(warmup + iters):
        now = time.monotonic()  # the prefill rank's start
        if rank == PREFILL:
            messages = sum(path.send(p) for p in parts)
            path.wait_ack()
        else:
            for p in parts:
                path.receive(p)
            now = time.monotonic()  # the decode rank's end
            path.ack()
        if i >= warmup:
            stamps.append(now)
    ends = torch.tensor(stamps, dtype=torch.float64)
    dist.broadcast(ends, DECODE)  # the decode rank's ends, on both ranks
    return ((ends - torch.tensor(stamps, dtype=torch.float64)).tolist() if rank == PREFILL else []), messages


def checked(path: Path, cache: torch.Tensor, mode: str, rank: int) -> tuple[int, int]:
    """One more transfer into a zeroed cache: (bytes received, bytes wrong), agreed on both ranks."""
    got = wrong = 0
    if rank == PREFILL:
        for p in parts_of(cache, mode):
            path.send(p)
        path.wait_ack()
    else:
        cache.zero_()
        got = sum(path.receive(p) for p in parts_of(cache, mode))
        path.ack()
        wrong = wrong_bytes(cache)
    figures = torch.tensor([got, wrong], dtype=torch.int64)
    dist.broadcast(figures, DECODE)
    return int(figures[0]), int(figures[1])


def measure(path: Path, cache: torch.Tensor, mode: str, prompt_tokens: int, rank: int, iters: int,
            warmup: int) -> Point:
    dist.barrier()
    seconds, messages = timed(path, parts_of(cache, mode), rank, iters, warmup)
    got, wrong = checked(path, cache, mode, rank)
    us = [s * 1e6 for s in seconds] or [0.0]  # the decode rank has no times: only rank 0 reports
    return Point(path.name, mode, prompt_tokens, cache.shape[0], cache.shape[1], got, messages,
                 statistics.fmean(us), statistics.median(us), min(us), wrong)


def paths(timeout_s: float) -> list[Path]:
    """gloo always; shared memory where both ranks are CPU processes of one x86-64 host (collective)."""
    found: list[Path] = []
    for name in PATHS:
        if name == "gloo":
            found.append(GlooPath())
        elif usable(dist.group.WORLD, torch.device("cpu")):
            found.append(ShmPath(timeout_s))
    return found


def run(r: KvBenchRequest, env: RankEnv) -> dict[str, Any] | None:
    """Every path: its link-constant points, then every prompt length in both modes. Rank 0 returns the result."""
    if env.world_size != 2:
        raise TopoplanError(f"the KV transfer runs between 2 ranks (a prefill and a decode worker); {env.world_size} "
                            "were started")
    join_world(env, "gloo", r.timeout)
    rank = env.rank
    shapes = [(0, 1, size) for size in parse_sizes(FIT_SIZES)] + [(p, r.spec.layers, r.layer_bytes(p))
                                                                  for p in r.prompts]
    points = []
    for path in paths(r.timeout):
        for prompt, layers, layer_bytes in shapes:
            cache = new_cache(rank, layers, layer_bytes)
            for mode in MODES if prompt else ("whole",):
                points.append(measure(path, cache, mode, prompt, rank, r.iters, r.warmup))
            del cache  # before the next one: one cache per rank at a time
    if rank != PREFILL:
        return None
    return {"model": r.spec.name, "dtype": r.dtype, "iters": r.iters, "warmup": r.warmup,
            "slot_bytes": SLOT_BYTES, "slots": SLOTS,
            "points": [asdict(p) for p in points]}


def main(argv: list[str] | None = None) -> None:
    def body(env: RankEnv) -> str | None:
        result = run(KvBenchRequest.from_worker_argv(argv), env)
        return json.dumps(result) if result is not None else None

    rank_main("topoplan-bench-kv", body)


if __name__ == "__main__":
    main()
