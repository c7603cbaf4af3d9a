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


@app.command()
def run(
    model: str = typer.Option("tiny", help="Built-in model (tiny, small) or an HF checkpoint folder."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, help="Pipeline stages."),
    dp: int = typer.Option(1, help="Data-parallel replicas (each takes a share of the prompts)."),
    prompt: list[str] = typer.Option([], help="Prompt text (repeat for a batch); needs tokenizer.json or a built-in model."),
    prompt_ids: list[str] = typer.Option([], help="Prompt as token ids, e.g. 1,2,3 (repeat for a batch)."),
    max_new_tokens: int = typer.Option(32, help="Tokens to generate per prompt (fewer if EOS comes first)."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    backend: str = typer.Option(None, help="nccl or gloo (default: nccl when CUDA is available)."),
    timeout: float = typer.Option(300.0, help="Seconds to wait for the rendezvous and for any collective."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling threshold (with --temperature)."),
    seed: int = typer.Option(0, help="Sampling seed (the same on every rank)."),
    ignore_eos: bool = typer.Option(False, help="Always generate --max-new-tokens (benchmarks)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (see docs/runner.md); no progress bar."),
    save: str = typer.Option(None, help="Write the built-in --model as an HF checkpoint folder here, then exit."),
) -> None:
    """Run the sharded inference runner on this machine: one local process per rank (gloo on CPUs)."""
    from topoplan.runner.local import run_local
    from topoplan.runner.options import RunOptions

    try:
        if save is not None:
            from topoplan.runner.builtin import BUILTIN
            from topoplan.runner.tiny import save_checkpoint

            if model not in BUILTIN:
                raise TopoplanError(f"--save writes a built-in model; --model {model!r} is not one of {', '.join(BUILTIN)}")
            print(save_checkpoint(save, BUILTIN[model]))
            return
        code = run_local(RunOptions(model, tp, pp, dp, prompt, prompt_ids, max_new_tokens, dtype, backend, timeout,
                                    temperature, top_p, seed, ignore_eos, json_out))
    except TopoplanError as error:
        raise fail(error) from None
    if code:
        raise typer.Exit(code)


def main() -> None:
    """Console-script entry point: user errors become one line and exit code 2, never a traceback."""
    try:
        app()
    except TopoplanError as error:
        raise SystemExit(fail(error).exit_code) from None
