"""`topoplan launch` from the command line: every format renders, --explain has a reason for every variable,
bad input is one line on stderr with exit code 2 and leaves no file behind."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from launch_support import DGX_A100, FIXTURES, ROOT, block_placements, expected_topology
from typer.testing import CliRunner

from topoplan.cli import LaunchFormat, app
from topoplan.cpuset import CpuFacts
from topoplan.errors import TopoplanError
from topoplan.launch.formats import ENGINE_ONLY_FORMATS, FORMATS, render
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout, RankPlacement

DGX = str(FIXTURES / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt")
RTX = FIXTURES / "11_rtx2080ti-4gpu-all-pix.txt"


def launch(*args: str):
    return CliRunner().invoke(app, ["launch", *args])


@pytest.mark.parametrize("fmt", ["torchrun", "mpirun", "srun", "sbatch", "shell", "json"])
def test_every_format_renders(fmt):
    result = launch("--topo", DGX, "--layout", "tp=4,pp=2", "--model", "70b", "--checkpoint", "/m/llama 70b",
                    "--format", fmt)
    assert result.exit_code == 0, result.output
    if fmt == "json":
        data = json.loads(result.stdout)
        assert [r["rank"] for r in data["ranks"]] == list(range(8))
        starts = [line for line in data["commands"] if line.startswith("env RANK=")]
        assert [int(line.split()[1][5:]) for line in starts] == list(range(8))
        assert data["commands"][-1] == 'exit "$status"'
        assert data["ranks"][0]["command"][-8:] == ["--model=/m/llama 70b", "--tp", "4", "--pp", "2", "--dp", "1",
                                                    "--prompt-ids=1,2,3"]
    else:  # the whole text is valid shell: every word quoted
        assert shlex.split(result.stdout, comments=True)


def test_command_after_double_dash_and_explain_gives_every_reason():
    result = launch("--topo", DGX, "--layout", "tp=2", "--format", "json", "--explain", "--", "echo", "--format", "x")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ranks"][1]["command"][-3:] == ["echo", "--format", "x"]
    for rank in data["ranks"]:
        assert set(rank["reasons"]) == set(rank["env"]) and all(rank["reasons"].values())
        for name in rank["env"]:
            assert name in result.stderr
    assert data["ranks"][0]["mem_node_reason"] and "numactl --preferred" in result.stderr


def test_output_file_is_written_executable(tmp_path):
    out = tmp_path / "job.sbatch"
    result = launch("--topo", DGX, "--layout", "tp=8,dp=2", "--nodes", "2", "--hosts", "a,b", "--format", "sbatch",
                    "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("#!/bin/bash\n#SBATCH") and out.stat().st_mode & 0o111
    data = tmp_path / "launch.json"
    assert launch("--topo", DGX, "--layout", "tp=8", "--format", "json", "-o", str(data)).exit_code == 0
    assert json.loads(data.read_text())["ranks"] and not data.stat().st_mode & 0o111
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "launch.json"]  # no temporary left


def small_affinity_paste(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(RTX.read_text().replace("0-19,40-59", "0,40"))  # 4 GPUs, one core (two threads) between them
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--topo", DGX, "--layout", "tp=8,pp=2"], "needs 16 GPUs, but 1 node(s) of this topology have 8"),
    (["--topo", DGX, "--layout", "tp=8,dp=2", "--nodes", "2", "--hosts", "a"], "names 1 host(s) but --nodes is 2"),
    (["--topo", DGX, "--layout", "tp=2", "--hosts", "a,b,c"], "names 3 host(s) but --nodes is 1"),
    (["--topo", DGX, "--layout", "tp=8", "--rank", "1"], "--layout and --rank both choose the layout"),
    (["--topo", DGX], "choose a layout"),
    (["--topo", DGX, "--layout", "tp=8,dp=2", "--nodes", "2", "--format", "torchrun"], "needs their host names"),
    (["--topo", DGX, "--layout", "tp=8,dp=2", "--nodes", "2", "--format", "shell"], "needs their host names"),
    (["--topo", DGX, "--layout", "tp=8,dp=2", "--nodes", "2", "--format", "mpirun"], "needs their host names"),
    (["--topo", DGX, "--layout", "tp=2", "--hosts", "a,,b"], "none empty"),
    (["--topo", DGX, "--layout", "tp=2", "--port", "70000"], "not a TCP port"),
    (["--topo", DGX, "--layout", "tq=2"], "expected tp=N,pp=N,dp=N"),
    (["--topo", "no-such-file.txt", "--layout", "tp=2"], "no-such-file.txt"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    out = tmp_path / "launch.sh"
    result = launch(*args, "-o", str(out))
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1 and result.stderr.startswith("topoplan: error:")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cpu_affinity_too_small(tmp_path):
    result = launch("--topo", small_affinity_paste(tmp_path), "--layout", "tp=4")
    assert result.exit_code == 2
    assert "4 ranks share CPU affinity 0,40, but only 2 of its CPUs are free" in result.stderr


def test_srun_refuses_nodes_bound_differently():
    topo = expected_topology(DGX_A100)
    layout = Layout(tp=2, dp=2)
    placements = block_placements(layout, ["GPU0", "GPU1"], nodes=2)
    placements[2:] = [RankPlacement(2, 1, "GPU6", 0, 0, 1), RankPlacement(3, 1, "GPU7", 1, 0, 1)]
    spec = build_spec(topo, layout, placements, command=["x"], hosts=["a", "b"])
    with pytest.raises(TopoplanError, match="one binding map to every node"):
        render(spec, "srun")
    assert "CUDA_VISIBLE_DEVICES=6,7" in render(spec, "mpirun")  # mpirun places every rank on its own
    shuffled = block_placements(layout, ["GPU0", "GPU1"], nodes=2)
    shuffled = [RankPlacement(p.rank, 1 - p.node, p.gpu, p.tp_rank, p.pp_rank, p.dp_rank) for p in shuffled]
    with pytest.raises(TopoplanError, match="numbers ranks node by node"):
        render(build_spec(topo, layout, shuffled, command=["x"], hosts=["a", "b"]), "torchrun")


def test_rank_launches_the_plans_row():
    plan = CliRunner().invoke(app, ["plan", "--model", "70b", "--topo", DGX, "--gpu", "a100", "--json", "--top", "0"])
    assert plan.exit_code == 0, plan.output
    rows = json.loads(plan.stdout)["layouts"]
    for n in (1, 2):
        result = launch("--topo", DGX, "--model", "70b", "--gpu", "a100", "--rank", str(n), "--format", "json", "--",
                        "my-server")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        row = rows[n - 1]
        assert data["layout"] == {"tp": row["tp"], "pp": row["pp"], "dp": row["dp"], "ep": row["ep"]}
        assert [r["gpu"] for r in data["ranks"]] == [p["gpu"] for p in row["placement"]]
        assert data["nodes"][0]["cuda_visible_devices"] == row["cuda_visible_devices"]


@pytest.mark.parametrize("args, message", [
    (["--topo", DGX, "--rank", "1"], "needs --model"),
    (["--topo", DGX, "--rank", "0"], "--rank 0: expected a row number of `topoplan plan`, counted from 1"),
    (["--topo", DGX, "--rank", "-1", "--model", "70b"], "--rank -1: expected a row number"),
    (["--topo", DGX, "--rank", "999", "--model", "70b", "--gpu", "a100"], "--rank 999: the plan has"),
    (["--topo", DGX, "--rank", "1", "--model", "70b"], "pass --gpu NAME"),
])
def test_rank_bad_input(args, message):
    result = launch(*args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_p2p_matrix_is_read():
    rtx = str(FIXTURES / "14_rtx3090-2gpu-nv4-lxc-cpuset.txt")
    result = launch("--topo", rtx, "--p2p", str(FIXTURES / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt"),
                    "--layout", "tp=2",
                    "--format", "json")
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert [r["cpus"] for r in ranks] == [[4, 6, 9], [15, 17]] and "NCCL_P2P_LEVEL" not in ranks[0]["env"]


@pytest.mark.parametrize("args, model", [
    ([], "tiny"), (["--model", "small"], "small"), (["--model", "70b", "--checkpoint", "/ckpt/70b"], "/ckpt/70b"),
])
def test_default_command_gets_a_loadable_model_and_a_prompt(args, model):
    result = launch("--topo", DGX, "--layout", "tp=2", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    command = json.loads(result.stdout)["ranks"][0]["command"]
    assert command[command.index("python3"):] == ["python3", "-m", "topoplan.runner", f"--model={model}", "--tp", "2",
                                                  "--pp", "1", "--dp", "1", "--prompt-ids=1,2,3"]


def test_prompts_are_forwarded_to_the_runner():
    result = launch("--topo", DGX, "--layout", "tp=2", "--model", "tiny", "--prompt", "Hello there", "--prompt", "x",
                    "--prompt-ids", "4,5", "--format", "json")
    assert result.exit_code == 0, result.output
    command = json.loads(result.stdout)["ranks"][0]["command"]
    assert command[-3:] == ["--prompt=Hello there", "--prompt=x", "--prompt-ids=4,5"]


@pytest.mark.parametrize("args, message", [
    (["--model", "70b"], "--model '70b' is a planner model: pass --checkpoint DIR, or your own command after --"),
    (["--model", "tiny", "--prompt-ids", "1,x"], "--prompt-ids '1,x': expected comma-separated token ids"),
    (["--checkpoint", " "], "--checkpoint: expected a folder"),
    (["--checkpoint", "/ckpt", "--", "my-server"], "with your own COMMAND after --, put them in it"),
    (["--prompt", "hi", "--", "my-server"], "with your own COMMAND after --, put them in it"),
])
def test_default_command_refuses_what_the_runner_cannot_run(args, message, tmp_path):
    out = tmp_path / "launch.sh"
    result = launch("--topo", DGX, "--layout", "tp=2", *args, "-o", str(out))
    assert result.exit_code == 2 and result.stderr.startswith("topoplan: error:") and message in result.stderr, \
        result.output
    assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--objective", "bogus"], "--objective 'bogus': expected one of latency, throughput"),
    (["--gpu", "nosuch"], "unknown GPU 'nosuch'"),
    (["--model", "nosuch", "--", "x"], "unknown model 'nosuch'"),
    (["--model", "70b", "--", "x"], "num_attention_heads=64 is not divisible by tp=3"),
])
def test_plan_options_are_checked_with_layout(args, message, tmp_path):
    out = tmp_path / "launch.sh"
    layout = "tp=3" if "70b" in args else "tp=2"
    result = launch("--topo", DGX, "--layout", layout, *args, "-o", str(out))
    assert result.exit_code == 2 and result.stderr.startswith("topoplan: error:") and message in result.stderr, \
        result.output
    assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_this_machine_refuses_a_paste_from_another_machine(tmp_path):
    online = CpuFacts.read_sysfs().online
    if online is not None and set(range(256)) <= set(online):
        pytest.skip("this machine has every CPU of the DGX paste online")
    out = tmp_path / "launch.sh"
    result = launch("--topo", DGX, "--layout", "tp=2", "--this-machine", "-o", str(out))
    assert result.exit_code == 2 and "which are not online on this machine" in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["torchrun", "mpirun", "srun", "sbatch", "shell"])
def test_output_files_are_scripts_the_kernel_can_start(fmt, tmp_path):
    """An executable file needs a `#!` line: without one, exec fails (ENOEXEC) and only some shells fall back."""
    out = tmp_path / "launch"
    result = launch("--topo", DGX, "--layout", "tp=2", "--format", fmt, "-o", str(out), "--", "true")
    assert result.exit_code == 0, result.output
    first = out.read_text().splitlines()[0]
    assert first in ("#!/usr/bin/env bash", "#!/bin/bash") and out.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0  # valid bash, as the #! line promises


def test_format_choices_are_the_renderers():
    assert tuple(f.value for f in LaunchFormat) == (*FORMATS, *ENGINE_ONLY_FORMATS)


def test_lws_is_refused_for_the_bundled_runner_in_one_line():
    result = launch("--topo", DGX, "--layout", "tp=2", "--format", "lws")
    assert result.exit_code == 2
    assert result.stderr.startswith("topoplan: error: --format lws is for serving engines") and \
        result.stderr.count("\n") == 1


def test_help_reads_like_the_other_commands():
    import click
    import typer.main

    command = typer.main.get_command(app).commands["launch"]
    helps = {p.name: p.help for p in command.params if isinstance(p, click.Option)}
    for name, text in helps.items():
        assert text[0].isupper() and text.endswith("."), (name, text)
    model = next(p for p in command.params if p.name == "model")
    assert "-m" in model.opts
    result = launch("--topo", DGX, "--layout", "tp=2", "-m", "tiny", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["ranks"][0]["command"][-8] == "--model=tiny"


def test_unknown_format_is_one_line(tmp_path):
    """Typer refuses a --format outside the choices; the console entry point makes that one line too."""
    out = tmp_path / "launch.sh"
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--topo", DGX, "--layout", "tp=2", "--format",
                           "pbs", "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("topoplan: error: Invalid value for '--format': 'pbs' is not one of 'torchrun',")
    assert list(tmp_path.iterdir()) == []
