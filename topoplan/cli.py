"""The `topoplan` command line: options -> library call -> render. No logic of its own.

Heavy modules (torch, pynvml) are imported inside the commands that need them, so `topoplan inspect`
starts as fast as typer and rich allow.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum

import typer

import topoplan.bench.definitions as bench_defaults
from topoplan import __version__
from topoplan.errors import TopoplanError, printable
from topoplan.model_aliases import ALIAS_HELP
from topoplan.rank_env import DEFAULT_MASTER_PORT

app = typer.Typer(
    name="topoplan",
    help="Read a multi-GPU machine's topology, plan TP x PP x DP layouts, launch, run and measure them.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion [bash|zsh|fish|powershell]
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)
list_app = typer.Typer(help="The catalogs the planner prices with (GPUs, models), each entry with its source.",
                       no_args_is_help=True)
app.add_typer(list_app, name="list")


@contextmanager
def progress_steps(quiet: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar on stderr for a long command, fed (label, done, total): drawn on a terminal (or with
    TOPOPLAN_PROGRESS=1), never with --json or into a pipe; None when not drawn."""
    from topoplan.runner.process import Progress

    with Progress.on_rank(0, quiet) as progress:
        if progress.bar is None:
            yield None
            return
        update = progress.task("starting")
        yield lambda label, done, total: update(done, total, label)


def warn(warnings: list[str]) -> None:
    for warning in warnings:
        print(f"topoplan: warning: {printable(warning)}", file=sys.stderr)


def fail(error: TopoplanError) -> typer.Exit:
    """Print a user error as one line on stderr; return the Exit to raise."""
    print(f"topoplan: error: {error}", file=sys.stderr)
    return typer.Exit(error.exit_code)


def _print_version(value: bool) -> None:
    if value:
        print(f"topoplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                       help="Print topoplan's version and exit.")) -> None:
    """topoplan: inspect, plan, launch, run, bench."""


def _print_catalog(rows: list, table, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        from rich.console import Console

        from topoplan.terminal import emit

        emit(Console(), table(rows))


@list_app.command("gpus")
def list_gpus(as_json: bool = typer.Option(False, "--json", help="Every field of every entry, as JSON.")) -> None:
    """The GPU catalog: memory, bandwidth, peak TFLOP/s, NVLinks, and the datasheet each figure is from."""
    from topoplan.plan.catalog import gpu_rows, gpu_table

    _print_catalog(gpu_rows(), gpu_table, as_json)


@list_app.command("models")
def list_models(as_json: bool = typer.Option(False, "--json", help="Every entry with its config keys, as JSON."),
                ) -> None:
    """The model catalog: sizes as the planner reads them, aliases, and the config.json each is from."""
    from topoplan.plan.catalog import model_rows, model_table

    _print_catalog(model_rows(), model_table, as_json)


class InspectFormat(str, Enum):
    table = "table"
    json = "json"
    dot = "dot"
    mermaid = "mermaid"
    svg = "svg"
    png = "png"
    nccl_xml = "nccl-xml"


class InspectSource(str, Enum):
    auto = "auto"
    nvml = "nvml"
    smi = "smi"
    file = "file"


@app.command()
def inspect(
    file: str | None = typer.Option(None, "--topo", "--file", "-f", metavar="PATH",
                                    help="A saved `nvidia-smi topo -m` paste, NVML recording, NCCL topology XML, "
                                         "`rocm-smi --showtopo` or `amd-smi topology` output ('-': stdin); --file is "
                                         "the same option. Default: read this machine."),
    source: InspectSource = typer.Option(InspectSource.auto, "--source",
                                         help="auto: --file if given, else NVML, else `nvidia-smi topo -m`."),
    save: str | None = typer.Option(None, "--save", metavar="FILE",
                                    help="Also write NVML's raw answers to FILE (JSON), to replay with --file."),
    gpu: str | None = typer.Option(None, "--gpu", metavar="NAME",
                                   help="The GPU model (e.g. h100-sxm), for pastes, which do not name it."),
    p2p: str | None = typer.Option(None, "--p2p", metavar="FILE",
                                   help="A `nvidia-smi topo -p2p r|w|n|a|p` matrix to attach."),
    fmt: InspectFormat | None = typer.Option(None, "--format", help="Output format (default table); svg/png need -o; "
                                             "nccl-xml writes a file for NCCL_TOPO_FILE."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    output: str | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Write to FILE instead of stdout."),
    allow_invented_bus_ids: bool = typer.Option(False, "--allow-invented-bus-ids", help="--format nccl-xml: write "
                                                "made-up PCI bus ids where the source gives none (NCCL matches "
                                                "devices by bus id: for reading back, not for NCCL)."),
) -> None:
    """Show GPUs, NICs, the link between every pair, CPU/NUMA affinity, NVLink islands and warnings."""
    from topoplan.machine import load_topology
    from topoplan.topology.render import emit

    try:
        if as_json and fmt not in (None, InspectFormat.json):
            raise TopoplanError(f"--json and --format {fmt.value} ask for two formats: pass one")
        chosen = "json" if as_json else (fmt or InspectFormat.table).value
        emit(load_topology(file, p2p, source.value, save, gpu), chosen, output, allow_invented_bus_ids)
    except TopoplanError as error:
        raise fail(error) from None


class PlanDevice(str, Enum):
    gpu = "gpu"
    cpu = "cpu"


@app.command("plan")
def plan_command(
    model: str = typer.Option(..., "--model", "-m", help=f"Catalog name, alias ({ALIAS_HELP}), a HF checkpoint "
                              "folder or its config.json."),
    topo: str = typer.Option(None, "--topo", "--file", help="`nvidia-smi topo -m` text file or NVML recording "
                             "(--file is the same option); default: read this machine through NVML."),
    gpu: str = typer.Option(None, "--gpu", help="GPU model (a100-80gb, h100, ...); needed with --topo text, "
                            "which names no GPU."),
    cpu: str = typer.Option(None, "--cpu", help="CPU family, for SYS (socket-crossing) hops: intel-broadwell, "
                            "intel-skylake (default), intel-sapphire-rapids, intel-emerald-rapids, amd-zen, power9, "
                            "arm."),
    nodes: int = typer.Option(1, "--nodes", help="Identical nodes of this topology."),
    gpus: str = typer.Option(None, "--gpus", help="Plan on these GPUs of the machine only, e.g. 4,5,6,7 or 4-7 "
                             "(a shared node, a broken GPU); default: all."),
    batch: int = typer.Option(None, "--batch", help="Sequences per DP replica (default 1; with --objective "
                              "throughput the default is the largest batch each layout fits, within the limits)."),
    prompt_len: int = typer.Option(512, "--prompt-len", help="Prompt tokens per sequence."),
    gen_len: int = typer.Option(128, "--gen-len", help="Generated tokens per sequence."),
    dtype: str = typer.Option(None, "--dtype", help="Weights (default bf16, or what a config's quantization_config "
                              "stores): bf16, fp16, fp32, fp8 (weight-only on Ampere), mxfp4 or "
                              "int4 (AWQ/GPTQ, bf16 activations); refused where the GPU lacks it."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV cache: bf16, fp16, fp32 or fp8 (default: the "
                                 "activation dtype, bf16 for fp8/int4 weights)."),
    max_ttft_ms: float = typer.Option(None, "--max-ttft-ms", help="Latency limit on time to first token (the "
                                      "batch's prefill) that the priced batch must meet."),
    max_tpot_ms: float = typer.Option(None, "--max-tpot-ms", help="Latency limit on time per output token."),
    objective: str = typer.Option("latency", "--objective", help="latency (request time) or throughput "
                                  "(tokens/s per GPU)."),
    top: int = typer.Option(10, "--top", help="Show the best N layouts (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    per_rank: bool = typer.Option(False, "--per-rank", help="With --json: every rank's placement, not one "
                                  "node's (every node runs the same shape)."),
    max_tp: int = typer.Option(None, "--max-tp", help="Largest TP degree to consider."),
    tp: int = typer.Option(None, "--tp", help="Fix the TP degree."),
    pp: int = typer.Option(None, "--pp", help="Fix the PP degree."),
    dp: int = typer.Option(None, "--dp", help="Fix the DP degree (all three: price one layout)."),
    ep: int = typer.Option(None, "--ep", help="MoE models: fix the expert-parallel degree (1: experts TP-sharded; "
                           "else tp x dp, vLLM's --enable-expert-parallel). Default: price both."),
    nic_gbps: float = typer.Option(None, "--nic-gbps", help="Per-NIC bandwidth between nodes, GB/s (bytes); "
                                   "default by GPU generation (A100: 25, H100: 50)."),
    calibration: str = typer.Option(None, "--calibration", help="Calibration JSON (docs/planner.md) overriding "
                                    "the cost model's constants."),
    device: PlanDevice = typer.Option(PlanDevice.gpu, "--device", help="gpu: GPU layouts (this machine through "
                                      "NVML, or --topo); cpu: CPU-process layouts of this machine, priced with "
                                      "the --calibration file's `cpu` entry."),
    engine: str = typer.Option("topoplan", "--engine", help="Serving engine to price for: topoplan (the bundled "
                               "runner), vllm, sglang, trtllm; NAME@VERSION for an older profile, e.g. vllm@0.2 "
                               "(docs/engines.md)."),
    output: str = typer.Option(None, "--output", "-o", metavar="FILE", help="Also write the plan as JSON with the "
                               "request that priced it, for `launch --plan FILE --rank N` (docs/launch-engines.md)."),
) -> None:
    """Rank TP x PP x DP layouts and GPU placements for a model on this machine (or a topo -m file)."""
    import json

    from rich.console import Console

    from topoplan.engines import resolve
    from topoplan.plan.cost import Workload
    from topoplan.plan.frontend import PlanRequest, plan_for
    from topoplan.plan.plan_table import plan_table
    from topoplan.plan.rank import Limits, nothing_fits, plan_json
    from topoplan.terminal import emit

    try:
        if top < 0:
            raise TopoplanError(f"--top must be >= 0 (0: all), got {top}")
        request = PlanRequest(model=model, topo=topo, gpu=gpu, cpu=cpu, nodes=nodes, objective=objective, max_tp=max_tp,
                              tp=tp, pp=pp, dp=dp, ep=ep, nic_gbps=nic_gbps, calibration=calibration,
                              engine=resolve(engine),
                              workload=Workload(1 if batch is None else batch, prompt_len, gen_len, dtype or "bf16",
                                                kv_dtype), dtype_given=dtype is not None, gpus=gpus,
                              limits=Limits(max_ttft_ms, max_tpot_ms),
                              search_batch=objective == "throughput" and batch is None)
        if device is PlanDevice.cpu:
            from topoplan.plan.cpu_layouts import plan_cpu

            if output is not None:
                raise TopoplanError("-o saves a GPU plan for `launch --plan`; a CPU launch takes --layout")
            result = plan_cpu(request)
        else:
            result = plan_for(request)
        document = plan_json(result, top or None, per_rank)
        if device is PlanDevice.gpu:
            from topoplan.plan.saved import RECORD_KEY, request_record

            document[RECORD_KEY] = request_record(request)
        if output is not None:
            from topoplan.atomic import write_atomic

            write_atomic(output, json.dumps(document, indent=1) + "\n")
    except TopoplanError as error:
        raise fail(error) from None
    warn(result.warnings)
    if as_json:
        print(json.dumps(document, indent=1))
    else:
        console = Console()
        emit(console, plan_table(result, top or None, console.width))
    if (error := nothing_fits(result)) is not None:  # the rows above show how far off; the exit says it failed
        raise fail(error)


class LaunchFormat(str, Enum):  # the keys of topoplan.launch.formats.RENDERERS (not imported here: start-up time)
    torchrun = "torchrun"
    mpirun = "mpirun"
    srun = "srun"
    sbatch = "sbatch"
    shell = "shell"
    json = "json"
    lws = "lws"  # serving engines only: a Kubernetes LeaderWorkerSet (topoplan.launch.engines.render_lws)


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    command: list[str] = typer.Argument(None, help="COMMAND... to start on every rank (after --). Default: the "
                                        "bundled runner with the layout's degrees, --checkpoint or a built-in "
                                        "--model, and the prompt."),
    topo: str = typer.Option(None, "--topo", "--file", metavar="FILE", help="`nvidia-smi topo -m` output of one "
                             "node ('-': stdin; --file is the same option). Default: this machine, through NVML."),
    p2p: str = typer.Option(None, "--p2p", metavar="FILE", help="`nvidia-smi topo -p2p` output of the same node."),
    layout: str = typer.Option(None, "--layout", help="tp=N,pp=N,dp=N, placed by the planner's placement."),
    plan_file: str = typer.Option(None, "--plan", metavar="FILE", help="A plan saved by `topoplan plan -o FILE`: "
                                  "launch its row --rank N exactly, with every option that priced it (model, "
                                  "topology, engine, dtypes, batch, lengths, limits); refused when stale."),
    rank: int = typer.Option(None, "--rank", help="Launch row N of `topoplan plan` (1 = best) for the same "
                             "--model, --topo, --gpu, --nodes and --objective."),
    model: str = typer.Option(None, "--model", "-m", help=f"Planner model: catalog name, alias ({ALIAS_HELP}) or a "
                              "path to a HF config.json. Also the runner's model when it is a built-in (tiny, small)."),
    checkpoint: str = typer.Option(None, "--checkpoint", metavar="DIR", help="HF checkpoint folder (on the launch "
                                   "hosts) for the default runner command; needed unless --model is a built-in."),
    prompt: list[str] = typer.Option([], "--prompt", metavar="TEXT", help="Prompt text for the default runner "
                                     "command (repeat for a batch)."),
    prompt_ids: list[str] = typer.Option([], "--prompt-ids", metavar="IDS", help="Prompt token ids for the default "
                                         "runner command, e.g. 1,2,3 (repeat for a batch). Default without --prompt: "
                                         "1,2,3."),
    gpu: str = typer.Option(None, "--gpu", help="GPU model for the plan (--rank with --topo text, which names no "
                            "GPU)."),
    objective: str = typer.Option("latency", "--objective", help="Plan objective for --rank: latency or throughput."),
    nodes: int = typer.Option(1, "--nodes", help="Identical nodes to spread the layout over."),
    hosts: str = typer.Option(None, "--hosts", help="Host names, one per node, node 0 first: a,b."),
    port: int = typer.Option(None, "--port", help=f"--engine topoplan: the rendezvous TCP port on node 0 (default "
                             f"{DEFAULT_MASTER_PORT}). A serving engine: its HTTP port (default 8000)."),
    master_port: int = typer.Option(None, "--master-port", help="A serving engine's rendezvous TCP port on node 0 "
                                    f"(default {DEFAULT_MASTER_PORT})."),
    engine: str = typer.Option(None, "--engine", help="topoplan (default: the bundled runner, per-rank lines), or a "
                               "serving engine: vllm, sglang, trtllm (its own command per node; see "
                               "docs/launch-engines.md)."),
    device: str = typer.Option("gpu", "--device", help="gpu, or cpu: ranks on CPUs alone (this machine's NUMA "
                               "nodes; the bundled runner over gloo, or --engine vllm's CPU build), no GPU requests; "
                               "needs --layout."),
    ifname: str = typer.Option(None, "--ifname", metavar="IF", help="Several nodes: the network interface that "
                               "reaches the other nodes, for NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (default with "
                               "--this-machine: the one routing to the first --hosts; else the script asks for "
                               "TOPOPLAN_IFNAME)."),
    host: str = typer.Option(None, "--host", help="A serving engine's HTTP address (default 127.0.0.1; srun/sbatch: "
                             "node 0's address, read from the allocation; lws: 0.0.0.0, the pod's interfaces)."),
    engine_python: str = typer.Option("python3", "--engine-python", metavar="PYTHON", help="The Python that has "
                                      "the engine installed (default: python3 on PATH)."),
    kv_cache_gib: int = typer.Option(1, "--kv-cache-gib", help="--device cpu: vLLM's KV cache in GiB "
                                     "(VLLM_CPU_KVCACHE_SPACE)."),
    fmt: LaunchFormat = typer.Option(LaunchFormat.shell, "--format", help="Launcher to write the lines for."),
    explain: bool = typer.Option(False, "--explain", help="Also print every variable's reason (on stderr)."),
    this_machine: bool = typer.Option(False, "--this-machine", help="The --topo file is of this machine: read SMT "
                                      "siblings, NUMA nodes and online CPUs from /sys instead of assuming Linux "
                                      "numbering."),
    output: str = typer.Option(None, "--output", "-o", metavar="FILE", help="Write to FILE (atomically) instead of "
                               "stdout."),
    mem_policy: str = typer.Option("preferred", "--mem-policy", help="numactl memory policy on the rank's NUMA "
                                   "node: preferred (spills when full), bind (strict) or none."),
    partition: str = typer.Option(None, "--partition", help="Slurm partition (srun, sbatch)."),
    account: str = typer.Option(None, "--account", help="Slurm account (srun, sbatch)."),
    time_limit: str = typer.Option(None, "--time", help="Slurm time limit, e.g. 30, 1:00:00, 1-12:00:00."),
    job_name: str = typer.Option(None, "--job-name", help="Slurm job name (sbatch default: topoplan)."),
    allow_run_as_root: bool = typer.Option(False, "--allow-run-as-root", help="mpirun: export OMPI_ALLOW_RUN_AS_"
                                           "ROOT(_CONFIRM)=1, which Open MPI needs to start as root."),
    image: str = typer.Option(None, "--image", help="--format lws: the engine's container image."),
    pod_memory: str = typer.Option(None, "--pod-memory", help="--format lws: each pod's memory (request = limit, "
                                   "e.g. 900Gi), making it Guaranteed so the kubelet can pin its CPUs."),
    preflight: bool = typer.Option(False, "--preflight", help="The script first runs `topoplan doctor --for` on its "
                                   "host and stops with its one line when the layout is blocked there "
                                   "(docs/doctor.md)."),
) -> None:
    """Per-rank environment, CPU/NUMA binding and the lines that start a layout with your launcher, or a serving
    engine's own command (--engine vllm|sglang|trtllm; extra engine options after --)."""
    from rich.console import Console

    from topoplan.atomic import write_atomic
    from topoplan.engines import resolve
    from topoplan.launch.command import LaunchRequest, engine_launch_for, launch_spec, load_saved_plan, parse_hosts
    from topoplan.launch.engines.common import DEFAULT_HOST, DEFAULT_SERVE_PORT
    from topoplan.launch.engines.scripts import render_engine
    from topoplan.launch.explain import explain as explain_spec
    from topoplan.launch.explain import explain_engine
    from topoplan.launch.formats import render
    from topoplan.launch.launcher_options import LauncherOptions
    from topoplan.launch.runtime_addr import default_serve_host
    from topoplan.layout import Layout

    try:
        saved = None
        if plan_file is not None:
            saved = load_saved_plan(plan_file, rank, given={
                "--model": model, "--topo": topo, "--gpu": gpu, "--layout": layout, "--engine": engine,
                "--objective": objective != "latency", "--nodes": nodes != 1})
            asked = saved.request
            model, topo, gpu, objective = asked.model, asked.topo, asked.gpu, asked.objective
            engine, nodes = str(asked.engine), saved.row.nodes
        chosen_engine = resolve(engine or "topoplan")
        serving = chosen_engine.serves
        if not serving and master_port is not None:
            raise TopoplanError("--master-port is for serving engines; the bundled runner's rendezvous port is --port")
        request = LaunchRequest(layout=Layout.parse(layout) if layout is not None else None, rank=rank, model=model,
                                topo=topo, p2p=p2p, gpu=gpu, objective=objective, nodes=nodes,
                                hosts=parse_hosts(hosts),
                                port=(master_port if serving else port) or DEFAULT_MASTER_PORT,
                                command=tuple(command or ()), this_machine=this_machine, checkpoint=checkpoint,
                                prompts=tuple(prompt), prompt_ids=tuple(prompt_ids), engine=chosen_engine,
                                device=device,
                                host=host if host is not None else default_serve_host(fmt.value, DEFAULT_HOST),
                                serve_port=port if serving and port is not None else DEFAULT_SERVE_PORT,
                                engine_python=engine_python, kv_cache_gib=kv_cache_gib, mem_policy=mem_policy,
                                launcher=LauncherOptions(partition, account, time_limit, job_name, allow_run_as_root,
                                                         image=image, pod_memory=pod_memory), saved=saved,
                                ifname=ifname)
        served = engine_launch_for(request, fmt.value) if serving else None
        spec = served.spec if served is not None else launch_spec(request)
        text = render_engine(served, fmt.value) if served is not None else render(spec, fmt.value)
        if preflight:
            from topoplan.launch.preflight import preflight_line, with_preflight

            text = with_preflight(text, preflight_line(str(spec.layout), nodes, topo, chosen_engine.name, device))
    except TopoplanError as error:
        raise fail(error) from None
    if explain and served is not None:
        explain_engine(served, Console(stderr=True))
    elif explain:
        explain_spec(spec, Console(stderr=True))
    if output is not None:
        write_atomic(output, text, executable=fmt not in (LaunchFormat.json, LaunchFormat.lws))
    else:
        sys.stdout.write(text)


@app.command("doctor")
def doctor_command(
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON (docs/doctor.md)."),
    save: str = typer.Option(None, "--save", metavar="FILE", help="Also write what was read as one JSON recording "
                             "(atomically), for bug reports and --file."),
    file: str = typer.Option(None, "--file", metavar="FILE", help="Judge a saved recording instead of this machine."),
    for_layout: str = typer.Option(None, "--for", "--layout", metavar="LAYOUT", help="tp=N,pp=N,dp=N: check what "
                                   "this layout needs (its NICs up, P2P in its TP groups, /dev/shm, the CPUs it "
                                   "binds), placed as `launch` places it."),
    topo: str = typer.Option(None, "--topo", metavar="FILE", help="With --for: the topology the layout is placed on "
                             "(a `topo -m` paste or NVML recording). Default: this machine, through NVML."),
    gpu: str = typer.Option(None, "--gpu", help="With --for and a `topo -m` paste: the GPU model."),
    nodes: int = typer.Option(1, "--nodes", help="With --for: identical nodes the layout spans (NICs matter from 2)."),
    engine: str = typer.Option("topoplan", "--engine", help="With --for: the engine whose /dev/shm need is checked: "
                               "topoplan, vllm, sglang, trtllm."),
    preflight: bool = typer.Option(False, "--preflight", help="With --for, for launch scripts: print nothing when "
                                   "the layout can run, a warning per slowing finding, and one line and exit 4 when "
                                   "something blocks it."),
) -> None:
    """What on this machine will slow or hang a multi-GPU launch: PCIe links, ACS, IOMMU, NVLink, RDMA ports,
    /dev/shm, memlock, NUMA balancing, governors, cpuset. Exit 0 (ok, notes), 3 (slows), 4 (blocks)."""
    from topoplan.doctor.finding import exit_code
    from topoplan.doctor.run import diagnose, get_recording

    try:
        if preflight and for_layout is None:
            raise TopoplanError("--preflight checks a layout: pass --for tp=N,pp=N,dp=N")
        if for_layout is None and (topo, gpu, nodes, engine) != (None, None, 1, "topoplan"):
            raise TopoplanError("--topo, --gpu, --nodes and --engine describe a layout: pass --for tp=N,pp=N,dp=N too")
        recording, source = get_recording(file, save)
        findings = diagnose(recording, for_layout, topo, nodes, engine, gpu)
    except TopoplanError as error:
        raise fail(error) from None
    if preflight:
        from topoplan.doctor.for_layout import blocking_line

        warn([f"doctor: {f.subject}: {f.message} ({f.evidence})" for f in findings if f.severity == "slows"])
        if (line := blocking_line(findings)) is not None:
            print(f"topoplan: preflight: {printable(line)}", file=sys.stderr)
            raise typer.Exit(exit_code(findings))
        return
    if as_json:
        from topoplan.doctor.findings_table import findings_json

        print(json.dumps(findings_json(findings, source), indent=1))
    else:
        from topoplan.doctor.findings_table import print_findings

        print_findings(findings, source)
    if code := exit_code(findings):
        raise typer.Exit(code)


@app.command()
def run(
    model: str = typer.Option("tiny", "--model", "-m", help="Built-in model (tiny, small) or an HF checkpoint folder."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, help="Pipeline stages."),
    dp: int = typer.Option(1, help="Data-parallel replicas (each takes a share of the prompts)."),
    ep: int = typer.Option(1, help="MoE checkpoints: split the experts over this many ranks of each TP group "
                           "(must divide --tp; tokens travel by all-to-all)."),
    prompt: list[str] = typer.Option([], help="Prompt text (repeat for a batch); needs tokenizer.json or a built-in "
                                     "model."),
    prompt_ids: list[str] = typer.Option([], help="Prompt as token ids, e.g. 1,2,3 (repeat for a batch)."),
    max_new_tokens: int = typer.Option(32, help="Tokens to generate per prompt (fewer if EOS comes first)."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    backend: str = typer.Option(None, help="nccl or gloo (default: nccl when CUDA is available)."),
    timeout: float = typer.Option(300.0, help="Seconds to wait for the rendezvous and for any collective."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling threshold (with --temperature)."),
    seed: int = typer.Option(0, help="Sampling seed (the same on every rank)."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Always generate --max-new-tokens (benchmarks)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (see docs/runner.md); no progress bar."),
    micro_batches: int = typer.Option(0, "--micro-batches", help="Pipeline micro-batches in flight (0: one per stage, "
                                      "the schedule `plan` prices; 1: none)."),
    shared_memory: bool = typer.Option(True, "--shared-memory/--no-shared-memory", help="TP and EP collectives and "
                                       "pipeline messages between CPU ranks of one host through shared memory (else "
                                       "gloo's sockets)."),
    compile_step: bool = typer.Option(False, "--compile", help="Compile each stage's forward with torch.compile "
                                      "before generating (fewer, fused kernels per decode step; tens of seconds "
                                      "of start-up, reported as compile_s; docs/runner.md)."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="GPUs: record each micro-batch's decode step "
                                     "once as a CUDA graph and replay it every step (fixed-shape step over the "
                                     "whole KV cache; docs/runner.md)."),
    fixed_threads: bool = typer.Option(False, "--fixed-threads", help="CPU: keep each rank's threads at its cores' "
                                       "count (else a rank with no collective in its step, TP, PP and EP 1, runs "
                                       "one thread fewer while another process slows it; docs/runner.md)."),
    save: str = typer.Option(None, help="Write the built-in --model as an HF checkpoint folder here (a new folder in "
                             "an existing one), then exit; takes no other option."),
) -> None:
    """Run the sharded inference runner on this machine: one local process per rank (gloo on CPUs)."""
    from topoplan.run_options import RunOptions
    from topoplan.runner.local import check_save, run_local

    try:
        opts = RunOptions(model=model, tp=tp, pp=pp, dp=dp, ep=ep, prompt=prompt, prompt_ids=prompt_ids,
                          max_new_tokens=max_new_tokens, dtype=dtype, backend=backend, timeout=timeout,
                          temperature=temperature, top_p=top_p, seed=seed, ignore_eos=ignore_eos, json=json_out,
                          micro_batches=micro_batches, no_shared_memory=not shared_memory, compile=compile_step,
                          cuda_graphs=cuda_graphs, fixed_threads=fixed_threads)
        if save is not None:
            from topoplan.runner.builtin import BUILTIN
            from topoplan.runner.tiny import save_checkpoint

            print(save_checkpoint(check_save(save, opts), BUILTIN[model]))
            return
        code = run_local(opts)
    except TopoplanError as error:
        raise fail(error) from None
    if code:
        raise typer.Exit(code)


@app.command("bench")
def bench_command(
    ops: str = typer.Option(bench_defaults.DEFAULT_OPS, "--ops",
                            help="Comma-separated collectives; ops the backend lacks are listed as skipped."),
    sizes: str = typer.Option(bench_defaults.DEFAULT_SIZES, "--sizes",
                              help="LO:HI doubling (4K:256M, powers of 1024) or a list 4K,1M."),
    ranks: int = typer.Option(None, "--ranks", help="Ranks to start on this machine (default: GPUs, else 2; at most "
                              "8 per CPU)."),
    layout: str = typer.Option(None, "--layout", help="tp=..,pp=..,dp=..: run inside this layout's groups "
                               "(see --groups); starts layout.world ranks."),
    groups: str = typer.Option(None, "--groups", help="With --layout: which groups run the collectives "
                               "(tp, pp, dp; default tp), all at once, as the runner would."),
    backend: str = typer.Option(None, "--backend", help="nccl or gloo (default: nccl when CUDA is available)."),
    dtype: str = typer.Option(bench_defaults.DEFAULT_DTYPE, "--dtype",
                              help="float32, bfloat16, float16 or float8_e4m3fn."),
    iters: int = typer.Option(bench_defaults.DEFAULT_ITERS, "--iters", min=1, help="Timed operations per point."),
    warmup: int = typer.Option(bench_defaults.DEFAULT_WARMUP, "--warmup", min=0,
                               help="Untimed operations before each point."),
    timeout: float = typer.Option(bench_defaults.DEFAULT_TIMEOUT_S, "--timeout",
                                  help="Seconds for rendezvous and each collective."),
    plot: str = typer.Option(None, "--plot", help="Write busbw vs size as an SVG chart to this .svg file."),
    check: bool = typer.Option(False, "--check", "-c", help="Verify every result (nccl-tests' -c): the #wrong "
                               "column counts the wrong elements over all ranks."),
    redop: str = typer.Option("sum", "--redop", "-o", help="Reduction of all_reduce, reduce and reduce_scatter: "
                              "sum, prod, min, max or avg (avg: NCCL only)."),
    root: int = typer.Option(0, "--root", "-r", help="Root of broadcast, reduce, gather and scatter (a rank of "
                             "the group)."),
    shared_memory: bool = typer.Option(False, "--shared-memory", help="all_reduce (sum), all_to_all "
                                       "and sendrecv between CPU ranks of one host through shared memory, as `topoplan "
                                       "run`'s TP/EP groups and pipeline stages do (gloo else)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (docs/bench.md)."),
) -> None:
    """nccl-tests-style sweep: time, algbw and busbw per collective and size, over local ranks."""
    from rich.console import Console

    from topoplan.atomic import write_atomic
    from topoplan.bench.launch import spawn_json
    from topoplan.bench.plot import svg
    from topoplan.bench.report import print_bench
    from topoplan.bench.request import BenchRequest

    try:
        request = BenchRequest.from_options(ops=ops, sizes=sizes, ranks=ranks, layout=layout, groups=groups,
                                            backend=backend, dtype=dtype, iters=iters, warmup=warmup, timeout=timeout,
                                            plot=plot, redop=redop, root=root, check=check,
                                            shared_memory=shared_memory)
        world = request.world()
        request.check_backend(world)
        result = spawn_json(world, "topoplan.bench.sweep_worker", request.worker_argv(), echo=not as_json, what="bench")
        if plot:
            write_atomic(plot, svg(result["results"], f"busbw vs size: {result['backend']}, "
                                                      f"groups of {result['group_size']}"))
    except TopoplanError as error:
        raise fail(error) from None
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_bench(result, Console())


@app.command("calibrate")
def calibrate_command(
    out: str = typer.Option("calibration.json", "--out", "-o", help="Calibration file to write (atomically)."),
    sizes: str = typer.Option("1K:4M", "--sizes", help="Collective sizes swept per link class."),
    iters: int = typer.Option(20, "--iters", min=1, help="Timed operations per size."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed operations before each size."),
    dtype: str = typer.Option(None, "--dtype", help="Probe dtype: fp32, bf16, fp16 (default: bf16 on GPU, "
                              "fp32 on CPU)."),
    topo: str = typer.Option(None, "--topo", "--file", help="GPU machines: `topo -m` text file naming the link "
                             "classes (--file is the same option; default: NVML)."),
    probe_mib: int = typer.Option(256, "--probe-mib", help="Buffer size of the memory and GEMV probes (MiB): "
                                  "far above the last-level cache."),
    force: bool = typer.Option(False, "--force", help="Measure and write even when the machine is busy (the file "
                               "records the warnings)."),
    as_json: bool = typer.Option(False, "--json", help="Also print the file's contents."),
    engine: str = typer.Option("topoplan", "--engine", help="topoplan (the runner and this machine), or vllm: serve "
                               "vLLM's CPU build on every layout it runs here and fit its overheads into a copy of "
                               "--calibration."),
    calibration: str = typer.Option(None, "--calibration", help="--engine vllm: the CPU calibration file of "
                                    "`topoplan calibrate` to start from."),
    engine_python: str = typer.Option("python3", "--engine-python", metavar="PYTHON", help="--engine vllm: the Python "
                                      "of a venv with vllm-cpu."),
    model: str = typer.Option("small", "--model", "-m", help="--engine vllm: the runner model vLLM serves."),
) -> None:
    """Measure collectives per link class, memory bandwidth, GEMV/GEMM, and write the planner's calibration."""
    from topoplan.atomic import check_folder
    from topoplan.bench.calibrate import calibrate
    from topoplan.bench.drivers import driver_of
    from topoplan.engines import resolve
    from topoplan.plan.calibration_file import calibration_json, write_calibration_file

    try:
        check_folder(out)
        chosen = resolve(engine)
        if chosen.serves:
            driver = driver_of(chosen, "calibrate")
            if calibration is None:
                raise TopoplanError(f"--engine {engine} prices layouts with this machine's CPU calibration: pass "
                                    "--calibration FILE (from `topoplan calibrate`)")
            document = driver.calibrate_served(chosen, calibration, model=model, python=engine_python, force=force)
            path = write_calibration_file(out, document)
            fit = document.engines[chosen.name]
            c = fit.constants
            print(f"wrote {path}: {chosen.name} {fit.engine_version} overhead per layer "
                  f"{c.layer_overhead_us:.1f} us in prefill, {c.decode_layer_overhead_us:.1f} us in "
                  f"decode; per step {c.step_overhead_us:.1f} us + {c.step_overhead_per_rank_us:.1f} "
                  "us per extra rank")
            return
        with progress_steps(as_json) as on_step:
            document = calibrate(sizes=sizes, iters=iters, warmup=warmup, dtype=dtype, topo=topo, probe_mib=probe_mib,
                                 force=force, on_step=on_step)
        path = write_calibration_file(out, document)
    except TopoplanError as error:
        raise fail(error) from None
    warn(document.measured.load_warnings if document.measured else [])
    if as_json:
        print(json.dumps(calibration_json(document), indent=2))
    else:
        cal = document.calibration()
        links = ", ".join(f"{k}: alpha {v.alpha_us:.1f} us, {v.bandwidth_gbps:.2f} GB/s"
                          for k, v in cal.links.items() if v.bandwidth_gbps)
        print(f"wrote {path}: base {cal.collective_base_us:.1f} us; {links or 'no link measured'}; "
              f"memory efficiency {cal.memory_bandwidth_efficiency:.2f}, "
              f"layer overhead {cal.layer_overhead_us:.1f} us")


@app.command("validate")
def validate_command(
    model: str = typer.Option("small", "--model", "-m", help="Runner model: tiny, small (~370 MB fp32, memory-bound "
                              "decode on a CPU) or an HF checkpoint folder."),
    layouts: str = typer.Option("all", "--layouts", help="`all` (every CPU-process layout that fits) or layouts "
                                "separated by ';', e.g. 'tp=2;pp=2;tp=1,dp=2'."),
    calibration: str = typer.Option(None, "--calibration", help="Calibration file from `topoplan calibrate` "
                                    "(needs its `cpu` entry)."),
    batch: int = typer.Option(2, "--batch", help="Prompts in the batch (split over DP replicas)."),
    prompt_len: int = typer.Option(32, "--prompt-len", help="Tokens per prompt."),
    gen_len: int = typer.Option(32, "--gen-len", help="New tokens per prompt."),
    repeats: int = typer.Option(3, "--repeats", help="Runs per layout, interleaved; the median is kept."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds per run."),
    force: bool = typer.Option(False, "--force", help="Measure even when the machine is busy (the result records "
                               "the warnings)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (docs/bench.md)."),
    engine: str = typer.Option("topoplan", "--engine", help="topoplan (the runner), or vllm: vLLM's CPU build "
                               "served on every layout it runs here, priced with `calibrate --engine vllm`'s fit."),
    engine_python: str = typer.Option("python3", "--engine-python", metavar="PYTHON", help="--engine vllm: the Python "
                                      "of a venv with vllm-cpu."),
) -> None:
    """Predicted vs measured prefill and decode time for every layout that fits this machine."""
    from rich.console import Console

    from topoplan.bench.drivers import driver_of
    from topoplan.bench.report import print_validate
    from topoplan.bench.validate import validate
    from topoplan.engines import resolve

    try:
        chosen = resolve(engine)
        if chosen.serves:
            driver = driver_of(chosen, "validate")
            if layouts.strip().lower() != "all":
                raise TopoplanError(f"--engine {engine} validates every layout it runs here: drop --layouts")
            result = driver.validate_served(chosen, model, calibration, python=engine_python, batch=batch,
                                            prompt_len=prompt_len, gen_len=gen_len, repeats=repeats,
                                            timeout_s=timeout, force=force)
        else:
            with progress_steps(as_json) as on_step:
                result = validate(model, layouts, calibration, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                                  repeats=repeats, timeout_s=timeout, force=force, on_step=on_step)
    except TopoplanError as error:
        raise fail(error) from None
    warn(result["load"]["warnings"])
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_validate(result, Console())


def _usage_error_base() -> type[Exception]:
    """The base class of typer's usage errors: typer >= 0.2x vendors click and exposes it as TyperException."""
    base = getattr(typer, "TyperException", None)
    if base is None:
        import click

        base = click.ClickException
    return base


def main() -> None:
    """Console-script entry point: user errors (ours and typer's usage errors) become one line on stderr
    and exit code 2, never a traceback or a boxed panel."""
    try:
        code = app(prog_name="topoplan", standalone_mode=False)  # also under `python -m topoplan`
    except TopoplanError as error:
        code = fail(error).exit_code
    except typer.Abort:
        print("topoplan: aborted", file=sys.stderr)
        code = 1
    except _usage_error_base() as error:
        ctx = getattr(error, "ctx", None)
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()  # `topoplan` alone: the help text (click prints it on stdout), exit 2
        else:
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            print(f"topoplan: error: {printable(error.format_message())}{where}", file=sys.stderr)
        code = getattr(error, "exit_code", 2)
    raise SystemExit(code or 0)
