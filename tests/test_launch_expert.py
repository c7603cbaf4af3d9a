"""The launch answers an HPC engineer would sign (issue 11), each asserted on a bundled paste: the emitted line,
word for word where it matters."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from launch_support import FIXTURES, ROOT, block_placements
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.cpuset import CpuFacts
from topoplan.errors import TopoplanError
from topoplan.launch.formats import render
from topoplan.launch.launcher_options import LauncherOptions
from topoplan.launch.spec import build_spec
from topoplan.layout import Layout
from topoplan.topology.model import Gpu, build_topology
from topoplan.topology.read import read_topology

H200 = FIXTURES / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt"
DGX = FIXTURES / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
OCI = FIXTURES / "26_oci-bm-gpu4-a100-8gpu-nv12-18nic-nps4.txt"
CMD = ["python3", "-m", "topoplan.runner"]


def spec_for(path, layout: Layout, **kw):
    topo = read_topology(str(path))
    return build_spec(topo, layout, block_placements(layout, [g.id for g in topo.gpus]), command=CMD, **kw)


def launch(*args: str):
    return CliRunner().invoke(app, ["launch", *args])


def words(text: str) -> list[str]:
    return shlex.split(text, comments=True)


# --- an empty CPU Affinity cell --------------------------------------------------------------------------

def test_empty_affinity_binds_to_the_numa_node():
    spec = spec_for(H200, Layout(tp=8))
    assert spec.ranks[0].binding_argv() == ["numactl", "--physcpubind=0,2", "--preferred=0", "--"]
    assert spec.ranks[4].binding_argv() == ["numactl", "--cpunodebind=1", "--preferred=1", "--"]
    assert "OMP_NUM_THREADS" not in spec.ranks[4].env_dict()  # the node's CPU count is not known
    assert "node 0: GPU4's CPU affinity is empty in the topology: bound to its NUMA node 1's CPUs " \
           "(numactl --cpunodebind=1)" in "\n".join(spec.notes)


def test_explain_shows_the_numa_node_binding():
    result = launch("--topo", str(H200), "--layout", "tp=8", "--format", "json", "--explain")
    assert result.exit_code == 0, result.output
    assert "numactl --cpunodebind" in result.stderr and "NUMA node 1" in result.stderr
    rank4 = json.loads(result.stdout)["ranks"][4]
    assert (rank4["cpus"], rank4["cpu_node"], rank4["mem_policy"]) == (None, 1, "preferred")
    assert rank4["command"][:4] == ["numactl", "--cpunodebind=1", "--preferred=1", "--"]


def test_empty_affinity_takes_the_node_cpus_from_sys_on_this_machine():
    facts = CpuFacts({}, {0: (0, 2, 4, 6, 8, 10), 1: (1, 3, 5, 7, 9, 11)})
    spec = spec_for(H200, Layout(tp=8), facts=facts)
    assert [spec.ranks[r].cpus for r in range(4, 8)] == [(1, 3), (5, 7), (9,), (11,)]
    assert spec.ranks[4].binding_argv() == ["numactl", "--physcpubind=1,3", "--preferred=1", "--"]
    assert "/sys/devices/system/node" in spec.ranks[4].cpu_reason


def test_empty_affinity_takes_the_cpus_of_other_gpus_on_the_node():
    gpus = [Gpu("GPU0", 0, cpus=None, numa_node=0), Gpu("GPU1", 1, cpus=(0, 1, 2, 3), numa_node=0)]
    topo = build_topology(gpus, [], {("GPU0", "GPU1"): "NV4"})
    spec = build_spec(topo, Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]), command=CMD)
    assert spec.ranks[0].cpus and not set(spec.ranks[0].cpus) & set(spec.ranks[1].cpus)
    assert "the other GPUs of its NUMA node 0" in spec.ranks[0].cpu_reason


def test_no_affinity_and_no_numa_node_launches_unbound_and_says_why():
    topo = build_topology([Gpu("GPU0", 0), Gpu("GPU1", 1)], [], {("GPU0", "GPU1"): "NV4"})
    spec = build_spec(topo, Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]), command=CMD)
    assert spec.ranks[0].binding_argv() == []
    assert any("neither CPU affinity nor a NUMA node, so the rank is not CPU-bound" in n for n in spec.notes)


def test_srun_leaves_binding_to_numactl_when_a_cpu_list_is_missing():
    line = render(spec_for(H200, Layout(tp=8)), "srun")
    assert "--cpu-bind=none" in words(line) and "--mem-bind=none" in words(line)
    assert "4) exec env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in line
    assert "numactl --cpunodebind=1 --preferred=1 --" in line


# --- Slurm asks for GPUs and keeps them all visible --------------------------------------------------------

def test_srun_requests_every_gpu_and_binds_none_to_a_task():
    spec = spec_for(DGX, Layout(tp=4, pp=2))
    srun = words(render(spec, "srun"))
    assert "--gpus-per-node=8" in srun and not any("gpu-bind" in w for w in srun)
    assert "--cpu-bind=mask_cpu:" + ",".join(hex(sum(1 << c for c in r.cpus)) for r in spec.ranks) in srun
    assert "--mem-bind=prefer,map_mem:3,3,1,1,7,7,5,5" in srun
    wrapper = srun[srun.index("bash") + 2]
    assert wrapper.count("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7") == 8  # every task sees the node's GPUs
    sbatch = render(spec, "sbatch")
    assert "#SBATCH --gpus-per-node=8" in sbatch.splitlines() and "--gres" not in sbatch


def test_mem_policy_bind_and_none_under_slurm():
    assert "--mem-bind=map_mem:3,3,1,1,7,7,5,5" in words(render(spec_for(DGX, Layout(tp=8), mem_policy="bind"),
                                                                  "srun"))
    assert "--mem-bind=none" in words(render(spec_for(DGX, Layout(tp=8), mem_policy="none"), "srun"))


def test_slurm_cluster_options():
    spec = spec_for(DGX, Layout(tp=8), launcher=LauncherOptions("gpu-a", "proj1", "1-12:00:00", "llama 70b"))
    header = [line for line in render(spec, "sbatch").splitlines() if line.startswith("#SBATCH")]
    assert header[:4] == ["#SBATCH '--job-name=llama 70b'", "#SBATCH --partition=gpu-a", "#SBATCH --account=proj1",
                          "#SBATCH --time=1-12:00:00"]
    srun = words(render(spec, "srun"))
    assert srun[srun.index("srun") + 1:srun.index("srun") + 5] == ["--job-name=llama 70b", "--partition=gpu-a",
                                                                   "--account=proj1", "--time=1-12:00:00"]


@pytest.mark.parametrize("kw, message", [({"time": "1 day"}, "--time '1 day'"), ({"partition": "a b"}, "--partition"),
                                         ({"account": "x;y"}, "--account"), ({"job_name": ""}, "--job-name")])
def test_bad_slurm_options_are_refused(kw, message):
    with pytest.raises(TopoplanError, match=message):
        LauncherOptions(**kw)
    assert LauncherOptions(partition="gpu-a,gpu-b").slurm_args() == ["--partition=gpu-a,gpu-b"]  # sbatch -p a,b


def test_cpu_launch_asks_for_no_gpu():
    result = launch("--device", "cpu", "--layout", "tp=2", "--model", "tiny", "--format", "sbatch", "--partition",
                    "debug", "--time", "10", "--job-name", "tiny tp2")
    assert result.exit_code == 0, result.output
    header = [line for line in result.stdout.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH '--job-name=tiny tp2'", "#SBATCH --partition=debug", "#SBATCH --time=10",
                      "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2", "#SBATCH --exclusive",
                      "#SBATCH --mem=0"]
    assert "gpu" not in result.stdout.replace("topoplan", "").lower()  # no --gres/--gpus*, no CUDA variables
    assert words(result.stdout)[-1] == "--prompt-ids=1,2,3" and "--backend=gloo" in words(result.stdout)
    data = json.loads(launch("--device", "cpu", "--layout", "tp=2", "--format", "json").stdout)
    assert data["device"] == "cpu" and all("CUDA_VISIBLE_DEVICES" not in r["env"] for r in data["ranks"])
    cpus = [set(r["cpus"]) for r in data["ranks"]]
    assert cpus[0] and cpus[1] and not cpus[0] & cpus[1] and cpus[0] | cpus[1] <= set(os.sched_getaffinity(0))


@pytest.mark.parametrize("args, message", [
    (["--device", "cpu", "--topo", str(DGX), "--layout", "tp=2"], "--topo describe"),
    (["--device", "cpu", "--layout", "tp=3", "--nodes", "2", "--hosts", "a,b"], "do not split evenly"),
    (["--device", "tpu", "--layout", "tp=2"], "--device 'tpu'"),
    (["--topo", str(DGX), "--layout", "tp=2", "--mem-policy", "strict"], "--mem-policy 'strict'"),
    (["--topo", str(DGX), "--layout", "tp=8,dp=2", "--nodes", "2", "--hosts", "n1,n1"], "names n1 more than once"),
    (["--topo", str(DGX), "--layout", "tp=2", "--format", "sbatch", "--time", "soon"], "--time 'soon'"),
])
def test_launch_refuses(args, message):
    result = launch(*args)
    assert result.exit_code == 2 and message in result.output, result.output


# --- NCCL_IB_HCA: the node's GPU-facing NICs ----------------------------------------------------------------

@pytest.mark.parametrize("path, names, left_out", [
    (H200, [f"mlx5_{i}" for i in range(8)], "mlx5_8, mlx5_9"),
    (OCI, [f"mlx5_{i}" for i in range(1, 18) if i != 13], "mlx5_0, mlx5_13"),  # the two front-end NICs
])
def test_nccl_ib_hca_is_node_wide_without_storage_nics(path, names, left_out):
    spec = spec_for(path, Layout(tp=8))
    assert {r.env_dict()["NCCL_IB_HCA"] for r in spec.ranks} == {"=" + ",".join(names)}
    assert f"left out {left_out}, the nearest NIC of no GPU" in spec.ranks[0].reasons()["NCCL_IB_HCA"]


# --- torchrun: static rendezvous ---------------------------------------------------------------------------

def test_torchrun_uses_static_rendezvous():
    spec = build_spec(read_topology(str(DGX)), Layout(tp=8, pp=2),
                      block_placements(Layout(tp=8, pp=2), [f"GPU{i}" for i in range(8)], 2), command=CMD,
                      hosts=["node0", "node1"])
    ws = words(render(spec, "torchrun"))
    starts = [i for i, w in enumerate(ws) if w == "torchrun"]
    assert len(starts) == 2 and not any("rdzv" in w for w in ws)
    for node, i in enumerate(starts):
        assert ws[i:i + 7] == ["torchrun", "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=8",
                               "--master-addr=node0", "--master-port=29500", "--no-python"]


# --- mpirun: what a working cluster line needs -------------------------------------------------------------

def test_mpirun_forwards_the_environment_and_opts_into_root():
    plain = render(spec_for(DGX, Layout(tp=2)), "mpirun")
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in plain
    root = render(spec_for(DGX, Layout(tp=2), launcher=LauncherOptions(allow_run_as_root=True)), "mpirun")
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in root.splitlines()
    script = root.split("\nmpirun ")[0] + '\nprintf "%s\\n" "${forward[@]}"\n'
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/p", "VIRTUAL_ENV": "/venv"}  # no LD_LIBRARY_PATH
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout.split() == ["-x", "PATH", "-x", "PYTHONPATH", "-x", "VIRTUAL_ENV"]
    assert 'mpirun --bind-to none "${forward[@]}" \\' in root


# --- --topo and --file on every command that reads a topology ----------------------------------------------

@pytest.mark.parametrize("command", [["inspect", "--json"],
                                     ["plan", "--model", "8b", "--gpu", "a100-80gb", "--top", "2"],
                                     ["launch", "--layout", "tp=2", "--format", "json"]])
def test_topo_and_file_name_the_same_option(command):
    outputs = [CliRunner().invoke(app, [*command, name, str(DGX)]) for name in ("--topo", "--file")]
    assert [o.exit_code for o in outputs] == [0, 0], outputs[0].output + outputs[1].output
    assert outputs[0].stdout == outputs[1].stdout


def test_calibrate_accepts_both_names():
    done = subprocess.run(["python3", "-m", "topoplan", "calibrate", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"))
    assert "--topo" in done.stdout and "--file" in done.stdout


def test_cpu_slots_fill_numa_nodes_in_blocks(monkeypatch):
    import topoplan.launch.cpu_slots as slots_module

    monkeypatch.setattr(slots_module, "cpu_cores", lambda: [0, 1, 2, 3, 4, 5, 6, 7])
    facts = CpuFacts({}, {0: (0, 1, 2, 3), 1: (4, 5, 6, 7), 2: ()})  # node 2: memory only
    topo = slots_module.cpu_slots(4, facts)
    assert [(g.numa_node, g.cpus) for g in topo.gpus] == [(0, (0, 1, 2, 3)), (0, (0, 1, 2, 3)),
                                                         (1, (4, 5, 6, 7)), (1, (4, 5, 6, 7))]
    assert topo.link("CPU0", "CPU1").code == "NODE" and topo.link("CPU1", "CPU2").code == "SYS"
    spec = build_spec(topo, Layout(tp=2, dp=2), block_placements(Layout(tp=2, dp=2), [g.id for g in topo.gpus]),
                      command=CMD, facts=facts, device="cpu")
    assert [r.binding_argv()[1:3] for r in spec.ranks] == [["--physcpubind=0-1", "--preferred=0"],
                                                           ["--physcpubind=2-3", "--preferred=0"],
                                                           ["--physcpubind=4-5", "--preferred=1"],
                                                           ["--physcpubind=6-7", "--preferred=1"]]
    assert spec.gpus_per_node == 0 and not any("CUDA" in v.name or "NCCL" in v.name for r in spec.ranks for v in r.env)
    # each CPU rank's OpenMP threads: one per core it is bound to, with the bounded barrier spin `topoplan run` uses
    envs = [r.env_dict() for r in spec.ranks]
    assert [(env["OMP_NUM_THREADS"], env["GOMP_SPINCOUNT"]) for env in envs] == [("2", "10000")] * 4


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12), st.text(max_size=12), st.text(max_size=12))
def test_any_slurm_option_text_is_refused_or_stays_one_word(partition, account, time_limit, job_name):
    try:
        options = LauncherOptions(partition, account, time_limit, job_name)
    except TopoplanError as error:
        assert "\n" not in str(error)
        return
    spec = build_spec(read_topology(str(DGX)), Layout(tp=2), block_placements(Layout(tp=2), ["GPU0", "GPU1"]),
                      command=CMD, launcher=options)
    header = [line for line in render(spec, "sbatch").splitlines() if line.startswith("#SBATCH")]
    assert [shlex.split(line) for line in header[:4]] == [["#SBATCH", word] for word in options.slurm_args()]
