"""The `topoplan` command line: options -> library call -> render. No logic of its own.

Heavy modules (torch, pynvml) are imported inside the commands that need them, so `topoplan inspect`
starts as fast as typer and rich allow.
"""

from __future__ import annotations

import sys

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


def main() -> None:
    """Console-script entry point: user errors become one line and exit code 2, never a traceback."""
    try:
        app()
    except TopoplanError as error:
        raise SystemExit(fail(error).exit_code) from None


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
