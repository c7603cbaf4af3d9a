"""`topoplan launch` as a library call: a LaunchRequest in, a LaunchSpec out (topoplan.launch.formats writes it).

Kept out of cli.py so the CLI only parses options, and so tests and other tools get the same behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topoplan.cpuset import CpuFacts
from topoplan.engines import Engine, default_engine, resolve
from topoplan.errors import TopoplanError
from topoplan.launch.binding import DEFAULT_MEM_POLICY, check_mem_policy
from topoplan.launch.engines.common import (
    DEFAULT_HOST,
    DEFAULT_SERVE_PORT,
    EngineLaunch,
    EngineSettings,
    ServeOptions,
)
from topoplan.launch.launcher_options import LauncherOptions
from topoplan.launch.netif import check_ifname, interface_to
from topoplan.launch.runtime_addr import default_serve_host
from topoplan.launch.spec import LaunchSpec, build_spec, check_device, check_hosts
from topoplan.layout import Layout, check_nodes
from topoplan.model_aliases import ALIAS_HELP
from topoplan.models import BUILTIN_MODELS
from topoplan.option_fields import argument, build, given_options, nested, option
from topoplan.plan.cost import Workload, settle_workload
from topoplan.plan.rank import Limits
from topoplan.rank_env import DEFAULT_MASTER_PORT
from topoplan.run_options import parse_ids
from topoplan.topology.model import Topology

if TYPE_CHECKING:  # the planner's search loads only for --rank and --plan (start-up time)
    from topoplan.plan.frontend import PlanRequest
    from topoplan.plan.saved import SavedRow

DEFAULT_PROMPT_IDS = "1,2,3"  # token ids every vocabulary has, so the default command runs for any checkpoint


def runner_command(layout: Layout, model: str | None, checkpoint: str | None = None,
                   prompts: Sequence[str] = (), prompt_ids: Sequence[str] = (), device: str = "gpu") -> list[str]:
    """The default COMMAND: the bundled runner with the layout's degrees, a model it can load and a prompt.

    The runner loads a built-in model (tiny, small) or an HF checkpoint folder, never a planner catalog name:
    `checkpoint` (a folder on the launch hosts) wins, else `model` must be a built-in (none: `tiny`, a smoke
    test of the launch). Without a prompt the runner refuses to start, so `--prompt-ids 1,2,3` stands in when
    neither prompts nor ids are given. A CPU launch (`device="cpu"`) asks for gloo, which the runner would
    otherwise only choose where CUDA is missing.
    """
    if layout.tp % layout.ep:
        raise TopoplanError(f"layout {layout}: the bundled runner splits experts inside a TP group (ep dividing tp; "
                            "its DP replicas run independently), so vLLM's ep = tp x dp needs an engine: put its "
                            "command after --")
    if checkpoint is not None:
        if not checkpoint.strip():
            raise TopoplanError("--checkpoint: expected a folder, got an empty path")
        runner_model = checkpoint
    elif model is None or model in BUILTIN_MODELS:
        runner_model = model or "tiny"
    else:
        raise TopoplanError(f"the bundled runner loads a built-in model ({', '.join(BUILTIN_MODELS)}) or an HF "
                            f"checkpoint folder, and --model {model!r} is a planner model: pass --checkpoint DIR, or "
                            "your own command after --")
    if not prompts and not prompt_ids:
        prompt_ids = [DEFAULT_PROMPT_IDS]
    # `--option=value`: a value starting with "-" (a folder named -rf, a prompt "-x") stays a value
    argv = ["python3", "-m", "topoplan.runner", f"--model={runner_model}",
            "--tp", str(layout.tp), "--pp", str(layout.pp), "--dp", str(layout.dp)]
    if layout.ep > 1:
        argv += ["--ep", str(layout.ep)]
    if device == "cpu":
        argv.append("--backend=gloo")
    for text in prompts:
        argv.append(f"--prompt={text}")
    for ids in prompt_ids:
        parse_ids(ids)
        argv.append(f"--prompt-ids={ids}")
    return argv


def engine_settings(saved: SavedRow) -> EngineSettings:
    """What the plan's row (saved, or planned for --rank N) assumed of the engine: its served concurrency (else its
    batch) per replica, the workload's lengths and dtypes, and the engine's memory share at the row's TP degree."""
    from topoplan.plan.engine_costs import memory_policy

    plan, cost = saved.plan, saved.row.cost
    work, layout = plan.workload, cost.layout
    seqs = cost.served.replica.concurrency if cost.served is not None else cost.batch
    fraction = memory_policy(plan.engine, plan.calibration).fraction_for(layout.tp)
    return EngineSettings(max_seqs=max(1, seqs), max_model_len=work.prompt_len + work.gen_len,
                          dtype=plan.device.activation_dtype(work.weights), kv_dtype=work.kv.short,
                          weights=work.dtype, memory_fraction=round(fraction, 4),
                          why=f"plan row {layout}: {seqs} in flight, prompt {work.prompt_len} + {work.gen_len} tokens")


def load_saved_plan(path: str, rank: int | None, given: dict[str, object]) -> SavedRow:
    """`launch --plan FILE --rank N`: the saved plan's row N, checked against a fresh plan (topoplan.plan.saved).
    `given` maps the options the plan already holds to whether they were passed too, which is refused."""
    from topoplan.plan.saved import load_plan

    clash = [name for name, value in given.items() if value]
    if clash:
        raise TopoplanError(f"--plan FILE holds the options that priced it: drop {', '.join(clash)}")
    if rank is None:
        raise TopoplanError("--plan FILE launches one of its rows: add --rank N (1 = the best)")
    return load_plan(path, rank)


def plan_options_given(given: dict[str, Any]) -> tuple[str, ...]:
    """The workload and limit options (plan's, which launch takes for --rank N and --disagg) the command line gave,
    from its parsed values: refused where nothing is planned (--layout) or the plan is a file's."""
    return (*given_options(Workload, given), *given_options(Limits, given))


def parse_hosts(text: str | None) -> tuple[str, ...] | None:
    """`--hosts a,b,c` -> ("a", "b", "c"); None when not given. Checked against --nodes by LaunchRequest."""
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
    and the prompts). A serving `engine` (vllm, sglang, trtllm) serves `checkpoint` on `host`:`serve_port`
    instead, and `command` holds extra options for it; `device` cpu plans ranks on this machine's CPUs (vLLM's
    CPU build). `port` is the rendezvous port (the bundled runner's MASTER_PORT, the engines' master port)."""

    layout: Layout | None = field(default=None, metadata=option(
        "--layout", type=str, parse=Layout.parse, help="tp=N,pp=N,dp=N, placed by the planner's placement."))
    rank: int | None = field(default=None, metadata=option(
        "--rank", help="Launch row N of `topoplan plan` (1 = best) for the same --model, --topo, --gpu, --nodes, "
        "--engine, --objective, workload (--batch, --prompt-len, --gen-len, --dtype, --kv-dtype) and limits "
        "(--max-ttft-ms, --max-tpot-ms); a serving engine is given the row's batch, lengths and dtypes. With "
        "--disagg: the N-th deployment of `plan --disagg --json`'s `candidates` (1 = the chosen one)."))
    model: str | None = field(default=None, metadata=option(  # planner model; also the runner's if built-in
        "--model", "-m", help=f"Planner model: catalog name, alias ({ALIAS_HELP}) or a path to a HF config.json. Also "
        "the runner's model when it is a built-in (tiny, small)."))
    topo: str | None = field(default=None, metadata=option(  # one node's paste or recording; None: this machine
        "--topo", "--file", metavar="FILE", help="`nvidia-smi topo -m` output of one node ('-': stdin; --file is the "
        "same option). Default: this machine, through NVML."))
    p2p: str | None = field(default=None, metadata=option("--p2p", metavar="FILE", help="`nvidia-smi topo -p2p` "
                                                          "output of the same node."))
    gpu: str | None = field(default=None, metadata=option("--gpu", help="GPU model for the plan (--rank with --topo "
                                                          "text, which names no GPU)."))
    objective: str = field(default="latency", metadata=option("--objective", help="Plan objective for --rank: "
                                                              "latency or throughput."))
    workload: Workload = field(default_factory=Workload, metadata=nested())  # plan's --batch, --prompt-len, ...
    limits: Limits = field(default_factory=Limits, metadata=nested())  # plan's --max-ttft-ms, --max-tpot-ms
    nodes: int = field(default=1, metadata=option("--nodes", help="Identical nodes to spread the layout over."))
    hosts: tuple[str, ...] | None = field(default=None, metadata=option(  # one per node, node 0 first
        "--hosts", type=str, parse=parse_hosts, help="Host names, one per node, node 0 first: a,b."))
    port: int = field(default=DEFAULT_MASTER_PORT, metadata=option(  # from_cli: the runner's, or --master-port
        "--port", default=None, help=f"--engine topoplan: the rendezvous TCP port on node 0 (default "
        f"{DEFAULT_MASTER_PORT}). A serving engine: its HTTP port (default 8000)."))
    command: tuple[str, ...] = field(default=(), metadata=argument(
        parse=tuple, help="COMMAND... to start on every rank (after --). Default: the bundled runner with the "
        "layout's degrees, --checkpoint or a built-in --model, and the prompt."))
    this_machine: bool = field(default=False, metadata=option(  # read /sys for SMT siblings, NUMA nodes, online CPUs
        "--this-machine", help="The --topo file is of this machine: read SMT siblings, NUMA nodes and online CPUs "
        "from /sys instead of assuming Linux numbering."))
    checkpoint: str | None = field(default=None, metadata=option(
        "--checkpoint", metavar="DIR", help="HF checkpoint folder (on the launch hosts) for the default runner "
        "command; needed unless --model is a built-in."))
    prompts: tuple[str, ...] = field(default=(), metadata=option(
        "--prompt", metavar="TEXT", parse=tuple, help="Prompt text for the default runner command (repeat for a "
        "batch)."))
    prompt_ids: tuple[str, ...] = field(default=(), metadata=option(
        "--prompt-ids", metavar="IDS", parse=tuple, help="Prompt token ids for the default runner command, e.g. 1,2,3 "
        "(repeat for a batch). Default without --prompt: 1,2,3."))
    device: str = field(default="gpu", metadata=option(  # "cpu": ranks on CPUs alone (NUMA nodes), no GPU requests
        "--device", help="gpu, or cpu: ranks on CPUs alone (this machine's NUMA nodes; the bundled runner over gloo, "
        "or --engine vllm's CPU build), no GPU requests; needs --layout."))
    mem_policy: str = field(default=DEFAULT_MEM_POLICY, metadata=option(  # numactl memory policy
        "--mem-policy", help="numactl memory policy on the rank's NUMA node: preferred (spills when full), bind "
        "(strict) or none."))
    launcher: LauncherOptions = field(default=LauncherOptions(), metadata=nested())  # Slurm and Open MPI options
    engine: Engine = field(default_factory=default_engine, metadata=option(  # resolved at the edge (engines.resolve)
        "--engine", type=str, default=None, help="topoplan (default: the bundled runner, per-rank lines), or a "
        "serving engine: vllm, sglang, trtllm (its own command per node; see docs/launch-engines.md)."))
    host: str = field(default=DEFAULT_HOST, metadata=option(  # from_cli: by --format when not given
        "--host", default=None, help="A serving engine's HTTP address (default 127.0.0.1; srun/sbatch: node 0's "
        "address, read from the allocation; lws: 0.0.0.0, the pod's interfaces)."))
    serve_port: int = DEFAULT_SERVE_PORT  # from_cli: --port, for a serving engine
    engine_python: str = field(default="python3", metadata=option(
        "--engine-python", metavar="PYTHON", help="The Python that has the engine installed (default: python3 on "
        "PATH)."))
    kv_cache_gib: int = field(default=1, metadata=option("--kv-cache-gib", help="--device cpu: vLLM's KV cache in GiB "
                                                         "(VLLM_CPU_KVCACHE_SPACE)."))
    saved: SavedRow | None = None  # `--plan FILE --rank N` (topoplan.plan.saved): the row and what priced it
    dtype_given: bool = True  # as PlanRequest's: --dtype was given, not a default a quantised checkpoint replaces
    search_batch: bool | None = None  # as PlanRequest's: price each layout at its best batch
    plan_options: tuple[str, ...] = ()  # the workload and limit options the command line gave (--prompt-len, ...)
    ifname: str | None = field(default=None, metadata=option(  # the interface that reaches the other nodes
        "--ifname", metavar="IF", help="Several nodes: the network interface that reaches the other nodes, for "
        "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (default with --this-machine: the one routing to the first --hosts; "
        "else the script asks for TOPOPLAN_IFNAME)."))

    @classmethod
    def from_options(cls, given: dict[str, Any], *, fmt: str, plan_file: str | None = None,
                 master_port: int | None = None) -> LaunchRequest:
        """From the command line's values (by field name, as topoplan.option_fields parses them): `--plan FILE`
        supplies the options that priced it; --port is the runner's rendezvous port or a serving engine's HTTP
        port, whose rendezvous port is --master-port; --host defaults by the launcher `fmt`."""
        saved = None
        planned = plan_options_given(given)
        if plan_file is not None:
            saved = load_saved_plan(plan_file, given.get("rank"), given={
                "--model": given.get("model"), "--topo": given.get("topo"), "--gpu": given.get("gpu"),
                "--layout": given.get("layout"), "--engine": given.get("engine"),
                "--objective": given.get("objective", "latency") != "latency", "--nodes": given.get("nodes", 1) != 1,
                **dict.fromkeys(planned, True)})
            asked = saved.request
            given = {**given, "model": asked.model, "topo": asked.topo, "gpu": asked.gpu,
                     "objective": asked.objective, "engine": str(asked.engine), "nodes": saved.row.nodes}
        engine = resolve(given.get("engine") or "topoplan")
        if not engine.serves and master_port is not None:
            raise TopoplanError("--master-port is for serving engines; the bundled runner's rendezvous port is --port")
        port, host = given.get("port"), given.get("host")
        return build(cls, {**given, "port": (master_port if engine.serves else port) or DEFAULT_MASTER_PORT,
                           "host": host if host is not None else default_serve_host(fmt, DEFAULT_HOST)},
                     engine=engine, saved=saved, plan_options=planned,
                     serve_port=port if engine.serves and port is not None else DEFAULT_SERVE_PORT)

    @classmethod
    def from_cli(cls, kwargs: dict[str, Any]) -> LaunchRequest:
        """From topoplan.option_fields.build: the workload settled as `plan` settles it (topoplan.plan.cost.
        settle_workload), so --rank N plans what `plan` would."""
        return cls(**{**kwargs, "launcher": LauncherOptions(**kwargs["launcher"]), "limits": Limits(**kwargs["limits"]),
                      **settle_workload(kwargs["workload"], kwargs["objective"])})

    @property
    def serving(self) -> bool:
        return self.engine.serves

    def __post_init__(self) -> None:
        if self.layout is not None and self.rank is not None:
            raise TopoplanError("--layout and --rank both choose the layout: give one of them")
        if self.layout is None and self.rank is None:
            raise TopoplanError("choose a layout: --layout tp=N,pp=N,dp=N, or --rank N (the N-th row of "
                                "`topoplan plan`)")
        if self.rank is not None and self.rank < 1:
            raise TopoplanError(f"--rank {self.rank}: expected a row number of `topoplan plan`, counted from 1 "
                                "(the best)")
        object.__setattr__(self, "engine", resolve(self.engine))  # NAME or NAME@VERSION from Python callers
        if self.layout is not None and (self.plan_options or self.workload != Workload() or self.limits != Limits()):
            own = "the engine's own options (e.g. --max-model-len)" if self.serving else "your own COMMAND"
            raise TopoplanError(f"--layout {self.layout} is launched without a plan, so "
                                f"{', '.join(self.plan_options) or 'a workload or limits'} would change nothing: "
                                f"launch the plan's row they price with --rank N, or pass {own} after --")
        if self.ifname is not None:
            check_ifname(self.ifname)
        self._check_engine_options()
        if not self.serving and self.command and (self.checkpoint is not None or self.prompts or self.prompt_ids):
            raise TopoplanError("--checkpoint, --prompt and --prompt-ids are for the bundled runner's default "
                                "command; with your own COMMAND after --, put them in it")
        check_nodes(self.nodes)
        if self.hosts is not None and len(self.hosts) != self.nodes:
            raise TopoplanError(f"--hosts names {len(self.hosts)} host(s) but --nodes is {self.nodes}: give one "
                                "host per node")
        if self.hosts is not None:
            check_hosts(self.hosts, self.nodes)
        check_mem_policy(self.mem_policy)
        if check_device(self.device) == "cpu":
            self._check_cpu_launch()
        self._check_plan_options()

    def _check_cpu_launch(self) -> None:
        """A CPU launch takes a fixed layout split evenly over the nodes; GPU topology options have no meaning."""
        given = [name for name, value in (("--topo", self.topo), ("--p2p", self.p2p), ("--gpu", self.gpu),
                                          ("--rank", self.rank)) if value is not None]
        if given:
            raise TopoplanError(f"--device cpu runs ranks on this machine's CPUs; {', '.join(given)} describe(s) GPUs: "
                                "drop it, and give --layout")
        if self.layout is not None and self.layout.world % self.nodes:
            raise TopoplanError(f"--device cpu: layout {self.layout} has {self.layout.world} ranks, which do not "
                                f"split evenly over {self.nodes} node(s)")

    def _check_engine_options(self) -> None:
        check_device(self.device)
        if not self.serving:
            return
        if self.checkpoint is None:
            raise TopoplanError(f"--engine {self.engine} serves a checkpoint: pass --checkpoint DIR (a folder on the "
                                "launch hosts, or a hub name the engine can fetch)")
        if self.prompts or self.prompt_ids:
            raise TopoplanError(f"--prompt and --prompt-ids are for the bundled runner; --engine {self.engine} serves "
                                "requests over HTTP")
        if self.device == "cpu" and (self.rank is not None or self.topo is not None):
            raise TopoplanError("--device cpu places ranks on this machine's CPUs: give --layout, without --topo or "
                                "--rank")
        self.serve_options()  # its own checks (host, port, ...)

    def serve_options(self, row: SavedRow | None = None) -> ServeOptions:
        """How the engine serves; `row` (the plan's row it launches, see plan_row) gives its batch, lengths and
        dtypes (None: the engine's own defaults, as for --layout)."""
        return ServeOptions(checkpoint=self.checkpoint or "", host=self.host, port=self.serve_port,
                            python=self.engine_python, device=self.device, kv_cache_gib=self.kv_cache_gib,
                            extra_args=self.command, settings=engine_settings(row) if row is not None else None,
                            ifname=self.network_interface())

    def plan_request(self) -> PlanRequest:
        """The `topoplan plan` request whose row --rank N launches: the same model, machine, engine, objective,
        workload and limits."""
        from topoplan.plan.frontend import PlanRequest

        if self.model is None:
            raise TopoplanError("--rank N picks a row of `topoplan plan`, which needs --model")
        return PlanRequest(model=self.model, topo=self.topo, gpu=self.gpu, nodes=self.nodes, workload=self.workload,
                           objective=self.objective, engine=self.engine, limits=self.limits,
                           search_batch=self.search_batch, dtype_given=self.dtype_given)

    def network_interface(self) -> str | None:
        """--ifname; else, on the machine itself (--this-machine) with node 0 named, the interface this machine
        reaches node 0 through (topoplan.launch.netif); None: the scripts ask for it."""
        if self.ifname is not None or not (self.this_machine and self.hosts and self.nodes > 1):
            return self.ifname
        return interface_to(self.hosts[0])

    def _check_plan_options(self) -> None:
        """The planner's options, even where --layout makes the plan unneeded: a typo is refused, not ignored,
        and a fixed layout's TP degree must split the model's heads as the planner requires."""
        from topoplan.hardware import find_gpu
        from topoplan.models import find_model
        from topoplan.plan.layouts import check_ep, check_tp
        from topoplan.plan.rank import check_objective

        check_objective(self.objective)
        if self.gpu is not None:
            find_gpu(self.gpu)
        if self.model is not None:
            spec = find_model(self.model)
            if self.layout is not None:
                check_tp(spec, self.layout.tp)
                check_ep(spec, self.layout.ep)
                if self.serving and not self.engine.parallelism.runs(self.layout, spec.is_moe):
                    raise TopoplanError(f"{self.engine}: {spec.name}'s replicas share one expert group under "
                                        f"{self.engine.name}'s data parallelism, so {self.layout} would spread its "
                                        f"experts over all {self.layout.tp * self.layout.dp} GPUs: use "
                                        f"ep={self.layout.tp * self.layout.dp}, or one server per replica")


def read_launch_topology(topo: str | None, p2p: str | None) -> Topology:
    """The `topo -m` paste or NVML recording (with `-p2p` statuses), or this machine (NVML, then nvidia-smi)."""
    from topoplan.machine import load_topology

    return load_topology(topo, p2p)


def plan_row(request: LaunchRequest) -> SavedRow | None:
    """The plan's row the launch runs: `--plan FILE`'s row, or row --rank N of `topoplan plan` for the request's
    model, machine, engine, objective, workload and limits (the rows an engine's plan ranks are its own); None
    for --layout, which is not planned."""
    from topoplan.plan.frontend import plan_for
    from topoplan.plan.saved import SavedRow

    r = request
    if r.saved is not None or r.rank is None:
        return r.saved
    asked = r.plan_request()
    result = plan_for(asked)
    if not 1 <= r.rank <= len(result.layouts):
        raise TopoplanError(f"--rank {r.rank}: the plan has {len(result.layouts)} layout(s), numbered from 1")
    entry = result.layouts[r.rank - 1]
    if not entry.cost.fits:
        raise TopoplanError(f"--rank {r.rank}: layout {entry.cost.layout} does not fit {asked.model} in GPU memory "
                            "(see `topoplan plan`)")
    if entry.nodes != r.nodes:
        raise TopoplanError(f"--rank {r.rank}: layout {entry.cost.layout} runs on {entry.nodes} of the {r.nodes} "
                            f"nodes; launch it with --nodes {entry.nodes} (and that many --hosts)")
    return SavedRow(asked, result, entry)


def launch_spec(request: LaunchRequest, row: SavedRow | None = None) -> LaunchSpec:
    """Read the topology, take the layout (--layout, placed by the planner's placement, or the plan's `row`:
    plan_row's, worked out here when not given), and build the spec. Without --topo the machine itself is read,
    and its /sys too."""
    from topoplan.plan.placement import expand, place

    r = request
    if r.device == "cpu":
        return cpu_launch_spec(r)
    topology = read_launch_topology(r.topo, r.p2p)
    if r.layout is not None:
        chosen = r.layout
        if chosen.world > r.nodes * len(topology.gpus):
            raise TopoplanError(f"layout {chosen} needs {chosen.world} GPUs, but {r.nodes} node(s) of this topology "
                                f"have {r.nodes * len(topology.gpus)} ({len(topology.gpus)} per node); add --nodes "
                                "or shrink the layout", source=topology.source or None)
        placements = place(topology, chosen, r.nodes)
    else:  # --rank N of a fresh plan, or of `--plan FILE` (planned again and checked)
        row = row or plan_row(r)
        assert row is not None  # LaunchRequest: --layout or --rank N
        chosen = row.row.cost.layout
        placements = expand(chosen, row.row.nodes, row.row.order)
    facts = CpuFacts.read_sysfs() if r.this_machine or r.topo is None else None
    if facts is not None:
        facts.check_online([c for g in topology.gpus for c in g.cpus or ()], topology.source or None)
    if r.serving:  # the engine's command is per node (engine_launch_for); the spec carries its per-rank facts
        command: Sequence[str] = (r.engine.name,)
    else:
        command = r.command or runner_command(chosen, r.model, r.checkpoint, r.prompts, r.prompt_ids)
    return build_spec(topology, chosen, placements, command=command, nodes=r.nodes, hosts=r.hosts,
                      master_port=r.port, facts=facts, mem_policy=r.mem_policy, launcher=r.launcher)


def cpu_launch_spec(request: LaunchRequest) -> LaunchSpec:
    """`--device cpu`: every rank is a CPU process on this machine (the bundled runner over gloo, or vLLM's CPU
    build); each node's ranks fill its NUMA nodes in blocks and split their CPUs (topoplan.launch.cpu_slots)."""
    from topoplan.launch.cpu_slots import cpu_slots
    from topoplan.plan.placement import expand

    r = request
    layout = r.layout
    assert layout is not None  # checked by LaunchRequest
    facts = CpuFacts.read_sysfs()
    slots = cpu_slots(layout.world // r.nodes, facts)
    if r.serving:
        command: Sequence[str] = (r.engine.name,)
    else:
        command = r.command or runner_command(layout, r.model, r.checkpoint, r.prompts, r.prompt_ids, "cpu")
    return build_spec(slots, layout, expand(layout, r.nodes, [g.id for g in slots.gpus]), command=command,
                      nodes=r.nodes, hosts=r.hosts, master_port=r.port, facts=facts, device="cpu",
                      mem_policy=r.mem_policy, launcher=r.launcher)


def engine_launch_for(request: LaunchRequest, fmt: str = "shell") -> EngineLaunch:
    """`topoplan launch --engine vllm|sglang|trtllm`: the spec, then the engine's own command per node. For a
    `fmt` whose job decides node 0's address (Slurm, LWS), the engine is given a placeholder for it
    (topoplan.launch.runtime_addr)."""
    from topoplan.launch.engines import engine_launch
    from topoplan.launch.runtime_addr import head_at_run_time

    row = plan_row(request) if request.device == "gpu" else None
    return engine_launch(request.engine, head_at_run_time(launch_spec(request, row), fmt),
                         request.serve_options(row))
