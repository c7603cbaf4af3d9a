"""The `topoplan` command line: request -> library call -> render. No logic of its own.

Each command names the request dataclasses it builds; their fields declare the options (topoplan.option_fields,
docs/library.md "Adding an option") and topoplan.cli_options turns them into the typer command, built only when
that command runs or is listed. What is declared here is only how a command shows its result (PlanView,
LaunchView, json_flag). Heavy modules (torch, pynvml, the planner) are imported inside the commands that need
them, so `topoplan inspect` starts as fast as typer and rich allow.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import typer

from topoplan import __version__
from topoplan.cli_options import Commands, Unbuilt, fail
from topoplan.errors import TopoplanError, printable
from topoplan.option_fields import option, options_of
from topoplan.rank_env import DEFAULT_MASTER_PORT

if TYPE_CHECKING:
    from topoplan.bench.measure_requests import CalibrateRequest, ValidateRequest
    from topoplan.bench.request import BenchRequest
    from topoplan.doctor.run import DoctorRequest
    from topoplan.plan.frontend import PlanRequest
    from topoplan.run_options import RunOptions
    from topoplan.topology.inspect_request import InspectRequest

commands = Commands()  # each command is built when called or listed (topoplan.cli_options)
app = typer.Typer(
    cls=commands.group,
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


def json_flag(help: str) -> type:
    """A dataclass of one option, `--json` with this help: a command's choice of JSON over its table."""
    return make_dataclass("JsonFlag", [("json", bool, field(default=False, metadata=option("--json", help=help)))],
                          frozen=True)


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


@commands.command("inspect", "topoplan.topology.inspect_request:InspectRequest")
def inspect(request: InspectRequest) -> None:
    """Show GPUs, NICs, the link between every pair, CPU/NUMA affinity, NVLink islands and warnings."""
    from topoplan.machine import load_topology
    from topoplan.topology.render import emit

    r = request
    emit(load_topology(r.file, r.p2p, r.source, r.save, r.gpu), r.chosen_format, r.output, r.allow_invented_bus_ids)


@dataclass(frozen=True)
class PlanView:
    """What `plan` does with the ranked layouts: how many rows, JSON or a table, and where it plans (GPUs or this
    machine's CPUs)."""

    top: int = field(default=10, metadata=option("--top", help="Show the best N layouts (0: all)."))
    json: bool = field(default=False, metadata=option("--json", help="Print the plan as JSON."))
    per_rank: bool = field(default=False, metadata=option("--per-rank", help="With --json: every rank's placement, "
                                                          "not one node's (every node runs the same shape)."))
    device: str = field(default="gpu", metadata=option(
        "--device", choices=("gpu", "cpu"), help="gpu: GPU layouts (this machine through NVML, or --topo); cpu: "
        "CPU-process layouts of this machine, priced with the --calibration file's `cpu` entry."))
    output: str | None = field(default=None, metadata=option(
        "--output", "-o", metavar="FILE", help="Also write the plan as JSON with the request that priced it, for "
        "`launch --plan FILE --rank N` (docs/launch-engines.md)."))
    disagg: bool = field(default=False, metadata=option(
        "--disagg", help="Disaggregated prefill/decode: prefill and decode workers on separate GPUs, their KV "
        "transfer's NICs, P:D, against the best aggregated layout (docs/planner.md)."))
    pd: str | None = field(default=None, metadata=option(
        "--pd", metavar="P:D", help="With --disagg: fix the prefill:decode worker counts, e.g. 1:3 (default: searched "
        "for the limits)."))
    pd_from: str | None = field(default=None, metadata=option(
        "--pd-from", metavar="FILE", help="With --disagg: take the P:D and each role's worker layout from "
        "aiconfigurator's result (its disagg/best_config_topn.csv, first row, or the run's folder) and place and "
        "price that deployment here."))
    kv_connector: str | None = field(default=None, metadata=option(
        "--kv-connector", choices=("whole", "per-layer"), help="With --disagg: how the KV cache is sent (default "
        "whole: after the prefill, SGLang's and vLLM NixlConnector's way; per-layer: as each layer is done)."))

    def __post_init__(self) -> None:
        if self.top < 0:
            raise TopoplanError(f"--top must be >= 0 (0: all), got {self.top}")


@commands.command("plan", "topoplan.plan.frontend:PlanRequest", PlanView)
def plan_command(request: PlanRequest, view: PlanView) -> None:
    """Rank TP x PP x DP layouts and GPU placements for a model on this machine (or a topo -m file)."""
    from rich.console import Console

    from topoplan.plan.frontend import plan_for
    from topoplan.plan.plan_table import plan_table
    from topoplan.plan.rank import nothing_fits, plan_json
    from topoplan.terminal import emit

    top = view.top or None
    if view.disagg or any(v is not None for v in (view.pd, view.pd_from, view.kv_connector)):
        plan_disagg(request, view)
        return
    if view.device == "cpu":
        from topoplan.plan.cpu_layouts import plan_cpu

        if view.output is not None:
            raise TopoplanError("-o saves a GPU plan for `launch --plan`; a CPU launch takes --layout")
        if request.estimator != "builtin":
            raise TopoplanError("--estimator aiconfigurator prices GPU kernels; a CPU plan has none")
        result = plan_cpu(request)
    else:
        result = plan_for(request)
    document = plan_json(result, top, view.per_rank)
    if view.device == "gpu":
        from topoplan.plan.saved import RECORD_KEY, request_record

        document[RECORD_KEY] = request_record(request)
    if view.output is not None:
        from topoplan.atomic import write_atomic

        write_atomic(view.output, json.dumps(document, indent=1) + "\n")
    warn(result.warnings)
    if view.json:
        print(json.dumps(document, indent=1))
    else:
        console = Console()
        emit(console, plan_table(result, top, console.width))
    if (error := nothing_fits(result)) is not None:  # the rows above show how far off; the exit says it failed
        raise fail(error)


def plan_disagg(request: PlanRequest, view: PlanView) -> None:
    """`plan --disagg`: the plan's JSON with a `disagg` object (and the request with its `disagg` record), or the
    disaggregated tables (topoplan.plan.disagg)."""
    from rich.console import Console

    from topoplan.plan.disagg import DEFAULT_CONNECTOR, DisaggRequest
    from topoplan.plan.disagg_json import disagg_json
    from topoplan.plan.disagg_table import disagg_table
    from topoplan.plan.rank import plan_json
    from topoplan.plan.saved import RECORD_KEY, request_record
    from topoplan.terminal import emit

    if view.device != "gpu":
        raise TopoplanError("--disagg plans GPU workers; --device cpu has no prefill/decode split")
    asked = DisaggRequest.parse(view.pd, view.kv_connector or DEFAULT_CONNECTOR, view.pd_from)
    result = asked.plan(request)
    document = {**plan_json(result.plan, view.top or None), "disagg": disagg_json(result),
                RECORD_KEY: request_record(request, asked)}
    if view.output is not None:
        from topoplan.atomic import write_atomic

        write_atomic(view.output, json.dumps(document, indent=1) + "\n")
    warn(result.chosen.warnings)
    if view.json:
        print(json.dumps(document, indent=1))
    else:
        emit(Console(), disagg_table(result))


class LaunchFormat(str, Enum):  # the keys of topoplan.launch.formats.RENDERERS (not imported here: start-up time)
    torchrun = "torchrun"
    mpirun = "mpirun"
    srun = "srun"
    sbatch = "sbatch"
    shell = "shell"
    json = "json"
    lws = "lws"  # serving engines only: a Kubernetes LeaderWorkerSet (topoplan.launch.engines.render_lws)


@dataclass(frozen=True)
class LaunchView:
    """What `launch` writes and where, and the options that choose the request's values rather than being one of
    them (--plan, --master-port: topoplan.launch.command.LaunchRequest.from_options)."""

    plan_file: str | None = field(default=None, metadata=option(
        "--plan", metavar="FILE", help="A plan saved by `topoplan plan -o FILE`: launch its row --rank N exactly, with "
        "every option that priced it (model, topology, engine, dtypes, batch, lengths, limits); refused when "
        "stale."))
    master_port: int | None = field(default=None, metadata=option(
        "--master-port", help=f"A serving engine's rendezvous TCP port on node 0 (default {DEFAULT_MASTER_PORT})."))
    format: LaunchFormat = field(default=LaunchFormat.shell, metadata=option(
        "--format", type=LaunchFormat, help="Launcher to write the lines for."))
    explain: bool = field(default=False, metadata=option("--explain", help="Also print every variable's reason (on "
                                                         "stderr)."))
    output: str | None = field(default=None, metadata=option("--output", "-o", metavar="FILE", help="Write to FILE "
                                                             "(atomically) instead of stdout."))
    preflight: bool = field(default=False, metadata=option(
        "--preflight", help="The script first runs `topoplan doctor --for` on its host and stops with its one line "
        "when the layout is blocked there (docs/doctor.md)."))
    disagg: bool = field(default=False, metadata=option(
        "--disagg", help="--engine sglang|vllm: plan as `plan --disagg` with the same workload and limit options "
        "and write each prefill and decode worker's server and the router; --rank N: its N-th candidate "
        "(docs/launch-engines.md)."))
    pd: str | None = field(default=None, metadata=option(
        "--pd", metavar="P:D", help="With --disagg: the prefill:decode worker counts, e.g. 1:3 (default: searched)."))


@commands.command("launch", Unbuilt("topoplan.launch.command:LaunchRequest"), LaunchView,
                  context_settings={"allow_interspersed_args": False})
def launch(given: dict[str, Any], view: LaunchView) -> None:
    """Per-rank environment, CPU/NUMA binding and the lines that start a layout with your launcher, or a serving
    engine's own command (--engine vllm|sglang|trtllm; extra engine options after --)."""
    from rich.console import Console

    from topoplan.launch.command import LaunchRequest, engine_launch_for, launch_spec
    from topoplan.launch.engines.scripts import render_engine
    from topoplan.launch.explain import explain as explain_spec
    from topoplan.launch.explain import explain_engine
    from topoplan.launch.formats import render

    fmt = view.format.value
    if view.disagg or view.pd is not None:
        launch_disagg(given, view)
        return
    request = LaunchRequest.from_options(given, fmt=fmt, plan_file=view.plan_file, master_port=view.master_port)
    served = engine_launch_for(request, fmt) if request.serving else None
    spec = served.spec if served is not None else launch_spec(request)
    text = render_engine(served, fmt) if served is not None else render(spec, fmt)
    if view.preflight:
        from topoplan.launch.preflight import preflight_line, with_preflight

        text = with_preflight(text, preflight_line(str(spec.layout), request.nodes, request.topo,
                                                   request.engine.name, request.device))
    if view.explain and served is not None:
        explain_engine(served, Console(stderr=True))
    elif view.explain:
        explain_spec(spec, Console(stderr=True))
    write_launch(text, view)


def write_launch(text: str, view: LaunchView) -> None:
    """The launch's text to -o FILE (atomically; a script executable, JSON and YAML not) or to stdout."""
    from topoplan.atomic import write_atomic

    if view.output is not None:
        write_atomic(view.output, text, executable=view.format not in (LaunchFormat.json, LaunchFormat.lws))
    else:
        sys.stdout.write(text)


def launch_disagg(given: dict[str, Any], view: LaunchView) -> None:
    """`launch --engine sglang|vllm --disagg [--plan FILE] [--rank N]`: the disaggregated plan's workers and router
    (topoplan.launch.engines.disagg), written as --format shell, srun, sbatch, json or lws. The options that choose
    one aggregated layout or bind it otherwise are refused: the disaggregated plan places and binds its workers."""
    from topoplan.engines import resolve
    from topoplan.launch.command import parse_hosts, plan_options_given
    from topoplan.launch.engines.common import DEFAULT_HOST, DEFAULT_SERVE_PORT, ServeOptions
    from topoplan.launch.engines.disagg import check_disagg_engine, disagg_launch_for, saved_disagg_launch
    from topoplan.launch.engines.disagg_scripts import render_disagg
    from topoplan.launch.launcher_options import LauncherOptions
    from topoplan.launch.runtime_addr import default_serve_host
    from topoplan.option_fields import build
    from topoplan.plan.frontend import PlanRequest

    fmt, g = view.format.value, given.get
    engine = g("engine") or "topoplan"
    refused = {"--layout": g("layout"), "--device cpu": g("device", "gpu") != "gpu", "--p2p": g("p2p"),
               "--master-port": view.master_port,
               "--mem-policy": g("mem_policy", "preferred") != "preferred",
               "--objective": g("objective", "latency") != "latency", "--prompt": g("prompts") or g("prompt_ids"),
               "--this-machine": g("this_machine"), "--preflight": view.preflight, "--pod-memory": g("pod_memory"),
               "--allow-run-as-root": g("allow_run_as_root")}
    if view.plan_file is not None:  # the file holds what priced it
        refused.update({"--model": g("model"), "--topo": g("topo"), "--gpu": g("gpu"), "--pd": view.pd,
                        "--nodes": g("nodes", 1) != 1, "--engine": engine != "topoplan",
                        **dict.fromkeys(plan_options_given(given), True)})
    else:
        check_disagg_engine(resolve(engine))
    clash = [name for name, value in refused.items() if value]
    if clash:
        raise TopoplanError(f"--disagg {'--plan FILE ' if view.plan_file else ''}plans and binds its own workers and "
                            f"does not take {', '.join(clash)}: drop it")
    if g("checkpoint") is None or (g("model") is None and view.plan_file is None):
        raise TopoplanError("--disagg needs --checkpoint DIR (what the workers serve) and --model (what the plan "
                            "prices) or --plan FILE (a plan saved by `plan --disagg -o FILE`)")
    host = g("host")
    options = ServeOptions(checkpoint=g("checkpoint"), host=host if host is not None else default_serve_host(
        fmt, DEFAULT_HOST), port=DEFAULT_SERVE_PORT if g("port") is None else g("port"),
        python=g("engine_python") or "python3",
        extra_args=tuple(g("command") or ()), ifname=g("ifname"))
    launcher = LauncherOptions(g("partition"), g("account"), g("time"), g("job_name"), False, g("image"))
    hosts = parse_hosts(g("hosts"))
    rank = 1 if g("rank") is None else g("rank")  # the rank-th of `plan --disagg`'s candidates (1: its choice)
    served = saved_disagg_launch(view.plan_file, options, hosts, launcher, rank) if view.plan_file else \
        disagg_launch_for(build(PlanRequest, {**given, "engine": engine}), view.pd, options, hosts, launcher, rank)
    text = render_disagg(served, fmt)
    warn(served.plan.warnings)
    if view.explain:
        from rich.console import Console

        from topoplan.launch.explain import explain_disagg

        explain_disagg(served, Console(stderr=True))
    write_launch(text, view)


@commands.command("doctor", json_flag("Print the findings as JSON (docs/doctor.md)."),
                  "topoplan.doctor.run:DoctorRequest")
def doctor_command(view: Any, request: DoctorRequest) -> None:
    """What on this machine will slow or hang a multi-GPU launch: PCIe links, ACS, IOMMU, NVLink, RDMA ports,
    /dev/shm, memlock, NUMA balancing, governors, cpuset. Exit 0 (ok, notes), 3 (slows), 4 (blocks)."""
    from topoplan.doctor.finding import exit_code

    findings, source = request.findings()
    if request.preflight:
        from topoplan.doctor.for_layout import blocking_line

        warn([f"doctor: {f.subject}: {f.message} ({f.evidence})" for f in findings if f.severity == "slows"])
        if (line := blocking_line(findings)) is not None:
            print(f"topoplan: preflight: {printable(line)}", file=sys.stderr)
            raise typer.Exit(exit_code(findings))
        return
    if view.json:
        from topoplan.doctor.findings_table import findings_json

        print(json.dumps(findings_json(findings, source), indent=1))
    else:
        from topoplan.doctor.findings_table import print_findings

        print_findings(findings, source)
    if code := exit_code(findings):
        raise typer.Exit(code)


@dataclass(frozen=True)
class RunSave:
    """`run --save DIR`: write the built-in model as a checkpoint instead of running it."""

    save: str | None = field(default=None, metadata=option(help="Write the built-in --model as an HF checkpoint "
                                                           "folder here (a new folder in an existing one), then exit; "
                                                           "takes no other option."))


@commands.command("run", "topoplan.run_options:RunOptions", RunSave)
def run(opts: RunOptions, to: RunSave) -> None:
    """Run the sharded inference runner on this machine: one local process per rank (gloo on CPUs)."""
    from topoplan.runner.local import check_save, run_local

    if to.save is not None:
        from topoplan.runner.builtin import BUILTIN
        from topoplan.runner.tiny import save_checkpoint

        print(save_checkpoint(check_save(to.save, opts), BUILTIN[opts.model]))
        return
    if code := run_local(opts):
        raise typer.Exit(code)


@dataclass(frozen=True)
class KvTransferView:
    """`bench --kv-transfer`: the KV-transfer mode instead of the collective sweep, and its own options
    (topoplan.bench.kv_request.KvBenchRequest checks them)."""

    kv_transfer: bool = field(default=False, metadata=option(
        "--kv-transfer", help="Instead: send one request's KV cache from a prefill to a decode rank (shared memory "
        "and gloo, whole and per layer) and set the planner's price beside it; takes --model, --prompt-len, "
        "--calibration, --dtype, --iters, --warmup, --timeout."))
    model: str | None = field(default=None, metadata=option(
        "--model", "-m", help="--kv-transfer: whose KV cache (default Llama-3.1-8B)."))
    prompt_len: str | None = field(default=None, metadata=option(
        "--prompt-len", help="--kv-transfer: prompt tokens, LO:HI doubling or a list (default 1K:8K)."))
    calibration: str | None = field(default=None, metadata=option(
        "--calibration", help="--kv-transfer: also price with this `topoplan calibrate` file's CPU link."))


@commands.command("bench", "topoplan.bench.request:BenchRequest",
                  json_flag("Print the result as JSON (docs/bench.md)."), KvTransferView)
def bench_command(request: BenchRequest, view: Any, kv: KvTransferView) -> None:
    """nccl-tests-style sweep: time, algbw and busbw per collective and size, over local ranks."""
    from rich.console import Console

    from topoplan.atomic import write_atomic
    from topoplan.bench.launch import spawn_json
    from topoplan.bench.plot import svg
    from topoplan.bench.report import print_bench

    kv_options = {"--model": kv.model, "--prompt-len": kv.prompt_len, "--calibration": kv.calibration}
    if kv.kv_transfer:
        bench_kv_transfer(request, kv, view.json)
        return
    if given := next((name for name, value in kv_options.items() if value is not None), None):
        raise TopoplanError(f"{given} needs --kv-transfer")
    world = request.world()
    request.check_backend(world)
    result = spawn_json(world, "topoplan.bench.sweep_worker", request.worker_argv(), echo=not view.json, what="bench")
    if request.plot:
        write_atomic(request.plot, svg(result["results"], f"busbw vs size: {result['backend']}, "
                                                          f"groups of {result['group_size']}"))
    if view.json:
        print(json.dumps(result, indent=2))
    else:
        print_bench(result, Console())


def bench_kv_transfer(request: BenchRequest, kv: KvTransferView, as_json: bool) -> None:
    """`bench --kv-transfer`: the sweep's options the user changed are refused (this mode takes --dtype, --iters,
    --warmup and --timeout of them); the KV bench runs and prints its table or JSON."""
    from rich.console import Console

    from topoplan.bench.kv_bench import kv_transfer_bench
    from topoplan.bench.kv_request import KvBenchRequest
    from topoplan.bench.report import print_kv_transfer
    from topoplan.bench.request import BenchRequest

    shared = ("dtype", "iters", "warmup", "timeout")
    defaults = BenchRequest()
    refused = [opt.names[0] for f, opt in options_of(BenchRequest)
               if f.name not in shared and getattr(request, f.name) != getattr(defaults, f.name)]
    given = {"model": kv.model, "prompt_len": kv.prompt_len, "calibration": kv.calibration}
    result = kv_transfer_bench(KvBenchRequest.from_options(
        **{k: v for k, v in given.items() if v is not None}, dtype=request.dtype, iters=request.iters,
        warmup=request.warmup, timeout=request.timeout, refused=refused), echo=not as_json)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_kv_transfer(result, Console())


@commands.command("calibrate", "topoplan.bench.measure_requests:CalibrateRequest",
                  json_flag("Also print the file's contents."))
def calibrate_command(r: CalibrateRequest, view: Any) -> None:
    """Measure collectives per link class, memory bandwidth, GEMV/GEMM, and write the planner's calibration."""
    from topoplan.bench.calibrate import calibrate
    from topoplan.bench.measure_requests import driver
    from topoplan.plan.calibration_file import calibration_json, write_calibration_file

    if r.chosen.serves:
        document = driver(r.chosen, "calibrate").calibrate_served(r.chosen, r.calibration, model=r.model,
                                                                  python=r.engine_python, force=r.force)
        path = write_calibration_file(r.out, document)
        fit = document.engines[r.chosen.name]
        c = fit.constants
        print(f"wrote {path}: {r.chosen.name} {fit.engine_version} overhead per layer "
              f"{c.layer_overhead_us:.1f} us in prefill, {c.decode_layer_overhead_us:.1f} us in "
              f"decode; per step {c.step_overhead_us:.1f} us + {c.step_overhead_per_rank_us:.1f} "
              "us per extra rank")
        return
    with progress_steps(view.json) as on_step:
        document = calibrate(sizes=r.sizes, iters=r.iters, warmup=r.warmup, dtype=r.dtype, topo=r.topo,
                             probe_mib=r.probe_mib, force=r.force, on_step=on_step)
    path = write_calibration_file(r.out, document)
    warn(document.measured.load_warnings if document.measured else [])
    if view.json:
        print(json.dumps(calibration_json(document), indent=2))
    else:
        cal = document.calibration()
        links = ", ".join(f"{k}: alpha {v.alpha_us:.1f} us, {v.bandwidth_gbps:.2f} GB/s"
                          for k, v in cal.links.items() if v.bandwidth_gbps)
        print(f"wrote {path}: base {cal.collective_base_us:.1f} us; {links or 'no link measured'}; "
              f"memory efficiency {cal.memory_bandwidth_efficiency:.2f}, "
              f"layer overhead {cal.layer_overhead_us:.1f} us")


@commands.command("validate", "topoplan.bench.measure_requests:ValidateRequest",
                  json_flag("Print the result as JSON (docs/bench.md)."))
def validate_command(r: ValidateRequest, view: Any) -> None:
    """Predicted vs measured prefill and decode time for every layout that fits this machine."""
    from rich.console import Console

    from topoplan.bench.measure_requests import driver
    from topoplan.bench.report import print_validate
    from topoplan.bench.validate import validate

    if r.chosen.serves:
        result = driver(r.chosen, "validate").validate_served(
            r.chosen, r.model, r.calibration, python=r.engine_python, batch=r.batch, prompt_len=r.prompt_len,
            gen_len=r.gen_len, repeats=r.repeats, timeout_s=r.timeout, force=r.force)
    else:
        with progress_steps(view.json) as on_step:
            result = validate(r.model, r.layouts, r.calibration, batch=r.batch, prompt_len=r.prompt_len,
                              gen_len=r.gen_len, repeats=r.repeats, timeout_s=r.timeout, force=r.force,
                              on_step=on_step)
    warn(result["load"]["warnings"])
    if view.json:
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
