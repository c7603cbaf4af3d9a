"""Start bench and runner ranks on this machine with the machinery of `topoplan run` (topoplan.runner.spawn
and its per-rank environment), and read back rank 0's JSON.

Imports no torch: the parent process only starts children and reads their output.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.runner.local import rank_env
from topoplan.runner.spawn import spawn_ranks


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def spawn_json(world: int, module: str, args: Sequence[str], *, timeout_s: float | None = None, echo: bool = True,
               what: str = "ranks", extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m module args` as `world` ranks, each with `topoplan run`'s per-rank environment (the
    cores shared out as OMP_NUM_THREADS; rank 0 draws its progress bar on our terminal when `echo`);
    rank 0's last stdout line parsed as JSON."""
    cores, progress = cpu_cores(), echo and sys.stderr.isatty()
    result = spawn_ranks(world, [sys.executable, "-m", module, *args],
                         env_per_rank=lambda rank: {**rank_env(rank, world, cores, progress), **(extra_env or {})},
                         timeout_s=timeout_s, capture_stdout=True, echo=echo)
    if result.returncode != 0:
        tail = [line for line in result.stderr if "error" in line.lower() or "failed" in line.lower()][-1:]
        why = tail[0] if tail else (result.stderr[-1] if result.stderr else "no output")
        if result.returncode == 2 and "error:" in why:  # a user error reported by a rank: pass it on as is
            raise TopoplanError(why.split("error: ", 1)[1])
        raise TopoplanError(f"{what} failed (rank {result.failed_rank}, exit {result.returncode}): {why}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise TopoplanError(f"{what}: rank 0 printed no JSON result") from None
