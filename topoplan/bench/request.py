"""`topoplan bench`'s request, checked in the parent before any rank starts, and turned into the worker's argv.

Imports no torch: the CLI calls this at start-up cost only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from topoplan.atomic import check_folder
from topoplan.bench.definitions import (
    DEFAULT_DTYPE,
    DEFAULT_ITERS,
    DEFAULT_OPS,
    DEFAULT_SIZES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP,
    OPS,
    ROOTED,
    human_size,
    parse_ops,
    parse_redop,
    parse_sizes,
)
from topoplan.dtypes import BENCH_DTYPES
from topoplan.errors import TopoplanError
from topoplan.layout import GROUP_KINDS, Layout
from topoplan.limits import RANKS_PER_CPU, check_count, max_local_ranks
from topoplan.option_fields import build, option, options_of
from topoplan.run_options import check_common


def default_ranks() -> int:
    """Every GPU NVML sees, else 2 CPU ranks."""
    try:
        import pynvml
    except ImportError:
        return 2
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no library: a CPU machine
        return 2
    try:
        return pynvml.nvmlDeviceGetCount() or 2
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class BenchRequest:
    """A collective sweep: checked and parsed once, in the parent (`topoplan bench`, calibrate), and handed to
    each rank as argv (`worker_argv`), which the ranks read back with `from_worker_argv`. The options live here
    only (topoplan.option_fields): the CLI shows them, the worker inherits them."""

    ops: tuple[str, ...] = field(default=OPS, metadata=option(
        "--ops", type=str, default=DEFAULT_OPS, parse=lambda text: tuple(parse_ops(text)),
        help="Comma-separated collectives; ops the backend lacks are listed as skipped."))
    sizes: tuple[int, ...] = field(default=tuple(parse_sizes(DEFAULT_SIZES)), metadata=option(
        "--sizes", type=str, default=DEFAULT_SIZES, parse=lambda text: tuple(parse_sizes(text)),
        help="LO:HI doubling (4K:256M, powers of 1024) or a list 4K,1M."))
    ranks: int | None = field(default=None, metadata=option(  # None: one per GPU, else 2 (or the layout's world)
        "--ranks", help="Ranks to start on this machine (default: GPUs, else 2; at most 8 per CPU)."))
    layout: Layout | None = field(default=None, metadata=option(  # run inside this layout's groups
        "--layout", type=str, parse=Layout.parse, help="tp=..,pp=..,dp=..: run inside this layout's groups (see "
        "--groups); starts layout.world ranks."))
    groups: str | None = field(default=None, metadata=option(  # which of the layout's groups: tp (default), pp or dp
        "--groups", help="With --layout: which groups run the collectives (tp, pp, dp; default tp), all at once, as "
        "the runner would."))
    backend: str | None = field(default=None, metadata=option(  # None: nccl when CUDA is available
        "--backend", help="nccl or gloo (default: nccl when CUDA is available)."))
    dtype: str = field(default=DEFAULT_DTYPE, metadata=option("--dtype", help="float32, bfloat16, float16 or "
                                                              "float8_e4m3fn."))
    iters: int = field(default=DEFAULT_ITERS, metadata=option("--iters", min=1, help="Timed operations per point."))
    warmup: int = field(default=DEFAULT_WARMUP, metadata=option("--warmup", min=0, help="Untimed operations before "
                                                                "each point."))
    timeout: float = field(default=DEFAULT_TIMEOUT_S, metadata=option("--timeout", help="Seconds for rendezvous and "
                                                                      "each collective."))
    plot: str | None = field(default=None, metadata=option("--plot", help="Write busbw vs size as an SVG chart to "
                                                           "this .svg file."))
    check: bool = field(default=False, metadata=option("--check", "-c", help="Verify every result (nccl-tests' -c): "
                                                       "the #wrong column counts the wrong elements over all ranks."))
    redop: str = field(default="sum", metadata=option(  # the reducing ops' reduction (nccl-tests' -o)
        "--redop", "-o", help="Reduction of all_reduce, reduce and reduce_scatter: sum, prod, min, max or avg (avg: "
        "NCCL only)."))
    root: int = field(default=0, metadata=option(  # the rooted ops' root, a place in the group (nccl-tests' -r)
        "--root", "-r", help="Root of broadcast, reduce, gather and scatter (a rank of the group)."))
    shared_memory: bool = field(default=False, metadata=option(  # as the runner runs them on one host
        "--shared-memory", help="all_reduce (sum), all_to_all and sendrecv between CPU ranks of one host through "
        "shared memory, as `topoplan run`'s TP/EP groups and pipeline stages do (gloo else)."))

    def __post_init__(self) -> None:
        parse_redop(self.redop)
        if self.root < 0:
            raise TopoplanError(f"--root {self.root}: expected a rank of the group, 0 or more")
        if not self.ops or any(op not in OPS for op in self.ops):
            parse_ops(",".join(self.ops))  # names the unknown ones
        if not self.sizes or min(self.sizes) < 1:
            raise TopoplanError(f"--sizes {self.sizes}: expected positive byte counts")
        check_common(backend=self.backend, dtype=self.dtype, dtypes=BENCH_DTYPES, timeout=self.timeout)
        check_count("--iters", self.iters)
        check_count("--warmup", self.warmup)
        if self.plot is not None:
            if not self.plot.lower().endswith(".svg"):
                raise TopoplanError(f"--plot {self.plot!r}: the chart is SVG; expected a file name ending in .svg")
            check_folder(self.plot)
        if self.layout is not None and self.ranks is not None:
            raise TopoplanError("--ranks and --layout both set the rank count: pass one")
        if self.groups is not None and self.layout is None:
            raise TopoplanError("--groups needs --layout (without it the collectives run over all ranks)")
        if self.groups is not None and self.groups not in GROUP_KINDS:
            raise TopoplanError(f"--groups {self.groups!r}: expected tp, pp or dp")
        if self.ranks is not None and self.ranks < 1:
            raise TopoplanError(f"--ranks {self.ranks}: expected at least 1")

    @classmethod
    def from_options(cls, **given: Any) -> BenchRequest:
        """From the command line's values (`--ops a,b`, `--sizes 4K:64M`, `--layout tp=2,dp=2` as strings); the
        options not given take their defaults."""
        unknown = set(given) - {f.name for f, _ in options_of(cls)}
        if unknown:
            raise TypeError(f"BenchRequest.from_options: no option {', '.join(sorted(unknown))}")
        return build(cls, given)

    @property
    def group(self) -> str:
        """The group kind the collectives run in: the layout's `groups` (tp by default), else the world."""
        return (self.groups or "tp") if self.layout is not None else "world"

    def group_size(self, world: int) -> int:
        """Ranks in each group the collectives run in, out of `world` started."""
        if self.layout is None:
            return world
        return {"tp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp}[self.group]

    def world(self) -> int:
        """Ranks to start, at most RANKS_PER_CPU per usable CPU (asks NVML for the GPU count by default); a root
        outside the groups is refused here, where the group size is first known."""
        world = self.layout.world if self.layout is not None else (default_ranks() if self.ranks is None
                                                                   else self.ranks)
        limit = max_local_ranks()
        if world > limit:
            raise TopoplanError(f"{world} ranks: at most {limit} ({RANKS_PER_CPU} per usable CPU) start on this "
                                "machine")
        size = self.group_size(world)
        if self.root >= size and any(op in ROOTED for op in self.ops):
            raise TopoplanError(f"--root {self.root}: the groups have {size} rank(s); expected 0 to {size - 1}")
        return world

    def check_backend(self, world: int) -> None:
        """`--backend nccl` needs a CUDA device per rank: refused here, in one line, before any rank starts
        (otherwise every rank fails alone and says so). Imports torch, and only for an explicit nccl."""
        if self.backend != "nccl":
            return
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world:
            raise TopoplanError(f"--backend nccl: {world} rank(s) need a CUDA device each; torch sees {have} "
                                "(use --backend gloo on CPUs)")

    def worker_argv(self) -> list[str]:
        """The argv of `python -m topoplan.bench.sweep_worker` for this request (what `from_worker_argv` reads)."""
        return (["--ops", ",".join(self.ops), "--sizes", ",".join(human_size(s) for s in self.sizes),
                 "--iters", str(self.iters), "--warmup", str(self.warmup), "--dtype", self.dtype,
                 "--timeout", str(self.timeout)] + (["--backend", self.backend] if self.backend else [])
                + (["--layout", str(self.layout)] if self.layout is not None else [])
                + (["--groups", self.groups] if self.groups is not None else [])
                + ["--redop", self.redop, "--root", str(self.root)] + (["--check"] if self.check else [])
                + (["--shared-memory"] if self.shared_memory else []))

    @classmethod
    def from_worker_argv(cls, argv: Sequence[str] | None = None) -> BenchRequest:
        """A rank's request from its argv (the worker also runs under torchrun with options typed by hand)."""
        parser = argparse.ArgumentParser(prog="python -m topoplan.bench.sweep_worker")
        for name in ("ops", "sizes", "layout", "groups", "backend", "dtype", "iters", "warmup", "timeout", "redop",
                     "root"):
            parser.add_argument(f"--{name}", default=None)
        parser.add_argument("--check", action="store_true", default=None)
        parser.add_argument("--shared-memory", action="store_true", default=None)
        given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        for name, kind in (("iters", int), ("warmup", int), ("timeout", float), ("root", int)):
            if name in given:
                try:
                    given[name] = kind(given[name])
                except ValueError:
                    raise TopoplanError(f"--{name} {given[name]!r}: expected a number") from None
        return cls.from_options(**given)
