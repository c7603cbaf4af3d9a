"""Hostile names (a NIC or host called `x;touch pwned ...`) come out of every renderer as inert data.

Each emitted text is executed (shell, torchrun, mpirun, and the sbatch script with a stand-in `srun` that
runs its tasks here); every rank dumps its environment, which must hold the hostile name verbatim, and no
`pwned*` file may appear.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_slurm import fake_slurm
from launch_support import AS_ROOT, FACTS, ROOT, block_placements, child_env, local_topology

from topoplan.launch.formats import render
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout

HOSTILE = "x;touch pwned1 `touch pwned2` $(touch pwned3) 'q' \"d\" & touch pwned4 #"
DUMP = ("import json, os, sys; r = next(os.environ[k] for k in ('RANK', 'OMPI_COMM_WORLD_RANK', 'SLURM_LOCALID') "
        "if k in os.environ); open(os.path.join(sys.argv[1], 'env' + r), 'w').write(json.dumps(dict(os.environ)))")


def hostile_spec(tmp_path: Path, host: str | None):
    topo = local_topology(2, nic_name=HOSTILE)
    layout = Layout(tp=2)
    return build_spec(topo, layout, block_placements(layout, ["GPU0", "GPU1"]), hosts=[host] if host else None,
                      command=[sys.executable, "-c", DUMP, str(tmp_path)], facts=FACTS, launcher=AS_ROOT)


def run_text(text: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "launch.sh"
    script.write_text(text)
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env or child_env(), capture_output=True, text=True,
                          timeout=180)


def assert_inert(tmp_path: Path, ranks: int = 2) -> list[dict]:
    assert not [p for d in (tmp_path, ROOT) for p in d.glob("pwned*")]
    envs = [json.loads((tmp_path / f"env{r}").read_text()) for r in range(ranks)]
    assert all(e["NCCL_IB_HCA"] == "=" + HOSTILE for e in envs)
    return envs


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed (.ci/run installs it)")
def test_shell_with_hostile_nic_and_host(tmp_path):
    done = run_text(render(hostile_spec(tmp_path, HOSTILE), "shell"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(e["MASTER_ADDR"] == HOSTILE for e in assert_inert(tmp_path))


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed (.ci/run installs it)")
def test_torchrun_with_hostile_nic(tmp_path):
    done = run_text(render(hostile_spec(tmp_path, None), "torchrun"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_inert(tmp_path)


@pytest.mark.skipif(shutil.which("mpirun") is None or shutil.which("numactl") is None,
                    reason="Open MPI / numactl not installed (.ci/run installs them)")
def test_mpirun_with_hostile_nic(tmp_path):
    done = run_text(render(hostile_spec(tmp_path, None), "mpirun"), tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert_inert(tmp_path)


def test_mpirun_hostile_host_stays_one_word(tmp_path):
    words = shlex.split(render(hostile_spec(tmp_path, HOSTILE), "mpirun"), comments=True)
    assert words.count(f"{HOSTILE}:2") == 2 and f"MASTER_ADDR={HOSTILE}" in words


def test_sbatch_script_with_hostile_nic_and_host(tmp_path):
    """Run the sbatch script with a stand-in srun that records its argv, then run each task's wrapper."""
    env = dict(child_env(), **fake_slurm(tmp_path / "bin", {"node-a": "127.0.0.1"}), SRUN_ARGV=str(tmp_path / "argv"))
    (tmp_path / "bin" / "srun").write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$SRUN_ARGV"\n'
                                           'printf "%s" "$MASTER_ADDR" > "$SRUN_ARGV.master"\n')  # records, runs none
    spec = hostile_spec(tmp_path, HOSTILE)
    done = run_text(render(spec, "sbatch"), tmp_path, env)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert f"--nodelist={HOSTILE}" in argv and "--gpus-per-node=2" in argv and not any("gpu-bind" in w for w in argv)
    assert (tmp_path / "argv.master").read_text() == "127.0.0.1"  # the allocation's address, not the host name
    wrapper = argv[argv.index("bash"):]
    for local in range(2):  # what srun would run as task `local` on the node (it binds CPUs itself)
        task_env = dict(env, SLURM_LOCALID=str(local), SLURM_PROCID=str(local), MASTER_ADDR="127.0.0.1")
        subprocess.run(wrapper, cwd=tmp_path, env=task_env, check=True, timeout=60)
    envs = assert_inert(tmp_path)
    assert [e["OMP_NUM_THREADS"] for e in envs] == [str(r.physical_cores) for r in spec.ranks]
