"""`topoplan bench`'s options, checked in the parent before any rank starts, and turned into the worker's argv.

Imports no torch: the CLI calls this at start-up cost only.
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.atomic import check_folder
from topoplan.bench.definitions import parse_ops, parse_sizes
from topoplan.dtypes import BENCH_DTYPES
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.bench.limits import RANKS_PER_CPU, max_local_ranks
from topoplan.runner.options import check_common



@dataclass(frozen=True)
class BenchJob:
    """What to start: `world` ranks of `python -m topoplan.bench.worker argv`."""

    world: int
    argv: list[str]


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


def bench_job(*, ops: str, sizes: str, ranks: int | None, layout: str | None, groups: str | None,
              backend: str | None, dtype: str, iters: int, warmup: int, timeout: float, plot: str | None) -> BenchJob:
    """Refuse bad options (one TopoplanError) and return the job; `groups` None means not given."""
    parse_ops(ops), parse_sizes(sizes)
    check_common(backend=backend, dtype=dtype, dtypes=BENCH_DTYPES, timeout=timeout)
    if plot is not None:
        if not plot.lower().endswith(".svg"):
            raise TopoplanError(f"--plot {plot!r}: the chart is SVG; expected a file name ending in .svg")
        check_folder(plot)
    if layout is not None and ranks is not None:
        raise TopoplanError("--ranks and --layout both set the rank count: pass one")
    if groups is not None and layout is None:
        raise TopoplanError("--groups needs --layout (without it the collectives run over all ranks)")
    group = groups or "tp"
    if group not in ("tp", "pp", "dp"):
        raise TopoplanError(f"--groups {group!r}: expected tp, pp or dp")
    if ranks is not None and ranks < 1:
        raise TopoplanError(f"--ranks {ranks}: expected at least 1")
    world = Layout.parse(layout).world if layout is not None else (default_ranks() if ranks is None else ranks)
    limit = max_local_ranks()
    if world > limit:
        raise TopoplanError(f"{world} ranks: at most {limit} ({RANKS_PER_CPU} per usable CPU) start on this machine")
    argv = ["--ops", ops, "--sizes", sizes, "--iters", str(iters), "--warmup", str(warmup), "--dtype", dtype,
            "--timeout", str(timeout)] + (["--backend", backend] if backend else []) \
        + (["--layout", layout, "--group", group] if layout is not None else [])
    return BenchJob(world, argv)
