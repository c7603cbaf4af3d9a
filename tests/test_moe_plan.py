"""Expert parallelism in the planner: EP layouts, memory per rank by hand, the all-to-all priced on the placed
links (NVLink, NIC rails across nodes), the routing imbalance, EP-aware placement, reasons, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.hardware import find_gpu
from topoplan.layout import Layout, RankGrid
from topoplan.models import find_model, spec_from_config
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer, Ring
from topoplan.plan.cost import CostModel, StageModel, Workload, stages_of
from topoplan.plan.device import DeviceSpec
from topoplan.plan.layouts import enumerate_layouts
from topoplan.plan.moe import imbalance
from topoplan.plan.placement import NodePlacer
from topoplan.plan.rank import Limits, plan
from topoplan.topology.read import read_topology

ROOT = Path(__file__).resolve().parent.parent
TOPO = ROOT / "fixtures" / "topo"
HGX_NV18 = str(TOPO / "01_b300-sxm6-8gpu-nv18-9nic-sglang.txt")  # 8 GPUs on NVSwitch (NV18), as HGX H100/H200
H100_NVL = str(TOPO / "17_h100-nvl-8gpu-nv12-pairs-2nic.txt")  # NVLink pairs joined by PCIe / SYS


def topology(path, gpu):
    spec = find_gpu(gpu)
    return read_topology(path).with_arch(spec.arch, spec.key), DeviceSpec.from_gpu(spec)


def priced(path, gpu, model, work, nodes=1, **fixed):
    topo, device = topology(path, gpu)
    result = plan(topo, find_model(model), device, work, nodes=nodes, **fixed)
    return {entry.cost.layout: entry for entry in result.layouts + result.hidden}


def test_moe_models_get_expert_parallel_twins_dense_models_do_not():
    dsv3 = enumerate_layouts(find_model("dsv3"), 8)
    assert Layout(8, 1, 1, 8) in dsv3 and Layout(2, 1, 4, 8) in dsv3 and Layout(8) in dsv3
    assert all(layout.ep in (1, layout.tp * layout.dp) for layout in dsv3)
    assert all(layout.ep == 1 for layout in enumerate_layouts(find_model("70b"), 8))
    mixtral = enumerate_layouts(find_model("mixtral"), 8, ep=8)  # 8 experts: only tp x dp = 8 splits them
    assert {layout.tp * layout.dp for layout in mixtral} == {8} and all(layout.ep == 8 for layout in mixtral)


def test_ep_memory_per_rank_by_hand():
    """Routed experts split over ep ranks; attention, shared expert, router, embedding and head over tp."""
    m = find_model("dsv3")
    (stage,) = stages_of(m, 1)
    ep8, tp8 = StageModel(m, stage, 2, 1, 1, 1, ep=8, replicas=4), StageModel(m, stage, 2, 1, 1, 1)
    routed = 58 * 256 * 3 * 7168 * 2048  # 58 MoE layers x 256 experts x SwiGLU(7168, 2048)
    assert ep8.weight_bytes() == pytest.approx((m.params - routed) / 2 + routed / 8)
    assert tp8.weight_bytes() == pytest.approx(m.params / 2)
    assert ep8.expert_bytes() == pytest.approx(routed / 8)


def test_decode_reads_the_experts_the_ep_groups_tokens_touch():
    m = find_model("dsv3")
    (stage,) = stages_of(m, 1)
    one = StageModel(m, stage, 1, 1, 1, 1, ep=8, replicas=8)  # tp1 dp8 ep8: 8 replicas' tokens meet in each layer
    dense, routed, _attention = one.decode(1, 100)
    touched = m.experts_touched(8)  # 8 tokens (one per replica), 8 experts each, over 256
    assert touched == pytest.approx(256 * (1 - (1 - 8 / 256) ** 8))
    # the busiest of 8 ranks (32 experts each, each in use with p = touched/256) runs 10.6 of them; a
    # simulation of 20,000 such steps (8 tokens, 8 distinct experts each) gave 10.66
    p = touched / 256
    busiest = 32 * p + 1.4338 * math.sqrt(32 * p * (1 - p))  # Blom's z for 8 ranks
    assert busiest == pytest.approx(10.66, rel=0.02)
    per_rank_routed = 58 * busiest * m.expert_params
    non_routed = m.matmul_params(3, 58, touched) - 58 * touched * m.expert_params + m.head_params
    assert routed.nbytes == pytest.approx(per_rank_routed, rel=1e-4)
    assert dense.nbytes == pytest.approx(non_routed, rel=1e-4)
    assert routed.rows == pytest.approx(8 * 8 / touched)  # each expert in use multiplies its share of 64 pairs


def test_streamed_products_count_the_runners_weight_products_by_hand():
    """Per layer: fused QKV and output; each routed expert run: fused gate/up and down. Only weights of 1 MiB or
    more stream from memory and pay a product's fixed cost (matmul_call_us)."""
    m = spec_from_config({"model_type": "mixtral", "vocab_size": 264, "hidden_size": 768, "intermediate_size": 1536,
                          "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
                          "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 512,
                          "tie_word_embeddings": False}, "test-mixtral")
    (stage,) = stages_of(m, 1)
    touched = 8 * (1 - (1 - 2 / 8) ** 2)  # 2 tokens, top-2 of 8 experts: 3.5 expected
    # fp32: an attention product 768 x 1024 x 4 B = 3.1 MB, an expert's gate/up 7.1 MB; the head 264 x 768 x 4 B
    # = 0.8 MB stays in cache
    assert StageModel(m, stage, 1, 4, 4, 4).streamed_products(2) == pytest.approx(4 * (2 + 2 * touched))
    # EP2: whole experts, the busiest rank runs 1.75 + 0.589 sd of its 4 (Blom's z for 2 ranks; 2.31 simulated)
    busiest = 1.75 + 0.5894 * math.sqrt(4 * (touched / 8) * (1 - touched / 8))
    assert StageModel(m, stage, 2, 4, 4, 4, ep=2).streamed_products(2) == pytest.approx(4 * (2 + 2 * busiest), rel=1e-3)
    # TP8: attention 393 KB and expert slices 885 KB per rank: nothing streams
    assert StageModel(m, stage, 8, 4, 4, 4).streamed_products(2) == 0


def test_imbalance_is_the_busiest_ranks_share_under_uniform_routing():
    assert imbalance(1000, 1) == 1.0
    mean = 8000 / 8
    z8 = 1.4236  # the expected largest of 8 standard normals (tables); Blom's formula gives 1.434
    assert imbalance(8000, 8) == pytest.approx((mean + z8 * math.sqrt(mean * 7 / 8)) / mean, rel=1e-3)
    assert imbalance(0.01, 8) == 8.0  # capped: the busiest rank gets at most everything
    assert imbalance(10**6, 8) < imbalance(10**3, 8) < imbalance(10**3, 64)


def test_alltoall_by_hand_on_nvlink_and_across_nodes():
    topo, device = topology(HGX_NV18, "h200")
    cal = Calibration()
    pricer = LinkPricer(topo, cal, device.nic_gbps)
    gpus = [g.id for g in topo.gpus]
    nv = pricer.group_bottleneck(Ring.of([(0, g) for g in gpus]))
    assert nv.code == "NV18"
    one_node = pricer.alltoall_us(Ring.of([(0, g) for g in gpus]), 8e6)
    assert one_node == pytest.approx(cal.collective_base_us + 7 * nv.alpha_us + 7 / 8 * 8e6 / (nv.bandwidth_gbps * 1e3))
    two_nodes = Ring.of([(n, g) for n in (0, 1) for g in gpus])
    net = pricer.group_bottleneck(two_nodes)
    assert net.code == "NET"
    # each node's 8 ranks push 8 x S x 8/16 through its rails
    network = 8 * 8e6 * 8 / 16 / (net.bandwidth_gbps * 1e3)
    assert pricer.alltoall_us(two_nodes, 8e6) == pytest.approx(cal.collective_base_us + 15 * net.alpha_us + network)
    assert pricer.alltoall_us(Ring.of([(0, gpus[0])]), 8e6) == 0.0


def test_deepseek_v3_on_eight_h200_lists_ep_layouts_with_all_to_all_and_placement():
    work = Workload(32, 512, 128, "fp8")
    # at batch 32 per replica, not the largest each layout fits (the throughput objective's default search)
    entries = priced(HGX_NV18, "h200", "dsv3", work, objective="throughput", search_batch=False)
    ep8 = entries[Layout(1, 1, 8, 8)].cost
    assert ep8.fits and ep8.all_to_all_ms > 0
    assert ep8.reasons[0].startswith("EP8 inside an NVLink domain (NV18")
    assert "EP8 beats TP1-sharded experts for the MoE layers" in ep8.reasons[1]
    assert entries[Layout(8)].cost.all_to_all_ms == 0.0
    # the all-to-alls: 58 MoE layers x (dispatch + combine) of 32 tokens x top-8 x 7168 x 2 bytes per rank: fp8
    # weights keep bf16 activations (topoplan.dtypes: hidden states travel in the activation dtype), so the
    # tokens cross the all-to-all at 2 bytes per element, not the weights' 1
    topo, device = topology(HGX_NV18, "h200")
    pricer = LinkPricer(topo, Calibration(), device.nic_gbps)
    group = Ring.of([(0, g.id) for g in topo.gpus])
    skew = imbalance(32 * 8 * 8, 8)
    assert ep8.all_to_all_ms == pytest.approx(58 * 2 * pricer.alltoall_us(group, 32 * 8 * 7168 * 2 * skew) / 1e3)


def test_ep_wins_or_loses_for_the_reasons_given():
    """Batch 1 on one TP8 group: EP8's 116 small all-to-alls cost more than reading 1/8 of the touched experts saves."""
    entries = priced(HGX_NV18, "h200", "dsv3", Workload(1, 512, 128, "fp8"), tp=8, pp=1, dp=1)
    ep, tp = entries[Layout(8, 1, 1, 8)].cost, entries[Layout(8)].cost
    assert ep.decode_ms_per_token > tp.decode_ms_per_token
    assert f"EP8 loses to TP8-sharded experts for the MoE layers: decode {ep.decode_ms_per_token:.2f} vs " \
           f"{tp.decode_ms_per_token:.2f} ms/token" in ep.reasons[1]


def test_ep_across_nodes_is_priced_on_the_nic_rails():
    entries = priced(HGX_NV18, "h200", "dsv3", Workload(8, 512, 128, "fp8"), nodes=2, tp=8, pp=1, dp=2)
    cost = entries[Layout(8, 1, 2, 16)].cost
    assert cost.reasons[0].startswith("EP16 spans nodes (NET")
    inside = priced(HGX_NV18, "h200", "dsv3", Workload(8, 512, 128, "fp8"), tp=8, pp=1, dp=1)[Layout(8, 1, 1, 8)]
    assert cost.all_to_all_ms > inside.cost.all_to_all_ms


def test_placement_keeps_an_ep_group_on_nvlink_when_it_can():
    """NVLink pairs: pipelined replicas put each stage's EP pair on a pair, not the pipeline hand-offs."""
    topo, _ = topology(H100_NVL, "h100-nvl")
    placer = NodePlacer(topo)
    for layout, code in ((Layout(1, 4, 2, 2), "NV12"), (Layout(1, 4, 2), "SYS")):
        order = placer.local_order(layout)
        stage0 = RankGrid(Layout(1, 4, 2, 2)).ep_groups[0]
        assert topo.link(order[stage0[0]], order[stage0[1]]).code == code
    entry = priced(H100_NVL, "h100-nvl", "mixtral", Workload(4, 256, 64), tp=1, pp=4, dp=2)[Layout(1, 4, 2, 2)]
    assert entry.cost.reasons[0].startswith("EP2 inside an NVLink domain (NV12")


def test_cli_plan_deepseek_v3_fp8_h200_json_lists_ep_layouts(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", "--model", "deepseek-v3", "--topo", HGX_NV18,
                           "--gpu", "h200", "--dtype", "fp8", "--batch", "32", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    layouts = json.loads(done.stdout)["layouts"]
    ep = [entry for entry in layouts if entry["ep"] > 1]
    assert ep and all(entry["all_to_all_ms"] > 0 and entry["ep_groups"] for entry in ep)
    first = ep[0]
    assert sorted(r for group in first["ep_groups"] for r in group) == list(range(first["gpus"]))
    assert {p["gpu"] for p in first["placement"]} == {f"GPU{i}" for i in range(8)}


def test_launch_passes_the_layouts_ep_to_the_runner():
    from topoplan.launch.command import runner_command
    from topoplan.run_options import parse_argv

    argv = runner_command(Layout(2, 1, 1, 2), None, checkpoint="/ckpt/mixtral")
    assert argv[:3] == ["python3", "-m", "topoplan.runner"]
    assert parse_argv(argv[3:]).layout == Layout(2, 1, 1, 2)
    assert "--ep" not in runner_command(Layout(2), None, checkpoint="/ckpt/mixtral")


def test_alltoall_inside_a_multi_node_nvlink_domain_stays_on_nvlink():
    """GB200 NVL72 trays (4 GPUs each, 18 to a domain): an EP group over 2 trays is an NVLink all-to-all; over
    trays 17 and 18 it leaves the domain and pays the network."""
    from topoplan.machine import load_topology

    topo = load_topology(str(ROOT / "fixtures" / "nvml" / "gb200-nvl72-tray-4gpu.json"))
    pricer = LinkPricer(topo, Calibration(), nic_gbps=50.0, domain_gpus=72)
    gpus = [g.id for g in topo.gpus]
    inside = Ring.of([(n, g) for n in (0, 1) for g in gpus])
    across = Ring.of([(n, g) for n in (17, 18) for g in gpus])
    nv, net = pricer.group_bottleneck(inside), pricer.group_bottleneck(across)
    assert (nv.link_class, net.code) == ("nvlink", "NET")
    cal = Calibration()
    assert pricer.alltoall_us(inside, 8e6) == pytest.approx(
        cal.collective_base_us + 7 * nv.alpha_us + 7 / 8 * 8e6 / (nv.bandwidth_gbps * 1e3))
    assert pricer.alltoall_us(across, 8e6) > pricer.alltoall_us(inside, 8e6)


@pytest.mark.parametrize("args, message", [
    (["--model", "70b", "--ep", "2"], "ep=2: Llama-3.1-70B has no experts"),
    (["--model", "mixtral", "--ep", "3"], "ep=3 does not divide the 8 routed experts of Mixtral-8x7B"),
    (["--model", "mixtral", "--tp", "2", "--pp", "1", "--dp", "1", "--ep", "4"],
     "ep=4: expert parallelism runs over tp x dp = 2 ranks per stage"),
    (["--model", "mixtral", "--ep", "0"], "--ep must be >= 1, got 0"),
])
def test_plan_ep_bad_input_is_one_line(args, message, tmp_path):
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", *args, "--topo", HGX_NV18, "--gpu", "h200"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_launch_refuses_a_vllm_style_ep_layout_for_the_bundled_runner():
    from topoplan.errors import TopoplanError
    from topoplan.launch.command import LaunchRequest, runner_command

    with pytest.raises(TopoplanError, match=r"layout tp=1,pp=1,dp=8,ep=8: the bundled runner splits experts inside"):
        runner_command(Layout(1, 1, 8, 8), None, checkpoint="/ckpt")
    with pytest.raises(TopoplanError, match="ep=2: Llama-3.1-70B has no experts"):
        LaunchRequest(layout=Layout(2, 1, 1, 2), model="70b")


def test_throughput_search_prices_ep_layouts_at_their_own_batch_all_to_alls_included():
    """The throughput objective's batch search (expert-plan) on an EP layout (moe): no limit, so the largest batch
    that fits, and the all-to-alls priced at that batch; a TPOT limit stops the search below it."""
    work = Workload(1, 512, 128, "fp8")
    ep8 = priced(HGX_NV18, "h200", "dsv3", work, objective="throughput", tp=1, pp=1, dp=8)[Layout(1, 1, 8, 8)].cost
    assert ep8.fits and ep8.batch == ep8.max_batch > 32
    topo, device = topology(HGX_NV18, "h200")
    pricer = LinkPricer(topo, Calibration(), device.nic_gbps)
    group = Ring.of([(0, g.id) for g in topo.gpus])
    b = ep8.batch  # each rank dispatches its replica's b tokens x top-8 x 7168 x 2 bytes (bf16 activations)
    sent = b * 8 * 7168 * 2 * imbalance(b * 64, 8)  # the busiest rank's share: b x 8 replicas x top-8 pairs
    assert ep8.all_to_all_ms == pytest.approx(58 * 2 * pricer.alltoall_us(group, sent) / 1e3)
    limited = priced(HGX_NV18, "h200", "dsv3", work, objective="throughput", tp=1, pp=1, dp=8,
                     limits=Limits(tpot_ms=ep8.decode_ms_per_token / 2))[Layout(1, 1, 8, 8)].cost
    assert 1 <= limited.batch < ep8.batch and not limited.slo_miss
    assert limited.decode_ms_per_token <= ep8.decode_ms_per_token / 2


def test_each_moe_layer_pays_the_runners_routing_and_per_expert_overheads():
    """Mixtral (32 MoE layers, top-2) decoding one token at TP1: exactly its 2 experts run in each layer, so the
    step pays 32 x (moe_layer_overhead_us + 2 x expert_overhead_us) more; dense Llama layers pay nothing."""
    def decode_ms(model: str, **overheads: float) -> float:
        return priced(HGX_NV18, "h200", model, Workload(1, 128, 16), calibration=Calibration(**overheads),
                      tp=1, pp=1, dp=1)[Layout()].cost.decode_ms_per_token

    base = decode_ms("mixtral")
    assert decode_ms("mixtral", moe_layer_overhead_us=100.0, expert_overhead_us=25.0) - base == pytest.approx(
        32 * (100 + 2 * 25) / 1e3, rel=1e-9)
    assert decode_ms("70b", moe_layer_overhead_us=100.0, expert_overhead_us=25.0) == decode_ms("70b")


def test_routed_experts_are_priced_at_their_own_rows():
    """A prefill of 64 x 8 tokens sends each of Mixtral's 8 experts 64 x 8 x 2 / 8 = 128 rows: on a device whose
    FLOP rate depends on the rows (a CPU's probe curve) the experts' products run at the 128-row rate, the rest
    at the 512-row rate; the routed work is its own roofline term (memory-bound experts beside compute-bound
    attention projections)."""
    m = find_model("mixtral")
    (stage,) = stages_of(m, 1)
    dense, routed, _attention = StageModel(m, stage, 1, 2, 2, 2).prefill(64, 8)
    assert (dense.rows, routed.rows) == (512, pytest.approx(128, rel=1e-6))
    assert routed.flops == pytest.approx(2 * m.expert_params * 32 * 512 * 2)
    flat = DeviceSpec("cpu", 8e11, 100.0, {"bf16": 4.0}, 1.0)
    curve = DeviceSpec("cpu", 8e11, 100.0, {"bf16": 4.0}, 1.0, tflops_by_rows=((1, 0.25), (128, 1.0), (512, 4.0)))
    assert [curve.tflops_at("bf16", rows) for rows in (512, 128, None)] == [4.0, 1.0, 4.0]  # None: `tflops`
    assert curve.tflops_at("bf16", 256) == pytest.approx(2.5)  # halfway in log2(rows) between 128 and 512
    assert curve.tflops_at("bf16", 4096) == 4.0 and curve.tflops_at("bf16", 0.5) == 0.25  # the ends beyond them

    def prefill_ms(device: DeviceSpec) -> float:
        cal = Calibration(flop_efficiency=1.0, memory_bandwidth_efficiency=1.0, layer_overhead_us=0.0)
        model = CostModel(m, device, Workload(64, 8, 1), cal, LinkPricer(read_topology(HGX_NV18), cal, 1.0))
        return model._roofline_ms([dense, routed])

    # the experts' FLOPs at 1 TFLOP/s instead of 4: 3/4 of their time at the flat rate more
    extra = routed.flops / 1e12 * (1 - 1 / 4) * 1e3
    assert prefill_ms(curve) - prefill_ms(flat) == pytest.approx(extra, rel=1e-6)
