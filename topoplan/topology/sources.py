"""Where a topology comes from: a saved `nvidia-smi topo -m` paste (`--file`, `-` for stdin), or this
machine, by running `nvidia-smi topo -m`. Every source ends in the one parser and the one model."""

from __future__ import annotations

import shutil
import subprocess

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology

LIVE_COMMAND = ("nvidia-smi", "topo", "-m")
LIVE_TIMEOUT_S = 60
NO_LIVE_HINT = "read a saved paste instead: nvidia-smi topo -m > topo.txt, then --file topo.txt"


def run_nvidia_smi(args: tuple[str, ...] = LIVE_COMMAND[1:]) -> str:
    """The stdout of `nvidia-smi ARGS`; a TopoplanError suggesting --file when there is no driver or GPU."""
    command = " ".join(("nvidia-smi", *args))
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise TopoplanError(f"nvidia-smi is not installed (no NVIDIA driver on this machine); {NO_LIVE_HINT}")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=LIVE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TopoplanError(f"`{command}` could not run ({error}); {NO_LIVE_HINT}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[0]
        raise TopoplanError(f"`{command}` failed (exit {done.returncode}): {said}; {NO_LIVE_HINT}")
    return done.stdout


def load_topology(file: str | None, p2p: str | None) -> Topology:
    """The topology from `file` (a paste; `-` is stdin), or from this machine's nvidia-smi when None."""
    from topoplan.topology.read import attach_p2p, read_text, read_topology
    from topoplan.topology.smi_text import parse_topo_text

    if file is not None:
        return read_topology(file, p2p)
    topology = parse_topo_text(run_nvidia_smi(), source=" ".join(LIVE_COMMAND))
    if p2p is None:
        return topology
    from topoplan.topology.p2p_text import parse_p2p_text

    return attach_p2p(topology, parse_p2p_text(read_text(p2p), source="<stdin>" if p2p == "-" else p2p))
