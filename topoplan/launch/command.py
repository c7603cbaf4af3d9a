"""`topoplan launch` as a library call: options in, LaunchSpec and rendered text out.

Kept out of cli.py so the CLI only parses options, and so tests and other tools get the same behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence

from topoplan.errors import TopoplanError
from topoplan.cpuset import CpuFacts
from topoplan.launch.spec import LaunchSpec, build_spec
from topoplan.rank_env import DEFAULT_MASTER_PORT
from topoplan.layout import Layout, RankPlacement, check_nodes
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
    if rank is not None and rank < 1:
        raise TopoplanError(f"--rank {rank}: expected a row number of `topoplan plan`, counted from 1 (the best)")


def check_plan_options(layout: Layout | None, model: str | None, gpu: str | None, objective: str) -> None:
    """Check the planner's options even where --layout makes the plan unneeded: a typo is refused, not ignored,
    and a fixed layout's TP degree must split the model's heads as the planner requires."""
    from topoplan.hardware import find_gpu
    from topoplan.models import find_model
    from topoplan.plan.layouts import check_tp
    from topoplan.plan.rank import OBJECTIVES

    if objective not in OBJECTIVES:
        raise TopoplanError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if gpu is not None:
        find_gpu(gpu)
    if model is not None:
        spec = find_model(model)
        if layout is not None:
            check_tp(spec, layout.tp)


def read_launch_topology(topo: str | None, p2p: str | None) -> Topology:
    """The `topo -m` paste or NVML recording (with `-p2p` statuses), or this machine (NVML, then nvidia-smi)."""
    from topoplan.machine import load_topology

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
                port: int = DEFAULT_MASTER_PORT, command: Sequence[str] = (), this_machine: bool = False,
                checkpoint: str | None = None, prompts: Sequence[str] = (), prompt_ids: Sequence[str] = ()) -> LaunchSpec:
    """Read the topology, take the layout (--layout, placed by the planner's placement, or --rank N of the
    plan), and build the spec. Without --topo the machine itself is read, and its /sys too."""
    from topoplan.plan.placement import place

    check_choice(layout, rank)
    if command and (checkpoint is not None or prompts or prompt_ids):
        raise TopoplanError("--checkpoint, --prompt and --prompt-ids are for the bundled runner's default command; "
                            "with your own COMMAND after --, put them in it")
    check_nodes(nodes)
    if hosts is not None and len(hosts) != nodes:
        raise TopoplanError(f"--hosts names {len(hosts)} host(s) but --nodes is {nodes}: give one host per node")
    fixed = Layout.parse(layout) if layout is not None else None
    check_plan_options(fixed, model, gpu, objective)
    topology = read_launch_topology(topo, p2p)
    if fixed is not None:
        chosen = fixed
        if chosen.world > nodes * len(topology.gpus):
            raise TopoplanError(f"layout {chosen} needs {chosen.world} GPUs, but {nodes} node(s) of this topology "
                                f"have {nodes * len(topology.gpus)} ({len(topology.gpus)} per node); add --nodes or "
                                "shrink the layout", source=topology.source or None)
        placements = place(topology, chosen, nodes)
    else:
        chosen, placements = planned_placement(topo=topo, model=model, gpu=gpu, nodes=nodes, objective=objective,
                                               rank=rank)  # type: ignore[arg-type]
    facts = CpuFacts.read_sysfs() if this_machine or topo is None else None
    if facts is not None:
        facts.check_online([c for g in topology.gpus for c in g.cpus or ()], topology.source or None)
    return build_spec(topology, chosen, placements, command=command or runner_command(chosen, model, checkpoint, prompts, prompt_ids), nodes=nodes,
                      hosts=hosts, master_port=port, facts=facts)


