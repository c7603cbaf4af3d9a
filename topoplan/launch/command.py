"""`topoplan launch` as a library call: options in, LaunchSpec and rendered text out.

Kept out of cli.py so the CLI only parses options, and so tests and other tools get the same behaviour.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from topoplan.errors import TopoplanError
from topoplan.launch.binding import CpuFacts
from topoplan.launch.spec import DEFAULT_PORT, LaunchSpec, build_spec
from topoplan.layout import Layout


def runner_command(layout: Layout, model: str | None) -> list[str]:
    """The default COMMAND: the bundled runner with the layout's degrees (and the model, when given)."""
    argv = ["python", "-m", "topoplan.runner"]
    if model:
        argv += ["--model", model]
    return [*argv, "--tp", str(layout.tp), "--pp", str(layout.pp), "--dp", str(layout.dp)]


def parse_hosts(text: str | None) -> list[str] | None:
    """`--hosts a,b,c` -> ["a", "b", "c"]; None when not given."""
    if text is None:
        return None
    hosts = [h.strip() for h in text.split(",")]
    if not all(hosts):
        raise TopoplanError(f"--hosts {text!r}: expected host names separated by commas, none empty")
    return hosts


def choose_layout(layout: str | None, rank: int | None) -> Layout:
    """The layout from --layout; --rank (the N-th plan) needs the planner's ranking."""
    if layout is not None and rank is not None:
        raise TopoplanError("--layout and --rank both choose the layout: give one of them")
    if layout is not None:
        return Layout.parse(layout)
    if rank is not None:
        raise TopoplanError("--rank needs the planner's ranking (`topoplan plan`), which this build does not have "
                            "yet; give --layout tp=N,pp=N,dp=N")
    raise TopoplanError("choose a layout: --layout tp=N,pp=N,dp=N")


def launch_spec(*, topo: str, p2p: str | None, layout: Layout, nodes: int, hosts: Sequence[str] | None,
                port: int = DEFAULT_PORT, command: Sequence[str], this_machine: bool = False) -> LaunchSpec:
    """Read the topology, place the layout with the planner's placement, and build the spec."""
    from topoplan.plan.placement import place
    from topoplan.topology.read import read_topology

    if nodes < 1:
        raise TopoplanError(f"--nodes must be at least 1, got {nodes}")
    if hosts is not None and len(hosts) < nodes:
        raise TopoplanError(f"--hosts names {len(hosts)} host(s) but --nodes is {nodes}: give one host per node")
    topology = read_topology(topo, p2p)
    if layout.world > nodes * len(topology.gpus):
        raise TopoplanError(f"layout {layout} needs {layout.world} GPUs, but {nodes} node(s) of this topology have "
                            f"{nodes * len(topology.gpus)} ({len(topology.gpus)} per node); add --nodes or shrink "
                            "the layout", source=topology.source or None)
    placements = place(topology, layout, nodes)
    facts = CpuFacts.read_sysfs() if this_machine else None
    return build_spec(topology, layout, placements, command=command, nodes=nodes, hosts=hosts, master_port=port,
                      facts=facts)


def write_output(path: Path, text: str, *, executable: bool) -> None:
    """Write atomically: a crash or a bad option never leaves a half-written launch script behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
