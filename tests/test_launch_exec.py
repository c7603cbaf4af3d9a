"""Execute what `topoplan launch` emits: shell lines, torchrun on two loopback "nodes", Open MPI.

Every rank is the tiny worker (tests/launch_worker.py): it checks its own variables, its CPU affinity
(sched_getaffinity) and memory policy against the spec, then all-reduces its rank over gloo. The
topology is this machine's CPUs dressed up with fake GPUs (no GPU is touched), so binding is real.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import AS_ROOT, FACTS, LOOPBACK_HOSTS, ROOT, block_placements, child_env, free_port, local_topology

from topoplan.launch.formats import render
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout

WORKER = ROOT / "tests" / "launch_worker.py"
needs_numactl = pytest.mark.skipif(shutil.which("numactl") is None,
                                   reason="numactl not installed (.ci/run installs it)")


def make_spec(tmp_path: Path, layout: Layout, nodes: int = 1, hosts=None):
    topo = local_topology(layout.world // nodes)
    spec_file, out = tmp_path / "spec.json", tmp_path / "out"
    out.mkdir()
    spec = build_spec(topo, layout, block_placements(layout, [g.id for g in topo.gpus], nodes), nodes=nodes,
                      hosts=hosts, command=[sys.executable, str(WORKER), str(spec_file), str(out)],
                      master_port=free_port(), facts=FACTS, launcher=AS_ROOT)
    spec_file.write_text(render(spec, "json"))
    return spec, out


def check_results(spec, out: Path) -> None:
    planned = json.loads(render(spec, "json"))["ranks"]
    seen = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(spec.world)}
    for r, got in seen.items():
        assert got["failures"] == [], (r, got)
        assert got["affinity"] == planned[r]["cpus"]  # the binding each rank actually got
        assert got["sum"] == spec.world * (spec.world - 1) // 2
    for node in spec.nodes:  # ranks of one node never share a CPU
        cpus = [c for r in node.ranks for c in seen[r]["affinity"]]
        assert len(cpus) == len(set(cpus)), f"two ranks of node {node.index} share a CPU"


def run(script: str, tmp_path: Path, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    path = tmp_path / "launch.sh"
    path.write_text(script)
    return subprocess.run(["bash", str(path)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, **kw)


@needs_numactl
def test_shell_lines_start_and_pass_checks(tmp_path):
    spec, out = make_spec(tmp_path, Layout(tp=2))
    done = run(render(spec, "shell"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    check_results(spec, out)
    assert {json.loads((out / f"rank{r}.json").read_text())["launcher"] for r in range(2)} == {"torchrun"}


@needs_numactl
def test_torchrun_two_loopback_nodes(tmp_path):
    spec, out = make_spec(tmp_path, Layout(tp=2, dp=2), nodes=2, hosts=LOOPBACK_HOSTS)
    # the emitted text is a comment line and a torchrun line per node: start both blocks side by side
    blocks = render(spec, "torchrun").split("\n# node ")[1:]
    assert len(blocks) == 2 and all("\ntorchrun " in b for b in blocks)
    procs = [subprocess.Popen(["bash", "-c", "# node " + block], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for block in blocks]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(l[-3000:] for l in logs)
    check_results(spec, out)
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert {s["launcher"] for s in seen} == {"torchrun"}
    assert all(len(s["affinity"]) == 1 for s in seen)  # 2 CPUs per "node", split between its 2 ranks


@needs_numactl
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed (.ci/run installs openmpi-bin)")
def test_mpirun_line_starts_and_passes_checks(tmp_path):
    spec, out = make_spec(tmp_path, Layout(tp=2))
    text = render(spec, "mpirun")
    done = run(text, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    check_results(spec, out)
    assert {json.loads((out / f"rank{r}.json").read_text())["launcher"] for r in range(2)} == {"openmpi"}


@needs_numactl
def test_shell_script_on_two_loopback_nodes(tmp_path):
    spec, out = make_spec(tmp_path, Layout(tp=2, dp=2), nodes=2, hosts=LOOPBACK_HOSTS)
    script = tmp_path / "launch.sh"
    script.write_text(render(spec, "shell"))
    # the same script on both "hosts", each told its node index
    procs = [subprocess.Popen(["bash", str(script)], cwd=ROOT, env=dict(child_env(), TOPOPLAN_NODE=str(node)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(l[-3000:] for l in logs)
    check_results(spec, out)
    unset = subprocess.run(["bash", str(script)], cwd=ROOT, env=child_env(), capture_output=True, text=True)
    assert unset.returncode != 0 and "TOPOPLAN_NODE" in unset.stderr


@needs_numactl
def test_shell_ends_every_rank_when_one_fails(tmp_path):
    """Rank 1 fails at once; rank 0 would sleep for minutes (like a rank stuck in a collective): the script
    must kill it and exit with rank 1's status, well inside the subprocess timeout."""
    layout = Layout(tp=2)
    topo = local_topology(2)
    stuck = 'if [ "$RANK" = 1 ]; then exit 7; fi; exec sleep 600'
    spec = build_spec(topo, layout, block_placements(layout, [g.id for g in topo.gpus]), facts=FACTS,
                      master_port=free_port(), command=["bash", "-c", stuck])
    done = run(render(spec, "shell"), tmp_path, timeout=60)
    assert done.returncode == 7, done.stderr
