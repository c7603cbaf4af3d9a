"""The emitted srun and sbatch lines run unchanged on a real single-node Slurm cluster (tests/slurm_cluster.sh:
munged + slurmctld + slurmd, CPU-only, no GPU configured), for a `--device cpu` launch:

- the bundled runner (tiny model, tp=2) started by `sbatch --wait` and by the srun script inside `salloc`
  prints the same generated text as one unsharded process;
- the launch test worker, started the same way, finds the CPU mask, memory policy and variables the spec
  planned (Slurm's --cpu-bind and --mem-bind did bind it), MASTER_ADDR read from the allocation (the node's
  NodeAddr, 127.0.0.2, named by no launch option), and all-reduces over gloo;
- an engine's sbatch script, and its srun script inside salloc (`--engine vllm --device cpu`, the engine a
  stand-in that records its argv and answers /health, tests/fake_engine.py) serves on the allocation's address
  and prints its URL once /health answers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import ROOT, child_env, free_port, generated_lines

SCRIPT = ROOT / "tests" / "slurm_cluster.sh"
WORKER = ROOT / "tests" / "launch_worker.py"
FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"
NODE_ADDR = "127.0.0.2"  # the cluster's NodeAddr (tests/slurm_cluster.sh)
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "numactl")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(d) is None for d in DAEMONS),
    reason="needs root and slurm-wlm + munge + numactl (.ci/run installs them)")


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    yield dict(child_env(), SLURM_CONF=str(state / "slurm.conf"))
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], timeout=60)


def emit(fmt: str, out: Path, *extra: str) -> Path:
    """`topoplan launch --device cpu` as a user would run it, written to a file."""
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--device", "cpu", "--layout", "tp=2",
                           "--port", str(free_port()), "--format", fmt, "-o", str(out), *extra], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def submit(script: Path, env: dict, tmp_path: Path) -> str:
    """Run an sbatch script (waiting for it) or an srun script (inside salloc); its output."""
    if script.suffix == ".sbatch":
        log = tmp_path / "job.out"
        done = subprocess.run(["sbatch", "--wait", f"--output={log}", str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        return f"{done.returncode}\n" + (log.read_text() if log.exists() else "") + done.stderr
    done = subprocess.run(["salloc", "--exclusive", "--nodes=1", "bash", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    return f"{done.returncode}\n" + done.stdout + done.stderr


@pytest.fixture(scope="module")
def unsharded() -> list[str]:
    done = subprocess.run([sys.executable, "-m", "topoplan.runner", "--model", "tiny", "--prompt-ids", "1,2,3"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300, check=True)
    assert len(generated_lines(done.stdout)) == 1
    return generated_lines(done.stdout)


@pytest.mark.parametrize("fmt", ["sbatch", "srun"])
def test_runner_under_slurm_matches_unsharded(fmt, slurm_env, unsharded, tmp_path):
    script = emit(fmt, tmp_path / f"job.{fmt}", "--model", "tiny", "--partition", "debug")
    output = submit(script, slurm_env, tmp_path)
    assert output.startswith("0\n"), output[-3000:]
    assert generated_lines(output) == unsharded


@pytest.mark.parametrize("fmt", ["sbatch", "srun"])
def test_slurm_binds_what_the_spec_plans(fmt, slurm_env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    spec = tmp_path / "spec.json"
    port = str(free_port())
    common = ["--device", "cpu", "--layout", "tp=2", "--port", port]
    command = ["--", sys.executable, str(WORKER), str(spec), str(out)]
    for fmt_, path in (("json", spec), (fmt, tmp_path / f"job.{fmt}")):
        done = subprocess.run([sys.executable, "-m", "topoplan", "launch", *common, "--format", fmt_, "-o", str(path),
                               *command], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    output = submit(tmp_path / f"job.{fmt}", slurm_env, tmp_path)
    assert output.startswith("0\n"), output[-3000:]
    planned = json.loads(spec.read_text())["ranks"]
    for r in range(2):
        seen = json.loads((out / f"rank{r}.json").read_text())
        assert seen["failures"] == [] and seen["launcher"] == "slurm", seen
        assert seen["affinity"] == planned[r]["cpus"]
        assert seen["env"]["MASTER_ADDR"] == NODE_ADDR and planned[r]["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert f"prefer:{planned[r]['mem_node']}" in seen["policy"]  # --mem-bind=prefer,map_mem
    assert not set(planned[0]["cpus"]) & set(planned[1]["cpus"])  # each task its own CPUs


@pytest.mark.parametrize("fmt", ["sbatch", "srun"])
def test_engine_script_serves_on_the_allocations_address(fmt, slurm_env, tmp_path):
    port = free_port()
    script = tmp_path / f"serve.{fmt}"
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--device", "cpu",
                           "--layout", "tp=2", "--checkpoint", "/models/m", "--engine-python", str(FAKE_ENGINE),
                           "--port", str(port), "--format", fmt, "-o", str(script)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert NODE_ADDR not in text
    if fmt == "sbatch":
        assert {"#SBATCH --exclusive", "#SBATCH --mem=0"} <= set(text.splitlines())
    out = tmp_path / "engine"
    out.mkdir()
    output = submit(script, dict(slurm_env, FAKE_ENGINE_OUT=str(out)), tmp_path)
    assert output.startswith("0\n"), output[-3000:]
    assert f"topoplan: vllm serves http://{NODE_ADDR}:{port}" in output.splitlines()
    seen = json.loads((out / "node0.json").read_text())
    argv, env = seen["argv"], seen["env"]
    assert argv[argv.index("--host") + 1] == NODE_ADDR and argv[argv.index("--port") + 1] == str(port)
    assert env["SLURM_NODEID"] == "0" and env["TOPOPLAN_HEAD_ADDR"] == NODE_ADDR and env["SLURM_JOB_ID"]
    assert env["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1  # the per-rank CPU lists reached the engine
