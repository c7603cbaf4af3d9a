"""`topoplan plan --device cpu`: CPU-process layouts of this machine, priced from a calibration's `cpu` entry
without any topology file (a CPU machine has no `nvidia-smi topo -m` to give)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.cpuset import cpu_cores
from topoplan.models import find_model
from topoplan.plan.calibration_file import parse_cpu_entry
from topoplan.plan.cpu_entry import layer_overhead_us

ROOT = Path(__file__).resolve().parent.parent
CORES = len(cpu_cores())
GEMV_ALL, GEMV_ONE = 10.0, 6.0  # GB/s: every core streaming, one core


def calibration(tmp_path: Path, cores: int = CORES, call_us: dict[str, float] | None = None,
                by_bytes: dict[str, float] | None = None, curve: dict[str, float] | None = None,
                by_kernel: dict[str, dict[str, float]] | None = None) -> Path:
    """A `cpu` entry for this machine's core count: memory-bound figures, tiny overheads, and the planner's
    memory efficiency at 1, so the decode time can be worked out by hand. `by_bytes`: the layer overhead's
    curve by a layer's bytes, `by_kernel` the FLOP-rate curves per kernel (none: the file predates them)."""
    probes = {"stream_gbps": 9.0, "gemm_tflops": 0.05, "layer_overhead_us": 1.0, "step_overhead_us": 1.0,
              "matmul_tflops": curve or {"1": 0.5, "64": 1.0}, "matmul_call_us": call_us or {"1": 0.0},
              **({"layer_overhead_by_bytes": by_bytes} if by_bytes else {}),
              **({"matmul_tflops_by_kernel": by_kernel} if by_kernel else {})}
    threads = {"1": {**probes, "gemv_gbps": GEMV_ONE}, str(CORES): {**probes, "gemv_gbps": GEMV_ALL},
               str(cores): {**probes, "gemv_gbps": GEMV_ALL}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"version": 1, "memory_bandwidth_efficiency": 1.0, "cpu": {
        "cores": cores, "numa_nodes": 1, "memory_bytes": 8e9, "dtype": "fp32", "threads": threads}}))
    return path


def plan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}  # no nvidia-smi, no NVML: a CPU box
    return subprocess.run([sys.executable, "-m", "topoplan", "plan", "--device", "cpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=120)


def test_plans_this_machines_cpu_layouts_without_a_topology(tmp_path: Path):
    done = plan("--model", "small", "--calibration", str(calibration(tmp_path)), "--prompt-len", "16",
                "--gen-len", "16", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    data = json.loads(done.stdout)
    assert data["topology"]["gpus"] == [f"CPU{i}" for i in range(CORES)]
    assert data["model"]["dtype"] == "fp32" and data["topology"]["gpu"] == "CPU cores"
    shown = [(l["tp"], l["pp"], l["dp"]) for l in data["layouts"] + data["hidden"]]
    # TP1 on every core, and one single-threaded rank per core in every split of the cores
    assert (1, 1, 1) in shown and all(tp * pp * dp in (1, CORES) for tp, pp, dp in shown)
    assert len(shown) == len(set(shown))
    times = [l["request_ms"] for l in data["layouts"]]
    assert times == sorted(times)  # ranked by latency
    # TP1 streams every fp32 weight through all cores' GEMV bandwidth each step (memory-bound: the KV cache
    # of 32 tokens and the 1 us overheads are below 1 %)
    tp1 = next(l for l in data["layouts"] + data["hidden"] if (l["tp"], l["pp"], l["dp"]) == (1, 1, 1))
    weights = find_model("small").weight_bytes("fp32")
    assert tp1["decode_ms_per_token"] == pytest.approx(weights / (GEMV_ALL * 1e9) * 1e3, rel=0.01)


def test_each_streamed_weight_product_adds_the_probed_call_cost_at_the_steps_rows(tmp_path: Path):
    """`small` on one rank: 8 layers x (fused QKV, output, fused gate/up, down) + the LM head (264 x 1024 x 4 B,
    just over 1 MiB) = 33 products a step, each paying the `matmul_call_us` probed at the step's rows."""
    def tp1_decode(call_us: dict[str, float] | None, batch: int) -> float:
        folder = tmp_path / f"{bool(call_us)}-{batch}"
        folder.mkdir()
        done = plan("--model", "small", "--calibration", str(calibration(folder, call_us=call_us)), "--tp", "1",
                    "--pp", "1", "--dp", "1", "--batch", str(batch), "--prompt-len", "16", "--gen-len", "16", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["layouts"][0]["decode_ms_per_token"]

    calls = {"1": 100.0, "2": 300.0}
    assert tp1_decode(calls, 1) - tp1_decode(None, 1) == pytest.approx(33 * 0.1, rel=1e-6)
    assert tp1_decode(calls, 4) - tp1_decode(None, 4) == pytest.approx(33 * 0.3, rel=1e-6)  # "2": 2 rows and more


def test_layer_overhead_is_read_at_the_layers_bytes_between_the_cached_and_the_streamed_probe():
    """Linear in bytes between the probes, their values beyond them; a file without the curve keeps the
    cached probe's figure."""
    def probes(**curve: dict[str, float]):
        raw = {"stream_gbps": 1.0, "gemv_gbps": 1.0, "gemm_tflops": 1.0, "layer_overhead_us": 100.0,
               "matmul_tflops": {"1": 1.0}, **curve}
        return parse_cpu_entry({"cores": 1, "memory_bytes": 1e9, "threads": {"1": raw}}, "cal.json").probes(1)

    curve = probes(layer_overhead_by_bytes={"1000": 100.0, "64000": 400.0})
    assert layer_overhead_us(curve, 500) == 100.0 and layer_overhead_us(curve, 1000) == 100.0
    assert layer_overhead_us(curve, 22000) == pytest.approx(200.0)  # a third of the way
    assert layer_overhead_us(curve, 64000) == 400.0 and layer_overhead_us(curve, 1e9) == 400.0
    assert layer_overhead_us(probes(), 1e9) == 100.0


@pytest.mark.skipif(CORES < 2, reason="one core has only the TP1 layout")
def test_each_layer_pays_the_overhead_at_the_bytes_its_rank_streams(tmp_path: Path):
    """`small`'s layer is 11.8 M fp32 weights (47,185,920 B): TP1's rank streams all of it, at the curve's top
    (400 us), a TP2 rank half, a third of the way up a curve from 1 us at a quarter of it (134 us); 8 layers a
    step. The curve set to the warm figure everywhere is the file without it."""
    layer = find_model("small").layer_params_per_rank() * 4
    assert layer == 47185920
    curve = {str(int(layer // 4)): 1.0, str(int(layer)): 400.0}

    def decode(tp: int, by_bytes: dict[str, float] | None) -> float:
        folder = tmp_path / f"{tp}-{bool(by_bytes)}"
        folder.mkdir()
        done = plan("--model", "small", "--calibration", str(calibration(folder, by_bytes=by_bytes)), "--tp",
                    str(tp), "--pp", "1", "--dp", str(CORES // tp), "--batch", "1", "--prompt-len", "16",
                    "--gen-len", "16", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["layouts"][0]["decode_ms_per_token"]

    assert decode(1, curve) - decode(1, None) == pytest.approx(8 * (400.0 - 1.0) / 1e3, rel=1e-6)
    assert decode(2, curve) - decode(2, None) == pytest.approx(8 * (1 / 3 * 399.0) / 1e3, rel=1e-6)


# TFLOP/s by rows, low enough that a 64-token prefill of `small` is compute-bound (GEMV 10 GB/s)
MKL = {"1": 0.05, "64": 0.05, "4096": 0.05}  # faster at 1 row,
ONEDNN = {"1": 0.025, "64": 0.1, "4096": 0.1}  # faster from 4 rows on (8 rows: 0.025 + 3/6 x 0.075 = 0.0625)


@pytest.mark.parametrize(("batch", "kernel"), [(1, MKL), (8, ONEDNN)])
def test_prefill_runs_on_the_kernel_the_runner_keeps_for_its_decode_rows(tmp_path: Path, batch, kernel):
    """The runner holds every weight for the kernel faster at its decode step's rows and multiplies prefill's
    rows with it too: with per-kernel curves, TP1's prefill (and decode) cost what a file whose only curve is
    that kernel's gives; batch 1 decodes 1 row (MKL's), batch 8 decodes 8 (oneDNN's)."""
    def tp1(**curves: dict) -> tuple[float, float]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        done = plan("--model", "small", "--calibration", str(calibration(folder, **curves)), "--tp", "1", "--pp",
                    "1", "--dp", "1", "--batch", str(batch), "--prompt-len", "64", "--gen-len", "16", "--json")
        assert done.returncode == 0, done.stderr
        layout = json.loads(done.stdout)["layouts"][0]
        return layout["prefill_ms"], layout["decode_ms_per_token"]

    both = tp1(curve={k: max(MKL[k], ONEDNN[k]) for k in MKL}, by_kernel={"mkl": MKL, "onednn": ONEDNN})
    assert both == tp1(curve=kernel)
    assert both != tp1(curve=ONEDNN if kernel is MKL else MKL)  # the other kernel's rate prices prefill otherwise


@pytest.mark.skipif(CORES < 2, reason="one core has only the TP1 layout")
def test_fixed_degrees_and_a_one_thread_rank_per_core(tmp_path: Path):
    done = plan("--model", "small", "--calibration", str(calibration(tmp_path)), "--tp", str(CORES), "--pp", "1",
                "--dp", "1", "--prompt-len", "16", "--gen-len", "16", "--json")
    assert done.returncode == 0, done.stderr
    [layout] = json.loads(done.stdout)["layouts"]
    assert (layout["tp"], layout["pp"], layout["dp"]) == (CORES, 1, 1)
    # each single-threaded rank reads 1/CORES of the weights, the ranks sharing the socket's bandwidth
    weights = find_model("small").weight_bytes("fp32")
    per_rank_gbps = min(GEMV_ONE, GEMV_ALL / CORES)
    assert layout["decode_ms_per_token"] >= weights / CORES / (per_rank_gbps * 1e9) * 1e3


@pytest.mark.skipif(CORES < 2, reason="one core has no pipeline")
def test_pipeline_decode_is_priced_as_the_runners_micro_batched_step(tmp_path: Path):
    """With batch >= pp the runner keeps pp micro-batches in flight: every stage streams its weights at once
    (sharing the socket), and a token per sequence takes pp micro-batch passes of the slowest stage."""
    done = plan("--model", "small", "--calibration", str(calibration(tmp_path)), "--tp", "1", "--pp", str(CORES),
                "--dp", "1", "--batch", str(2 * CORES), "--prompt-len", "16", "--gen-len", "16", "--json")
    assert done.returncode == 0, done.stderr
    [layout] = json.loads(done.stdout)["layouts"]
    weights = find_model("small").weight_bytes("fp32")
    stage_ms = weights / CORES / (min(GEMV_ONE, GEMV_ALL / CORES) * 1e9) * 1e3
    assert layout["decode_ms_per_token"] == pytest.approx(CORES * stage_ms, rel=0.03)
    assert layout["tokens_per_s"] == pytest.approx(2 * CORES / layout["decode_ms_per_token"] * 1e3, rel=1e-3)


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "tiny"], "--device cpu needs --calibration FILE with a `cpu` entry"),
    (["--model", "tiny", "--topo", "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"],
     "--device cpu plans this machine's CPU cores; --topo describe GPU machines"),
    (["--model", "tiny", "--device", "tpu"], "Invalid value for '--device'"),
])
def test_bad_input_is_one_line(args, message):
    done = plan(*args)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_calibration_without_a_cpu_entry_is_refused(tmp_path: Path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"version": 1, "flop_efficiency": 0.6}))
    done = plan("--model", "tiny", "--calibration", str(path))
    assert done.returncode == 2 and "no `cpu` entry: run `topoplan calibrate` on this machine" in done.stderr


def test_a_calibration_from_another_core_count_is_warned(tmp_path: Path):
    path = calibration(tmp_path, cores=CORES + 2)
    done = plan("--model", "tiny", "--calibration", str(path), "--top", "1")
    assert done.returncode == 0
    assert done.stderr == f"topoplan: warning: {path} was measured on {CORES + 2} cores; this machine has {CORES}\n"


def test_plan_on_a_machine_without_gpus_points_to_device_cpu(tmp_path: Path):
    """No driver (a pynvml whose nvmlInit fails, no nvidia-smi on PATH) and no --topo: the error says how to
    plan this CPU machine instead."""
    (tmp_path / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    value = 9\n    def __str__(self):\n        return 'Driver Not Loaded'\n"
        "def nvmlInit():\n    raise NVMLError()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", "--model", "tiny", "--calibration",
                           str(calibration(tmp_path))], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("topoplan: error: no topology from this machine: NVML could not start")
    assert done.stderr.endswith("; on a machine without GPUs, `plan --device cpu --calibration FILE` plans its "
                                "CPU-process layouts\n")


MOE = "moe_layer_overhead_us (may be 0)"
LAYER = "layer_overhead_by_bytes (bytes -> us, may be 0)"
KERNELS = "matmul_tflops_by_kernel (kernel -> rows -> TFLOP/s)"


@pytest.mark.parametrize("field, value, message", [
    ("moe_layer_overhead_us", float("nan"), "NaN is not JSON (expected a finite number"),  # the reader refuses it
    *[("moe_layer_overhead_us", v, MOE) for v in (-1.0, True, "1")],
    *[("layer_overhead_by_bytes", v, LAYER) for v in ({"x": 1.0}, {"0": 1.0}, {"1000": -1.0}, {"1000": True}, {},
                                                      [1.0])],
    *[("matmul_tflops_by_kernel", v, KERNELS) for v in ({}, {"mkl": {}}, {"mkl": {"1": 0.0}}, {"mkl": {"x": 1.0}},
                                                        [1.0], {"mkl": {"1": True}}, {"mkl": {"0": 1.0}})],
    ("matmul_tflops", {"0": 1.0}, "matmul_tflops (rows -> TFLOP/s)")])  # no rate at 0 rows to interpolate from
def test_a_bad_probe_in_the_cpu_entry_is_one_line(tmp_path: Path, field, value, message):
    path = calibration(tmp_path)
    raw = json.loads(path.read_text())
    raw["cpu"]["threads"]["1"][field] = value
    path.write_text(json.dumps(raw))
    done = plan("--model", "small", "--calibration", str(path), "--json")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr
    if message in (LAYER, KERNELS):
        assert "cpu.threads.1: expected positive " + message in done.stderr
