"""`topoplan run`: start the runner's ranks as local processes and relay rank 0's output.

Checks what it can before starting anything (layout, config, TP divisibility), so user errors are one
line from this process rather than one per rank. Imports no torch (the ranks do): start-up stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.runner.builtin import BUILTIN
from topoplan.runner.config import check_tp, load_hf_config, parse_hf_config, split_layers
from topoplan.runner.options import RunOptions
from topoplan.runner.spawn import spawn_ranks

def check_run(opts: RunOptions) -> Layout:
    """Refuse a run that cannot work, before any process starts."""
    layout = Layout(opts.tp, opts.pp, opts.dp)
    opts.validate()
    if opts.model in BUILTIN:
        config = parse_hf_config(BUILTIN[opts.model], source=f"built-in model {opts.model}")
    else:
        folder = Path(opts.model)
        if not folder.is_dir():
            raise TopoplanError(f"--model {opts.model!r}: not a folder; expected an HF checkpoint folder or one "
                                f"of {', '.join(BUILTIN)}")
        config = load_hf_config(folder)
        if opts.prompt and not config.byte_tokenizer and not (folder / "tokenizer.json").exists():
            raise TopoplanError(f"{folder} has no tokenizer.json: pass token ids with --prompt-ids 1,2,3")
    check_tp(config, layout.tp, source=str(layout))
    split_layers(config.n_layers, layout.pp)
    too_big = [i for ids in opts.prompt_token_ids for i in ids if i >= config.vocab_size]
    if too_big:
        raise TopoplanError(f"prompt token id {max(too_big)} is outside the model's vocabulary of {config.vocab_size}")
    return layout


def rank_env(rank: int, world: int, cores: int, progress: bool) -> dict[str, str]:
    """Extra environment of one local rank (spawn.py adds RANK, WORLD_SIZE, MASTER_ADDR/PORT...)."""
    env = {"OMP_NUM_THREADS": str(max(1, cores // world))}  # share this machine's cores, don't oversubscribe
    if progress and rank == 0:
        env["TOPOPLAN_PROGRESS"] = "1"  # rank 0's stderr is a pipe to our terminal: draw the bar anyway
    return env


def run_local(opts: RunOptions, timeout_s: float | None = None) -> int:
    """Run the job on this machine; returns the exit code (0, or the first failing rank's)."""
    layout = check_run(opts)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    progress = sys.stderr.isatty() and not opts.json
    argv = [sys.executable, "-m", "topoplan.runner", *opts.to_argv()]
    result = spawn_ranks(layout.world, argv, env_per_rank=lambda r: rank_env(r, layout.world, cores, progress),
                         timeout_s=timeout_s)
    if result.returncode == 124:
        print(f"topoplan: error: the ranks did not finish within {timeout_s:.0f} s", file=sys.stderr)
    return result.returncode
