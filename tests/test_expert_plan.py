"""The planner's answers an HPC engineer would sign (issue 11, "Plan"), each against a figure worked out by
hand from the formulas in docs/planner.md and the catalog figures in docs/hardware.md, on bundled pastes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError
from topoplan.hardware import find_gpu, lookup_gpu
from topoplan.layout import Layout
from topoplan.plan.cost import Workload
from topoplan.plan.frontend import PlanRequest, plan_for
from topoplan.plan.rank import Limits
from topoplan.topology.read import read_topology
from topoplan.topology.smi_text import NVLINK_HIDDEN, parse_topo_text

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
DGX_A100 = str(TOPO / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt")
B300 = TOPO / "01_b300-sxm6-8gpu-nv18-9nic-sglang.txt"
B300_MP = TOPO / "02_b300-sxm6-8gpu-topo-mp-pcie-only-derived.txt"
DGX1 = str(TOPO / "07_dgx1-v100-sxm2-16gb-cubemesh-mlx5-driver440.txt")
AZURE_AMD = str(TOPO / "18_azure-nc96ads-a100v4-4gpu-nv12-pairs-4numa.txt")
L40S_1NIC = str(TOPO / "22_l40s-8gpu-node-sys-1nic-nolegend.txt")

A100_USABLE = 81_920 * 2**20 * 0.9  # NVML's 81,920 MiB less the 10% runtime reserve: 77,309,411,328 B
LLAMA70_LAYERS = 80 * 855_654_400  # 80 x (attention 150,994,944 + MLP 704,643,072 + norms 16,384) parameters
LLAMA70_EMBED = 128_256 * 8_192  # the embedding; the (untied) LM head is as large


def cli(*args: str) -> subprocess.CompletedProcess:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def one(model: str, topo: str, gpu: str, tp: int, pp: int = 1, dp: int = 1, workload: Workload = Workload(),
        nodes: int = 1, cpu: str | None = None):
    result = plan_for(PlanRequest(model=model, topo=topo, gpu=gpu, cpu=cpu, nodes=nodes, tp=tp, pp=pp, dp=dp,
                                  workload=workload))
    (entry,) = result.layouts
    return entry.cost


# --- GPU memory as NVML reports it ---------------------------------------------------------------------------
def test_catalog_memory_is_the_mib_nvml_reports():
    assert find_gpu("a100-80gb").memory_mib == 81_920 and find_gpu("h100").memory_mib == 81_559
    assert find_gpu("h200").memory_mib == 143_771 and find_gpu("b200").memory_mib == 183_359
    assert find_gpu("a100-80gb").memory_bytes == 85_899_345_920  # 85.9e9 B, not the 80e9 "80 GB" suggests


def test_qwen25_72b_bf16_fits_tp2_on_two_80gb_gpus_with_4gb_for_kv():
    cost = one("qwen2.5-72b", DGX_A100, "a100-80gb", tp=2)
    # weights per GPU: (80 layers x 877,684,736 + embedding and head 2 x 1,245,708,288) x 2 B / 2
    weights = (80 * 877_684_736 + 2 * 1_245_708_288) * 2 // 2
    assert weights == 72_706_195_456
    kv_per_seq = 640 * 2 * 4 * 128 * 80 * 2  # 4 of its 8 KV heads per rank: 104,857,600 B
    assert cost.fits and cost.memory_per_gpu == weights + kv_per_seq
    assert A100_USABLE - weights == pytest.approx(4.603e9, rel=1e-3)  # ~4.6 GB per GPU left for the KV cache
    assert cost.max_batch == int((A100_USABLE - weights) // kv_per_seq) == 43


# --- every GPU a bundled paste names ------------------------------------------------------------------------
@pytest.mark.parametrize("fixture_gpu, key", [
    ("NVIDIA B300 SXM6 AC", "b300"),  # 01 (and 02)
    ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"),  # 11
    ("Tesla P100-SXM2-16GB", "p100-sxm2-16gb"),  # 20 (POWER8 Minsky)
    ("Tesla T4", "t4"),  # 40
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),  # 07
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),  # 18
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),  # 24
    ("NVIDIA H100 NVL", "h100-nvl"),  # 17
    ("NVIDIA L40S", "l40s"),  # 22
    ("NVIDIA GH200 480GB", "gh200"),  # 23
])
def test_every_gpu_of_the_bundled_pastes_is_in_the_catalog(fixture_gpu, key):
    spec = lookup_gpu(fixture_gpu)
    assert spec is not None and spec.key == key and spec.memory_mib > 0 and spec.source


def test_new_entries_carry_their_sourced_figures():
    t4, p100, b300 = find_gpu("t4"), find_gpu("p100-sxm2"), find_gpu("b300")
    assert (t4.memory_mib, t4.memory_bandwidth_gbps, t4.bf16_tflops, t4.fp8_tflops) == (15_360, 320, 65, None)
    assert (p100.memory_mib, p100.arch, p100.nvlink_links) == (16_280, "sm60", 4)
    assert (b300.memory_mib, b300.bf16_tflops, b300.fp8_tflops) == (275_040, 2250, 4500)


# --- dtype support per GPU ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, kv, gpu, says", [
    ("bf16", None, "v100", "--dtype bf16: v100-sxm2-32gb has no bf16; it computes in fp32, fp16; weight-only: int4"),
    ("fp8", None, "v100", "--dtype fp8: v100-sxm2-32gb has no fp8"),
    ("fp16", "fp8", "v100", "--kv-dtype fp8: v100-sxm2-32gb keeps the KV cache in fp32, fp16"),
])
def test_a_dtype_the_gpu_lacks_is_refused_in_one_line(dtype, kv, gpu, says):
    run = cli("plan", "-m", "8b", "--topo", DGX1, "--gpu", gpu, "--dtype", dtype, *(("--kv-dtype", kv) if kv else ()))
    assert run.returncode == 2 and says in run.stderr and run.stderr.count("\n") == 1


def test_fp8_on_ampere_is_weight_only_and_on_hopper_native():
    fp8 = Workload(dtype="fp8")
    a100, h100 = one("70b", DGX_A100, "a100-80gb", tp=1, workload=fp8), one("70b", DGX_A100, "h100", tp=1,
                                                                                workload=fp8)
    # layers at 1 B/param, embedding and LM head kept in bf16; the KV cache in bf16 (vLLM's "auto")
    weights = LLAMA70_LAYERS * 1 + 2 * LLAMA70_EMBED * 2
    kv_per_seq = 640 * 2 * 8 * 128 * 80 * 2
    assert a100.memory_per_gpu == h100.memory_per_gpu == weights + kv_per_seq == 72_864_759_808
    assert a100.max_batch == int((A100_USABLE - weights) // kv_per_seq) == 22
    assert any("fp8 weights are weight-only here" in r and "bf16 rate" in r for r in a100.reasons)
    assert not any("weight-only" in r for r in h100.reasons)


def test_int4_awq_gptq_weights_and_an_fp8_kv_cache():
    int4 = one("70b", DGX_A100, "a100-80gb", tp=1, workload=Workload(dtype="int4"))
    # 4-bit weights + one fp16 scale and one 4-bit zero per group of 128: 133/256 B per parameter
    weights = LLAMA70_LAYERS * 133 // 256 + 2 * LLAMA70_EMBED * 2
    assert int4.memory_per_gpu == weights + 640 * 2 * 8 * 128 * 80 * 2 == 39_975_543_808
    model = json.loads(cli("plan", "-m", "70b", "--topo", DGX_A100, "--gpu", "a100", "--dtype", "int4", "--json",
                           "--top", "1").stdout)["model"]
    assert model["weight_gb"] == round((weights + 8_192 * 2) / 1e9, 3)  # + the final norm, kept in bf16 too
    assert (model["kv_dtype"], model["kv_bytes_per_token"]) == ("bf16", 2 * 8 * 128 * 80 * 2)
    fp8_kv = one("70b", DGX_A100, "a100-80gb", tp=2, workload=Workload(kv_dtype="fp8"))
    # bf16 weights as in test_cost (70,553,698,304 B per GPU at tp=2), KV at 1 B: 52,428,800 B per sequence
    assert fp8_kv.max_batch == int((A100_USABLE - (LLAMA70_LAYERS + 2 * LLAMA70_EMBED)) // 52_428_800) == 128


# --- the throughput objective searches the batch -----------------------------------------------------------
def test_throughput_prices_each_layout_at_the_batch_it_fits():
    out = json.loads(cli("plan", "-m", "70b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--objective",
                         "throughput", "--json", "--top", "0").stdout)
    every = {(e["tp"], e["pp"], e["dp"]): e for e in out["layouts"] + out["hidden"]}
    tp2 = every[(2, 1, 4)]
    assert tp2["batch"] == tp2["max_batch"] == 64  # not batch 1 (nor the max batch 13 of 80e9-byte GPUs)
    assert all(e["batch"] == e["max_batch"] for e in every.values() if e["fits"])  # no limits: all that fits
    assert out["layouts"][0]["batch"] > 64  # the winner serves hundreds of sequences per replica
    per_gpu = [e["served"]["output_tokens_per_s_per_gpu"] for e in out["layouts"] if e["fits"]]
    assert per_gpu == sorted(per_gpu, reverse=True)  # delivered, not the decode-phase rate


def test_throughput_within_latency_limits_picks_the_most_delivered_at_the_largest_batch_that_meets_them():
    """Static batches (the bundled runner): TTFT is the batch's prefill, so the 5 s limit bounds the batch; two
    TP4 replicas deliver more than one TP8 (the decode-phase rate ranked TP8 first)."""
    limits = Limits(ttft_ms=5000, tpot_ms=50)
    request = PlanRequest(model="70b", topo=DGX_A100, gpu="a100-80gb", objective="throughput", limits=limits)
    result = plan_for(request)
    best, tp8 = result.layouts[0].cost, result.layouts[1].cost
    assert best.layout == Layout(4, 1, 2) and tp8.layout == Layout(8, 1, 1) and not best.slo_miss
    assert best.served.output_tokens_per_s > tp8.served.output_tokens_per_s
    assert best.tokens_per_s_per_gpu < tp8.tokens_per_s_per_gpu  # the decode-phase rate says the opposite
    assert best.batch > 32 and best.served.replica.ttft_ms <= 5000 and best.served.replica.tpot_ms <= 50
    over = plan_for(PlanRequest(model="70b", topo=DGX_A100, gpu="a100-80gb", tp=4, pp=1, dp=2,
                                workload=Workload(batch=best.batch + 1), limits=limits)).layouts[0].cost
    assert over.slo_miss  # one more sequence breaks a limit: the search stopped at the largest that meets both
    tp2 = cli("plan", "-m", "70b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--objective", "throughput",
              "--max-tpot-ms", "50", "--max-ttft-ms", "5000", "--json", "--top", "0")
    missing = [e for e in json.loads(tp2.stdout)["layouts"] if e["tp"] == 2 and e["pp"] == 1]
    assert missing and all("TPOT 50.1 ms > --max-tpot-ms 50" in e["slo_miss"] for e in missing)


def test_latency_limits_must_be_positive():
    with pytest.raises(TopoplanError, match="--max-tpot-ms must be a positive number of milliseconds"):
        Limits(tpot_ms=0)


# --- SYS hops per CPU family --------------------------------------------------------------------------------
def test_sys_hops_are_priced_for_the_cpu_family():
    # Azure NC96ads A100 v4 (AMD EPYC, 4 NUMA nodes): TP4 crosses SYS between the NVLink pairs
    default = one("70b", AZURE_AMD, "a100-pcie-80gb", tp=4).reasons[0]
    amd = one("70b", AZURE_AMD, "a100-pcie-80gb", tp=4, cpu="amd-zen").reasons[0]
    assert "ring bottleneck 8 GB/s" in default and "--cpu names the family" in default  # min(24, 10) x 0.8
    assert "ring bottleneck 19 GB/s" in amd and "amd-zen interconnect 32 GB/s" in amd  # min(24, 32) x 0.8
    run = cli("plan", "-m", "70b", "--topo", AZURE_AMD, "--gpu", "a100-pcie-80gb", "--cpu", "epyc")
    assert run.returncode == 2 and "unknown --cpu 'epyc': expected one of intel-broadwell" in run.stderr


# --- multi-node ---------------------------------------------------------------------------------------------
def test_405b_on_four_one_nic_nodes_keeps_tp_inside_the_node():
    out = json.loads(cli("plan", "-m", "405b", "--topo", L40S_1NIC, "--gpu", "l40s", "--nodes", "4", "--json",
                         "--top", "0").stdout)
    fitting = [e for e in out["layouts"] if e["fits"]]
    inside = [e["tp"] <= e["ranks_per_node"] for e in fitting]
    assert inside[0] and inside == sorted(inside, reverse=True)  # node-spanning TP only after every in-node one
    tp16 = one("405b", L40S_1NIC, "l40s", tp=16, pp=2, nodes=4)
    assert tp16.reasons[0].startswith("TP16 spans nodes") and "network hop 20 GB/s" in tp16.reasons[0]


def test_a_layout_on_fewer_nodes_wins_when_the_node_count_does_not_tile():
    # 405B bf16 needs 2 DGX A100 nodes; on 3, every all-node layout needs 24 GPUs (a third pipeline stage)
    out = json.loads(cli("plan", "-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--nodes", "3",
                         "--json").stdout)
    best = out["layouts"][0]
    assert (best["tp"], best["pp"], best["dp"], best["nodes"]) == (8, 2, 1, 2)
    assert "runs on 2 of the 3 nodes (1 left free)" in best["reasons"]
    fixed = one("405b", DGX_A100, "a100-80gb", tp=8, pp=2, dp=1, nodes=3)  # no tp8 pp2 tiles all 3 nodes
    assert fixed.layout == Layout(8, 2, 1) and "runs on 2 of the 3 nodes (1 left free)" in fixed.reasons
    run = CliRunner().invoke(app, ["launch", "--topo", DGX_A100, "--model", "405b", "--gpu", "a100", "--nodes", "3",
                                   "--hosts", "a,b,c", "--rank", "1"])
    assert run.exit_code == 2 and "runs on 2 of the 3 nodes; launch it with --nodes 2" in run.stderr



def test_fewer_node_layouts_follow_the_engine_rules_and_get_expert_parallel_twins():
    """On 3 nodes of 8 GPUs, 2 full nodes (16 GPUs) are offered: tp x pp = 16. An engine without pipeline
    parallelism keeps only pp 1; an MoE model gets ep = tp twins where tp divides its experts (Mixtral: 8)."""
    from topoplan.engines.engine import Parallelism
    from topoplan.models import find_model
    from topoplan.plan.layouts import fewer_node_layouts

    dense = {layout for layout, n in fewer_node_layouts(find_model("405b"), 8, 3, 2)}
    assert dense == {Layout(1, 16, 1), Layout(2, 8, 1), Layout(4, 4, 1), Layout(8, 2, 1), Layout(16, 1, 1)}
    assert fewer_node_layouts(find_model("405b"), 8, 3, 2, rules=Parallelism(pp=False)) == [(Layout(16, 1, 1), 2)]
    moe = {layout for layout, n in fewer_node_layouts(find_model("mixtral"), 8, 3, 1)}
    assert moe == dense | {Layout(2, 8, 1, 2), Layout(4, 4, 1, 4), Layout(8, 2, 1, 8)}  # 16 does not divide 8
    assert fewer_node_layouts(find_model("mixtral"), 8, 3, 1, ep=8) == [(Layout(8, 2, 1, 8), 2)]

# --- hidden NVLink ------------------------------------------------------------------------------------------
def test_a_topo_mp_paste_warns_that_nvlink_is_not_shown():
    assert NVLINK_HIDDEN in read_topology(str(B300_MP)).notes and read_topology(str(B300)).notes == ()
    with_command = "$ nvidia-smi topo -mp\n" + (TOPO / "22_l40s-8gpu-node-sys-1nic-nolegend.txt").read_text()
    assert NVLINK_HIDDEN in parse_topo_text(with_command).notes  # no legend: the command line says it
    run = cli("plan", "-m", "70b", "--topo", str(B300_MP), "--gpu", "b300", "--top", "1")
    assert run.returncode == 0 and f"topoplan: warning: {NVLINK_HIDDEN}" in run.stderr


# --- JSON at scale ------------------------------------------------------------------------------------------
def test_json_describes_one_node_unless_per_rank():
    args = ("plan", "-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--nodes", "4", "--json", "--top", "1")
    (shape,) = json.loads(cli(*args).stdout)["layouts"]
    (ranks,) = json.loads(cli(*args, "--per-rank").stdout)["layouts"]
    assert len(shape["placement"]) == shape["ranks_per_node"] == 8 and shape["nodes"] == 4
    assert shape["placement_scope"] == "node 0 (every node the same shape)"
    assert len(ranks["placement"]) == ranks["gpus"] == 32 and ranks["placement"][:8] == shape["placement"]
    for p in ranks["placement"]:  # node n repeats node 0's GPUs in the same order
        assert p["node"] == p["rank"] // 8 and p["gpu"] == shape["placement"][p["rank"] % 8]["gpu"]


def test_a_recording_prices_the_memory_nvml_reported(tmp_path):
    """NVML's own total for these GPUs beats the catalog's (e.g. a part with less memory enabled); --gpu naming
    another GPU than the recording's goes back to the catalog."""
    recording = json.loads((TOPO.parent / "nvml" / "hgx-h100-8gpu-nvswitch.json").read_text())
    for gpu in recording["nvml"]["gpus"]:
        gpu["memory_total"] = 64_000 * 2**20
    path = tmp_path / "h100-64000mib.json"
    path.write_text(json.dumps(recording))
    assert plan_for(PlanRequest(model="8b", topo=str(path))).device.memory_bytes == 64_000 * 2**20
    other = plan_for(PlanRequest(model="8b", topo=str(path), gpu="h200"))
    assert other.device.memory_bytes == 143_771 * 2**20


def test_a_recording_names_its_cpu_family(tmp_path):
    """The recorder keeps /proc/cpuinfo's model name; the reader maps it to the SYS-hop figures; --cpu wins."""
    from topoplan.topology.links import cpu_family_of
    from topoplan.topology.nvml_reader import read_cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n")
    assert read_cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480C" and read_cpu_model(tmp_path / "no") is None
    assert [cpu_family_of(name) for name in ("Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz", "Intel(R) Xeon(R) "
            "Platinum 8580", "AMD EPYC 7763 64-Core Processor", "Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz",
            "Intel(R) Xeon(R) 6960P")] == ["intel-skylake", "intel-emerald-rapids", "amd-zen", "intel-broadwell",
                                           None]
    recording = json.loads((TOPO.parent / "nvml" / "l40s-8gpu-2socket-p2p-cns.json").read_text())
    recording["cpu"] = {"model_name": read_cpu_model(cpuinfo)}
    path = tmp_path / "l40s-spr.json"
    path.write_text(json.dumps(recording))
    from topoplan.machine import load_topology

    topo = load_topology(str(path))
    sys_link = next(link for link in topo.links() if link.code == "SYS" and link.a.startswith("GPU")
                    and link.b.startswith("GPU"))
    assert topo.cpu == "intel-sapphire-rapids" and sys_link.bandwidth_gbps == 22.0  # min(PCIe Gen4 24, SPR 22)
    assert any("CPU family intel-sapphire-rapids" in note for note in topo.notes)
    assert load_topology(str(path), cpu="amd-zen").link(sys_link.a, sys_link.b).bandwidth_gbps == 24.0


def test_tp_across_the_trays_of_one_nvlink_domain_is_not_the_network():
    """GB200 NVL72 trays share one NVLink domain: TP spanning trays is not pushed behind in-tray TP."""
    result = plan_for(PlanRequest(model="405b", topo=str(TOPO.parent / "nvml" / "gb200-nvl72-tray-4gpu.json"),
                                  nodes=4))
    best = result.layouts[0]
    assert best.cost.layout.tp > len(best.order) and not best.tp_network
    assert "spans nodes over NVLink (one multi-node NVLink domain)" in best.cost.reasons[0]
