"""`launch --preflight`: the emitted script runs `topoplan doctor --for` on its host before starting any rank,
and stops with doctor's one line when the layout is blocked there (a required NIC down, /dev/shm too small,
bound CPUs outside the cpuset: docs/doctor.md). Slowing findings are printed and the launch goes on.

Kept apart from the renderers: it adds one line after the script's leading comment block (shebang, #SBATCH
directives, the header), whatever launcher or engine wrote the rest. TOPOPLAN_DOCTOR_FILE, when set where the
script runs, replays a saved doctor recording instead of reading the host (tests, dry runs).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from topoplan.errors import TopoplanError

DOCTOR_FILE_VAR = "TOPOPLAN_DOCTOR_FILE"


def preflight_line(layout: str, nodes: int, topo: str | None, engine: str, device: str = "gpu") -> str:
    """The shell line that runs the check and exits with its status when it blocks."""
    if device != "gpu":
        raise TopoplanError("--preflight checks what a GPU layout needs (its NICs, P2P, CPUs near its GPUs); "
                            "--device cpu has no GPU: drop one of them")
    if topo == "-":
        raise TopoplanError("--preflight reruns the placement on the launch host and cannot re-read stdin: pass "
                            "--topo FILE")
    argv = ["python3", "-m", "topoplan", "doctor", "--preflight", f"--for={layout}", "--nodes", str(nodes),
            f"--engine={engine}"]
    if topo is not None:
        argv.append(f"--topo={Path(topo).resolve()}")  # the script may run from another folder
    replay = f'${{{DOCTOR_FILE_VAR}:+--file="${DOCTOR_FILE_VAR}"}}'  # unquoted on purpose: absent -> no word
    return f"{shlex.join(argv)} {replay} || exit $?  # stop here if this host cannot run the layout"


def with_preflight(script: str, line: str) -> str:
    """`script` with `line` after its leading block of comment lines (shebang, #SBATCH, header)."""
    if not script.startswith("#!"):
        raise TopoplanError("--preflight adds a line to a shell script; --format json is not one")
    lines = script.split("\n")
    at = next((i for i, text in enumerate(lines) if not text.startswith("#")), len(lines))
    return "\n".join([*lines[:at], line, *lines[at:]])
