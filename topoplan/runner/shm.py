"""Collectives and pipeline channels through shared memory for the ranks of one process group that run on
the same host (CPU).

Why: gloo moves even a 4 KiB all-reduce through TCP sockets and a helper thread per rank, ~0.5-1 ms on
loopback, and a TP decode step makes two of them per layer; ranks on one host can read each other's memory
instead (vLLM's CPU backend does the same with its C++ shared-memory all-reduce). Across hosts, and on GPUs,
the runner stays on gloo/NCCL: this is not a transport between machines.

Protocol (one segment per group, in /dev/shm, unlinked as soon as every member has mapped it, so a killed
job leaves nothing behind): each member owns a sequence counter on its own cache line and, per parity, one
slot of `capacity` bytes. Call n: write my tensor into slot[n % 2][me], publish counter = n, wait until every
peer's counter is >= n, then read all slots. Two parities make this safe without a second barrier: a member
overwrites slot[n % 2] at call n + 2 only after every peer published n + 1, which each does only after it
finished reading call n. Every member sums the slots in member order, so all get bit-identical results,
as with gloo.

Ordering: the data stores must be visible before the counter store. x86-64 keeps stores in order (TSO), so
plain stores suffice; on other architectures (Arm's weaker model) `usable` says no and gloo is used.
"""

from __future__ import annotations

import math
import mmap
import os
import platform
import socket
import time
from contextlib import suppress

import torch
import torch.distributed as dist

from topoplan.runner.shm_names import SHM_DIR, new_segment_name

LINE = 64  # bytes per member header line (its counter, then its pid): one cache line each, not shared
DEFAULT_CAPACITY = 8 << 20  # bytes per member per parity: decode and short prefills; larger calls use gloo
SPINS_BEFORE_CLOCK = 1024  # counter reads between deadline checks
CACHED_SHAPES = 64  # ShmGroup keeps its slot views for this many call shapes (decode's few, the first prefills')


def usable(group: dist.ProcessGroup, device: torch.device) -> bool:
    """True when every member of `group` is a CPU rank on this host and the host keeps stores in order.

    Collective over `group` (every member must call it): members compare host names."""
    here = socket.gethostname() if device.type == "cpu" and os.path.isdir(SHM_DIR) else ""
    names: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(names, here, group=group)
    return platform.machine() in ("x86_64", "AMD64") and all(names) and len(set(names)) == 1


def shm_group(group: dist.ProcessGroup, device: torch.device, timeout_s: float) -> ShmGroup | None:
    """The group's shared-memory collectives where `usable`, else None (gloo/NCCL). Collective over `group`."""
    return ShmGroup(group, timeout_s) if usable(group, device) else None


def pipeline_channels(group: dist.ProcessGroup, device: torch.device, timeout_s: float) -> ShmChannels | None:
    """The pipeline group's stage-to-stage channels in shared memory where `usable`, else None (gloo/NCCL):
    activations from each stage to the next and tokens from the last stage back to the first. Collective."""
    stages = dist.get_world_size(group)
    pairs = [(i, i + 1) for i in range(stages - 1)] + [(stages - 1, 0)]
    return ShmChannels(group, pairs, timeout_s) if usable(group, device) else None


def alive(pid: int) -> bool:
    """Whether process `pid` is still running (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def shared_segment(group: dist.ProcessGroup, nbytes: int) -> mmap.mmap:
    """A zeroed /dev/shm mapping of `nbytes` shared by every member of `group` (collective): member 0 creates it,
    the others map it, and its name is unlinked as soon as all have, so nothing outlives the job.

    Member 0 unlinks on every path it survives: after the last barrier, or when a barrier raises because a peer
    died (no barrier runs in `finally`: one that raises there would skip the unlink). A member 0 killed before
    the unlink leaves the name to its spawner (topoplan.runner.shm_names)."""
    me = dist.get_rank(group)
    names = [new_segment_name() if me == 0 else ""]
    dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
    path = os.path.join(SHM_DIR, names[0])
    try:
        if me == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, nbytes)
            mapped = mmap.mmap(fd, nbytes)
            os.close(fd)
        dist.barrier(group=group)  # created and sized before the others open it
        if me != 0:
            fd = os.open(path, os.O_RDWR)
            mapped = mmap.mmap(fd, nbytes)
            os.close(fd)
        dist.barrier(group=group)  # everyone has mapped it: the name is no longer needed
    finally:
        if me == 0:
            with suppress(FileNotFoundError):  # never created (os.open failed)
                os.unlink(path)
    return mapped


def wait_for(counters: memoryview, index: int, target: int, who: str, timeout_s: float, what: str) -> None:
    """Spin until counters[index] >= target, yielding the core to any other runnable thread (a loaded host) on
    every turn. counters[index + 1] holds the pid of the process that advances it: fail as soon as that process
    has ended, or after `timeout_s` (a frozen peer), as gloo does."""
    spins, deadline = 0, None
    while counters[index] < target:
        os.sched_yield()
        spins += 1
        if spins % SPINS_BEFORE_CLOCK == 0:
            now = time.monotonic()
            deadline = deadline or now + timeout_s
            if not alive(counters[index + 1]):
                raise RuntimeError(f"{what}: {who} (pid {counters[index + 1]}) has ended")
            if now > deadline:
                raise RuntimeError(f"{what}: {who} did not arrive within {timeout_s:g} s")


class ShmGroup:
    """Shared-memory all-reduce (sum), all-gather and all-to-all for the members of one process group on one host."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float, capacity: int = DEFAULT_CAPACITY):
        self.size, self.me = dist.get_world_size(group), dist.get_rank(group)
        self.capacity, self.timeout_s, self.calls = capacity, timeout_s, 0
        header = LINE * self.size
        self._map = shared_segment(group, header + 2 * self.size * capacity)
        self._counters = memoryview(self._map)[:header].cast("q")  # counter of member i at index i * LINE / 8
        self._counters[self.me * (LINE // 8) + 1] = os.getpid()  # so a waiting peer can tell this process died
        dist.barrier(group=group)
        self._slots = torch.frombuffer(self._map, dtype=torch.uint8, offset=header).view(2, self.size, capacity)
        self._views: dict[tuple, tuple[list[torch.Tensor], ...]] = {}  # _slot_views by (dtype, shape)

    def fits(self, tensor: torch.Tensor) -> bool:
        return tensor.numel() * tensor.element_size() <= self.capacity

    def _exchange(self, tensor: torch.Tensor, rows: list[int] | None = None) -> list[torch.Tensor]:
        """Publish `tensor`, wait for every member's, and return all members' tensors (views of the segment,
        valid until this member's next call but one). `rows`: each member's dim-0 size, where they differ."""
        self.calls += 1
        key = (tensor.dtype, tuple(tensor.shape))
        views = self._views.get(key) if rows is None else None
        if views is None:
            views = self._slot_views(tensor, rows)
            if rows is None and len(self._views) < CACHED_SHAPES:
                self._views[key] = views
        parts = views[self.calls % 2]
        parts[self.me].copy_(tensor)
        step = LINE // 8
        self._counters[self.me * step] = self.calls
        for peer in range(self.size):
            if peer != self.me:
                self._wait(peer * step)
        return parts

    def _slot_views(self, tensor: torch.Tensor, rows: list[int] | None) -> tuple[list[torch.Tensor], ...]:
        """Per parity, every member's slot seen as its tensor of a call shaped like `tensor` (`rows`: each member's
        dim-0 size, where they differ). Kept per shape for calls without `rows` (CACHED_SHAPES): building the views
        cost a 4 KiB all-reduce 20 us a call where the exchange costs 4 (2 ranks, back to back, the Intel VM)."""
        row_shape = tuple(tensor.shape[1:])
        shapes = [(n, *row_shape) for n in rows] if rows is not None else [tuple(tensor.shape)] * self.size
        row_bytes = tensor.element_size() * math.prod(row_shape)
        return tuple([slots[i, :shape[0] * row_bytes if shape else row_bytes].view(tensor.dtype).view(shape)
                      for i, shape in enumerate(shapes)] for slots in self._slots)

    def _wait(self, index: int) -> None:
        wait_for(self._counters, index, self.calls, f"member {index * 8 // LINE} of the group", self.timeout_s,
                 "shared-memory collective")

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group into `tensor`, in place; members added in order, so every member gets the same bits."""
        parts = self._exchange(tensor)
        torch.add(parts[0], parts[1], out=tensor)
        for part in parts[2:]:
            tensor.add_(part)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """The members' tensors concatenated along `dim`, in member order."""
        return torch.cat(self._exchange(tensor), dim=dim)

    def all_to_all_fits(self, counts: list[list[int]], tensor: torch.Tensor) -> bool:
        """Whether an all_to_all of `counts` rows shaped like `tensor`'s fits every member's slot: the same verdict
        on every member (all know `counts` and the row shape, even one sending no rows)."""
        row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()
        return max(sum(sent) for sent in counts) * row_bytes <= self.capacity

    def all_to_all(self, tensor: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
        """counts[i][j] rows go from member i to member j; `tensor` holds this member's rows grouped by
        destination, in member order. Returns the rows received, grouped by source in member order."""
        parts = self._exchange(tensor, rows=[sum(sent) for sent in counts])
        received = []
        for i, part in enumerate(parts):
            start = sum(counts[i][:self.me])
            received.append(part[start:start + counts[i][self.me]])
        return torch.cat(received)


class ShmChannels:
    """One-way message queues through shared memory between members of one process group on one host: the
    stages of a pipeline. Channel i carries messages from member pairs[i][0] to member pairs[i][1], in order,
    at most `slots` unread (a sender finding them all unread waits). A message is a few int64 words (`meta`,
    at most META_WORDS) and optionally a tensor of up to `capacity` bytes; a larger tensor is the caller's to
    send another way, after the message that says so (send returns False), so the order holds.

    Each channel has two counters on their own cache lines, messages written (advanced by the sender) and read
    (by the receiver), each followed by its writer's pid; a slot is written before the count that publishes it
    and read before the count that frees it (x86-64 store order, as ShmGroup)."""

    META_WORDS = 14
    SLOT_HEADER = 16 * 8  # meta words, their count, the payload's bytes (-1: not in the slot)

    def __init__(self, group: dist.ProcessGroup, pairs: list[tuple[int, int]], timeout_s: float, slots: int = 8,
                 capacity: int = 1 << 20):
        self.me, self.pairs, self.slots, self.capacity = dist.get_rank(group), pairs, slots, capacity
        self.timeout_s = timeout_s
        header = 2 * LINE * len(pairs)
        slot_bytes = self.SLOT_HEADER + capacity
        self._map = shared_segment(group, header + len(pairs) * slots * slot_bytes)
        self._counters = memoryview(self._map)[:header].cast("q")
        for i, (src, dst) in enumerate(pairs):
            if self.me in (src, dst):
                self._counters[self._index(i, reader=self.me == dst) + 1] = os.getpid()
        dist.barrier(group=group)
        body = torch.frombuffer(self._map, dtype=torch.uint8, offset=header).view(len(pairs), slots, slot_bytes)
        self._heads = body[:, :, :self.SLOT_HEADER].view(torch.int64)  # [channel, slot, 16]
        self._payloads = body[:, :, self.SLOT_HEADER:]
        self._done = [0] * len(pairs)  # messages this member wrote (as sender) or read (as receiver), per channel

    @staticmethod
    def _index(channel: int, reader: bool) -> int:
        return (2 * channel + reader) * LINE // 8

    def send(self, channel: int, meta: list[int], payload: torch.Tensor | None) -> bool:
        """Queue a message; True when `payload` (if any) travelled in it."""
        n = self._done[channel]
        wait_for(self._counters, self._index(channel, reader=True), n - self.slots + 1,
                 f"member {self.pairs[channel][1]} of the pipeline", self.timeout_s, "shared-memory pipeline")
        slot = n % self.slots
        nbytes = -1 if payload is None else payload.numel() * payload.element_size()
        inline = 0 <= nbytes <= self.capacity
        if inline:
            self._payloads[channel, slot, :nbytes].view(payload.dtype).view(payload.shape).copy_(payload)
        head = self._heads[channel, slot]
        head[:len(meta)] = torch.tensor(meta, dtype=torch.int64)
        head[self.META_WORDS], head[self.META_WORDS + 1] = len(meta), nbytes if inline else -1
        self._done[channel] = n + 1
        self._counters[self._index(channel, reader=False)] = n + 1
        return inline or payload is None

    def receive(self, channel: int, out: torch.Tensor | None = None) -> tuple[list[int], torch.Tensor | None]:
        """The channel's next message: its meta words and its payload's bytes (a copy; None when it carried
        none, the sender then sends the tensor another way). `out`: copy the payload into these bytes (a uint8
        tensor at least that long; the result is its first bytes), so a receiver filling its own buffer (a KV
        cache) copies once."""
        n = self._done[channel]
        wait_for(self._counters, self._index(channel, reader=False), n + 1,
                 f"member {self.pairs[channel][0]} of the pipeline", self.timeout_s, "shared-memory pipeline")
        slot = n % self.slots
        head = self._heads[channel, slot].tolist()
        meta, nbytes = head[:head[self.META_WORDS]], head[self.META_WORDS + 1]
        payload = None
        if nbytes >= 0:
            source = self._payloads[channel, slot, :nbytes]
            payload = source.clone() if out is None else out[:nbytes].copy_(source)
        self._done[channel] = n + 1
        self._counters[self._index(channel, reader=True)] = n + 1
        return meta, payload
