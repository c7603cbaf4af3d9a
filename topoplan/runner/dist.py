"""torch.distributed start-up for the runner and the bench: backend, dtype check, process groups.

The groups are the ones topoplan.layout.RankGrid lists (TP fastest, then PP, then DP), the same lists the
planner places and prices: there is no second grid here.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from topoplan.dtypes import RUN_DTYPES, checked_dtype
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankCoords, RankGrid
from topoplan.rank_env import RankEnv, local_cuda_device
from topoplan.runner.shm import ShmChannels, ShmGroup, pipeline_channels, shm_group
from topoplan.vendors import TORCH_RUNTIMES, Vendor


def gpu_vendor() -> Vendor:
    """Whose runtime torch's `cuda` device and `nccl` backend are: AMD's (HIP, RCCL) under a ROCm build
    (torch.version.hip is set), which keeps torch's CUDA names, else NVIDIA's (topoplan.vendors)."""
    return TORCH_RUNTIMES["rocm" if getattr(torch.version, "hip", None) else "cuda"]


def choose_backend(requested: str | None) -> str:
    """NCCL (RCCL on ROCm) when a GPU is usable, gloo otherwise; `--backend` forces one."""
    if requested is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested not in ("nccl", "gloo"):
        raise TopoplanError(f"--backend {requested!r}: expected nccl or gloo")
    if requested == "nccl" and not torch.cuda.is_available():
        vendor = gpu_vendor()
        raise TopoplanError(f"--backend nccl needs a GPU ({vendor.runtime}, {vendor.collectives}), and torch sees no "
                            "GPU here")
    return requested


@dataclass
class CommTimer:
    """Wall time spent inside communication calls on this rank (including waiting for peers to arrive)."""

    seconds: float = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start


@dataclass
class Dist:
    """This rank's place in the layout and its process groups (None where the group has one member)."""

    layout: Layout
    rank: int
    coords: RankCoords
    device: torch.device
    backend: str
    tp_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None
    pp_ranks: list[int]
    timer: CommTimer = field(default_factory=CommTimer)
    ep_group: dist.ProcessGroup | None = None  # MoE expert parallelism (layout.ep > 1): this rank's EP group
    ep_rank: int = 0
    tp_shm: ShmGroup | None = None  # the TP group through shared memory, when all its ranks are CPU ranks of one host
    pp_shm: ShmChannels | None = None  # the pipeline stages' messages through shared memory, likewise
    ep_shm: ShmGroup | None = None  # the EP group's all-to-alls and all-gathers through shared memory, likewise

    def __post_init__(self) -> None:
        _LIVE[id(self)] = self  # the handle a compiled graph's collective names this rank's Dist by

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp_rank == self.layout.pp - 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the TP group, in place (the one collective of a row-parallel layer). Use the returned tensor:
        under torch.compile it is a new one (`traced_all_reduce`)."""
        if self.tp_group is None:
            return tensor
        if torch.compiler.is_compiling():
            return traced_all_reduce(tensor, id(self))
        with self.timer.timed():
            if self.tp_shm is not None and self.tp_shm.fits(tensor):
                self.tp_shm.all_reduce(tensor)
            else:
                dist.all_reduce(tensor, group=self.tp_group)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate the TP ranks' shards along the last dimension (vocab-parallel logits)."""
        if self.tp_group is None:
            return tensor
        if torch.compiler.is_compiling():
            return traced_all_gather_last_dim(tensor, id(self))
        if self.tp_shm is not None and self.tp_shm.fits(tensor):
            with self.timer.timed():
                return self.tp_shm.all_gather(tensor, dim=-1)
        parts = [torch.empty_like(tensor) for _ in range(self.layout.tp)]
        with self.timer.timed():
            dist.all_gather(parts, tensor.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=-1)

    def all_to_all(self, tensor: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
        """Over the EP group: counts[i][j] rows go from member i to member j, `tensor` holding this member's rows
        grouped by destination; returns the rows received, grouped by source (MoE dispatch and combine). Every
        member knows `counts`, so all agree whether shared memory holds it; gloo and NCCL run uneven splits."""
        me = self.ep_rank
        with self.timer.timed():
            if self.ep_shm is not None and self.ep_shm.all_to_all_fits(counts, tensor):
                return self.ep_shm.all_to_all(tensor, counts)
            out = tensor.new_empty((sum(sent[me] for sent in counts), *tensor.shape[1:]))
            dist.all_to_all_single(out, tensor.contiguous(), [sent[me] for sent in counts], counts[me],
                                   group=self.ep_group)
        return out

    def ep_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate the EP group's equal-sized slices along dim 0 (every token's MoE output on every rank)."""
        with self.timer.timed():
            if self.ep_shm is not None and self.ep_shm.fits(tensor):
                return self.ep_shm.all_gather(tensor, dim=0)
            parts = [torch.empty_like(tensor) for _ in range(self.layout.ep)]
            dist.all_gather(parts, tensor.contiguous(), group=self.ep_group)
        return torch.cat(parts)

    def broadcast_from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """Give every stage of this pipeline the last stage's tensor (the next tokens), in place."""
        if self.pp_group is not None:
            with self.timer.timed():
                dist.broadcast(tensor, src=self.pp_ranks[-1], group=self.pp_group)
        return tensor


_LIVE: weakref.WeakValueDictionary[int, Dist] = weakref.WeakValueDictionary()  # every Dist of this process, by id


@torch.library.custom_op("topoplan::tp_all_reduce", mutates_args=())
def traced_all_reduce(tensor: torch.Tensor, handle: int) -> torch.Tensor:
    """Dist.all_reduce as one opaque op of a compiled graph, for the Dist whose id is `handle`. Without it every
    collective is a graph break, and the timer's context manager around it made dynamo give up on whole frames
    (`tiny` TP2 ran eager after minutes of tracing); as an op, the layers between two collectives fuse as at
    TP1. Functional (a new tensor), as custom ops must be to be reordered safely."""
    return _LIVE[handle].all_reduce(tensor.clone())


@traced_all_reduce.register_fake
def _traced_all_reduce_shape(tensor: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.empty_like(tensor)


@torch.library.custom_op("topoplan::tp_all_gather_last_dim", mutates_args=())
def traced_all_gather_last_dim(tensor: torch.Tensor, handle: int) -> torch.Tensor:
    """Dist.all_gather_last_dim as one opaque op of a compiled graph (see traced_all_reduce)."""
    return _LIVE[handle].all_gather_last_dim(tensor)


@traced_all_gather_last_dim.register_fake
def _traced_all_gather_shape(tensor: torch.Tensor, handle: int) -> torch.Tensor:
    return tensor.new_empty((*tensor.shape[:-1], tensor.shape[-1] * _LIVE[handle].layout.tp))


def join_world(env: RankEnv, backend: str | None, timeout_s: float) -> tuple[str, torch.device]:
    """init_process_group over all ranks, with `timeout_s` on the rendezvous and every later collective."""
    backend = choose_backend(backend)
    visible_var = gpu_vendor().visible_devices
    device = (torch.device("cuda", local_cuda_device(env.local_rank, torch.cuda.device_count(), visible_var))
              if backend == "nccl" else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = rendezvous_store(env, timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=timeout_s))
    return backend, device


def rendezvous_store(env: RankEnv, timeout: timedelta) -> dist.TCPStore:
    """The rendezvous store, listening on MASTER_ADDR only (127.0.0.1 for one machine), not on every interface
    as TCPStore's own listener does: rank 0 binds the socket itself and hands it over (master_listen_fd).
    Under torchrun the agent already serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE): join it."""
    if env.rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in env.master_addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((env.master_addr, env.master_port))  # EADDRINUSE here makes spawn_ranks retry another port
    listener.listen(128)
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, True, timeout=timeout,
                          master_listen_fd=listener.detach())
    return store


def new_groups(groups: list[list[int]], timeout_s: float) -> tuple[list[int], dist.ProcessGroup]:
    """Create a process group for each rank list and return this rank's list and group.

    new_group is collective over the world, so every rank creates every group, in the same order, even the
    groups it is not in."""
    rank, mine = dist.get_rank(), None
    for ranks in groups:
        group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
        if rank in ranks:
            mine = (ranks, group)
    if mine is None:
        raise TopoplanError(f"rank {rank} is in none of the groups {groups}")
    return mine


def build_dist(layout: Layout, backend: str, device: torch.device, timeout_s: float,
               shared_memory: bool = True) -> Dist:
    """This rank's TP and PP groups for `layout` in the joined world (a group of one rank is None), and with
    `shared_memory` the TP and EP groups' collectives and the pipeline's messages through shared memory where the
    group's ranks share a host (topoplan.runner.shm)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != layout.world:
        raise TopoplanError(f"the launcher started {world} ranks but {layout} needs {layout.world}")
    grid = RankGrid(layout)
    # Groups of one rank are never created: every group of a kind has the same size, so all ranks skip alike.
    tp_group = new_groups(grid.tp_groups, timeout_s)[1] if layout.tp > 1 else None
    pp_group = new_groups(grid.pp_groups, timeout_s)[1] if layout.pp > 1 else None
    ep_ranks, ep_group = new_groups(grid.ep_groups, timeout_s) if layout.ep > 1 else ([rank], None)
    # shm_group is collective over the TP group, so every member reaches the same verdict
    tp_shm = shm_group(tp_group, device, timeout_s) if tp_group is not None and shared_memory else None
    pp_shm = pipeline_channels(pp_group, device, timeout_s) if pp_group is not None and shared_memory else None
    ep_shm = shm_group(ep_group, device, timeout_s) if ep_group is not None and shared_memory else None
    return Dist(layout, rank, grid.coords(rank), device, backend, tp_group, pp_group, grid.group_of("pp", rank),
                ep_group=ep_group, ep_rank=ep_ranks.index(rank), tp_shm=tp_shm, pp_shm=pp_shm, ep_shm=ep_shm)


def init_dist(env: RankEnv, layout: Layout, backend: str | None, timeout_s: float, shared_memory: bool = True) -> Dist:
    """Join the job and build this rank's groups."""
    if env.world_size != layout.world:
        raise TopoplanError(f"the launcher started {env.world_size} ranks but {layout} needs {layout.world}")
    backend, device = join_world(env, backend, timeout_s)
    return build_dist(layout, backend, device, timeout_s, shared_memory)


def usable_dtype(name: str, device: torch.device) -> torch.dtype:
    """The requested dtype if the backend can reduce it, else float32 with a warning (gloo bf16 on old torch).

    Checked by doing it: one small all-reduce over the world; every rank reaches the same verdict.
    """
    dtype = checked_dtype(name, RUN_DTYPES).torch()
    if dtype is torch.float32:
        return dtype
    try:
        dist.all_reduce(torch.ones(2, dtype=dtype, device=device))
    except (RuntimeError, ValueError) as error:
        if dist.get_rank() == 0:
            print(f"topoplan: warning: backend {dist.get_backend()} cannot all-reduce {name} "
                  f"({str(error).splitlines()[0]}); running in float32", file=sys.stderr)
        return torch.float32
    return dtype
