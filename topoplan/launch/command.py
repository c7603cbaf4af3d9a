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
from topoplan.layout import Layout, RankPlacement
from topoplan.topology.model import Topology


def runner_command(layout: Layout, model: str | None) -> list[str]:
    """The default COMMAND: the bundled runner with the layout's degrees (and the model, when given)."""
    argv = ["python3", "-m", "topoplan.runner"]
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


def check_choice(layout: str | None, rank: int | None) -> None:
    """Exactly one of --layout and --rank chooses the layout."""
    if layout is not None and rank is not None:
        raise TopoplanError("--layout and --rank both choose the layout: give one of them")
    if layout is None and rank is None:
        raise TopoplanError("choose a layout: --layout tp=N,pp=N,dp=N, or --rank N (the N-th row of `topoplan plan`)")


def read_launch_topology(topo: str | None, p2p: str | None) -> Topology:
    """The `topo -m` paste or NVML recording (with `-p2p` statuses), or this machine (NVML, then nvidia-smi)."""
    from topoplan.topology.sources import load_topology

    return load_topology(topo, p2p)


def planned_placement(*, topo: str | None, model: str | None, gpu: str | None, nodes: int, objective: str,
                      rank: int) -> tuple[Layout, list[RankPlacement]]:
    """Layout and placement of the `rank`-th row of `topoplan plan` for the same model, machine and objective
    (and the planner's default workload)."""
    from topoplan.plan.cost import Workload
    from topoplan.plan.frontend import plan_from_options
    from topoplan.plan.placement import expand

    if model is None:
        raise TopoplanError("--rank N picks a row of `topoplan plan`, which needs --model")
    w = Workload()
    result = plan_from_options(model=model, topo=topo, gpu=gpu, nodes=nodes, batch=w.batch, prompt_len=w.prompt_len,
                               gen_len=w.gen_len, dtype=w.dtype, objective=objective, max_tp=None, tp=None, pp=None,
                               dp=None, nic_gbps=None, calibration=None)
    if not 1 <= rank <= len(result.layouts):
        raise TopoplanError(f"--rank {rank}: the plan has {len(result.layouts)} layout(s), numbered from 1")
    entry = result.layouts[rank - 1]
    if not entry.cost.fits:
        raise TopoplanError(f"--rank {rank}: layout {entry.cost.layout} does not fit {model} in GPU memory "
                            "(see `topoplan plan`)")
    return entry.cost.layout, expand(entry.cost.layout, nodes, entry.order)


def launch_spec(*, topo: str | None, p2p: str | None, layout: str | None, rank: int | None, model: str | None,
                gpu: str | None = None, objective: str = "latency", nodes: int = 1, hosts: Sequence[str] | None = None,
                port: int = DEFAULT_PORT, command: Sequence[str] = (), this_machine: bool = False) -> LaunchSpec:
    """Read the topology, take the layout (--layout, placed by the planner's placement, or --rank N of the
    plan), and build the spec. Without --topo the machine itself is read, and its /sys too."""
    from topoplan.plan.placement import place

    check_choice(layout, rank)
    if nodes < 1:
        raise TopoplanError(f"--nodes must be at least 1, got {nodes}")
    if hosts is not None and len(hosts) < nodes:
        raise TopoplanError(f"--hosts names {len(hosts)} host(s) but --nodes is {nodes}: give one host per node")
    topology = read_launch_topology(topo, p2p)
    if layout is not None:
        chosen = Layout.parse(layout)
        if chosen.world > nodes * len(topology.gpus):
            raise TopoplanError(f"layout {chosen} needs {chosen.world} GPUs, but {nodes} node(s) of this topology "
                                f"have {nodes * len(topology.gpus)} ({len(topology.gpus)} per node); add --nodes or "
                                "shrink the layout", source=topology.source or None)
        placements = place(topology, chosen, nodes)
    else:
        chosen, placements = planned_placement(topo=topo, model=model, gpu=gpu, nodes=nodes, objective=objective,
                                               rank=rank)  # type: ignore[arg-type]
    facts = CpuFacts.read_sysfs() if this_machine or topo is None else None
    return build_spec(topology, chosen, placements, command=command or runner_command(chosen, model), nodes=nodes,
                      hosts=hosts, master_port=port, facts=facts)


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
