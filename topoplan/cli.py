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


def main() -> None:
    """Console-script entry point: user errors become one line and exit code 2, never a traceback."""
    try:
        app()
    except TopoplanError as error:
        raise SystemExit(fail(error).exit_code) from None
