"""Collectives through shared memory for the ranks of one process group that run on the same host (CPU).

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

import mmap
import os
import platform
import socket
import time
import uuid

import torch
import torch.distributed as dist

LINE = 64  # bytes per member header line (its counter, then its pid): one cache line each, not shared
SHM_DIR = "/dev/shm"
DEFAULT_CAPACITY = 8 << 20  # bytes per member per parity: decode and short prefills; larger calls use gloo
SPINS_BEFORE_CLOCK = 1024  # counter reads between deadline checks


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


def alive(pid: int) -> bool:
    """Whether process `pid` is still running (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class ShmGroup:
    """Shared-memory all-reduce (sum) and all-gather for the members of one process group on one host."""

    def __init__(self, group: dist.ProcessGroup, timeout_s: float, capacity: int = DEFAULT_CAPACITY):
        self.size, self.me = dist.get_world_size(group), dist.get_rank(group)
        self.capacity, self.timeout_s, self.calls = capacity, timeout_s, 0
        header = LINE * self.size
        nbytes = header + 2 * self.size * capacity
        names = [f"topoplan-{uuid.uuid4().hex}" if self.me == 0 else ""]
        dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
        path = os.path.join(SHM_DIR, names[0])
        try:
            if self.me == 0:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.ftruncate(fd, nbytes)
                self._map = mmap.mmap(fd, nbytes)
                os.close(fd)
            dist.barrier(group=group)  # created and sized before the others open it
            if self.me != 0:
                fd = os.open(path, os.O_RDWR)
                self._map = mmap.mmap(fd, nbytes)
                os.close(fd)
        finally:
            dist.barrier(group=group)  # everyone has mapped it: the name is no longer needed
            if self.me == 0:
                os.unlink(path)
        self._counters = memoryview(self._map)[:header].cast("q")  # counter of member i at index i * LINE / 8
        self._counters[self.me * (LINE // 8) + 1] = os.getpid()  # so a waiting peer can tell this process died
        dist.barrier(group=group)
        self._slots = torch.frombuffer(self._map, dtype=torch.uint8, offset=header).view(2, self.size, capacity)

    def fits(self, tensor: torch.Tensor) -> bool:
        return tensor.numel() * tensor.element_size() <= self.capacity

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Publish `tensor`, wait for every member's, and return all members' tensors (views of the segment,
        valid until this member's next call but one)."""
        self.calls += 1
        nbytes = tensor.numel() * tensor.element_size()
        slots = self._slots[self.calls % 2, :, :nbytes]
        slots[self.me].view(tensor.dtype).view(tensor.shape).copy_(tensor)
        step = LINE // 8
        self._counters[self.me * step] = self.calls
        for peer in range(self.size):
            if peer != self.me:
                self._wait(peer * step)
        return [slots[i].view(tensor.dtype).view(tensor.shape) for i in range(self.size)]

    def _wait(self, index: int) -> None:
        """Spin until the counter at `index` reaches this call, yielding the core to any other runnable thread
        (a loaded host) on every turn; fail when the peer's process has ended, or after the timeout (a frozen
        peer), as gloo does."""
        counters, target, spins = self._counters, self.calls, 0
        deadline = None
        while counters[index] < target:
            os.sched_yield()
            spins += 1
            if spins % SPINS_BEFORE_CLOCK == 0:
                now = time.monotonic()
                deadline = deadline or now + self.timeout_s
                member = index * 8 // LINE
                if not alive(counters[index + 1]):
                    raise RuntimeError(f"shared-memory collective: member {member} of the group (pid "
                                       f"{counters[index + 1]}) has ended")
                if now > deadline:
                    raise RuntimeError(f"shared-memory collective: member {member} of the group did not arrive "
                                       f"within {self.timeout_s:g} s")

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
