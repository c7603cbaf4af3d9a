"""End to end: the bundled runner started by the emitted shell, torchrun and mpirun lines (gloo, tiny model)
generates the same tokens as one unsharded process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from launch_support import (
    AS_ROOT,
    FACTS,
    LOOPBACK_HOSTS,
    ROOT,
    block_placements,
    child_env,
    free_port,
    generated_lines,
    local_topology,
)

from topoplan.launch.command import runner_command
from topoplan.launch.formats import render
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
                      launcher=AS_ROOT, command=[*runner_command(layout, "tiny", prompt_ids=[PROMPT_IDS]), *OPTIONS])
    script = tmp_path / "launch.sh"
    script.write_text(render(spec, fmt))
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert tokens(done.stdout) == unsharded


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


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed (.ci/run installs it)")
def test_runner_through_torchrun_on_two_loopback_nodes(unsharded, tmp_path):
    """tp=2 x pp=2 over two "nodes" (127.0.0.1 and 127.0.0.2): each node's torchrun line, started side by side,
    with static rendezvous; the last pipeline stage (node 1) prints the tokens."""
    layout = Layout(tp=2, pp=2)
    spec = build_spec(local_topology(2), layout, block_placements(layout, ["GPU0", "GPU1"], 2), nodes=2,
                      hosts=LOOPBACK_HOSTS, facts=FACTS, master_port=free_port(),
                      command=[*runner_command(layout, "tiny", prompt_ids=[PROMPT_IDS]), *OPTIONS])
    text = render(spec, "torchrun")
    assert "--rdzv-backend" not in text and f"--master-addr={LOOPBACK_HOSTS[0]}" in text
    blocks = text.split("\n# node ")[1:]
    procs = [subprocess.Popen(["bash", "-c", "# node " + block], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for block in blocks]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    printed = [log for log in logs if any(line.startswith("{") for line in log.splitlines())]
    assert len(printed) == 1 and tokens(printed[0]) == unsharded


@pytest.mark.skipif(shutil.which("mpirun") is None or os.geteuid() != 0, reason="needs Open MPI, run as root")
def test_mpirun_as_root_needs_the_opt_in(tmp_path):
    """As root, the line without --allow-run-as-root is refused by Open MPI itself: the opt-in is what makes the
    emitted line run (test_runner_through_emitted_lines runs it with the opt-in)."""
    layout = Layout(tp=2)
    spec = build_spec(local_topology(2), layout, block_placements(layout, ["GPU0", "GPU1"]), facts=FACTS,
                      master_port=free_port(), command=["true"])
    script = tmp_path / "launch.sh"
    script.write_text(render(spec, "mpirun"))
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "OMPI_ALLOW_RUN_AS_ROOT" in done.stdout + done.stderr
