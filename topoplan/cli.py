"""The `topoplan` command line: options -> library call -> render. No logic of its own.

Heavy modules (torch, pynvml) are imported inside the commands that need them, so `topoplan inspect`
starts as fast as typer and rich allow.
"""

from __future__ import annotations

import sys
from enum import Enum

import typer

from topoplan.errors import TopoplanError
from topoplan.models import ALIAS_HELP

app = typer.Typer(
    name="topoplan",
    help="Read a multi-GPU machine's topology, plan TP x PP x DP layouts, launch, run and measure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(error: TopoplanError) -> "typer.Exit":
    """Print a user error as one line on stderr; return the Exit to raise."""
    print(f"topoplan: error: {error}", file=sys.stderr)
    return typer.Exit(error.exit_code)


@app.callback()
def _root() -> None:
    """topoplan: inspect, plan, launch, run, bench."""


class InspectFormat(str, Enum):
    table = "table"
    json = "json"
    dot = "dot"
    mermaid = "mermaid"
    svg = "svg"
    png = "png"


class InspectSource(str, Enum):
    auto = "auto"
    nvml = "nvml"
    smi = "smi"
    file = "file"


@app.command()
def inspect(
    file: str | None = typer.Option(None, "--file", "-f", metavar="PATH",
                             help="A saved `nvidia-smi topo -m` paste or NVML recording ('-': stdin). "
                                  "Default: read this machine."),
    source: InspectSource = typer.Option(InspectSource.auto, "--source",
                                         help="auto: --file if given, else NVML, else `nvidia-smi topo -m`."),
    save: str | None = typer.Option(None, "--save", metavar="FILE",
                                    help="Also write NVML's raw answers to FILE (JSON), to replay with --file."),
    gpu: str | None = typer.Option(None, "--gpu", metavar="NAME",
                                   help="The GPU model (e.g. h100-sxm), for pastes, which do not name it."),
    p2p: str | None = typer.Option(None, "--p2p", metavar="FILE", help="A `nvidia-smi topo -p2p r|w|n|a|p` matrix to attach."),
    fmt: InspectFormat = typer.Option(InspectFormat.table, "--format", help="Output format; svg/png need -o."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    output: str | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Write to FILE instead of stdout."),
) -> None:
    """Show GPUs, NICs, the link between every pair, CPU/NUMA affinity, NVLink islands and warnings."""
    from topoplan.topology.render import emit
    from topoplan.topology.sources import load_topology

    try:
        emit(load_topology(file, p2p, source.value, save, gpu), "json" if as_json else fmt.value, output)
    except TopoplanError as error:
        raise fail(error) from None


@app.command("plan")
def plan_command(
    model: str = typer.Option(..., "--model", "-m", help=f"Catalog name, alias ({ALIAS_HELP}) or a path to a HF "
                              "config.json."),
    topo: str = typer.Option(None, "--topo", help="`nvidia-smi topo -m` text file; default: read this machine "
                             "through NVML."),
    gpu: str = typer.Option(None, "--gpu", help="GPU model (a100-80gb, h100, ...); needed with --topo text, "
                            "which names no GPU."),
    nodes: int = typer.Option(1, "--nodes", help="Identical nodes of this topology."),
    batch: int = typer.Option(1, "--batch", help="Sequences per DP replica."),
    prompt_len: int = typer.Option(512, "--prompt-len", help="Prompt tokens per sequence."),
    gen_len: int = typer.Option(128, "--gen-len", help="Generated tokens per sequence."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16, fp8 or fp32 (weights and KV cache)."),
    objective: str = typer.Option("latency", "--objective", help="latency (request time) or throughput "
                                  "(tokens/s per GPU)."),
    top: int = typer.Option(10, "--top", help="Show the best N layouts (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    max_tp: int = typer.Option(None, "--max-tp", help="Largest TP degree to consider."),
    tp: int = typer.Option(None, "--tp", help="Fix the TP degree."),
    pp: int = typer.Option(None, "--pp", help="Fix the PP degree."),
    dp: int = typer.Option(None, "--dp", help="Fix the DP degree (all three: price one layout)."),
    nic_gbps: float = typer.Option(None, "--nic-gbps", help="Per-NIC bandwidth between nodes, GB/s (bytes); "
                                   "default by GPU generation (A100: 25, H100: 50)."),
    calibration: str = typer.Option(None, "--calibration", help="Calibration JSON (docs/planner.md) overriding "
                                    "the cost model's constants."),
) -> None:
    """Rank TP x PP x DP layouts and GPU placements for a model on this machine (or a topo -m file)."""
    import json

    from rich.console import Console

    from topoplan.plan.frontend import plan_from_options
    from topoplan.plan.rank import plan_json
    from topoplan.plan.render import plan_table

    try:
        result = plan_from_options(model=model, topo=topo, gpu=gpu, nodes=nodes, batch=batch, prompt_len=prompt_len,
                                   gen_len=gen_len, dtype=dtype, objective=objective, max_tp=max_tp, tp=tp, pp=pp,
                                   dp=dp, nic_gbps=nic_gbps, calibration=calibration)
    except TopoplanError as error:
        raise fail(error) from None
    if as_json:
        print(json.dumps(plan_json(result, top or None), indent=1))
    else:
        Console().print(plan_table(result, top or None))


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
        code = app(standalone_mode=False)
    except TopoplanError as error:
        code = fail(error).exit_code
    except typer.Abort:
        print("topoplan: aborted", file=sys.stderr)
        code = 1
    except _usage_error_base() as error:
        ctx = getattr(error, "ctx", None)
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()  # `topoplan` alone: the help text, on stderr
        else:
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            print(f"topoplan: error: {error.format_message()}{where}", file=sys.stderr)
        code = getattr(error, "exit_code", 2)
    raise SystemExit(code or 0)
