"""Calibration file: the schema's defaults, overrides, round trip, and one-line errors naming the key."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.errors import TopoplanError
from topoplan.plan.calibration import Calibration
from topoplan.plan.calibration_file import (
    CalibrationFile,
    ConstantValues,
    LinkValues,
    calibration_json,
    load_calibration,
    parse_calibration_file,
    read_calibration_file,
    write_calibration_file,
)

ROOT = Path(__file__).resolve().parent.parent
TOPO = ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"


def write(tmp_path, data):
    path = tmp_path / "calibration.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_defaults_without_a_file():
    assert load_calibration(None) == Calibration()


def test_overrides_and_round_trip(tmp_path):
    path = write(tmp_path, {"version": 1, "links": {"nvlink": {"alpha_us": 1.5, "bandwidth_gbps": 180},
                                                    "net": {"bandwidth_gbps": 23}},
                            "memory_bandwidth_efficiency": 0.85, "layer_overhead_us": 12, "runtime_reserve": 0.2})
    cal = load_calibration(path)
    assert cal.link("nvlink").alpha_us == 1.5 and cal.link("nvlink").bandwidth_gbps == 180
    assert cal.link("net").bandwidth_gbps == 23 and cal.link("net").alpha_us == Calibration().link("net").alpha_us
    assert (cal.memory_bandwidth_efficiency, cal.layer_overhead_us, cal.runtime_reserve) == (0.85, 12, 0.2)
    assert cal.flop_efficiency == Calibration().flop_efficiency
    written = CalibrationFile(links={k: LinkValues(c.alpha_us, c.bandwidth_gbps) for k, c in cal.links.items()},
                              constants=ConstantValues.of(cal))
    again = parse_calibration_file(calibration_json(written), path).calibration()
    assert again == cal


@pytest.mark.parametrize("data, message", [
    ({"flop_efficiency": 1.5}, "flop_efficiency: expected a fraction in (0, 1], got 1.5"),
    ({"links": {"nvlnk": {"alpha_us": 1}}}, "links.nvlnk: unknown link class"),
    ({"links": {"pix": {"alpha_us": -1}}}, "links.pix.alpha_us: expected a non-negative number, got -1"),
    ({"links": {"pix": {"bandwidth_gbps": 0}}}, "links.pix.bandwidth_gbps: must be above 0"),
    ({"colective_base_us": 3}, "unknown key(s) colective_base_us"),
    ({"version": 2}, "version 2: this topoplan reads version 1"),
    ([], "expected a JSON object"),
])
def test_bad_files_name_the_key(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(TopoplanError) as error:
        load_calibration(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_invalid_json_names_the_line(tmp_path):
    path = write(tmp_path, '{\n"flop_efficiency": 0.5,\n}')
    with pytest.raises(TopoplanError, match=r"calibration.json:3: not valid JSON"):
        load_calibration(path)


# A file as `topoplan calibrate` (CPU) and then `calibrate --engine vllm` write it, every section present.
PROBES = {"stream_gbps": 9.5, "gemv_gbps": 12.0, "gemm_tflops": 0.05, "layer_overhead_us": 100.0,
          "step_overhead_us": 300.0, "moe_layer_overhead_us": 50.0, "expert_overhead_us": 10.0,
          "matmul_tflops_by_kernel": {"mkl": {"1": 0.004, "64": 0.05}}, "matmul_tflops": {"1": 0.004, "64": 0.05},
          "matmul_call_us": {"1": 20.0, "2": 40.0}, "layer_overhead_by_bytes": {"147456": 100.0, "47185920": 300.0},
          "spread": {"gemv": 0.02}}
WRITTEN = {"version": 1, "links": {"node": {"alpha_us": 212.0, "bandwidth_gbps": 1.9}, "nvlink": {"alpha_us": 3.0}},
           "collective_base_us": 41.0, "layer_overhead_us": 180.0, "memory_bandwidth_efficiency": 1.0,
           "cpu": {"cores": 2, "numa_nodes": 1, "memory_bytes": 25275990016, "dtype": "fp32",
                   "threads": {"1": PROBES, "2": PROBES}},
           "measured": {"host": "box", "when": "2026-12-06T07:00:00Z", "seconds": 61.5, "load_average": [0.1, 0.2, 0.3],
                        "load": {"busy": False, "warnings": []}, "topoplan": "0.1.0", "torch": "2.5.0+cpu",
                        "dtype": "fp32", "sizes": "1K:4M", "iters": 20, "probe_mib": 256, "base_from_fit": True,
                        "sync_wait_us": {"2": 40.0}, "fits": [{"op": "all_reduce", "group_size": 2}]},
           "engines": {"vllm": {"layer_overhead_us": 3000.0, "decode_layer_overhead_us": 900.0,
                                "step_overhead_us": 0.0, "step_overhead_per_rank_us": 15000.0, "device": "cpu",
                                "engine_version": "0.32.0", "model": "small", "batch": 2, "prompt_len": 32,
                                "gen_len": 32, "load": {"busy": False}, "fit_rows": [{"tp": 1}]}}}


def test_every_section_is_typed_and_written_back_as_read(tmp_path):
    path = write(tmp_path, WRITTEN)
    file = read_calibration_file(path)
    assert file.cpu.cores == 2 and file.cpu.threads[1].matmul_call_us == ((1, 20.0), (2, 40.0))
    assert file.cpu.probes(2).layer_overhead_by_bytes == ((147456, 100.0), (47185920, 300.0))
    assert file.measured.probe_mib == 256 and file.measured.torch == "2.5.0+cpu"
    assert file.engines["vllm"].constants.step_overhead_per_rank_us == 15000.0
    assert file.engines["vllm"].engine_version == "0.32.0"
    assert calibration_json(file) == WRITTEN
    out = write_calibration_file(tmp_path / "again.json", file)
    assert json.loads(out.read_text()) == WRITTEN
    # the engine's entry goes on top of the file's constants for that engine only
    assert file.calibration(engine="vllm").layer_overhead_us == 3000.0 and file.calibration().layer_overhead_us == 180.0


@pytest.mark.parametrize("section, value, message", [
    ("cpu", {"cores": 2, "memory_bytes": 1e9, "threads": {"1": PROBES}},
     "cpu: expected `cores` (an integer) and `threads` with an entry for all cores"),
    ("cpu", {"cores": 1, "threads": {"1": PROBES}}, "cpu.memory_bytes: expected a positive number of bytes"),
    ("cpu", [], "cpu: expected an object"),
    ("gpu", "H100", "gpu: expected an object"),
    ("gpu", {"name": 7}, "gpu.name: expected a string, got 7"),
    ("measured", {"probe_mib": "256"}, "measured.probe_mib: expected an integer, got '256'"),
    ("measured", {"iters": True}, "measured.iters: expected an integer, got True"),
    ("engines", {"vllm": []}, "engines.vllm: expected an object of constants"),
    ("engines", {"vllm": {"layer_overhead_us": -1}}, "engines.vllm.layer_overhead_us: expected a non-negative"),
    ("engines", {"vllm": {"runtime_reserve": 1.0}}, "engines.vllm.runtime_reserve: 1.0 leaves no memory"),
])
def test_a_malformed_section_is_one_line_naming_the_file_and_key(tmp_path, section, value, message):
    path = write(tmp_path, {"version": 1, section: value})
    with pytest.raises(TopoplanError) as error:
        read_calibration_file(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_file_of_another_version_says_to_calibrate_again(tmp_path):
    path = write(tmp_path, {**WRITTEN, "version": 2})
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", "--model", "tiny", "--topo", str(TOPO),
                           "--calibration", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"topoplan: error: {path}: version 2: this topoplan reads version 1; run `topoplan "
                           "calibrate` again to write a current one\n")


def test_a_layer_overhead_the_probe_clamped_to_0_is_read_and_a_negative_one_refused(tmp_path):
    """The probe clamps a slope the machine's noise made negative to 0 (topoplan.bench.probes): what `calibrate`
    writes, the reader takes."""
    zero = {**WRITTEN, "cpu": {**WRITTEN["cpu"], "threads": {"1": PROBES, "2": {**PROBES, "layer_overhead_us": 0.0}}}}
    assert read_calibration_file(write(tmp_path, zero)).cpu.probes(2).layer_overhead_us == 0.0
    negative = {**zero, "cpu": {**zero["cpu"], "threads": {"1": PROBES, "2": {**PROBES, "layer_overhead_us": -1}}}}
    with pytest.raises(TopoplanError, match=r"cpu.threads.2: expected positive layer_overhead_us \(may be 0\)"):
        read_calibration_file(write(tmp_path, negative))
