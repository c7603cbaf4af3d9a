"""The `topoplan` command line: options -> library call -> render. No logic of its own.

Heavy modules (torch, pynvml) are imported inside the commands that need them, so `topoplan inspect`
starts as fast as typer and rich allow.
"""

from __future__ import annotations

import sys
from enum import Enum

import typer

from topoplan.errors import TopoplanError

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
