"""The small per-rank wrapper used where a launcher starts every rank with the same command line.

torchrun and srun start k identical processes per node and tell each its rank only through the
environment, so per-rank binding has to happen after start-up but before the program runs: a `bash -c`
script picks the rank's line by the launcher's rank variable and `exec`s `env ... numactl ... -- "$@"`.
numactl binds before the program allocates anything, so its memory starts on the right node.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence

SHEBANG = "#!/usr/bin/env bash"  # first line of every bash text we emit, so `-o FILE` makes a runnable script
WRAPPER_NAME = "topoplan-rank"  # $0 of the wrapper script, shown by ps and in bash's error messages


def env_words(env: Mapping[str, str]) -> list[str]:
    """`env` followed by NAME=value words; [] for no variables."""
    return ["env", *(f"{k}={v}" for k, v in env.items())] if env else []


def dispatch_argv(key_var: str, cases: Mapping[int, Sequence[str]],
                  join: Callable[[Sequence[str]], str] = shlex.join) -> list[str]:
    """argv of a wrapper that runs `cases[$key_var] + "$@"`, and fails loudly for an unplanned value.

    `key_var` is one of our own fixed names (RANK, SLURM_LOCALID); every word of every case is quoted (by `join`:
    topoplan.launch.runtime_addr.shell_join where a word holds an address the job decides), and the script as a
    whole is quoted again by the caller, so hostile names stay data.
    """
    lines = [f'case "${{{key_var}:-}}" in']
    for key, prefix in cases.items():
        lines.append(f'  {key}) exec {join(prefix)} "$@" ;;' if prefix else f'  {key}) exec "$@" ;;')
    lines.append(f'  *) echo "{WRAPPER_NAME}: no binding planned for {key_var}=${{{key_var}:-unset}}" >&2; exit 2 ;;')
    lines.append("esac")
    return ["bash", "-c", "\n".join(lines), WRAPPER_NAME]


def continued(groups: Sequence[Sequence[str]]) -> str:
    """Several groups of words on continuation lines (` \\`), every word quoted."""
    return " \\\n    ".join(shlex.join(g) for g in groups if g)
