"""`topoplan launch` as a library call: a LaunchRequest in, a LaunchSpec out (topoplan.launch.render writes it).

Kept out of cli.py so the CLI only parses options, and so tests and other tools get the same behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topoplan.cpuset import CpuFacts
from topoplan.errors import TopoplanError
from topoplan.launch.spec import LaunchSpec, build_spec
from topoplan.layout import Layout, RankPlacement, check_nodes
from topoplan.rank_env import DEFAULT_MASTER_PORT
from topoplan.runner.options import parse_ids
from topoplan.topology.model import Topology

DEFAULT_PROMPT_IDS = "1,2,3"  # token ids every vocabulary has, so the default command runs for any checkpoint


def runner_command(layout: Layout, model: str | None, checkpoint: str | None = None,
                   prompts: Sequence[str] = (), prompt_ids: Sequence[str] = ()) -> list[str]:
    """The default COMMAND: the bundled runner with the layout's degrees, a model it can load and a prompt.

    The runner loads a built-in model (tiny, small) or an HF checkpoint folder, never a planner catalog name:
    `checkpoint` (a folder on the launch hosts) wins, else `model` must be a built-in (none: `tiny`, a smoke
    test of the launch). Without a prompt the runner refuses to start, so `--prompt-ids 1,2,3` stands in when
    neither prompts nor ids are given.
    """
    from topoplan.runner.builtin import BUILTIN

    if checkpoint is not None:
        if not checkpoint.strip():
            raise TopoplanError("--checkpoint: expected a folder, got an empty path")
        runner_model = checkpoint
    elif model is None or model in BUILTIN:
        runner_model = model or "tiny"
    else:
        raise TopoplanError(f"the bundled runner loads a built-in model ({', '.join(BUILTIN)}) or an HF checkpoint "
                            f"folder, and --model {model!r} is a planner model: pass --checkpoint DIR, or your own "
                            "command after --")
    if not prompts and not prompt_ids:
        prompt_ids = [DEFAULT_PROMPT_IDS]
    argv = ["python3", "-m", "topoplan.runner", "--model", runner_model,
            "--tp", str(layout.tp), "--pp", str(layout.pp), "--dp", str(layout.dp)]
    for text in prompts:
        argv += ["--prompt", text]
    for ids in prompt_ids:
        parse_ids(ids)
        argv += ["--prompt-ids", ids]
    return argv


def parse_hosts(text: str | None) -> tuple[str, ...] | None:
    """`--hosts a,b,c` -> ("a", "b", "c"); None when not given."""
    if text is None:
        return None
    hosts = tuple(h.strip() for h in text.split(","))
    if not all(hosts):
        raise TopoplanError(f"--hosts {text!r}: expected host names separated by commas, none empty")
    return hosts


@dataclass(frozen=True)
class LaunchRequest:
    """What `topoplan launch` is asked; every option's check runs when it is built, before any file is read.

    The layout is `layout` (placed by the planner's placement) or row `rank` of `topoplan plan` for `model`;
    `command` is what every rank runs (empty: the bundled runner with `checkpoint` or a built-in `model`,
    and the prompts)."""

    layout: Layout | None = None
    rank: int | None = None
    model: str | None = None  # planner model (catalog name, alias, config.json); also the runner's if built-in
    topo: str | None = None  # one node's `topo -m` paste or recording; None: this machine
    p2p: str | None = None
    gpu: str | None = None
    objective: str = "latency"
    nodes: int = 1
    hosts: tuple[str, ...] | None = None  # one per node, node 0 first
    port: int = DEFAULT_MASTER_PORT
    command: tuple[str, ...] = ()
    this_machine: bool = False  # read /sys for SMT siblings, NUMA nodes, online CPUs
    checkpoint: str | None = None
    prompts: tuple[str, ...] = ()
    prompt_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.layout is not None and self.rank is not None:
            raise TopoplanError("--layout and --rank both choose the layout: give one of them")
        if self.layout is None and self.rank is None:
            raise TopoplanError("choose a layout: --layout tp=N,pp=N,dp=N, or --rank N (the N-th row of "
                                "`topoplan plan`)")
        if self.rank is not None and self.rank < 1:
            raise TopoplanError(f"--rank {self.rank}: expected a row number of `topoplan plan`, counted from 1 "
                                "(the best)")
        if self.command and (self.checkpoint is not None or self.prompts or self.prompt_ids):
            raise TopoplanError("--checkpoint, --prompt and --prompt-ids are for the bundled runner's default "
                                "command; with your own COMMAND after --, put them in it")
        check_nodes(self.nodes)
        if self.hosts is not None and len(self.hosts) != self.nodes:
            raise TopoplanError(f"--hosts names {len(self.hosts)} host(s) but --nodes is {self.nodes}: give one "
                                "host per node")
        self._check_plan_options()

    def _check_plan_options(self) -> None:
        """The planner's options, even where --layout makes the plan unneeded: a typo is refused, not ignored,
        and a fixed layout's TP degree must split the model's heads as the planner requires."""
        from topoplan.hardware import find_gpu
        from topoplan.models import find_model
        from topoplan.plan.layouts import check_tp
        from topoplan.plan.rank import check_objective

        check_objective(self.objective)
        if self.gpu is not None:
            find_gpu(self.gpu)
        if self.model is not None:
            spec = find_model(self.model)
            if self.layout is not None:
                check_tp(spec, self.layout.tp)


def read_launch_topology(topo: str | None, p2p: str | None) -> Topology:
    """The `topo -m` paste or NVML recording (with `-p2p` statuses), or this machine (NVML, then nvidia-smi)."""
    from topoplan.machine import load_topology

    return load_topology(topo, p2p)


def planned_placement(*, topo: str | None, model: str | None, gpu: str | None, nodes: int, objective: str,
                      rank: int) -> tuple[Layout, list[RankPlacement]]:
    """Layout and placement of the `rank`-th row of `topoplan plan` for the same model, machine and objective
    (and the planner's default workload)."""
    from topoplan.plan.frontend import PlanRequest, plan_for
    from topoplan.plan.placement import expand

    if model is None:
        raise TopoplanError("--rank N picks a row of `topoplan plan`, which needs --model")
    result = plan_for(PlanRequest(model=model, topo=topo, gpu=gpu, nodes=nodes, objective=objective))
    if not 1 <= rank <= len(result.layouts):
        raise TopoplanError(f"--rank {rank}: the plan has {len(result.layouts)} layout(s), numbered from 1")
    entry = result.layouts[rank - 1]
    if not entry.cost.fits:
        raise TopoplanError(f"--rank {rank}: layout {entry.cost.layout} does not fit {model} in GPU memory "
                            "(see `topoplan plan`)")
    if entry.nodes != nodes:
        raise TopoplanError(f"--rank {rank}: layout {entry.cost.layout} runs on {entry.nodes} of the {nodes} nodes; "
                            f"launch it with --nodes {entry.nodes} (and that many --hosts)")
    return entry.cost.layout, expand(entry.cost.layout, nodes, entry.order)


def launch_spec(request: LaunchRequest) -> LaunchSpec:
    """Read the topology, take the layout (--layout, placed by the planner's placement, or --rank N of the
    plan), and build the spec. Without --topo the machine itself is read, and its /sys too."""
    from topoplan.plan.placement import place

    r = request
    topology = read_launch_topology(r.topo, r.p2p)
    if r.layout is not None:
        chosen = r.layout
        if chosen.world > r.nodes * len(topology.gpus):
            raise TopoplanError(f"layout {chosen} needs {chosen.world} GPUs, but {r.nodes} node(s) of this topology "
                                f"have {r.nodes * len(topology.gpus)} ({len(topology.gpus)} per node); add --nodes "
                                "or shrink the layout", source=topology.source or None)
        placements = place(topology, chosen, r.nodes)
    else:
        chosen, placements = planned_placement(topo=r.topo, model=r.model, gpu=r.gpu, nodes=r.nodes,
                                               objective=r.objective, rank=r.rank)  # type: ignore[arg-type]
    facts = CpuFacts.read_sysfs() if r.this_machine or r.topo is None else None
    if facts is not None:
        facts.check_online([c for g in topology.gpus for c in g.cpus or ()], topology.source or None)
    command = r.command or runner_command(chosen, r.model, r.checkpoint, r.prompts, r.prompt_ids)
    return build_spec(topology, chosen, placements, command=command, nodes=r.nodes, hosts=r.hosts,
                      master_port=r.port, facts=facts)
