"""Start bench and runner ranks on this machine with the machinery of `topoplan run` (topoplan.runner.spawn
and its per-rank environment), and read back rank 0's JSON.

Imports no torch: the parent process only starts children and reads their output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.runner.local import local_ranks
from topoplan.runner.spawn import spawn_ranks


def spawn_json(world: int, module: str, args: Sequence[str], *, timeout_s: float | None = None, echo: bool = True,
               what: str = "ranks", extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m module args` as `world` ranks, each with `topoplan run`'s per-rank environment (each
    pinned to its own CPUs with OMP_NUM_THREADS to match; rank 0 draws its progress bar on our terminal when `echo`);
    rank 0's last stdout line parsed as JSON."""
    ranks = local_ranks(world, progress=echo and sys.stderr.isatty())
    result = spawn_ranks(world, [sys.executable, "-m", module, *args],
                         env_per_rank=lambda rank: {**ranks[rank].env, **(extra_env or {})},
                         cpus_per_rank=lambda rank: ranks[rank].cpus,
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
