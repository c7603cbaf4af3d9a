"""Options declared on dataclass fields (topoplan.option_fields) and the typer commands made of them
(topoplan.cli_options): the way back to the dataclass, the help, the one-line errors, and that a command
imports only its own requests."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from topoplan.cli_options import Commands, Unbuilt
from topoplan.errors import TopoplanError
from topoplan.option_fields import argument, build, nested, option

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@dataclass(frozen=True)
class Shape:
    width: int = field(default=2, metadata=option("--width", help="Columns."))
    label: str = field(default="x", metadata=option("--label", "-l", help="Name."))


@dataclass(frozen=True)
class Ask:
    """A request with every kind of option field."""

    name: str = field(metadata=option("--name", help="Required."))
    parts: tuple[int, ...] = field(default=(1,), metadata=option(
        "--parts", type=str, default="1", parse=lambda text: tuple(int(p) for p in text.split(",")),
        help="Comma list."))
    mode: str = field(default="fast", metadata=option("--mode", choices=("fast", "exact"), help="Mode."))
    count: int = field(default=1, metadata=option("--count", default=None, help="None: not given."))
    shape: Shape = field(default_factory=Shape, metadata=nested())
    words: tuple[str, ...] = field(default=(), metadata=argument(parse=tuple, help="Words."))
    internal: int = 7  # no option

    def __post_init__(self) -> None:
        if self.shape.width > 10:
            raise TopoplanError(f"--width {self.shape.width}: at most 10")


@dataclass(frozen=True)
class Settled:
    """A request that settles an option default of its nested dataclass in from_cli."""

    shape: Shape = field(default_factory=Shape, metadata=nested())
    scale: int | None = field(default=None, metadata=option("--scale", help="Scale."))

    @classmethod
    def from_cli(cls, kwargs: dict) -> Settled:
        shape = kwargs["shape"]
        return cls(shape=Shape(**{**shape, "width": shape["width"] * (kwargs["scale"] or 1)}), scale=kwargs["scale"])


def test_build_parses_nests_and_keeps_defaults():
    built = build(Ask, {"name": "a", "parts": "3,4", "width": 5, "words": ["x", "y"]})
    assert built == Ask(name="a", parts=(3, 4), mode="fast", count=None, shape=Shape(5, "x"), words=("x", "y"))
    assert built.internal == 7
    assert build(Ask, {"name": "b", "words": None}).words == ()  # typer's None for no arguments: the field's ()
    assert build(Ask, {"name": "c"}, internal=9).internal == 9  # extra: fields that are no options


def test_build_runs_the_dataclass_checks():
    with pytest.raises(TopoplanError, match=r"^--width 11: at most 10$"):
        build(Ask, {"name": "a", "width": 11})


def test_from_cli_gets_the_nested_arguments_to_settle():
    assert build(Settled, {"width": 3, "scale": 4}).shape == Shape(12, "x")
    assert build(Settled, {}).shape == Shape(2, "x")


def command_app(*sources, body) -> typer.Typer:
    commands = Commands()
    app = typer.Typer(cls=commands.group, add_completion=False)
    app.callback()(lambda: None)  # a group, as topoplan's app (its commands are all built when used)
    commands.command("go", *sources)(body)
    commands.command("other", Shape)(lambda shape: print("other", shape.width))
    return app


@dataclass(frozen=True)
class Marked:
    extra: str = field(default="", metadata=option("--extra", help="Needs pip install 'topoplan[aiconfigurator]'."))
    style: str = field(default="", metadata=option("--style", help="Literal [bold]x[/bold]."))


def test_a_command_takes_its_dataclasses_options():
    seen = []
    app = command_app(Ask, body=lambda ask: seen.append(ask))
    result = runner.invoke(app, ["go", "--name", "n", "--mode", "exact", "-l", "lab", "--count", "3", "w1", "w2"])
    assert result.exit_code == 0, result.output
    assert seen == [Ask(name="n", mode="exact", count=3, shape=Shape(2, "lab"), words=("w1", "w2"))]
    assert runner.invoke(app, ["other", "--width", "4"]).stdout == "other 4\n"


def test_help_lists_each_option_with_its_default_and_choices():
    app = command_app(Ask, body=lambda ask: None)
    text = runner.invoke(app, ["go", "--help"], terminal_width=200).stdout
    for expected in ("--name", "Required.", "[required]", "--parts", "Comma list.", "[default: fast]",
                     "fast|exact", "--width", "[default: 2]", "--label", "-l", "Words."):
        assert expected in text, expected
    assert "[default: 1]" in text  # --parts: the text the parse reads
    assert "--internal" not in text and "--count" in text and "[default: None]" not in text


def test_help_shows_square_brackets_as_written():
    """Help text is plain text, not rich markup: `plan --help` said "pip install 'topoplan'" for --estimator, its
    "[aiconfigurator]" taken for a markup tag and dropped."""
    text = runner.invoke(command_app(Marked, body=lambda marked: None), ["go", "--help"], terminal_width=200).stdout
    assert "pip install 'topoplan[aiconfigurator]'" in text and "[bold]x[/bold]" in text


def test_a_failed_check_is_one_line_and_exit_2():
    app = command_app(Ask, body=lambda ask: None)
    result = runner.invoke(app, ["go", "--name", "n", "--width", "11"])
    assert (result.exit_code, result.stderr) == (2, "topoplan: error: --width 11: at most 10\n")
    assert runner.invoke(app, ["go", "--name", "n", "--mode", "slow"]).exit_code == 2  # typer refuses the choice


def test_unbuilt_hands_the_values_to_the_body():
    seen = []
    app = command_app(Unbuilt(Shape), body=lambda given: seen.append(given))
    assert runner.invoke(app, ["go", "--width", "3"]).exit_code == 0
    assert seen == [{"width": 3, "label": "x"}]


def test_two_sources_may_not_share_an_option_name():
    app = command_app(Shape, Ask, body=lambda *made: None)
    with pytest.raises(TypeError, match="share a field name"):
        runner.invoke(app, ["go", "--help"], catch_exceptions=False)


def test_inspect_loads_no_other_command_s_request():
    """`topoplan inspect` builds its command only: no planner, model catalog, engine registry or launch module
    (start-up time, benchmarks/cli_latency.py)."""
    code = ("import sys\nfrom topoplan.cli import main\n"
            "sys.argv = ['topoplan', 'inspect', '--file', 'fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only"
            ".txt', '--json']\ntry:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code\n"
            "loaded = sorted(m for m in sys.modules if m.startswith(('topoplan.plan', 'topoplan.engines', "
            "'topoplan.models', 'topoplan.launch', 'topoplan.bench', 'topoplan.run_options', 'topoplan.doctor')))\n"
            "print(loaded, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[]\n"
    assert done.stdout.startswith("{")


def test_plan_request_settles_batch_and_dtype_from_the_command_line():
    from topoplan.plan.frontend import PlanRequest

    searched = build(PlanRequest, {"model": "70b", "objective": "throughput"})
    assert (searched.workload.batch, searched.search_batch, searched.workload.dtype, searched.dtype_given) == \
        (1, True, "bf16", False)
    fixed = build(PlanRequest, {"model": "70b", "objective": "throughput", "batch": 4, "dtype": "fp8",
                                "ttft_ms": 500.0, "engine": "vllm"})
    assert (fixed.workload.batch, fixed.search_batch, fixed.workload.dtype, fixed.dtype_given) == \
        (4, False, "fp8", True)
    assert (fixed.limits.ttft_ms, fixed.limits.tpot_ms, fixed.engine.name) == (500.0, None, "vllm")


def test_launch_request_ports_and_host_follow_the_engine_and_format():
    from topoplan.launch.command import LaunchRequest

    runner_lines = LaunchRequest.from_options({"layout": "tp=2", "port": 30000}, fmt="shell")
    assert (runner_lines.port, runner_lines.serve_port, runner_lines.host) == (30000, 8000, "127.0.0.1")
    served = LaunchRequest.from_options({"layout": "tp=2", "engine": "vllm", "checkpoint": "/m", "port": 9000},
                                        fmt="lws", master_port=31000)
    assert (served.port, served.serve_port, served.host, served.engine.name) == (31000, 9000, "0.0.0.0", "vllm")
    with pytest.raises(TopoplanError, match="^--master-port is for serving engines"):
        LaunchRequest.from_options({"layout": "tp=2"}, fmt="shell", master_port=31000)
