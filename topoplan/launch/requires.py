"""The first lines of an emitted script: stop with one line, before anything starts, when a program it calls or
the checkpoint it serves is missing on this host (a rank that dies with "command not found" after its peers have
started leaves them waiting for it)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

# What to do when a program is missing, by program (others: "install it, or put it on PATH").
HINTS = {
    "numactl": "install numactl (apt-get install numactl), or write the lines again with --mem-policy none "
               "(taskset binds the CPUs, no memory policy)",
    "taskset": "install util-linux",
}
MISSING_PROGRAM = 127  # bash's own status for a command not found
MISSING_FILE = 2


def _say(message: str) -> str:
    return f"echo {shlex.quote('topoplan: ' + message)} >&2"


def require_lines(programs: Iterable[str], paths: Sequence[str] = ()) -> list[str]:
    """One check per distinct program (by name or path) and per local path (absolute or ./relative) given."""
    out = []
    for program in dict.fromkeys(p for p in programs if p):
        say = _say(f"{program} not found on this host: {HINTS.get(program, 'install it, or put it on PATH')}")
        out.append(f"command -v {shlex.quote(program)} >/dev/null || {{ {say}; exit {MISSING_PROGRAM}; }}")
    for path in dict.fromkeys(p for p in paths if p.startswith(("/", "./", "../"))):
        say = _say(f"{path} not found on this host: the checkpoint the engine serves must be there (a hub name "
                   "is fetched instead)")
        out.append(f"[ -e {shlex.quote(path)} ] || {{ {say}; exit {MISSING_FILE}; }}")
    return out


def argv_programs(argv: Sequence[str]) -> list[str]:
    """The programs an argv runs: its first word and, after a `numactl ... --` or `taskset -c CPUS` wrapper,
    the wrapped command's first word."""
    if not argv:
        return []
    if argv[0] == "numactl" and "--" in argv:
        return ["numactl", *argv_programs(argv[argv.index("--") + 1:])]
    if argv[0] == "taskset" and len(argv) > 3:
        return ["taskset", *argv_programs(argv[3:])]
    return [argv[0]]
