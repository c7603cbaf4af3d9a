"""calibrate/validate --engine vllm: the fit of vLLM's fixed costs, the file entry it writes and reads, the
layouts it serves, and the one-line errors. (Serving vLLM itself: tests/test_vllm_serve.py; the measured table:
docs/launch-engines.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.launch_support import ROOT
from topoplan.bench.vllm_cpu import engine_overheads, fit_overheads, vllm_candidates
from topoplan.engines import resolve
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.plan.calibration_file import read_calibration_file

VLLM = resolve("vllm")


def test_fit_takes_prefill_layer_cost_from_prefill_and_decode_costs_from_decode() -> None:
    # 8 layers. Prefill: 4 ms over the roofline in every row -> 500 us a layer.
    # Decode: TP1 is 5 ms over -> 625 us a layer; TP2 and PP2 are 7 ms over -> 2000 us more for their extra rank.
    rows = [{"layout": Layout(), "prefill_ms": 10.0, "decode_ms_per_token": 7.0},
            {"layout": Layout(tp=2), "prefill_ms": 12.0, "decode_ms_per_token": 10.0},
            {"layout": Layout(pp=2), "prefill_ms": 14.0, "decode_ms_per_token": 11.0}]
    base = [SimpleNamespace(prefill_ms=6.0, decode_ms_per_token=2.0),
            SimpleNamespace(prefill_ms=8.0, decode_ms_per_token=3.0),
            SimpleNamespace(prefill_ms=10.0, decode_ms_per_token=4.0)]
    assert fit_overheads(8, rows, base) == pytest.approx({"layer_overhead_us": 500.0, "decode_layer_overhead_us": 625.0,
                                                          "step_overhead_us": 0.0,
                                                          "step_overhead_per_rank_us": 2000.0})


def test_fit_never_goes_negative() -> None:
    rows = [{"layout": Layout(), "prefill_ms": 1.0, "decode_ms_per_token": 1.0}]
    base = [SimpleNamespace(prefill_ms=2.0, decode_ms_per_token=2.0)]
    assert fit_overheads(8, rows, base) == {"layer_overhead_us": 0.0, "decode_layer_overhead_us": 0.0,
                                            "step_overhead_us": 0.0, "step_overhead_per_rank_us": 0.0}


def test_engine_overheads_are_read_back_and_missing_ones_refused(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    fitted = {"layer_overhead_us": 12.5, "decode_layer_overhead_us": 12.5, "step_overhead_us": 900,
              "step_overhead_per_rank_us": 300}
    path.write_text(json.dumps({"engines": {"vllm": fitted}}))
    assert engine_overheads(VLLM, read_calibration_file(path)).named() == pytest.approx(fitted)
    path.write_text(json.dumps({"engines": {"sglang": fitted}}))  # another engine's entry is not vLLM's
    with pytest.raises(TopoplanError, match="calibrate --engine vllm"):
        engine_overheads(VLLM, read_calibration_file(path))


def test_the_planner_accepts_a_file_with_an_engines_entry(tmp_path: Path) -> None:
    from topoplan.plan.calibration_file import load_calibration

    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"layer_overhead_us": 40.0, "engines": {"vllm": {"layer_overhead_us": 1.0}}}))
    assert load_calibration(path).layer_overhead_us == 40.0


def test_vllm_layouts_are_tp1_on_every_core_and_one_rank_per_core(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOPOPLAN_CACHE", str(tmp_path))
    monkeypatch.setattr("topoplan.bench.vllm_cpu.cpu_cores", lambda: [0, 1])
    found = {(c.layout, c.threads) for c in vllm_candidates("small", 2)}
    assert found == {(Layout(), 2), (Layout(tp=2), 1), (Layout(pp=2), 1)}  # dp=2 is not served here


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path), TOPOPLAN_CACHE=str(tmp_path / "cache"))
    cal = tmp_path / "cal.json"
    cal.write_text("{}")
    for args, expected in ((["calibrate", "--engine", "vllm", "--out", str(tmp_path / "o.json")], "--calibration"),
                           (["calibrate", "--engine", "sglang", "--out", str(tmp_path / "o.json")], "measures the"),
                           (["validate", "--engine", "vllm", "--calibration", str(cal), "--engine-python",
                             str(tmp_path / "nope")], "not found"),
                           (["validate", "--engine", "vllm", "--calibration", str(cal), "--layouts", "tp=2"],
                            "drop --layouts")):
        done = subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_validate_vllm_rows_have_validates_fields(monkeypatch, tmp_path: Path) -> None:
    """validate --engine vllm end to end but for the engine itself: the served measurements are given (vLLM
    runs in tests/test_vllm_serve.py), the rest is real: pricing with the fitted overheads, the drift probe, and
    `validate`'s summary (best, orders) over rows shaped like its own."""
    from topoplan.bench import vllm_cpu

    monkeypatch.setenv("TOPOPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("topoplan.bench.vllm_cpu.cpu_cores", lambda: [0, 1])
    monkeypatch.setattr("topoplan.bench.validate.cpu_cores", lambda: [0, 1])
    monkeypatch.setattr(vllm_cpu, "check_python", lambda python: python)
    monkeypatch.setattr(vllm_cpu, "vllm_version", lambda python: "0.32.0")
    measured = {Layout(): 30.0, Layout(tp=2): 50.0, Layout(pp=2): 40.0}
    monkeypatch.setattr(vllm_cpu, "measure_layouts", lambda engine, model, python, candidates, **_: [
        {"layout": c.layout, "threads": c.threads, "prefill_ms": 150.0, "decode_ms_per_token": measured[c.layout],
         "decode_ms_runs": [measured[c.layout]] * 3, "prefill_ms_runs": [150.0] * 3} for c in candidates])
    probes = {"stream_gbps": 20.0, "gemv_gbps": 20.0, "gemm_tflops": 0.1, "layer_overhead_us": 400.0,
              "step_overhead_us": 200.0, "matmul_tflops": {"1": 0.01, "64": 0.1}}
    cal = tmp_path / "vllm.json"
    cal.write_text(json.dumps({"version": 1, "measured": {"probe_mib": 8}, "cpu": {
        "cores": 2, "numa_nodes": 1, "memory_bytes": 8e9, "dtype": "fp32", "threads": {"1": probes, "2": probes}},
        "engines": {"vllm": {"layer_overhead_us": 3000.0, "decode_layer_overhead_us": 900.0,
                             "step_overhead_us": 0.0, "step_overhead_per_rank_us": 15000.0}}}))
    result = vllm_cpu.validate_served(VLLM, "small", str(cal), python="python3", force=True)
    assert result["engine"] == "vllm" and result["engine_version"] == "0.32.0"
    assert {(r["tp"], r["pp"], r["dp"], r["ep"]) for r in result["rows"]} == {(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1)}
    for row in result["rows"]:
        assert row["measured_decode_ms"] == measured[Layout(row["tp"], row["pp"])]
        assert row["error"] == pytest.approx((row["predicted_decode_ms"] - row["measured_decode_ms"])
                                             / row["measured_decode_ms"])
    assert result["best_measured"]["tp"] == 1 and result["best_measured"]["pp"] == 1
    assert result["measured_order"] == ["tp=1,pp=1,dp=1", "tp=1,pp=2,dp=1", "tp=2,pp=1,dp=1"]
    assert result["drift"]["gemv_gbps_calibrated"] == 20.0 and result["drift"]["gemv_gbps_before"] > 0


def test_calibrate_pools_every_pass_of_a_layout_before_taking_medians() -> None:
    """A slow first serving (one pass) moves the fitted figure only as far as the median of all runs does."""
    from topoplan.bench.vllm_cpu import pooled

    first = [{"layout": Layout(), "prefill_ms": 0.0, "prefill_ms_runs": [100.0, 110.0, 120.0],
              "decode_ms_per_token": 0.0, "decode_ms_runs": [34.0, 35.0, 36.0]}]
    second = [{"layout": Layout(), "prefill_ms": 0.0, "prefill_ms_runs": [90.0, 95.0, 200.0],
               "decode_ms_per_token": 0.0, "decode_ms_runs": [28.0, 28.5, 29.0]}]
    (row,) = pooled([first, second])
    assert row["layout"] == Layout()
    assert row["decode_ms_per_token"] == pytest.approx((29.0 + 34.0) / 2)  # median of six runs
    assert row["prefill_ms"] == pytest.approx((100.0 + 110.0) / 2)
    assert len(row["decode_ms_runs"]) == 6
