"""The `topoplan` command line: options -> library call -> render. No logic of its own.

Heavy modules (torch, pynvml) are imported inside the commands that need them, so `topoplan inspect`
starts as fast as typer and rich allow.
"""

from __future__ import annotations

import sys

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


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    command: list[str] = typer.Argument(None, help="COMMAND... to start on every rank (after --); default: the "
                                        "bundled runner with the layout's options"),
    topo: str = typer.Option(..., "--topo", help="`nvidia-smi topo -m` output of one node (- for stdin)"),
    p2p: str = typer.Option(None, "--p2p", help="`nvidia-smi topo -p2p` output of the same node"),
    layout: str = typer.Option(None, "--layout", help="tp=N,pp=N,dp=N"),
    rank: int = typer.Option(None, "--rank", help="the N-th layout of `topoplan plan` (1 = best)"),
    model: str = typer.Option(None, "--model", help="model for the default runner command"),
    nodes: int = typer.Option(1, "--nodes", help="identical nodes to spread the layout over"),
    hosts: str = typer.Option(None, "--hosts", help="host names, one per node, node 0 first: a,b"),
    port: int = typer.Option(29500, "--port", help="rendezvous TCP port on node 0"),
    fmt: str = typer.Option("shell", "--format", help="torchrun | mpirun | srun | sbatch | shell | json"),
    explain: bool = typer.Option(False, "--explain", help="also print every variable's reason (on stderr)"),
    this_machine: bool = typer.Option(False, "--this-machine", help="the topology is of this machine: read SMT "
                                      "siblings and NUMA nodes from /sys instead of assuming Linux numbering"),
    output: str = typer.Option(None, "--output", "-o", help="write to this file (atomically) instead of stdout"),
) -> None:
    """Per-rank environment, CPU/NUMA binding and the lines that start a layout with your launcher."""
    from pathlib import Path

    from rich.console import Console

    from topoplan.launch.command import choose_layout, launch_spec, parse_hosts, runner_command, write_output
    from topoplan.launch.explain import explain as explain_spec
    from topoplan.launch.render import render

    try:
        chosen = choose_layout(layout, rank)
        spec = launch_spec(topo=topo, p2p=p2p, layout=chosen, nodes=nodes, hosts=parse_hosts(hosts), port=port,
                           command=command or runner_command(chosen, model), this_machine=this_machine)
        text = render(spec, fmt)
    except TopoplanError as error:
        raise fail(error) from None
    if explain:
        explain_spec(spec, Console(stderr=True, width=160))
    if output:
        write_output(Path(output), text, executable=fmt in ("shell", "sbatch", "srun", "torchrun", "mpirun"))
    else:
        sys.stdout.write(text)


def main() -> None:
    """Console-script entry point: user errors become one line and exit code 2, never a traceback."""
    try:
        app()
    except TopoplanError as error:
        raise SystemExit(fail(error).exit_code) from None
