"""`plan --estimator aiconfigurator` (topoplan.plan.aic_estimator): compute from aiconfigurator's kernel data,
links from topoplan, the built-in figures beside it; and the plan without the optional extra.

The tests that need the package run where it is installed; CI installs it (.ci/run sets TOPOPLAN_CI_EXTRAS,
which turns a missing package into a failure here rather than a skip). The no-extra path is checked by hiding
the package from a fresh interpreter, so it runs with or without the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.engines import resolve
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.models import find_model
from topoplan.plan import aic_estimator
from topoplan.plan.aic_estimator import pick_version
from topoplan.plan.cost import StageModel, Workload, stages_of
from topoplan.plan.frontend import PlanRequest, plan_for

ROOT = Path(__file__).resolve().parent.parent
H100 = str(ROOT / "fixtures" / "nvml" / "hgx-h100-8gpu-nvswitch.json")  # 8 x H100 SXM on NVSwitch
H200 = str(ROOT / "fixtures" / "topo" / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt")
PIX4 = str(ROOT / "fixtures" / "topo" / "11_rtx2080ti-4gpu-all-pix.txt")  # 4 GPUs on PCIe switches only
HIDDEN = "import sys; sys.modules['aiconfigurator_core'] = None; from topoplan.cli import main; main()"


@pytest.fixture(scope="module")
def aic():
    """The package, or a skip where it is not installed (a failure under CI, which installs it)."""
    if os.environ.get("TOPOPLAN_CI_EXTRAS"):
        return importlib.import_module("aiconfigurator_core")
    return pytest.importorskip("aiconfigurator_core")


def run_cli(*args: str, hide: bool = False, columns: int = 200) -> subprocess.CompletedProcess:
    code = HIDDEN if hide else "from topoplan.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def theirs(system: str, backend: str, version: str, tp: int, hf_id: str):
    """aiconfigurator's own engine for its bundled config of the model (not topoplan's config.json of it)."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    return EngineHandle.compile(hf_id, system, backend, backend_version=version, tp_size=tp, moe_tp_size=tp,
                                moe_ep_size=1)


# --- without the extra ---------------------------------------------------------------------------------------

def test_without_the_extra_the_estimator_is_refused_in_one_line():
    done = run_cli("plan", "--model", "70b", "--topo", H100, "--engine", "vllm", "--estimator", "aiconfigurator",
                   hide=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "topoplan: error: --estimator aiconfigurator needs the optional extra: pip install 'topoplan[aiconfigurator]'"]


def test_without_the_extra_a_builtin_plan_notes_where_it_would_apply():
    done = run_cli("plan", "--model", "70b", "--topo", H100, "--engine", "vllm", "--top", "1", "--json", hide=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["estimator"] == "builtin" and "estimates" not in plan["layouts"][0]
    assert [w for w in plan["warnings"] if "aiconfigurator" in w] == [
        "aiconfigurator has measured kernel times for vllm on h100-sxm: pip install 'topoplan[aiconfigurator]' and "
        "pass --estimator aiconfigurator to use them (links stay topoplan's)"]
    # the bundled runner is no engine aiconfigurator measured: no note
    done = run_cli("plan", "--model", "70b", "--topo", H100, "--top", "1", "--json", hide=True)
    assert not [w for w in json.loads(done.stdout)["warnings"] if "aiconfigurator" in w]


def test_a_builtin_plan_never_imports_the_package():
    code = ("import sys; from topoplan.plan.frontend import PlanRequest, plan_for; "
            f"plan_for(PlanRequest(model='70b', topo={H100!r}, engine='vllm')); "
            "print('aiconfigurator_core' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == "False", done.stderr


def test_an_unknown_estimator_is_refused():
    with pytest.raises(TopoplanError, match="--estimator 'fast': expected one of builtin, aiconfigurator"):
        PlanRequest(model="70b", estimator="fast")


# --- which data it takes --------------------------------------------------------------------------------------

def test_the_engine_version_maps_to_the_nearest_complete_collection():
    slots = {"current": "0.24.0", "next": "0.27.0"}  # `next` is a partial drop: never chosen
    assert pick_version(slots, resolve("vllm")) == "0.24.0"  # vllm@0.32: the newest not newer
    assert pick_version(slots, resolve("vllm@0.12")) == "0.24.0"  # older than any: the oldest there is
    assert pick_version({"current": "0.26.0", "previous": "0.20.0"}, resolve("vllm@0.22")) == "0.20.0"
    assert pick_version({"current": "0.26.0", "previous": "0.20.0"}, resolve("vllm@0.30")) == "0.26.0"
    assert pick_version({"current": "1.0.0"}, resolve("trtllm")) == "1.0.0"
    with pytest.raises(TopoplanError, match="no complete vllm collection"):
        pick_version({"next": "0.27.0"}, resolve("vllm"))


def test_the_static_coverage_table_matches_the_installed_package(aic):
    from aiconfigurator_core.sdk.perf_database import get_version_slots

    for system in aic_estimator.SYSTEMS.values():
        for backend in aic_estimator.BACKENDS:
            assert (get_version_slots(system, backend) or {}).get("current"), (system, backend)


def test_uncovered_gpus_models_and_degrees_are_refused_in_one_line(aic):
    with pytest.raises(TopoplanError, match="no aiconfigurator kernel data for vllm on a100-sxm4-40gb"):
        aic_estimator.load(find_model("70b"), "a100-sxm4-40gb", resolve("vllm"), "bf16", "bf16")
    with pytest.raises(TopoplanError, match="no aiconfigurator kernel data for topoplan on h100-sxm"):
        aic_estimator.load(find_model("70b"), "h100-sxm", resolve("topoplan"), "bf16", "bf16")
    with pytest.raises(TopoplanError, match="DeepSeek-V3 is neither"):
        aic_estimator.load(find_model("DeepSeek-V3"), "h200", resolve("vllm"), "bf16", "bf16")
    with pytest.raises(TopoplanError, match="--ep 8 needs the built-in estimator"):
        plan_for(PlanRequest(model="Mixtral-8x7B", topo=H100, engine="vllm", ep=8, estimator="aiconfigurator"))
    done = run_cli("plan", "--model", "70b", "--topo", H100, "--engine", "vllm", "--dtype", "int4", "--estimator",
                   "aiconfigurator")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith(
        "topoplan: error: aiconfigurator cannot price this plan at TP") and "int4_wo" in done.stderr
    moe = plan_for(PlanRequest(model="Mixtral-8x7B", topo=H100, engine="vllm", estimator="aiconfigurator"))
    assert {row.cost.layout.ep for row in moe.layouts + moe.hidden} == {1}
    assert "--estimator aiconfigurator prices MoE experts TP-sharded: no expert-parallel layouts (the built-in " \
           "estimator prices both)" in moe.warnings


# --- compute from aiconfigurator --------------------------------------------------------------------------------

def test_per_op_times_are_aiconfigurators_own(aic):
    """Llama-3.1-70B at TP4 on h100_sxm, vLLM 0.24.0 data: topoplan's config.json of it compiles to the same ops
    as aiconfigurator's bundled config, each op the same time; the QKV GEMM (n = (64 + 2 x 8) x 128 / 4 = 2560,
    k = 8192) is a memory-bound read of 2560 x 8192 x 2 B = 41.9 MB per layer: no faster than 3.35 TB/s."""
    model = find_model("Llama-3.1-70B")
    kernels = aic_estimator.load(model, "h100-sxm", resolve("vllm"), "bf16", "bf16")
    assert (kernels.system, kernels.backend, kernels.version) == ("h100_sxm", "vllm", "0.24.0")
    ours, _, gen = kernels._ops(4)
    own = theirs("h100_sxm", "vllm", "0.24.0", 4, "meta-llama/Meta-Llama-3.1-70B")
    # aiconfigurator's decode step reads 1024 + 128 / 2 + 1 tokens of KV (topoplan's served model asks for
    # prompt + gen / 2: one token fewer), so the comparison asks for its 1089
    reference = {name: ms for name, ms, *_ in own.decode_step_per_op(32, 1024, 128)}
    mine = {name: ms for name, ms, *_ in ours.evaluate_generation_ops(list(range(len(reference))), batch_size=32,
                                                                       s=1089)}
    for op in ("generation_qkv_gemm", "generation_attention", "generation_proj_gemm", "generation_gate_ffn1_gemm",
               "generation_ffn2_gemm", "generation_logits_gemm", "generation_add_norm_1"):
        assert mine[op] == pytest.approx(reference[op], rel=1e-9), op
    qkv_per_layer_us = reference["generation_qkv_gemm"] / 80 * 1e3
    assert 41.9e6 / 3.35e12 * 1e6 < qkv_per_layer_us < 3 * 41.9e6 / 3.35e12 * 1e6

    # a whole-model stage's decode step is the sum of the compute ops, the links (all-reduces, P2P) left out
    whole = StageModel(model, stages_of(model, 1)[0], 4, 2, 2, 2)
    compute = sum(ms for name, ms in reference.items() if "_ar" not in name and "p2p" not in name)
    assert kernels.decode_ms(whole, 32, 1089) == pytest.approx(compute, rel=1e-9)
    # two stages share the layers, the embedding on the first and the LM head on the last: the same sum
    first, last = (StageModel(model, s, 4, 2, 2, 2) for s in stages_of(model, 2))
    assert kernels.decode_ms(first, 32, 1089) + kernels.decode_ms(last, 32, 1089) == pytest.approx(compute)
    assert kernels.decode_ms(last, 32, 1089) - kernels.decode_ms(first, 32, 1089) == pytest.approx(
        reference["generation_logits_gemm"] - reference["generation_embedding"])
    # a prefill of 2 prompts of 1024 tokens: aiconfigurator's static context phase, links left out
    ctx, _ = own.run_static_per_op(batch_size=2, beam_width=1, isl=1024, osl=2, prefix=0,
                                   seq_imbalance_correction_scale=1.0, gen_seq_imbalance_correction_scale=1.0)
    assert kernels.prefill_ms(whole, 2, 1024) == pytest.approx(
        sum(ms for name, ms, *_ in ctx if "_ar" not in name and "p2p" not in name), rel=1e-9)
    assert len(gen.layer) + len(gen.attention) + len(gen.embedding) + len(gen.head) == 10  # of 14: 3 AR, 1 P2P


@pytest.mark.parametrize(("model", "hf_id", "gpu", "engine", "tp"), [
    ("Qwen3-32B", "Qwen/Qwen3-32B", "h100-sxm", "sglang", 2),  # QK norm: written as Qwen3ForCausalLM
    ("Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B", "h200", "trtllm", 1),
    ("Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", "h200", "vllm", 8),  # MoE in every layer: Qwen3MoeForCausalLM
])
def test_topoplans_config_of_a_model_prices_like_aiconfigurators_own(aic, model, hf_id, gpu, engine, tp):
    """The config.json topoplan writes for a model (hf_config) gives every compute op the time aiconfigurator's
    bundled config of it does, in both phases."""
    from tests.engine_cases import model_of

    kernels = aic_estimator.load(model_of(model), gpu, resolve(engine), "bf16", "bf16")
    ours = kernels._ops(tp)[0]
    own = theirs(kernels.system, engine, kernels.version, tp, hf_id)
    decode = {name: ms for name, ms, *_ in own.decode_step_per_op(16, 2048, 256)}
    mine = dict(v[:2] for v in ours.evaluate_generation_ops(list(range(len(decode))), batch_size=16, s=2177))
    assert mine == pytest.approx(decode, rel=1e-9)
    ctx, _ = own.run_static_per_op(batch_size=3, beam_width=1, isl=2048, osl=2, prefix=0,
                                   seq_imbalance_correction_scale=1.0, gen_seq_imbalance_correction_scale=1.0)
    mine = dict(v[:2] for v in ours.evaluate_context_ops(list(range(len(ctx))), batch_size=3, s=2048))
    assert mine == pytest.approx({name: ms for name, ms, *_ in ctx}, rel=1e-9)


def test_fractional_batches_interpolate_between_whole_ones(aic):
    model = find_model("Llama-3.1-8B")
    kernels = aic_estimator.load(model, "h200", resolve("vllm"), "bf16", "bf16")
    stage = StageModel(model, stages_of(model, 1)[0], 1, 2, 2, 2)
    four, five = kernels.decode_ms(stage, 4, 600), kernels.decode_ms(stage, 5, 600)
    assert kernels.decode_ms(stage, 4.25, 600) == pytest.approx(four + (five - four) / 4)


# --- links from topoplan ------------------------------------------------------------------------------------------

def test_all_reduces_are_topoplans_on_the_real_links(aic):
    """Four H100s on PCIe switches (no NVLink): the decode step's all-reduces are topoplan's ring over PCIe, not
    aiconfigurator's NVLink custom all-reduce, which is several times faster."""
    result = plan_for(PlanRequest(model="Llama-3.1-70B", topo=PIX4, gpu="h100-sxm", engine="vllm", tp=4, pp=1,
                                  dp=1, workload=Workload(8, 1024, 128), estimator="aiconfigurator"))
    steps = result.layouts[0].cost.steps
    costs, ring, stage = steps.costs, steps.rings[0], steps.models[0]
    model, pricer = costs.model, costs.pricer
    links_ms = ((2 * 80 + 1) * pricer.allreduce_us(ring, 8 * model.hidden * 2)
                + pricer.allgather_us(ring, 8 * model.vocab * 2)) / 1e3
    extra_ms = (costs.cal.step_overhead_us + 3 * costs.cal.step_overhead_per_rank_us
                + 8 * costs.cal.sequence_overhead_us) / 1e3  # topoplan's per-step and per-sequence costs
    assert steps.step_ms(8) == pytest.approx(costs.kernels.decode_ms(stage, 8, 1088) + links_ms + extra_ms)
    own = theirs("h100_sxm", "vllm", "0.24.0", 4, "meta-llama/Meta-Llama-3.1-70B")
    nvlink_ms = sum(ms for name, ms, *_ in own.decode_step_per_op(8, 1024, 128) if "_ar" in name)
    assert links_ms > 3 * nvlink_ms
    on_nvswitch = plan_for(PlanRequest(model="Llama-3.1-70B", topo=H100, engine="vllm", tp=4, pp=1, dp=2,
                                       workload=Workload(8, 1024, 128), estimator="aiconfigurator"))
    assert on_nvswitch.layouts[0].cost.steps.step_ms(8) < steps.step_ms(8) - 0.5 * links_ms


# --- the plan: both estimates, and agreement with aiconfigurator's own in-flight estimate --------------------------

def test_plan_carries_both_estimates_in_json_and_table(aic):
    done = run_cli("plan", "--model", "70b", "--topo", H200, "--gpu", "h200", "--engine", "vllm", "--estimator",
                   "aiconfigurator", "--top", "2", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["estimator"]["version"] == "0.24.0" and plan["estimator"]["for_engine"] == "vllm@0.32"
    assert not [w for w in plan["warnings"] if "aiconfigurator" in w]
    for row in plan["layouts"]:
        assert set(row["estimates"]) == {"builtin", "aiconfigurator"}
        assert row["estimates"]["aiconfigurator"] == row["served"]  # it ranks by the estimator asked for
        assert row["estimates"]["builtin"]["concurrency_per_replica"] == row["served"]["concurrency_per_replica"]
        assert row["estimates"]["builtin"]["tpot_ms"] != row["served"]["tpot_ms"]
        assert any(r.startswith("kernels: aiconfigurator-core ") and "h200_sxm vllm 0.24.0" in r
                   for r in row["reasons"])
    table = run_cli("plan", "--model", "70b", "--topo", H200, "--gpu", "h200", "--engine", "vllm", "--estimator",
                    "aiconfigurator", "--top", "1", columns=400)  # wide enough for every column
    assert "built-in TTFT" in table.stdout and "kernels from aiconfigurator" in table.stdout
    first = plan["layouts"][0]
    label = f"tp{first['tp']} pp{first['pp']} dp{first['dp']}"
    row = next(line for line in table.stdout.splitlines() if label in line)
    assert f"{first['estimates']['builtin']['tpot_ms']:.2f}" in row and f"{first['served']['tpot_ms']:.2f}" in row
    narrow = run_cli("plan", "--model", "70b", "--topo", H200, "--gpu", "h200", "--engine", "vllm", "--estimator",
                     "aiconfigurator", "--top", "1", columns=80)
    builtin = first["estimates"]["builtin"]
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80  # the built-in figures go under the row
    assert (f"built-in: TTFT {builtin['ttft_ms']:.1f} ms, TPOT {builtin['tpot_ms']:.2f} ms, "
            f"{builtin['output_tokens_per_s_per_gpu']:.1f} tok/s/GPU") in narrow.stdout


@pytest.mark.parametrize(("engine", "version", "model", "hf_id", "tp", "batch"), [
    ("vllm", "0.24.0", "Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", 4, 8),
    ("trtllm", "1.3.0rc20", "Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B", 1, 1),
])
def test_served_figures_agree_with_aiconfigurators_agg_estimate(aic, engine, version, model, hf_id, tp, batch):
    """aiconfigurator's in-flight ("agg") estimate on h200_sxm, prompt 1024, 128 out: TPOT and delivered tokens/s
    per GPU within 10%. TTFT is not: its agg model multiplies the prefill by a queueing factor (TensorRT-LLM:
    1.9 at one request) and adds vLLM 0.8 ms of dispatch per layer; topoplan's served model has neither
    (docs/planner.md, the estimator section)."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database_view

    agg = get_backend(engine).run_agg(get_model(hf_id, ModelConfig(tp_size=tp), engine),
                                      get_database_view("h200_sxm", engine, version),
                                      RuntimeConfig(batch_size=batch, isl=1024, osl=128), ctx_tokens=1024)
    agg = agg.get_result_dict()
    result = plan_for(PlanRequest(model=model, topo=H200, gpu="h200", engine=engine, tp=tp, pp=1, dp=1,
                                  workload=Workload(batch, 1024, 128), estimator="aiconfigurator"))
    served = result.layouts[0].cost.served
    assert served.replica.tpot_ms == pytest.approx(agg["tpot"], rel=0.10)
    assert served.replica.output_tokens_per_s / tp == pytest.approx(agg["tokens/s/gpu"], rel=0.10)


def test_disagg_workers_are_priced_by_the_estimator_asked_for(aic):
    """`plan --disagg --estimator aiconfigurator` compares its deployment with the aggregated layouts aiconfigurator
    priced, so its workers' kernels are aiconfigurator's too: the same 1P:1D of TP4 workers serves another TPOT
    than under the built-in estimator (they were equal: the workers were priced built-in), and a MoE model's
    workers keep experts TP-sharded (ep 1), the only split that estimator prices."""
    from topoplan.plan.disagg import disagg_for

    fixed = dict(model="70b", topo=H200, gpu="h200", engine="vllm", tp=4, pp=1)
    builtin = disagg_for(PlanRequest(**fixed), (1, 1)).chosen
    priced = disagg_for(PlanRequest(**fixed, estimator="aiconfigurator"), (1, 1)).chosen
    assert [w.layout for w in priced.workers] == [Layout(tp=4), Layout(tp=4)] == [w.layout for w in builtin.workers]
    assert priced.served.tpot_ms != pytest.approx(builtin.served.tpot_ms, rel=0.01)
    moe = disagg_for(PlanRequest(model="mixtral", topo=H200, gpu="h200", engine="vllm",
                                 estimator="aiconfigurator")).chosen
    assert all(w.layout.ep == 1 for w in moe.workers)
