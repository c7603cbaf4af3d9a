"""`topoplan doctor` as library calls: get a recording (this machine, or a saved file), judge it, and the one
call the launcher's preflight line makes. The CLI only parses options and renders what these return."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from topoplan.doctor.checks import run_checks
from topoplan.doctor.checks.host import SHM_NEED_BYTES
from topoplan.doctor.finding import Finding
from topoplan.doctor.reader import read_machine
from topoplan.doctor.readings_file import load_recording, save_recording
from topoplan.errors import TopoplanError
from topoplan.option_fields import option

THIS_MACHINE = "this machine"


@dataclass(frozen=True)
class DoctorRequest:
    """What `topoplan doctor` is asked: which recording (this machine, `file`, `save`d too) and, with `for_layout`,
    the layout whose needs are checked instead of the machine's general state."""

    save: str | None = field(default=None, metadata=option(
        "--save", metavar="FILE", help="Also write what was read as one JSON recording (atomically), for bug reports "
        "and --file."))
    file: str | None = field(default=None, metadata=option("--file", metavar="FILE", help="Judge a saved recording "
                                                           "instead of this machine."))
    for_layout: str | None = field(default=None, metadata=option(
        "--for", "--layout", metavar="LAYOUT", help="tp=N,pp=N,dp=N: check what this layout needs (its NICs up, P2P "
        "in its TP groups, /dev/shm, the CPUs it binds), placed as `launch` places it."))
    topo: str | None = field(default=None, metadata=option(
        "--topo", metavar="FILE", help="With --for: the topology the layout is placed on (a `topo -m` paste or NVML "
        "recording). Default: this machine, through NVML."))
    gpu: str | None = field(default=None, metadata=option("--gpu", help="With --for and a `topo -m` paste: the GPU "
                                                          "model."))
    nodes: int = field(default=1, metadata=option("--nodes", help="With --for: identical nodes the layout spans (NICs "
                                                  "matter from 2)."))
    engine: str = field(default="topoplan", metadata=option("--engine", help="With --for: the engine whose /dev/shm "
                                                            "need is checked: topoplan, vllm, sglang, trtllm."))
    preflight: bool = field(default=False, metadata=option(
        "--preflight", help="With --for, for launch scripts: print nothing when the layout can run, a warning per "
        "slowing finding, and one line and exit 4 when something blocks it."))

    def __post_init__(self) -> None:
        if self.preflight and self.for_layout is None:
            raise TopoplanError("--preflight checks a layout: pass --for tp=N,pp=N,dp=N")
        if self.for_layout is None and (self.topo, self.gpu, self.nodes, self.engine) != (None, None, 1, "topoplan"):
            raise TopoplanError("--topo, --gpu, --nodes and --engine describe a layout: pass --for tp=N,pp=N,dp=N too")

    def findings(self) -> tuple[list[Finding], str]:
        """The findings, and where the recording is from."""
        recording, source = get_recording(self.file, self.save)
        return diagnose(recording, self.for_layout, self.topo, self.nodes, self.engine, self.gpu), source


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
