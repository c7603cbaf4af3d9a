"""`plan --disagg`: KV bytes and transfer prices by hand, prefill and decode on disjoint GPUs, every GPU's KV route
through its nearest NIC as the fixture text lists it, --pd honoured, and bad requests -> one line, exit 2."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_table_width import check
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.machine import load_topology
from topoplan.models import find_model
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.disagg import DisaggRequest, best_split, disagg_for
from topoplan.plan.disagg_placement import RolePlan, WorkerPlacer, route_warnings
from topoplan.plan.frontend import PlanRequest
from topoplan.plan.kv_transfer import kv_bytes_per_request, kv_routes, price_transfer
from topoplan.plan.saved import load_disagg

H200 = "fixtures/topo/41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt"
DGX_A100 = "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
OCI_A100 = "fixtures/topo/26_oci-bm-gpu4-a100-8gpu-nv12-18nic-nps4.txt"
H100_NVL_2NIC = "fixtures/topo/17_h100-nvl-8gpu-nv12-pairs-2nic.txt"
AZURE_NO_NIC = "fixtures/topo/18_azure-nc96ads-a100v4-4gpu-nv12-pairs-4numa.txt"
AIC_LLAMA = "fixtures/aic/llama70b-h200-sglang-disagg-best_config_topn.csv"  # row 1: 2 x tp2 prefill, 1 x tp4 decode
AIC_DSV3 = "fixtures/aic/deepseek-v3-h200-sglang-disagg-best_config_topn.csv"  # 1 x tp8 ep8, 1 x tp1 dp8 ep8

# Each GPU's nearest NIC, read off the fixture text by hand (the NIC columns of the GPU rows, NIC legend names).
# Fixture 41: one PIX NIC per GPU. Fixture 00: each GPU pair sits behind a switch with two NICs (PXB), the pair
# takes them in turn. Fixture 26: each GPU pair has four PXB NICs (GPU0/1: NIC5-8, GPU2/3: NIC1-4,
# GPU4/5: NIC14-17, GPU6/7: NIC9-12), the pair takes the first two in turn.
NEAREST = {
    H200: {f"GPU{i}": (f"mlx5_{i}", "PIX") for i in range(8)},
    DGX_A100: {f"GPU{i}": (f"mlx5_{i}", "PXB") for i in range(8)},
    OCI_A100: {"GPU0": ("mlx5_5", "PXB"), "GPU1": ("mlx5_6", "PXB"), "GPU2": ("mlx5_1", "PXB"),
               "GPU3": ("mlx5_2", "PXB"), "GPU4": ("mlx5_14", "PXB"), "GPU5": ("mlx5_15", "PXB"),
               "GPU6": ("mlx5_9", "PXB"), "GPU7": ("mlx5_10", "PXB")},
}
LLAMA70_KV_PER_TOKEN = 80 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16 bytes
DSV3_KV_PER_TOKEN = 61 * (512 + 64) * 2  # layers x (kv_lora_rank + qk_rope_head_dim) x bf16 bytes: MLA's latent


def topoplan(*args: str) -> subprocess.CompletedProcess:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def disagg_json(*args: str) -> dict:
    run = topoplan("plan", "--disagg", "--json", *args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def slots(workers: list[dict]) -> list[tuple[int, str]]:
    """(node, GPU) of every GPU every worker holds (a worker spanning nodes holds its GPUs on each)."""
    return [(w["node"] + n, g) for w in workers for n in range(w["nodes"]) for g in w["gpus"]]


def test_kv_bytes_by_hand():
    assert kv_bytes_per_request(find_model("70b"), 2048, "bf16") == LLAMA70_KV_PER_TOKEN * 2048 == 671_088_640
    assert kv_bytes_per_request(find_model("70b"), 1000, "fp8") == LLAMA70_KV_PER_TOKEN // 2 * 1000
    assert kv_bytes_per_request(find_model("DeepSeek-V3"), 4096, "bf16") == DSV3_KV_PER_TOKEN * 4096


@pytest.mark.parametrize("fixture, gpu", [(H200, "h200"), (DGX_A100, "a100-80gb"), (OCI_A100, "a100-80gb")])
def test_llama70b_one_node_disjoint_gpus_and_nearest_nics(fixture, gpu):
    out = disagg_json("-m", "70b", "--topo", fixture, "--gpu", gpu, "--engine", "sglang", "--prompt-len", "2048",
                      "--gen-len", "256", "--max-ttft-ms", "2000", "--max-tpot-ms", "50")
    d = out["disagg"]
    workers = d["workers"]
    prefill = {g for w in workers if w["role"] == "prefill" for g in slots([w])}
    decode = {g for w in workers if w["role"] == "decode" for g in slots([w])}
    assert prefill and decode and not prefill & decode  # P and D share no GPU
    used = slots(workers)
    assert len(used) == len(set(used)) <= 8  # no GPU given twice, within the node
    assert [w["role"] for w in workers].count("prefill") == d["ratio"]["prefill"]
    assert [w["role"] for w in workers].count("decode") == d["ratio"]["decode"]
    for w in workers:
        assert [r["gpu"] for r in w["routes"]] == w["gpus"]
        for r in w["routes"]:
            assert (r["nic_name"], r["link"]) == NEAREST[fixture][r["gpu"]]
        assert w["layout"]["tp"] * w["layout"]["pp"] == len(w["gpus"])
    assert d["transfer"]["bytes_per_request"] == LLAMA70_KV_PER_TOKEN * 2048
    # SGLang's Mooncake backend speaks RDMA only: even on one node the KV cache leaves by each GPU's NIC
    assert "mlx5_" in d["transfer"]["path"] and not d["transfer"]["path"].startswith("NV")
    served = d["served"]
    assert served["ttft_ms"] <= 2000 and served["tpot_ms"] <= 50 and "slo_miss" not in d
    assert served["output_tokens_per_s_per_gpu"] * 8 == pytest.approx(served["output_tokens_per_s"], rel=1e-4)
    agg = d["aggregated"]
    assert d["pays"] == (served["output_tokens_per_s_per_gpu"] > agg["output_tokens_per_s_per_gpu"])
    assert ("does not pay" in d["verdict"]) == (not d["pays"])


def test_prefill_and_decode_use_disjoint_nics_on_a_two_socket_box():
    """Fixture 41: GPU0-3 on socket 0 with mlx5_0-3, GPU4-7 on socket 1 with mlx5_4-7. With --pd 1:1 at TP4 the
    two workers take one socket each, so their KV NIC sets are disjoint and each is bound to its own NUMA node."""
    d = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "1:1", "--tp", "4")["disagg"]
    p, dec = d["workers"]
    assert (p["role"], dec["role"]) == ("prefill", "decode")
    assert {p["numa_nodes"][0], dec["numa_nodes"][0]} == {0, 1} and len(p["numa_nodes"]) == len(dec["numa_nodes"]) == 1
    assert not {r["nic_name"] for r in p["routes"]} & {r["nic_name"] for r in dec["routes"]}
    socket0 = next(w for w in (p, dec) if w["numa_nodes"] == [0])
    assert socket0["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"] and socket0["cpus"] == [0, 2, 4, 6, 8, 10]
    socket1 = next(w for w in (p, dec) if w["numa_nodes"] == [1])
    assert socket1["cpus"] == []  # the fixture lists no CPU affinity for GPU4-7 (an empty container cpuset)


def test_pd_is_honoured_and_saved(tmp_path):
    saved = tmp_path / "plan.json"
    out = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "2:1", "-o", str(saved))
    d = out["disagg"]
    assert d["ratio"] == {"prefill": 2, "decode": 1}
    assert [w["name"] for w in d["workers"]] == ["prefill0", "prefill1", "decode0"]
    record = json.loads(saved.read_text())["request"]
    assert record["disagg"] == {"pd": [2, 1], "connector": "whole", "roles": None, "roles_from": None}
    assert record["model"] == "70b"
    request, result, deployment = load_disagg(str(saved))  # what `launch --disagg --plan FILE` reads
    assert request.model == "70b" and result.chosen.ratio == (2, 1) and deployment is result.chosen
    assert [w.gpus for w in result.chosen.workers] == [tuple(w["gpus"]) for w in d["workers"]]
    document = json.loads(saved.read_text())
    document["disagg"]["decode_layout"] = "tp=8,pp=1,dp=1"
    saved.write_text(json.dumps(document))
    with pytest.raises(TopoplanError, match="stale plan: the deployment is now"):
        load_disagg(str(saved))
    plain = tmp_path / "plain.json"
    assert topoplan("plan", "-m", "70b", "--topo", H200, "--gpu", "h200", "-o", str(plain)).returncode == 0
    with pytest.raises(TopoplanError, match="no `disagg` record"):
        load_disagg(str(plain))


def test_two_nodes_price_the_transfer_over_the_nics():
    """TP8 prefill on node 0, TP8 decode on node 1: each decode GPU receives its KV slice (one KV head of 8:
    1/8 of the cache) through GPU -> PIX -> mlx5_i -> network -> mlx5_i -> PIX -> GPU. The slowest hop is the
    H200's PCIe Gen5 x16 (48 GB/s x 0.8 bus efficiency = 38.4 GB/s) against the NIC's 50 x 0.8 = 40;
    latencies PIX 5 + NET 8 + PIX 5 us; the connector's 0.4 ms setup."""
    d = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--nodes", "2", "--pd", "1:1", "--tp", "8",
                    "--prompt-len", "2048")["disagg"]
    p, dec = d["workers"]
    assert (p["node"], dec["node"]) == (0, 1)
    t = d["transfer"]
    per_gpu = LLAMA70_KV_PER_TOKEN // 8 * 2048
    assert t["ms"] == pytest.approx(per_gpu / 38.4e9 * 1e3 + 0.018 + 0.4, rel=1e-3)  # + the connector's setup
    assert t["exposed_ms"] == t["ms"] and t["connector"] == "whole"
    assert "PIX hop" in t["path"] and "mlx5_" in t["path"] and "8 slice(s)" in t["path"]


def test_deepseek_v3_two_nodes_moves_the_mla_latent():
    d = disagg_json("-m", "DeepSeek-V3", "--dtype", "fp8", "--topo", H200, "--gpu", "h200", "--nodes", "2",
                    "--engine", "sglang", "--prompt-len", "4096", "--gen-len", "512", "--max-ttft-ms", "3000",
                    "--max-tpot-ms", "60")["disagg"]
    assert d["transfer"]["bytes_per_request"] == DSV3_KV_PER_TOKEN * 4096
    workers = d["workers"]
    used = slots(workers)
    assert len(used) == len(set(used))
    assert not {s for w in workers if w["role"] == "prefill" for s in slots([w])} & \
        {s for w in workers if w["role"] == "decode" for s in slots([w])}
    for w in workers:
        for r in w["routes"]:
            assert (r["nic_name"], r["link"]) == NEAREST[H200][r["gpu"]]


def test_deepseek_v3_on_four_a100_nodes_spans_workers_over_whole_nodes():
    """fp8 DeepSeek-V3 (671 GB) does not fit 8 x 80 GB: each worker takes two whole nodes, and the KV cache
    crosses the network between them."""
    d = disagg_json("-m", "DeepSeek-V3", "--dtype", "fp8", "--topo", DGX_A100, "--gpu", "a100-80gb", "--nodes", "4",
                    "--pd", "1:1")["disagg"]
    p, dec = d["workers"]
    assert p["nodes"] == dec["nodes"] == 2 and {p["node"], dec["node"]} == {0, 2}
    assert "mlx5_" in d["transfer"]["path"]
    for r in p["routes"] + dec["routes"]:
        assert (r["nic_name"], r["link"]) == NEAREST[DGX_A100][r["gpu"]]


@pytest.mark.parametrize("args, missing", [
    (("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "4:1"), "--pd 4:1 needs at least 10 GPUs"),
    (("-m", "DeepSeek-V3", "--dtype", "fp8", "--topo", H200, "--gpu", "h200"), "need at least 12 GPUs"),
    (("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "2:x"), "expected P:D"),
    (("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "0:2"), "at least one prefill and one decode"),
    (("-m", "70b", "--topo", AZURE_NO_NIC, "--gpu", "a100-80gb", "--nodes", "2", "--pd", "1:1", "--tp", "4"),
     "no NIC for a cross-node KV transfer"),
    (("-m", "70b", "--device", "cpu"), "--disagg plans GPU workers"),
])
def test_cannot_place_is_one_line_exit_2(args, missing):
    run = topoplan("plan", "--disagg", *args)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("topoplan: error: ") and missing in lines[0], run.stderr
    assert "Traceback" not in run.stderr


def test_route_warnings_name_gpus_far_from_their_nic():
    """Fixture 17: two NICs on socket 0. GPU1 reaches them at PHB and GPU0/2/3 at NODE (no NIC on their PCIe
    switch); GPU4-7 only at SYS (no NIC on their socket)."""
    topology = load_topology(H100_NVL_2NIC, gpu="h100-nvl")
    placer = WorkerPlacer(topology, 1)
    workers = placer.place(RolePlan("prefill", Layout(4), 1), RolePlan("decode", Layout(4), 1))
    switch, socket = sorted(route_warnings(workers), key=lambda line: "socket" in line)
    assert switch.startswith("no NIC on the PCIe switch of ")
    assert all(f"GPU{i} " in switch for i in range(4)) and "GPU4" not in switch
    assert socket.startswith("no NIC on the socket of ") and all(f"GPU{i} " in socket for i in range(4, 8))
    routes = kv_routes(topology)
    assert [routes[f"GPU{i}"].nic_name for i in range(8)] == ["mlx5_0", "mlx5_1"] * 4  # tied NICs taken in turn


def test_per_layer_connector_exposes_only_what_outlasts_the_prefill():
    topology = load_topology(H200, gpu="h200")
    pricer = LinkPricer(topology, Calibration(), 50.0)
    model = find_model("70b")
    placer = WorkerPlacer(topology, 2)
    src, dst = placer.place(RolePlan("prefill", Layout(8), 1), RolePlan("decode", Layout(8), 1))
    whole = price_transfer(pricer, model, 2048, "bf16", src, dst, "whole")
    short = price_transfer(pricer, model, 2048, "bf16", src, dst, "per-layer", prefill_ms=0.5)
    long = price_transfer(pricer, model, 2048, "bf16", src, dst, "per-layer", prefill_ms=100.0)
    assert short.ms == long.ms == whole.ms == whole.exposed_ms
    moved = whole.ms - 0.4  # the bytes' time: the connector's 0.4 ms setup comes once, after the last layer
    assert short.exposed_ms == pytest.approx(moved - 0.5 + moved / 80 + 0.4)
    assert long.exposed_ms == pytest.approx(moved / 80 + 0.4)  # all but the last layer hidden behind the prefill
    with pytest.raises(TopoplanError, match="KV connector 'nccl'"):
        price_transfer(pricer, model, 2048, "bf16", src, dst, "nccl")


def test_library_call_matches_the_cli():
    """disagg_for(PlanRequest, pd) is what `plan --disagg --pd` prints: the same workers on the same GPUs, the same
    transfer and served figures (it only checked the library's own output before)."""
    request = PlanRequest(model="70b", topo=H200, gpu="h200")
    result = disagg_for(request, (3, 1))
    assert result.chosen.ratio == (3, 1) and result.searched >= 1
    assert result.candidates[0].ratio == (3, 1) and result.connector == DisaggRequest().connector == "whole"
    gpus = [g for w in result.chosen.workers for g in w.gpus]
    assert len(gpus) == len(set(gpus))
    cli = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "3:1")["disagg"]
    assert [(w["name"], w["gpus"], w["layout"]["tp"], w["layout"]["pp"]) for w in cli["workers"]] == [
        (w.name, list(w.gpus), w.layout.tp, w.layout.pp) for w in result.chosen.workers]
    assert cli["transfer"]["ms"] == pytest.approx(result.chosen.transfer.ms, abs=1e-4)
    assert cli["served"]["output_tokens_per_s_per_gpu"] == pytest.approx(
        result.chosen.served.output_tokens_per_s_per_gpu, abs=1e-3)
    assert cli["verdict"] == result.verdict


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.from_regex(r"\A\s*\d{1,8}\s*:\s*\d{1,8}\s*\Z")))
def test_pd_text_is_counts_or_one_error(text):
    try:
        asked = DisaggRequest.parse(text)
    except TopoplanError as error:
        assert str(error).startswith("--pd ") and "\n" not in str(error)
    else:
        assert asked.pd is not None and min(asked.pd) >= 1 and max(asked.pd) < 10**6


def test_a_long_pd_is_quoted_whole_in_its_error():
    """The value is cut to 20 characters inside its quotes (it lost the closing quote: '9999...9: expected)."""
    with pytest.raises(TopoplanError) as error:
        DisaggRequest.parse("9" * 25 + ":1")
    assert str(error.value).startswith(f"--pd '{'9' * 20}': expected P:D")


@pytest.mark.parametrize("width", (80, 200))
@pytest.mark.parametrize("args", [
    ("-m", "70b", "--topo", H200, "--gpu", "h200", "--engine", "sglang"),
    ("-m", "70b", "--topo", OCI_A100, "--gpu", "a100-80gb", "--nodes", "2", "--pd", "2:2", "--tp", "4"),
])
def test_disagg_table_fits_the_terminal(width, args):
    result = CliRunner().invoke(app, ["plan", "--disagg", *args], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.stderr
    check(result.stdout, width)
    out = result.stdout
    assert "prefill0" in out and "decode0" in out and "KV transfer:" in out and "aggregated tp" in out
    assert "disaggregation" in out and "searched " in out
    assert "launch --disagg --rank N" in out and "candidates" in out


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([8, 16, 24, 64, 128]), st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
       st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.floats(0.01, 100), st.floats(0.01, 100))
def test_best_split_is_the_best_of_every_pd(g, gp, gd, rp, rd):
    """The few P:D weighed around the meeting point serve as many requests as the best of every (P, D)."""
    best, weighed = best_split(g, gp, gd, rp, rd)
    every = [(p, d) for p in range(1, g // gp + 1) for d in range(1, (g - p * gp) // gd + 1)]
    if not every:
        assert best is None
        return
    most = max(min(p * rp, d * rd) for p, d in every)
    assert best is not None and best[0] * gp + best[1] * gd <= g and weighed <= 12
    assert min(best[0] * rp, best[1] * rd) == pytest.approx(most, rel=1e-12)


def test_aiconfigurator_fixtures_have_its_columns():
    """The fixtures are in the format `aiconfigurator cli` writes: ColumnsDisagg, in order."""
    common = pytest.importorskip("aiconfigurator_core.sdk.common")
    for fixture in (AIC_LLAMA, AIC_DSV3):
        with open(fixture, encoding="utf-8") as handle:
            assert handle.readline().rstrip("\n").split(",") == common.ColumnsDisagg


def test_pd_from_places_aiconfigurators_deployment(tmp_path):
    """Row 1 of the Llama fixture: 2 prefill workers of tp2 and 1 decode worker of tp4 on the 8 GPUs; topoplan
    only places and prices them (searched: the one combination)."""
    saved = tmp_path / "plan.json"
    d = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--engine", "sglang", "--pd-from", AIC_LLAMA,
                    "-o", str(saved))["disagg"]
    assert d["ratio"] == {"prefill": 2, "decode": 1} and d["searched"] == 1
    assert (d["prefill_layout"], d["decode_layout"]) == ("tp=2,pp=1,dp=1", "tp=4,pp=1,dp=1")
    assert [(w["name"], len(w["gpus"])) for w in d["workers"]] == [("prefill0", 2), ("prefill1", 2), ("decode0", 4)]
    used = slots(d["workers"])
    assert len(used) == len(set(used)) == 8
    for w in d["workers"]:
        for r in w["routes"]:
            assert (r["nic_name"], r["link"]) == NEAREST[H200][r["gpu"]]
    assert any(n.startswith(f"P:D and worker layouts from {AIC_LLAMA} (aiconfigurator: model "
                            "meta-llama/Meta-Llama-3.1-70B") for n in d["notes"])
    assert ("aiconfigurator sized this P:D for 4000 prompt and 500 generated tokens; this plan prices 512 and 128 "
            "(pass --prompt-len 4000 --gen-len 500 to price what it chose)") in d["warnings"]
    same = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--engine", "sglang", "--pd-from", AIC_LLAMA,
                       "--prompt-len", "4000", "--gen-len", "500")["disagg"]
    assert same["ratio"] == d["ratio"] and not any("aiconfigurator sized" in w for w in same["warnings"])
    record = json.loads(saved.read_text())["request"]["disagg"]
    assert record["pd"] == [2, 1] and record["roles"] == ["tp=2,pp=1,dp=1", "tp=4,pp=1,dp=1"]
    _, result, _ = load_disagg(str(saved))  # launch --plan FILE: the same deployment, without the CSV
    assert result.chosen.ratio == (2, 1) and (result.chosen.prefill, result.chosen.decode) == (Layout(2), Layout(4))


def test_pd_from_reads_a_run_folder_and_attention_dp(tmp_path):
    """A run's folder stands for its disagg/best_config_topn.csv. DeepSeek-V3's decode worker is aiconfigurator's
    tp1 x dp8 with moe_ep 8: topoplan's attention DP (dp 8, ep 8). A request's MLA latent lands on one attention
    replica (one GPU at tp1): one slice of the whole latent, over the NICs (prefill on node 0, decode on node 1)."""
    run = tmp_path / "run" / "disagg"
    run.mkdir(parents=True)
    (run / "best_config_topn.csv").write_bytes(open(AIC_DSV3, "rb").read())
    d = disagg_json("-m", "DeepSeek-V3", "--dtype", "fp8", "--topo", H200, "--gpu", "h200", "--nodes", "2",
                    "--engine", "sglang", "--prompt-len", "4096", "--pd-from", str(tmp_path / "run"))["disagg"]
    p, dec = d["workers"]
    assert (p["layout"], dec["layout"]) == ({"tp": 8, "pp": 1, "dp": 1, "ep": 8}, {"tp": 1, "pp": 1, "dp": 8, "ep": 8})
    assert (p["node"], dec["node"]) == (0, 1) and len(dec["gpus"]) == 8
    t = d["transfer"]
    assert t["bytes_per_request"] == DSV3_KV_PER_TOKEN * 4096 and "1 slice(s)" in t["path"]
    assert t["gbps"] == pytest.approx(38.4, rel=0.05)  # the whole latent through one PCIe Gen5 hop (38.4 GB/s)


AGG_HEADER = "model,isl,osl,tp,pp,dp,moe_tp,moe_ep\nQwen/Qwen3-32B,4000,500,2,1,1,1,1\n"


@pytest.mark.parametrize("write, extra, expected", [
    (None, (), "no best_config_topn.csv in it"),  # an empty folder
    (AGG_HEADER, (), "no column (p)workers (an aggregated result?)"),
    (b"\x00\xff\xfe binary", (), "not UTF-8 text"),
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n", (),
     "no rows"),
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(p)cp,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n"
     "1,4,1,1,1,1,2,1,4,1,1,1,1\n", (), "context parallelism"),
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n"
     "1,four,1,1,1,1,1,4,1,1,1,1\n", (), "column (p)tp is 'four'; expected a whole number"),
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n"
     "1,4,1,1,1,1,1,1,1,8,8,1\n", (), "decode: (d)dp 8 without the experts over every GPU"),
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n"
     "1,8,1,1,1,1,1,8,1,1,1,1\n", (), "they need 16 GPUs; 1 node(s) x 8 GPUs have 8"),  # one 8-GPU node
    ("(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep\n"
     "1,4,1,1,1,1,1,4,1,1,1,1\n", ("--pd", "1:1"), "--pd and --pd-from both give the P:D"),
])
def test_pd_from_refuses_foreign_files_in_one_line(tmp_path, write, extra, expected):
    path = tmp_path / "result.csv"
    if write is None:
        path = tmp_path / "empty-run"
        path.mkdir()
    else:
        path.write_bytes(write if isinstance(write, bytes) else write.encode())
    run = topoplan("plan", "--disagg", "-m", "70b", "--topo", H200, "--gpu", "h200", "--pd-from", str(path), *extra)
    assert run.returncode == 2, run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("topoplan: error: ") and expected in lines[0], run.stderr
    if "--pd" not in extra:
        assert str(path) in lines[0]  # names the file it read


def test_kv_connector_option_reaches_the_price_table_json_and_record(tmp_path):
    """--kv-connector per-layer: the same 2.60 ms transfer as the whole-cache test above (TP8 -> TP8 across nodes,
    2048 tokens), of which the TTFT pays only the last layer's share and the setup: 2.20 / 80 + 0.40 ms (the
    prompt's prefill outlasts the bytes); the table says so, and the saved plan keeps it for launch --plan."""
    args = ("-m", "70b", "--topo", H200, "--gpu", "h200", "--nodes", "2", "--pd", "1:1", "--tp", "8",
            "--prompt-len", "2048")
    saved = tmp_path / "plan.json"
    t = disagg_json(*args, "--kv-connector", "per-layer", "-o", str(saved))["disagg"]["transfer"]
    moved = LLAMA70_KV_PER_TOKEN // 8 * 2048 / 38.4e9 * 1e3 + 0.018
    assert t["connector"] == "per-layer" and t["ms"] == pytest.approx(moved + 0.4, rel=1e-3)
    assert t["exposed_ms"] == pytest.approx(moved / 80 + 0.4, rel=1e-3)
    assert json.loads(saved.read_text())["request"]["disagg"]["connector"] == "per-layer"
    _, result, _ = load_disagg(str(saved))
    assert result.connector == result.chosen.transfer.connector == "per-layer"
    table = topoplan("plan", *args, "--kv-connector", "per-layer")  # implies --disagg, as --pd does
    assert table.returncode == 0 and "0.43 ms in the TTFT (per-layer connector)" in table.stdout
    assert "KV connector per-layer: each layer leaves as the prefill finishes it" in " ".join(table.stdout.split())
    whole = disagg_json(*args)["disagg"]["transfer"]
    assert whole["connector"] == "whole" and whole["exposed_ms"] == whole["ms"] == pytest.approx(t["ms"])


def test_kv_connector_choices_are_the_planners():
    """cli.py lists the choices without importing the planner (start-up time): they must stay CONNECTORS."""
    from dataclasses import fields

    from topoplan.cli import PlanView
    from topoplan.plan.kv_transfer import CONNECTORS

    assert next(f for f in fields(PlanView) if f.name == "kv_connector").metadata["cli"].choices == CONNECTORS
    run = topoplan("plan", "-m", "70b", "--topo", H200, "--gpu", "h200", "--kv-connector", "nccl")
    assert run.returncode == 2 and "'nccl' is not one of 'whole', 'per-layer'" in run.stderr


def test_same_node_transfer_path_is_the_engines():
    """One H200 node, a TP4 prefill on one socket and a TP4 decode on the other, a 2048-token Llama-3.1-70B prompt:
    each decode GPU receives 640 MiB / 4. SGLang's Mooncake (protocol rdma) sends it out through the sending GPU's
    PIX NIC and back in: 167,772,160 B / 38.4 GB/s (the PCIe Gen5 hop, the slowest) + (5 + 8 + 5) us + the 0.40 ms
    setup = 4.787 ms. vLLM's NIXL/UCX copies it over NVLink (CUDA IPC): NV18, several times faster."""
    args = ("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "1:1", "--tp", "4", "--prompt-len", "2048")
    sglang = disagg_json(*args, "--engine", "sglang")["disagg"]
    vllm = disagg_json(*args, "--engine", "vllm")["disagg"]
    per_gpu = LLAMA70_KV_PER_TOKEN // 4 * 2048
    assert sglang["transfer"]["ms"] == pytest.approx(per_gpu / 38.4e9 * 1e3 + 0.018 + 0.4, rel=1e-3)
    assert sglang["transfer"]["path"].startswith("PIX hop GPU") and "mlx5_" in sglang["transfer"]["path"]
    assert vllm["transfer"]["path"].startswith("NV18 GPU")
    assert vllm["transfer"]["ms"] < sglang["transfer"]["ms"] / 3
    assert any("goes out through the sending GPUs' NICs" in n for n in sglang["notes"])
    assert any("over the GPU-GPU link (CUDA IPC)" in n for n in vllm["notes"])
    for d in (sglang, vllm):  # the same placement either way: one socket each
        assert [w["gpus"] for w in d["workers"]] in ([[f"GPU{i}" for i in range(4)], [f"GPU{i}" for i in range(4, 8)]],
                                                     [[f"GPU{i}" for i in range(4, 8)], [f"GPU{i}" for i in range(4)]])


def test_engine_kv_paths_have_sources():
    """The same-node path is an engine fact with its source, not a branch on the engine's name."""
    from topoplan.engines import resolve
    from topoplan.engines.engine import GPU_LINK, VIA_NIC

    assert resolve("sglang").kv_transfer.same_node == VIA_NIC
    assert resolve("vllm").kv_transfer.same_node == resolve("trtllm").kv_transfer.same_node == GPU_LINK
    for name in ("sglang", "vllm", "trtllm"):
        assert len(resolve(name).kv_transfer.source) > 80


def test_deepseek_v3_two_nodes_takes_attention_dp_workers():
    """DeepSeek-V3 fp8 on two 8-GPU H200 nodes with SGLang, 4096/512 tokens, TTFT <= 3 s, TPOT <= 60 ms: one node
    prefills, the other decodes, and the decode worker is SGLang's published DeepSeek decode recipe, DP attention
    with the experts over all 8 GPUs (tp1 x dp8, ep8: --tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8);
    its TPOT is that of one attention replica at its share of the requests. A dense model never gets dp > 1
    inside a worker, and --ep 1 rules attention DP out (TP8 then)."""
    args = ("-m", "DeepSeek-V3", "--dtype", "fp8", "--topo", H200, "--gpu", "h200", "--nodes", "2", "--engine",
            "sglang", "--prompt-len", "4096", "--gen-len", "512", "--max-ttft-ms", "3000", "--max-tpot-ms", "60")
    d = disagg_json(*args)["disagg"]
    assert d["ratio"] == {"prefill": 1, "decode": 1} and "slo_miss" not in d
    p, dec = d["workers"]
    assert (p["node"], dec["node"]) == (0, 1) and len(p["gpus"]) == len(dec["gpus"]) == 8
    assert dec["layout"] == {"tp": 1, "pp": 1, "dp": 8, "ep": 8}
    assert d["served"]["tpot_ms"] <= 60 and d["served"]["ttft_ms"] <= 3000
    assert any("per replica x 8 (attention DP)" in n for n in d["notes"])
    assert "1 slice(s)" in d["transfer"]["path"]  # a request's latent lands on one attention replica: one GPU
    tp_only = disagg_json(*args, "--ep", "1")["disagg"]
    assert all(w["layout"]["dp"] == 1 and w["layout"]["ep"] == 1 for w in tp_only["workers"])
    dense = disagg_json("-m", "70b", "--topo", H200, "--gpu", "h200", "--engine", "sglang")["disagg"]
    assert all(c["prefill_layout"].split(",")[2] == c["decode_layout"].split(",")[2] == "dp=1"
               for c in dense["candidates"])


HEADER = "(p)workers,(p)tp,(p)pp,(p)dp,(p)moe_tp,(p)moe_ep,(d)workers,(d)tp,(d)pp,(d)dp,(d)moe_tp,(d)moe_ep,(p)cp\n"


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.lists(st.sampled_from(["0", "1", "2", "8", "8.0", "-1", "", "x", "1e9",
                                                                    '"', "\x00", "nan"]), min_size=13, max_size=13)))
def test_aiconfigurator_reader_returns_a_deployment_or_one_error(tmp_path_factory, content):
    """Any file: a deployment whose counts and layouts are whole and positive, or one TopoplanError line."""
    from topoplan.plan.aic_result import read_aic_disagg

    path = tmp_path_factory.mktemp("aic") / "result.csv"
    path.write_bytes(content if isinstance(content, bytes) else (HEADER + ",".join(content) + "\n").encode())
    try:
        aic = read_aic_disagg(str(path))
    except TopoplanError as error:
        assert "\n" not in str(error) and str(path) in str(error)
    else:
        assert min(aic.pd) >= 1 and all(layout.world >= 1 for layout in (aic.prefill, aic.decode))


def test_without_an_engine_the_plan_says_the_runner_has_no_split():
    """plan --disagg with the default engine (the bundled runner) still prices, but says which engines split."""
    base = ("-m", "70b", "--topo", H200, "--gpu", "h200", "--pd", "1:1", "--tp", "4")
    runner = topoplan("plan", "--disagg", *base)
    assert runner.returncode == 0 and "bundled runner has no prefill/decode split" in runner.stderr
    engine = topoplan("plan", "--disagg", "--engine", "sglang", *base)
    assert engine.returncode == 0 and "prefill/decode split" not in engine.stderr


def test_table_cells_write_runs_of_gpus_and_nics_once_in_their_order():
    """The workers table keeps 8 NICs on one line (mlx5_{0-7}) and GPU runs as 0-7, in rank order."""
    from topoplan.plan.disagg_table import _runs

    assert _runs([f"mlx5_{i}" for i in range(8)]) == ["mlx5_{0-7}"]
    assert _runs(["mlx5_0", "mlx5_1", "mlx5_3", "ib0", "none"]) == ["mlx5_{0-1}", "mlx5_3", "ib0", "none"]
    assert _runs(["4", "5", "6", "7"]) == ["4-7"] and _runs(["1", "0"]) == ["1", "0"]  # rank order kept
