"""Where a topology comes from: a saved file (`--file`: a `nvidia-smi topo -m` paste, an NVML recording, an NCCL
topology XML, `rocm-smi --showtopo` or `amd-smi topology` text, told apart by content in read.py; `-` for stdin),
or this machine, through NVML or by running `nvidia-smi topo -m`. Every source ends in the
one model. Which GPU it is (the catalog, `--gpu`) is the layer above: topoplan.machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from topoplan.errors import TopoplanError
from topoplan.topology.model import Topology

LIVE_COMMAND = ("nvidia-smi", "topo", "-m")
LIVE_TIMEOUT_S = 60
# Every command that reads a topology takes the file as --topo (documented) or --file (the same option).
NO_LIVE_HINT = "read a saved paste instead: nvidia-smi topo -m > topo.txt, then --topo topo.txt"
SOURCES = ("auto", "nvml", "smi", "file")


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


def _from_smi(p2p: str | None) -> Topology:
    from topoplan.topology.read import attach_p2p, read_text
    from topoplan.topology.smi_text import parse_topo_text

    topology = parse_topo_text(run_nvidia_smi(), source=" ".join(LIVE_COMMAND))
    if p2p is None:
        return topology
    from topoplan.topology.p2p_text import parse_p2p_text

    return attach_p2p(topology, parse_p2p_text(read_text(p2p), source="<stdin>" if p2p == "-" else p2p))


def _from_nvml(p2p: str | None, save: str | Path | None) -> Topology:
    if p2p is not None:
        raise TopoplanError("--p2p goes with `topo -m` text; NVML gives the P2P statuses itself")
    from topoplan.topology.nvml_reader import read_nvml_topology

    return read_nvml_topology(save=save)


def read_source(file: str | None, p2p: str | None = None, source: str = "auto",
                save: str | Path | None = None) -> Topology:
    """The topology from `file` (a paste or recording; `-` is stdin), or from this machine when None: NVML,
    `nvidia-smi topo -m`, or (auto) NVML and then nvidia-smi. `save` writes the NVML recording. The GPU
    stays as the source named it: topoplan.machine.load_topology resolves it against the catalog."""
    if source not in SOURCES:
        raise TopoplanError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")
    if file is not None or source == "file":
        if file is None:
            raise TopoplanError("--source file needs --file PATH")
        if source not in ("auto", "file"):
            raise TopoplanError(f"--file reads a saved file; it does not go with --source {source}")
        if save is not None:
            raise TopoplanError("--save records what NVML says on this machine; it does not go with --file")
        from topoplan.topology.read import read_topology

        return read_topology(file, p2p)
    if source == "smi" or (source == "auto" and p2p is not None):  # a -p2p matrix goes with topo -m text
        if save is not None:
            raise TopoplanError("--save records NVML's answers; it needs --source nvml or auto, without --p2p")
        return _from_smi(p2p)
    if source == "nvml":
        return _from_nvml(p2p, save)
    try:  # auto: NVML first, it knows more
        return _from_nvml(None, save)
    except TopoplanError as nvml_error:
        if save is not None:
            raise
        try:
            topology = _from_smi(None)
        except TopoplanError as smi_error:
            raise TopoplanError(f"no topology from this machine: {nvml_error}; {smi_error}") from None
        return topology.with_notes(f"NVML was not available ({nvml_error}); read with `{' '.join(LIVE_COMMAND)}`")
