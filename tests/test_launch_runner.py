"""End to end: the bundled runner started by the emitted shell, torchrun and mpirun lines (gloo, tiny model)
generates the same tokens as one unsharded process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from launch_support import FACTS, ROOT, block_placements, child_env, free_port, local_topology

from topoplan.launch.command import runner_command
from topoplan.launch.render import render
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout

PROMPT_IDS = "1,2,3"
OPTIONS = ["--max-new-tokens", "4", "--json"]


def tokens(stdout: str) -> list:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))["tokens"]


@pytest.fixture(scope="module")
def unsharded() -> list:
    done = subprocess.run([sys.executable, "-m", "topoplan.runner", "--model", "tiny", "--prompt-ids", PROMPT_IDS,
                           *OPTIONS], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300, check=True)
    return tokens(done.stdout)


@pytest.mark.skipif(shutil.which("numactl") is None or shutil.which("mpirun") is None,
                    reason="numactl / Open MPI not installed (.ci/run installs them)")
@pytest.mark.parametrize("fmt", ["shell", "torchrun", "mpirun"])
def test_runner_through_emitted_lines(fmt, unsharded, tmp_path):
    layout = Layout(tp=2)
    topo = local_topology(2)
    spec = build_spec(topo, layout, block_placements(layout, ["GPU0", "GPU1"]), facts=FACTS, master_port=free_port(),
                      command=[*runner_command(layout, "tiny", prompt_ids=[PROMPT_IDS]), *OPTIONS])
    script = tmp_path / "launch.sh"
    script.write_text(render(spec, fmt))
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert tokens(done.stdout) == unsharded


def generated_lines(stdout: str) -> list[str]:
    """The runner's human output: one `[i] 'text'` line per prompt."""
    return [line for line in stdout.splitlines() if line.startswith("[")]


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed (.ci/run installs it)")
def test_emitted_default_command_runs_for_tiny(tmp_path):
    """No COMMAND: launch's own default runner line (model, degrees, default prompt) runs as emitted."""
    layout = Layout(tp=2)
    default = runner_command(layout, "tiny")
    assert default[-1] == "--prompt-ids=1,2,3"
    spec = build_spec(local_topology(2), layout, block_placements(layout, ["GPU0", "GPU1"]), facts=FACTS,
                      master_port=free_port(), command=default)
    script = tmp_path / "launch.sh"
    script.write_text(render(spec, "shell"))
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    alone = subprocess.run([sys.executable, "-m", "topoplan.runner", "--model", "tiny", "--prompt-ids", "1,2,3"],
                           cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300, check=True)
    assert generated_lines(done.stdout) == generated_lines(alone.stdout) and len(generated_lines(alone.stdout)) == 1
