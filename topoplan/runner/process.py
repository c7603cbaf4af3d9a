"""The scaffold every rank process shares (the runner's worker and the bench's): who this rank is, a progress
bar on rank 0, and an end that cannot hang. Group creation is topoplan.runner.dist.new_groups.

A rank always ends with os._exit, so a dead peer cannot keep it waiting in interpreter shutdown (atexit
hooks, a process group's destructor): exit 2 for a user error, 1 for a failure (a peer died, a timeout),
each said in one line on stderr, `<prog>: rank N: error: ...` / `failed: ...`.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from topoplan.errors import TopoplanError
from topoplan.rank_env import RankEnv, discover_rank_env


class Progress:
    """A rich progress bar on stderr, or nothing: `Progress.on_rank(env.rank, quiet)` enables it on rank 0 when
    stderr is a terminal, or when the spawner pipes it to one (it says so with TOPOPLAN_PROGRESS=1)."""

    def __init__(self, enabled: bool, force_terminal: bool = False):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            console = Console(stderr=True, force_terminal=force_terminal or None)
            self.bar = RichProgress(transient=True, console=console)

    @classmethod
    def on_rank(cls, rank: int, quiet: bool = False) -> Progress:
        forced = os.environ.get("TOPOPLAN_PROGRESS") == "1"
        return cls(rank == 0 and not quiet and (forced or sys.stderr.isatty()), forced)

    def __enter__(self) -> Progress:
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.__exit__(*exc)

    def task(self, label: str, total: int | None = None) -> Callable[..., None]:
        """An update(completed, total, label) function for a new bar (total or label None: keep the current)."""
        if self.bar is None:
            return lambda completed, total=None, label=None: None
        task_id = self.bar.add_task(label, total=total)

        def update(completed: int, new_total: int | None = None, new_label: str | None = None) -> None:
            self.bar.update(task_id, completed=completed, **({"total": new_total} if new_total is not None else {}),
                            **({"description": new_label} if new_label is not None else {}))

        return update


def rank_main(prog: str, body: Callable[[RankEnv], str | None]) -> NoReturn:
    """Run one rank: `body(env)` returns what to print on stdout (rank 0's result) or None; then end the process
    with os._exit and the exit code of what happened (0, 2 for a TopoplanError, 1 otherwise)."""
    rank, code = "?", 0
    try:
        env = discover_rank_env()
        rank = str(env.rank)
        out = body(env)
        if out is not None:
            print(out, flush=True)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except TopoplanError as error:
        print(f"{prog}: rank {rank}: error: {error}", file=sys.stderr)
        code = error.exit_code
    except (RuntimeError, TimeoutError, ConnectionError) as error:  # a dead peer, a timeout: one line, no hang
        first = (str(error).strip().splitlines() or [""])[0]
        print(f"{prog}: rank {rank}: failed: {type(error).__name__}: {first}", file=sys.stderr)
        code = 1
    except BaseException:  # a bug in topoplan: show where, but still end this rank instead of hanging
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
