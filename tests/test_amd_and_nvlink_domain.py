"""`plan` and `launch` on an AMD box (rocm-smi / amd-smi fixtures) and on a GB200 NVL72 domain (the constructed
NVML recording of one tray), and the runner under a ROCm build of torch (faked at torch.version.hip).
Expected figures are worked out by hand in each test from the catalog and link table entries it names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError
from topoplan.hardware import lookup_gpu
from topoplan.machine import load_topology
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer, nvlink_domain_nodes
from topoplan.plan.cost import Workload
from topoplan.plan.frontend import PlanRequest, plan_for
from topoplan.topology.recording import topology_from_recording

ROOT = Path(__file__).resolve().parent.parent
MI300 = ROOT / "fixtures" / "amd" / "rocm-smi-mi300-8gpu-xgmi-2numa.txt"
RX7900 = ROOT / "fixtures" / "amd" / "amd-smi-rx7900xtx-2gpu-pcie-rocm-issue6074.txt"
TRAY = ROOT / "fixtures" / "nvml" / "gb200-nvl72-tray-4gpu.json"
DOMAIN = "6e1f3c2a-9b47-4d85-a0c3-5f2e8d7b1a90/32766"  # the fixture's cluster UUID / clique id
runner = CliRunner()


# --- AMD -------------------------------------------------------------------------------------------------
def test_amd_box_is_inferred_and_priced_with_xgmi_figures():
    topo = load_topology(str(MI300))
    assert (topo.arch, topo.gpu_name, topo.vendor) == ("gfx942", None, "amd")  # XGMI full mesh of 8: MI300 class
    assert topo.link("GPU0", "GPU7").bandwidth_gbps == 64.0  # one XGMI link, 128 GB/s both ways
    named = load_topology(str(MI300), gpu="mi300x")
    assert (named.gpu_name, named.vendor) == ("mi300x", "amd")


def test_amd_pictures_name_the_xgmi_fabric(tmp_path):
    out = tmp_path / "mi300.svg"
    result = runner.invoke(app, ["inspect", "--file", str(MI300), "--format", "svg", "-o", str(out)])
    assert result.exit_code == 0, result.output
    svg = out.read_text()
    assert "XGMI all-to-all" in svg and "NVLink" not in svg


def test_plan_on_an_amd_box():
    result = plan_for(PlanRequest(model="70b", topo=str(MI300), gpu="mi300x", tp=8, pp=1, dp=1))
    best = result.layouts[0]
    assert (best.cost.layout.tp, best.cost.fits) == (8, True)
    # bottleneck: 64 GB/s x the default bus efficiency 0.8 = 51.2 GB/s
    assert any(r.startswith("TP8 on XGMI: ring bottleneck 51 GB/s") for r in best.cost.reasons)
    assert any(r.startswith("XGMI full mesh: vLLM's custom all-reduce on ROCm") for r in best.cost.reasons)
    assert lookup_gpu("mi300x").memory_mib == 192 * 1024  # the data sheet's 192 GB read as GiB (no amd-smi log)


def _rank_env(script: str, out: Path) -> list[dict]:
    """Run emitted shell lines whose command writes the rank's GPU variables to out/rank<N>.json."""
    path = out / "launch.sh"
    path.write_text(script)
    subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]))]


def print_env(out: Path) -> list[str]:
    """A rank command recording its GPU variables in its own file (ranks run at once: no shared stdout)."""
    names = ("RANK", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_P2P_LEVEL",
             "NCCL_MNNVL_ENABLE")
    code = (f"import json, os, pathlib; pathlib.Path({str(out)!r}, 'rank' + os.environ['RANK'] + '.json')"
            f".write_text(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))")
    return [sys.executable, "-c", code]


def test_launch_on_an_amd_box_selects_gpus_with_hip_visible_devices():
    result = runner.invoke(app, ["launch", "--topo", str(MI300), "--gpu", "mi300x", "--model", "70b",
                                 "--layout", "tp=4,pp=1,dp=2", "--format", "json", "--", "python", "serve.py"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)
    assert len(spec["ranks"]) == 8
    for rank in spec["ranks"]:
        assert rank["env"]["HIP_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert "CUDA_VISIBLE_DEVICES" not in rank["env"] and "CUDA_DEVICE_ORDER" not in rank["env"]
    assert any("HIP_VISIBLE_DEVICES selects them" in note for note in spec["notes"])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fmt", ["shell", "json", "sbatch"])
def test_engine_launch_on_an_amd_box_selects_gpus_with_hip_visible_devices(engine, fmt):
    """A serving engine's node line on an MI300X recording names the GPUs with HIP's variable, as the per-rank lines
    do (it used to write CUDA_DEVICE_ORDER/CUDA_VISIBLE_DEVICES, which ROCm ignores)."""
    result = runner.invoke(app, ["launch", "--topo", str(MI300), "--gpu", "mi300x", "--layout", "tp=4,pp=1,dp=2",
                                 "--engine", engine, "--checkpoint", "/models/llama", "--format", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "json":
        env = json.loads(result.stdout)["nodes"][0]["env"]
        assert env["HIP_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_DEVICE_ORDER" not in env
    else:
        assert "HIP_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in result.stdout
        assert "CUDA_VISIBLE_DEVICES" not in result.stdout and "CUDA_DEVICE_ORDER" not in result.stdout


def test_launch_from_an_rccl_dump_names_the_gpu_facing_nics():
    """RCCL's own XML of an MI300X VM: each of the 8 NICs is the nearest NIC of some GPU (the four of a socket
    share its CPU, PHB), so every rank gets the node-wide list and RCCL, which reads NCCL_IB_HCA, picks each GPU's
    nearest NIC from it itself."""
    topo = ROOT / "fixtures" / "nccl" / "rccl-mi300x-8gpu-xgmi-8nic-vm-topo-expl.xml"
    result = runner.invoke(app, ["launch", "--topo", str(topo), "--gpu", "mi300x", "--model", "70b",
                                 "--layout", "tp=8,pp=1,dp=1", "--format", "json", "--", "python", "serve.py"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert {r["env"]["NCCL_IB_HCA"] for r in ranks} == {"=" + ",".join(f"mlx5_{i}" for i in range(8))}
    assert ranks[0]["env"]["HIP_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_launch_on_radeon_pair_without_peer_access_limits_p2p(tmp_path):
    result = runner.invoke(app, ["launch", "--topo", str(RX7900), "--gpu", "rx-7900-xtx", "--model", "8b",
                                 "--layout", "tp=2,pp=1,dp=1", "--format", "shell", "--", *print_env(tmp_path)])
    assert result.exit_code == 0, result.output
    ranks = _rank_env(result.stdout, tmp_path)
    assert [(r["HIP_VISIBLE_DEVICES"], r["NCCL_P2P_LEVEL"]) for r in ranks] == [("0,1", "PXB"), ("0,1", "PXB")]


def test_slurm_asks_for_every_gpu_and_selects_them_with_hip_on_amd():
    """Each task sees all of the node's GPUs (RCCL's peer path needs them), in the planned order."""
    result = runner.invoke(app, ["launch", "--topo", str(MI300), "--gpu", "mi300x", "--model", "70b",
                                 "--layout", "tp=8,pp=1,dp=1", "--format", "sbatch", "--", "python", "serve.py"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --gpus-per-node=8" in result.stdout.splitlines() and "gpu-bind" not in result.stdout
    assert result.stdout.count("exec env HIP_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ") == 8
    assert "CUDA_VISIBLE_DEVICES" not in result.stdout


# --- GB200 NVL72 -----------------------------------------------------------------------------------------
def _tray(fabric_state: int = 3) -> dict:
    recording = json.loads(TRAY.read_text())
    for gpu in recording["nvml"]["gpus"]:
        gpu["fabric"]["state"] = fabric_state
    return recording


def test_tray_recording_names_one_nvlink_domain():
    topo = load_topology(str(TRAY))
    assert topo.gpu_name == "gb200" and topo.arch == "sm100"
    assert topo.fabric_domains() == {DOMAIN: ["GPU0", "GPU1", "GPU2", "GPU3"]}
    assert {l.code for l in topo.links() if l.b.startswith("GPU")} == {"NV18"}  # every link goes to the switches
    data = json.loads(runner.invoke(app, ["inspect", "--file", str(TRAY), "--json"]).stdout)
    assert [g["fabric_domain"] for g in data["gpus"]] == [DOMAIN] * 4
    table = runner.invoke(app, ["inspect", "--file", str(TRAY)], env={"COLUMNS": "200"}).stdout
    assert f"NVLink domain: {DOMAIN} (cluster/clique): GPU0, GPU1, GPU2, GPU3;" in table


def test_fabric_still_being_set_up_is_no_domain_and_says_so():
    topo = topology_from_recording(_tray(fabric_state=2), "tray.json")  # NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert topo.fabric_domains() == {}
    assert "GPU0: NVLink fabric not ready (state 2, status 0)" in topo.notes[0]


def test_domain_spans_eighteen_trays():
    topo = load_topology(str(TRAY))
    assert nvlink_domain_nodes(topo, lookup_gpu("gb200").nvlink_domain_gpus) == 18  # 72 GPUs / 4 per tray
    assert nvlink_domain_nodes(topo, 0) == 0  # no size known: every planned node
    pricer = LinkPricer(topo, Calibration(), nic_gbps=50.0, domain_gpus=72)
    inside = pricer.hop((0, "GPU0"), (17, "GPU1"))
    outside = pricer.hop((17, "GPU0"), (18, "GPU1"))
    # NV18 x 40.1 GB/s (sm100) x 0.8 bus efficiency; the network: one 50 GB/s NIC x 0.8
    assert (inside.code, inside.link_class, inside.across_nodes) == ("NV18", "nvlink", True)
    assert inside.bandwidth_gbps == pytest.approx(18 * 40.1 * 0.8)
    assert (outside.code, outside.bandwidth_gbps) == ("NET", pytest.approx(40.0))


def test_plan_prices_tp_across_trays_at_nvlink_speed(tmp_path):
    request = PlanRequest(model="70b", topo=str(TRAY), nodes=2, tp=8, pp=1, dp=1,
                          workload=Workload(batch=1, prompt_len=512, gen_len=128))
    fabric = plan_for(request).layouts[0]
    plain_path = tmp_path / "tray-without-domain.json"
    plain = _tray()
    for gpu in plain["nvml"]["gpus"]:
        gpu["fabric"] = {"nvml_error": "NOT_SUPPORTED"}
    plain_path.write_text(json.dumps(plain))
    network = plan_for(PlanRequest(**{**request.__dict__, "topo": str(plain_path)})).layouts[0]
    assert any("TP8 spans nodes over NVLink (one multi-node NVLink domain): ring bottleneck 577 GB/s" in r
               for r in fabric.cost.reasons)
    assert any(r.startswith("TP8 spans nodes: ring bottleneck") for r in network.cost.reasons)
    assert fabric.cost.decode_ms_per_token < network.cost.decode_ms_per_token


def test_launch_lines_say_the_nodes_share_the_nvlink_domain():
    def launch(layout: str, nodes: str) -> dict:
        result = runner.invoke(app, ["launch", "--topo", str(TRAY), "--model", "70b", "--layout", layout, "--nodes",
                                     nodes, "--hosts", ",".join(["tray0", "tray1"][:int(nodes)]), "--format", "json",
                                     "--", "python", "serve.py"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    spec = launch("tp=8,pp=1,dp=1", "2")
    assert all(rank["env"]["NCCL_MNNVL_ENABLE"] == "1" for rank in spec["ranks"])
    assert any("trays of one NVLink domain" in note for note in spec["notes"])
    assert all("NCCL_MNNVL_ENABLE" not in rank["env"] for rank in launch("tp=4,pp=1,dp=1", "1")["ranks"])


# --- the runner on ROCm torch ------------------------------------------------------------------------------
def test_runner_names_rocm_and_hip_visible_devices(monkeypatch):
    import torch

    from topoplan.rank_env import RankEnv
    from topoplan.runner import dist as rdist

    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rdist.gpu_vendor().name == "amd"
    with pytest.raises(TopoplanError, match=r"--backend nccl needs a GPU \(ROCm, RCCL\)"):
        rdist.choose_backend("nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    env = RankEnv(3, 4, 3, 4, "127.0.0.1", 29500, "torchrun")
    with pytest.raises(TopoplanError, match="local rank 3 has no GPU: .* check HIP_VISIBLE_DEVICES"):
        rdist.join_world(env, "nccl", 5.0)
    monkeypatch.setattr(torch.version, "hip", None)
    assert rdist.gpu_vendor().name == "nvidia"

