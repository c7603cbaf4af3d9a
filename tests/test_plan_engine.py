"""`topoplan plan --engine NAME`: the JSON contract (today's fields plus `engine`), what each profile changes
(all-reduce kernel, memory policy, layout rules, per-step overhead) checked by hand, and bad names -> one
line, exit 2."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.test_plan_cli import DGX_A100, H100_NVL, topoplan
from topoplan.engines import resolve
from topoplan.errors import TopoplanError
from topoplan.hardware import find_gpu
from topoplan.models import find_model
from topoplan.plan.calibration import Calibration
from topoplan.plan.calibration_file import load_calibration
from topoplan.plan.collectives import LinkPricer, Ring
from topoplan.plan.cost import Workload
from topoplan.plan.device import DeviceSpec
from topoplan.plan.engine_costs import engine_calibration, memory_policy
from topoplan.plan.frontend import PlanRequest
from topoplan.plan.rank import plan
from topoplan.topology.read import read_topology

A100 = ("--topo", DGX_A100, "--gpu", "a100-80gb")


def plan_json(*extra):
    run = topoplan("plan", "-m", "llama-2-70b", *A100, "--prompt-len", "2048", "--dtype", "fp16", "--json",
                   "--top", "0", *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_json_keeps_every_field_and_adds_engine():
    default, vllm = plan_json(), plan_json("--engine", "vllm")
    assert default["engine"] == "topoplan@0.1" and vllm["engine"] == "vllm@0.32"
    assert set(vllm) == set(default) and set(default) - {"engine"} == {  # "limits": --max-ttft-ms/--max-tpot-ms
        "model", "topology", "workload", "objective", "limits", "calibration", "warnings", "layouts", "hidden",
        "serving", "request", "estimator"}  # "serving": the engine's scheduler and budget
    # (topoplan.engines.scheduling); "request": what priced the plan, for `launch --plan FILE` (topoplan.plan.saved);
    # "estimator": whose kernel times ("builtin", or what --estimator aiconfigurator used)
    assert set(vllm["layouts"][0]) == set(default["layouts"][0])
    assert plan_json("--engine", "topoplan") == default  # the default engine is the bundled runner's profile


def test_the_table_names_the_engine():
    run = topoplan("plan", "-m", "70b", *A100, "--engine", "sglang")
    assert run.returncode == 0 and "ranked by latency for sglang@0.5" in run.stdout


def test_unknown_engine_or_version_is_one_line_exit_2():
    for name, words in (("vllm@0.5", "no vllm profile for version '0.5'"), ("tgi", "unknown engine 'tgi'")):
        run = topoplan("plan", "-m", "70b", *A100, "--engine", name)
        assert run.returncode == 2 and words in run.stderr and run.stderr.count("\n") == 1, run.stderr
    with pytest.raises(TopoplanError, match="no sglang profile"):
        PlanRequest(model="70b", engine="sglang@0.1")  # checked before any file is read


def test_engine_without_pipeline_parallelism_refuses_pp_and_plans_pp1_only():
    run = topoplan("plan", "-m", "70b", *A100, "--engine", "vllm@0.2", "--pp", "2")
    assert run.returncode == 2 and "vllm@0.2 does not run pipeline parallelism" in run.stderr
    out = plan_json("--engine", "vllm@0.2")
    assert {e["pp"] for e in out["layouts"] + out["hidden"]} == {1}
    assert len({e["pp"] for e in plan_json("--engine", "vllm")["layouts"]}) > 1


def _pricer(engine: str) -> tuple[LinkPricer, Ring]:
    gpu = find_gpu("a100-sxm4-80gb")
    topo = read_topology(DGX_A100).with_arch(gpu.arch, gpu.key)
    profile = resolve(engine)
    cal = engine_calibration(profile)
    return LinkPricer(topo, cal, 25.0, allreduce=profile.allreduce), Ring.of([(0, f"GPU{i}") for i in range(8)])


def test_allreduce_path_by_hand():
    """16 KiB on 8 NVLink-meshed A100s. vLLM: one-shot, 5 us + 7 x 16384 B / (240 GB/s x 0.8: the link table's
    NV12); the bundled runner: the NCCL ring, 25 us + 14 x 3 us + 14/8 x 16384 B / 192 GB/s."""
    pricer, ring = _pricer("vllm")
    assert pricer.allreduce_kernel(ring, 16384) == "one-shot"
    assert pricer.allreduce_us(ring, 16384) == pytest.approx(5.0 + 7 * 16384 / 192e3)
    assert pricer.allreduce_kernel(ring, 1 << 20) == "two-shot"  # >= 256 KiB at 8 GPUs
    assert pricer.allreduce_us(ring, 1 << 20) == pytest.approx(10.0 + 2 * 7 / 8 * (1 << 20) / 192e3)
    assert pricer.allreduce_kernel(ring, 32 << 20) == "nccl"  # above the 8 MiB buffer
    runner, _ = _pricer("topoplan")
    assert runner.allreduce_kernel(ring, 16384) == "nccl"
    assert runner.allreduce_us(ring, 16384) == pytest.approx(25.0 + 14 * 3.0 + 14 / 8 * 16384 / 192e3)
    old, _ = _pricer("vllm@0.2")  # no custom all-reduce before 0.3.0: NCCL, at the eager launch cost
    assert old.allreduce_kernel(ring, 16384) == "nccl"
    assert old.allreduce_us(ring, 16384) == pytest.approx(45.0 + 14 * 3.0 + 14 / 8 * 16384 / 192e3)


def _cost(engine: str, tp: int = 4, batch: int = 1, calibration: Calibration | None = None):
    gpu = find_gpu("a100-sxm4-80gb")
    topo = read_topology(DGX_A100).with_arch(gpu.arch, gpu.key)
    return plan(topo, find_model("llama-2-70b"), DeviceSpec.from_gpu(gpu), Workload(batch, 2048, 128, "fp16"),
                tp=tp, pp=1, dp=1, engine=resolve(engine), calibration=calibration).layouts[0].cost


def test_memory_policy_by_hand():
    """Llama-2-70B fp16 at TP4 on an A100 80GB: 68.98e9 x 2 / 4 bytes of weights per GPU (vocab-parallel head
    included). The catalog gives the GPU's memory in MiB (81920 MiB = 80 x 2**30 bytes, what NVML reports), so
    the policies' fractions apply to 85.9e9 bytes, not total."""
    total = 80 * 2**30
    weights = find_model("llama-2-70b").params * 2 / 4
    kv_token = 2 * 2 * 128 * 80 * 2  # K and V, 2 of 8 KV heads per rank, head 128, 80 layers, 2 bytes
    vllm, trt, runner = _cost("vllm"), _cost("trtllm"), _cost("topoplan")
    assert vllm.usable_memory == pytest.approx(0.9 * total - 3.76e9)
    assert trt.usable_memory == pytest.approx(weights + 0.9 * (total - weights - 3.76e9), rel=1e-6)
    assert runner.usable_memory == pytest.approx(0.9 * total)
    # vLLM rounds a 2176-token sequence to 136 blocks of 16; the runner keeps exactly 2176 tokens
    assert vllm.memory_per_gpu - runner.memory_per_gpu == pytest.approx(0, abs=1)  # 2176 = 136 x 16
    assert vllm.max_batch == int((0.9 * total - 3.76e9 - weights) // (2176 * kv_token))
    sglang = _cost("sglang", tp=8)  # mem_fraction_static 0.81 at tp 8
    assert sglang.usable_memory == pytest.approx(0.81 * total)


def test_a_calibration_reserve_overrides_the_engine_fraction():
    profile = resolve("sglang")
    cal = engine_calibration(profile)
    assert memory_policy(profile, cal).fraction_for(8) == 0.81  # the engine's own table
    measured = memory_policy(profile, Calibration(runtime_reserve=0.25))
    assert measured.fraction_for(8) == 0.75 and measured.fraction_for(1) == 0.75


def test_step_overheads_and_cuda_graphs_change_decode_as_the_profile_says():
    """Same layout, only the per-step and per-layer constants differ: the difference is theirs alone."""
    base = engine_calibration(resolve("vllm"))
    no_step = _cost("vllm", calibration=replace(base, step_overhead_us=0.0))
    with_step = _cost("vllm", calibration=base)
    assert with_step.decode_ms_per_token - no_step.decode_ms_per_token == pytest.approx(
        resolve("vllm").overheads.step_overhead_us / 1e3)
    eager = replace(base, decode_layer_overhead_us=None)  # decode at the prefill overhead
    assert _cost("vllm", calibration=eager).decode_ms_per_token - with_step.decode_ms_per_token == pytest.approx(
        80 * (base.layer_overhead_us - base.decode_layer_overhead_us) / 1e3)
    per_rank = replace(base, step_overhead_per_rank_us=100.0)
    assert _cost("vllm", calibration=per_rank).decode_ms_per_token - with_step.decode_ms_per_token == pytest.approx(
        3 * 0.1)  # TP4: three ranks beyond the first
    # the per-sequence overhead: vLLM V1's 43 us for each sequence in a step, on top of the rest
    assert base.sequence_overhead_us == 43.0
    bare = replace(base, sequence_overhead_us=0.0)
    for batch in (1, 16):
        assert (_cost("vllm", batch=batch, calibration=base).decode_ms_per_token
                - _cost("vllm", batch=batch, calibration=bare).decode_ms_per_token) == pytest.approx(batch * 0.043)


def test_newer_vllm_is_faster_than_2023_vllm_and_says_why():
    old, new = plan_json("--engine", "vllm@0.2", "--tp", "8", "--pp", "1", "--dp", "1"), plan_json(
        "--engine", "vllm", "--tp", "8", "--pp", "1", "--dp", "1")
    assert old["layouts"][0]["decode_ms_per_token"] > 1.5 * new["layouts"][0]["decode_ms_per_token"]
    assert any("one-shot kernel" in r for r in new["layouts"][0]["reasons"])
    assert any("would cut the all-reduce latency" in r for r in old["layouts"][0]["reasons"])


def test_h100_nvl_pairs_are_no_full_mesh_beyond_two():
    """H100 NVL boards bridge GPUs in pairs: a TP4 group has no full NVLink mesh, so vLLM falls back to NCCL."""
    out = json.loads(topoplan("plan", "-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--engine", "vllm",
                              "--tp", "4", "--pp", "1", "--dp", "2", "--json").stdout)
    reasons = " ".join(out["layouts"][0]["reasons"])
    assert "one-shot" not in reasons and "NVLink full mesh" not in reasons


def test_a_calibration_files_engine_entry_applies_to_that_engine_only(tmp_path):
    """`calibrate --engine vllm` writes `engines.vllm` (topoplan.bench.vllm_cpu); `plan --engine vllm` lays it
    over the file's own keys, other engines ignore it."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"layer_overhead_us": 40.0, "engines": {"vllm": {
        "decode_layer_overhead_us": 1.0, "step_overhead_us": 500.0, "device": "cpu", "fit_rows": []}}}))
    vllm = load_calibration(path, engine_calibration(resolve("vllm")), "vllm")
    assert (vllm.layer_overhead_us, vllm.decode_layer_overhead_us, vllm.step_overhead_us) == (40.0, 1.0, 500.0)
    sglang = load_calibration(path, engine_calibration(resolve("sglang")), "sglang")
    assert (sglang.layer_overhead_us, sglang.decode_layer_overhead_us, sglang.step_overhead_us) == (40.0, 53.0, 0.0)
    runner = load_calibration(path)
    assert (runner.layer_overhead_us, runner.decode_layer_overhead_us, runner.step_overhead_us) == (40.0, None, 0.0)
    path.write_text(json.dumps({"engines": {"vllm": {"step_overhead_us": -1}}}))
    with pytest.raises(TopoplanError, match="engines.vllm.step_overhead_us: expected a non-negative number"):
        load_calibration(path, engine="vllm")
    run = topoplan("plan", "-m", "70b", *A100, "--engine", "vllm", "--calibration", str(path))
    assert run.returncode == 2 and "engines.vllm.step_overhead_us" in run.stderr and run.stderr.count("\n") == 1


def test_cpu_plans_refuse_a_serving_engine():
    """`plan --device cpu` ranks the bundled runner's CPU processes; a serving engine's profile is for GPUs."""
    run = topoplan("plan", "-m", "small", "--device", "cpu", "--engine", "vllm")
    assert run.returncode == 2 and "--engine vllm" in run.stderr and run.stderr.count("\n") == 1, run.stderr
