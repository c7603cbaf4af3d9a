"""The emitted srun/sbatch scripts read their allocation and wait for the engine, run here with stand-ins for
Slurm's commands (tests/fake_slurm.py) and for the engine (tests/fake_engine.py); tests/test_launch_slurm.py runs
them under a real single-node Slurm.

The allocation's addresses are loopback aliases that appear nowhere in the launch options, so an address in an
engine's argv can only have come from the allocation.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_slurm import fake_slurm
from launch_support import ROOT, child_env, free_port

FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"
ALLOCATION = {"gpu-a7": "127.0.0.3", "gpu-b2": "127.0.0.4"}  # host name -> NodeAddr, in Slurm's order


def emit(tmp_path: Path, fmt: str, *extra: str) -> tuple[Path, int]:
    """`launch --engine vllm --device cpu` over two nodes with the stand-in engine; the script and its HTTP port."""
    port = free_port()
    script = tmp_path / f"serve.{fmt}"
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "vllm", "--device", "cpu",
                           "--layout", "tp=2", "--nodes", "2", "--checkpoint", "/models/m", "--engine-python",
                           str(FAKE_ENGINE), "--port", str(port), "--format", fmt, "-o", str(script), *extra],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return script, port


def run_script(script: Path, tmp_path: Path, allocation: dict[str, str] = ALLOCATION, **env: str):
    out = tmp_path / "engine"
    out.mkdir(exist_ok=True)
    full = dict(child_env(), **fake_slurm(tmp_path / "bin", allocation), FAKE_ENGINE_OUT=str(out), **env)
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=120)
    return done, {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("node*.json")}


def value(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("fmt", ["sbatch", "srun"])
def test_two_node_script_takes_node_0_address_from_the_allocation(fmt, tmp_path):
    script, port = emit(tmp_path, fmt)
    text = script.read_text()
    assert "127.0.0" not in text and "gpu-a7" not in text  # nothing about the machines is baked in
    if fmt == "sbatch":
        header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
        assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --mem=0"} <= set(
            header) and not any("nodelist" in line for line in header)
    done, nodes = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(nodes) == [0, 1]
    head = ALLOCATION["gpu-a7"]
    serving, worker = nodes[0]["argv"], nodes[1]["argv"]
    assert value(serving, "--host") == head and value(serving, "--port") == str(port)  # routable, not loopback
    for argv in (serving, worker):  # the rendezvous on node 0, whatever its address
        assert value(argv, "--master-addr") == head and head in argv
    assert value(worker, "--node-rank") == "1" and nodes[1]["env"]["TOPOPLAN_HEAD_ADDR"] == head
    assert f"topoplan: vllm serves http://{head}:{port}" in done.stdout.splitlines()


def test_hosts_become_a_nodelist_but_the_address_is_read(tmp_path):
    script, _ = emit(tmp_path, "sbatch", "--hosts", "gpu-a7,gpu-b2")
    text = script.read_text()
    assert "#SBATCH --nodelist=gpu-a7,gpu-b2" in text.splitlines()
    srun_options = next(line for line in text.splitlines() if line.startswith("srun ")).split(" bash -c ")[0]
    assert "--nodelist=gpu-a7,gpu-b2" in shlex.split(srun_options)
    done, nodes = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert value(nodes[1]["argv"], "--master-addr") == ALLOCATION["gpu-a7"]


def test_allocation_of_another_size_is_refused(tmp_path):
    script, _ = emit(tmp_path, "sbatch")
    done, nodes = run_script(script, tmp_path, allocation={"gpu-a7": "127.0.0.3"})
    assert done.returncode == 2 and nodes == {}
    assert "this launch runs on 2 node(s), the allocation (gpu-a7) has 1" in done.stderr


def test_outside_an_allocation_the_script_says_how_to_get_one(tmp_path):
    script, _ = emit(tmp_path, "srun")
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "run inside a Slurm allocation: sbatch, or salloc --nodes=2 --exclusive --mem=0 bash SCRIPT" in done.stderr


def test_health_wait_is_bounded_and_stops_the_engine(tmp_path):
    script, port = emit(tmp_path, "sbatch")
    start = time.monotonic()
    done, nodes = run_script(script, tmp_path, FAKE_ENGINE_MODE="silent", TOPOPLAN_HEALTH_TIMEOUT="3")
    assert done.returncode == 1 and time.monotonic() - start < 60  # not the stand-in's 300 s sleep
    assert f"no answer from http://127.0.0.3:{port}/health within 3 s; stopping vllm" in done.stderr
    assert "serves" not in done.stdout and 0 in nodes


def test_engine_that_exits_first_passes_on_its_status(tmp_path):
    script, port = emit(tmp_path, "srun")
    done, _ = run_script(script, tmp_path, FAKE_ENGINE_MODE="fail")
    assert done.returncode == 3
    assert f"vllm exited (status 3) before answering http://127.0.0.3:{port}/health" in done.stderr


def test_explicit_host_is_kept(tmp_path):
    script, port = emit(tmp_path, "sbatch", "--host", "127.0.0.5")
    done, nodes = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert value(nodes[0]["argv"], "--host") == "127.0.0.5"
    assert value(nodes[0]["argv"], "--master-addr") == "127.0.0.3"  # the rendezvous is still node 0's address
    assert f"topoplan: vllm serves http://127.0.0.5:{port}" in done.stdout


def test_trtllm_over_nodes_reads_the_allocation_and_waits_too(tmp_path):
    dgx = ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "--engine", "trtllm", "--topo", str(dgx),
                           "--layout", "tp=8,pp=2", "--nodes", "2", "--checkpoint", "/m", "--format", "sbatch",
                           "--ifname", "ib0"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert {"#SBATCH --ntasks-per-node=8", "#SBATCH --exclusive", "#SBATCH --mem=0"} <= set(lines)
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--mpi=pmix" in srun
    step = next(line for line in lines if "trtllm-llmapi-launch" in line)  # the command after the wrapper
    assert step.endswith('--host "$TOPOPLAN_HEAD_ADDR" --port 8000 &')  # every rank, expanded by the script
    assert 'export MASTER_ADDR="$TOPOPLAN_HEAD_ADDR"' in lines and "until topoplan_healthy; do" in lines
