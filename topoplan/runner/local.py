"""`topoplan run`: start the runner's ranks as local processes and relay rank 0's output.

Checks what it can before starting anything (layout, config, TP divisibility), so user errors are one
line from this process rather than one per rank. Imports no torch (the ranks do): start-up stays fast.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from topoplan.cpuset import GOMP_SPIN_COUNT, CpuFacts, cpu_cores, split_cpus
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, split_layers
from topoplan.models import check_context
from topoplan.run_options import RunOptions
from topoplan.runner.builtin import BUILTIN, checkpoint_folder, encode_bytes
from topoplan.runner.config import ModelConfig, check_tp, load_hf_config, parse_hf_config
from topoplan.runner.spawn import signal_note, spawn_ranks


def check_save(folder: str, opts: RunOptions) -> Path:
    """Refuse `run --save` that cannot write, or that is given run options it would ignore."""
    defaults = RunOptions(model=opts.model)
    ignored = [f.name for f in fields(opts) if getattr(opts, f.name) != getattr(defaults, f.name)]
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        raise TopoplanError(f"--save writes --model's checkpoint and exits; it takes no {flags}")
    if opts.model not in BUILTIN:
        raise TopoplanError(f"--save writes a built-in model; --model {opts.model!r} is not one of "
                            f"{', '.join(BUILTIN)}")
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise TopoplanError("exists and is not a folder; expected a new folder to write the checkpoint into",
                            source=path)
    if not path.parent.is_dir():
        raise TopoplanError("the folder does not exist", source=path.parent)
    return path


def check_run_context(opts: RunOptions, config: ModelConfig, source: str) -> None:
    """The longest prompt plus the new tokens within the model's context. Text prompts count where their length
    is known here (byte models); tokenizer.json prompts only by the rest."""
    lengths = [len(ids) for ids in opts.prompt_token_ids]
    if config.byte_tokenizer:
        lengths += [len(encode_bytes(text)) for text in opts.prompt]
    longest = max(lengths, default=0)
    check_context(config.max_context, longest + opts.max_new_tokens,
                  f"--max-new-tokens {opts.max_new_tokens} + a {longest}-token prompt", source)


def check_run(opts: RunOptions) -> Layout:
    """Refuse a run that cannot work, before any process starts."""
    layout = opts.layout
    opts.validate()
    folder = checkpoint_folder(opts.model)
    if folder is None:
        source = f"built-in model {opts.model}"
        config = parse_hf_config(BUILTIN[opts.model], source=source)
    else:
        config, source = load_hf_config(folder), str(folder / "config.json")
        if opts.prompt and not config.byte_tokenizer and not (folder / "tokenizer.json").exists():
            raise TopoplanError(f"{folder} has no tokenizer.json: pass token ids with --prompt-ids 1,2,3")
    check_run_context(opts, config, source)
    check_tp(config, layout.tp, source=str(layout), ep=layout.ep)
    split_layers(config.n_layers, layout.pp)
    too_big = [i for ids in opts.prompt_token_ids for i in ids if i >= config.vocab_size]
    if too_big:
        raise TopoplanError(f"prompt token id {max(too_big)} is outside the model's vocabulary of {config.vocab_size}")
    return layout


SPIN_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # a user's own setting of either is kept


def thread_env(threads: int) -> dict[str, str]:
    """A local CPU rank's threading environment: torch's intra-op pool of `threads` threads (one per CPU the rank
    owns), and a bounded spin at its barriers (GOMP_SPIN_COUNT) unless the caller's environment sets one."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if not any(name in os.environ for name in SPIN_SETTINGS):
        env["GOMP_SPINCOUNT"] = str(GOMP_SPIN_COUNT)
    return env


@dataclass(frozen=True)
class LocalRank:
    """What one local rank is started with: its extra environment and the CPUs it is pinned to."""

    env: dict[str, str]
    cpus: tuple[int, ...] | None  # None: more ranks than CPUs, so every rank may run anywhere


def local_ranks(world: int, progress: bool) -> list[LocalRank]:
    """Each local rank's own CPUs, split as `topoplan launch` splits a GPU's affinity set (whole cores
    first, no CPU twice), and OMP_NUM_THREADS to match, so ranks never fight over cores (`thread_env`)."""
    cpus = cpu_cores()
    shares = None
    if len(cpus) >= world:
        shares = split_cpus({rank: cpus for rank in range(world)}, CpuFacts.read_sysfs(), where="this machine")
    ranks = []
    for rank in range(world):
        share = shares[rank].cpus if shares else None
        threads = len(share) if share else max(1, len(cpus) // world)
        env = thread_env(threads)
        if progress and rank == 0:
            env["TOPOPLAN_PROGRESS"] = "1"  # rank 0's stderr is a pipe to our terminal: draw the bar anyway
        ranks.append(LocalRank(env, share))
    return ranks


def run_local(opts: RunOptions, timeout_s: float | None = None) -> int:
    """Run the job on this machine; returns the exit code (0, or the first failing rank's)."""
    layout = check_run(opts)
    ranks = local_ranks(layout.world, progress=sys.stderr.isatty() and not opts.json)
    argv = [sys.executable, "-m", "topoplan.runner", *opts.to_argv()]
    result = spawn_ranks(layout.world, argv, env_per_rank=lambda r: ranks[r].env, cpus_per_rank=lambda r: ranks[r].cpus,
                         timeout_s=timeout_s, grace_s=failure_grace_s(opts.timeout))
    if result.returncode == 124:
        print(f"topoplan: error: the ranks did not finish within {timeout_s:.0f} s", file=sys.stderr)
    elif note := signal_note(result):
        print(f"topoplan: error: {note}; the other ranks were ended", file=sys.stderr)
    return result.returncode


def failure_grace_s(timeout_s: float) -> float:
    """After one rank fails, how long the others get to end on their own (their collectives time out after
    `timeout_s` and say why) before they are terminated: a fifth of the timeout, 1 to 10 s (docs/limits.md)."""
    return min(10.0, max(1.0, timeout_s / 5))
