"""`topoplan doctor` as library calls: get a recording (this machine, or a saved file), judge it, and the one
call the launcher's preflight line makes. The CLI only parses options and renders what these return."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from topoplan.doctor.checks import run_checks
from topoplan.doctor.checks.host import SHM_NEED_BYTES
from topoplan.doctor.finding import Finding
from topoplan.doctor.reader import read_machine
from topoplan.doctor.readings_file import load_recording, save_recording
from topoplan.errors import TopoplanError

THIS_MACHINE = "this machine"


def get_recording(file: str | None = None, save: str | None = None, root: str | Path = "/",
                  nvml: ModuleType | None = None) -> tuple[dict[str, Any], str]:
    """(recording, where it is from): `file` replayed, else this machine read under `root`; `save` writes a fresh
    reading (atomically) and is refused with `file`, which holds nothing new."""
    if file is not None:
        if save is not None:
            raise TopoplanError("--save records this machine; with --file there is nothing new to save (copy the file)")
        return load_recording(file), file
    if save is not None:
        from topoplan.atomic import check_folder

        check_folder(save)
    recording = read_machine(root, nvml)
    if save is not None:
        save_recording(recording, save)
    return recording, THIS_MACHINE


def check_engine(engine: str) -> str:
    if engine not in SHM_NEED_BYTES:
        raise TopoplanError(f"--engine {engine!r}: expected one of {', '.join(SHM_NEED_BYTES)}")
    return engine


def diagnose(recording: dict[str, Any], layout: str | None = None, topo: str | None = None, nodes: int = 1,
             engine: str = "topoplan", gpu: str | None = None) -> list[Finding]:
    """Every check on `recording`; with `layout` (tp=..,pp=..,dp=..), what that layout over `nodes` nodes of the
    topology `topo` (a file; None: this machine through NVML, as launch reads it) needs instead."""
    if layout is None:
        return run_checks(recording)
    from topoplan.doctor.for_layout import layout_findings
    from topoplan.layout import Layout, check_nodes
    from topoplan.machine import load_topology

    parsed = Layout.parse(layout)
    check_nodes(nodes)
    return layout_findings(recording, load_topology(topo, gpu=gpu), parsed, nodes, check_engine(engine))
