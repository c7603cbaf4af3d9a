"""`topoplan plan` end to end: the JSON contract, ranking, pricing one layout, and bad input -> one line, exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app
from topoplan.errors import TopoplanError

ROOT = Path(__file__).resolve().parent.parent
H100_NVL = "fixtures/topo/17_h100-nvl-8gpu-nv12-pairs-2nic.txt"
DGX_A100 = "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
DGX1 = "fixtures/topo/07_dgx1-v100-sxm2-16gb-cubemesh-mlx5-driver440.txt"


def topoplan(*args):
    """Run the command in-process (the console script's behaviour: errors exit 2 with one stderr line)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_json_contract_and_ranking():
    run = topoplan("plan", "-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--batch", "8", "--json",
                   "--top", "0")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["model"]["name"] == "Llama-3.1-70B" and out["topology"]["gpus"][0] == "GPU0"
    layouts = out["layouts"]
    for entry in layouts:
        assert entry["tp"] * entry["pp"] * entry["dp"] == len(entry["placement"])
        for key in ("fits", "batch", "memory_per_gpu_gib", "prefill_ms", "decode_ms_per_token", "tokens_per_s",
                    "cuda_visible_devices", "reasons"):
            assert key in entry
        assert entry["placement"][0].keys() == {"rank", "node", "gpu", "tp_rank", "pp_rank", "dp_rank"}
        assert entry["cuda_visible_devices"] == ",".join(p["gpu"][3:] for p in entry["placement"])
    fits = [e["fits"] for e in layouts]
    assert fits == sorted(fits, reverse=True)  # layouts that fit come first
    fitting = [e for e in layouts if e["fits"]]
    # best first by the served request latency (default objective); the bundled runner serves static batches:
    # TTFT = the batch's prefill, then 127 steps of the decode-phase rate (PP stages busy with micro-batches)
    latency = [e["served"]["request_latency_ms"] for e in fitting]
    assert latency == sorted(latency)
    for e in fitting:
        step = e["dp"] * 8 / e["tokens_per_s"] * 1e3
        assert e["served"]["ttft_ms"] == pytest.approx(e["prefill_ms"], abs=1e-3)
        assert e["served"]["request_latency_ms"] == pytest.approx(e["prefill_ms"] + 127 * step, rel=1e-3)
    assert not any(e["fits"] for e in layouts if e["tp"] * e["pp"] == 1)  # 141 GB of weights on one GPU
    pp3 = next(e for e in layouts if e["pp"] == 3)  # 80 layers: the 2 extra go to the stages before the last
    assert pp3["stages"] == [{"pp_rank": 0, "first_layer": 0, "last_layer": 26, "layers": 27},
                             {"pp_rank": 1, "first_layer": 27, "last_layer": 53, "layers": 27},
                             {"pp_rank": 2, "first_layer": 54, "last_layer": 79, "layers": 26}]
    assert "PP3 stages of 27/27/26 layers" in " ".join(pp3["reasons"])


def test_throughput_objective_ranks_by_delivered_tokens_per_gpu_of_the_machine():
    """Ranked by the served output tokens/s per GPU of the machine (was: the decode-phase rate per GPU the layout
    uses, which overstated a static batch's delivered rate and left idle GPUs out)."""
    run = topoplan("plan", "-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--batch", "32", "--json",
                   "--top", "0", "--objective", "throughput")
    fitting = [e for e in json.loads(run.stdout)["layouts"] if e["fits"]]
    per_gpu = [e["served"]["output_tokens_per_s_per_gpu"] for e in fitting]
    assert per_gpu == sorted(per_gpu, reverse=True) and len(per_gpu) > 5
    for e in fitting:  # a static batch delivers its gen tokens per sequence over prefill + 127 steps
        served = e["served"]
        assert served["output_tokens_per_s"] == pytest.approx(
            e["dp"] * 32 * 128 / (e["prefill_ms"] + 127 * e["dp"] * 32 / e["tokens_per_s"] * 1e3) * 1e3, rel=1e-3)
        assert served["output_tokens_per_s_per_gpu"] == pytest.approx(served["output_tokens_per_s"] / 8, rel=1e-3)
        assert served["output_tokens_per_s"] < e["tokens_per_s"]  # below the decode-phase rate


def test_price_one_layout():
    run = topoplan("plan", "-m", "8b", "--topo", DGX1, "--gpu", "v100-sxm2-16gb", "--tp", "4", "--pp", "1",
                   "--dp", "2", "--json", "--dtype", "fp16")
    assert run.returncode == 0, run.stderr
    (entry,) = json.loads(run.stdout)["layouts"]
    groups = [entry["placement"][i:i + 4] for i in (0, 4)]
    assert sorted(sorted(p["gpu"] for p in g) for g in groups) == [["GPU0", "GPU1", "GPU2", "GPU3"],
                                                                   ["GPU4", "GPU5", "GPU6", "GPU7"]]


def test_table_output_names_groups_and_reasons():
    run = topoplan("plan", "-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--top", "3")
    assert run.returncode == 0, run.stderr
    assert "ranked by latency" in run.stdout and "[0,1,2,3] | [4,5,6,7]" in run.stdout
    assert "TP4 spans a NODE hop: ring bottleneck 38 GB/s" in run.stdout


@pytest.mark.parametrize("args, message", [
    (("-m", "lama-70b", "--topo", H100_NVL, "--gpu", "h100-nvl"), "unknown model 'lama-70b'; close: "),
    (("-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--tp", "3"),
     "Llama-3.1-70B: num_attention_heads=64 is not divisible by tp=3;"),
    (("-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--tp", "8", "--dp", "2"),
     "tp=8 x pp=1 x dp=2 needs 16 GPUs; 1 node(s) x 8 GPUs have 8"),
    (("-m", "70b", "--topo", H100_NVL), "pass --gpu NAME"),
    (("-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--dtype", "int3"), "unknown --dtype 'int3'"),
    (("-m", "70b", "--topo", H100_NVL, "--gpu", "h100-nvl", "--calibration", "nope.json"),
     "nope.json: cannot read it: No such file or directory; expected a topoplan calibration file"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    run = topoplan("plan", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr and run.stdout == ""


A100_PLAN = ("-m", "70b", "--topo", DGX_A100, "--gpu", "a100-80gb")


@pytest.mark.parametrize("option, value, message", [
    ("--tp", "0", "--tp must be >= 1, got 0"), ("--tp", "-2", "--tp must be >= 1, got -2"),
    ("--pp", "0", "--pp must be >= 1, got 0"), ("--dp", "0", "--dp must be >= 1, got 0"),
    ("--max-tp", "0", "--max-tp must be >= 1, got 0"), ("--max-tp", "-1", "--max-tp must be >= 1, got -1"),
    ("--top", "-1", "--top must be >= 0 (0: all), got -1"), ("--nodes", "0", "--nodes must be from 1 to 4096, got 0"),
    ("--batch", "0", "--batch 0: expected 1 to 1,048,576"),
    ("--prompt-len", "0", "--prompt-len 0: expected 1 to 16,777,216"),
    ("--gen-len", "0", "--gen-len 0: expected 1 to 16,777,216"),
    ("--nic-gbps", "nan", "--nic-gbps must be a positive finite number, got nan"),
    ("--nic-gbps", "inf", "--nic-gbps must be a positive finite number, got inf"),
    ("--nic-gbps", "-1", "--nic-gbps must be a positive finite number, got -1.0"),
])
def test_counts_and_bandwidth_must_be_positive(option, value, message):
    run = topoplan("plan", *A100_PLAN, option, value)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr and run.stdout == ""


def test_unreadable_json_inputs_are_one_line(tmp_path):
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"{\n\xff\xfe\x00garbage")
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0)
    cases = [(("-m", str(binary)), f"{binary}:2: not UTF-8 text (byte 0xff); expected"),
             (("-m", "70b", "--calibration", str(binary)),
              f"{binary}:2: not UTF-8 text (byte 0xff); expected a topoplan calibration file"),
             (("-m", "70b", "--calibration", str(tmp_path)), f"{tmp_path}: cannot read it: Is a directory; expected"),
             (("-m", "70b", "--topo", str(tmp_path / "none.txt")),
              "none.txt: cannot read it: No such file or directory")]
    if not os.access(locked, os.R_OK):  # root reads any file: nothing to refuse then
        cases.append((("-m", "70b", "--calibration", str(locked)), f"{locked}: cannot read it: Permission denied"))
    for args, message in cases:
        run = topoplan("plan", *args, *(("--topo", DGX_A100) if "--topo" not in args else ()), "--gpu", "a100-80gb")
        assert run.returncode == 2 and message in run.stderr, (args, run.stderr)
        assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def test_context_beyond_the_model_is_refused(tmp_path):
    run = topoplan("plan", *A100_PLAN, "--prompt-len", "1000000")  # within --prompt-len's bound (docs/limits.md)
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert ("--prompt-len 1000000 + --gen-len 128 = 1000128 tokens exceed the model's context of "
            "131072 tokens (max_position_embeddings of Llama-3.1-70B)") in run.stderr
    assert topoplan("plan", *A100_PLAN, "--prompt-len", "130944", "--top", "1").returncode == 0  # exactly 131072
    config = tmp_path / "config.json"  # a config without max_position_embeddings: nothing to check against
    config.write_text(json.dumps({"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
                                  "intermediate_size": 512, "vocab_size": 1000}))
    run = topoplan("plan", "-m", str(config), "--topo", DGX_A100, "--gpu", "a100-80gb", "--prompt-len", "200000")
    assert run.returncode == 0, run.stderr


def test_nothing_fits_prints_the_rows_then_fails():
    message = ("no layout of Llama-3.1-405B fits in GPU memory on 1 node(s) x 8 GPUs; closest: tp=8,pp=1,dp=1 does "
               "not fit: needs 94.5 GiB/GPU, 72.0 usable")
    table = topoplan("plan", "-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb")
    assert table.returncode == 2 and message in table.stderr and table.stderr.count("\n") == 1
    assert "tp8 pp1 dp1" in table.stdout  # the rows show how far off each layout is
    as_json = topoplan("plan", "-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--json")
    assert as_json.returncode == 2 and message in as_json.stderr
    assert not any(entry["fits"] for entry in json.loads(as_json.stdout)["layouts"])


def test_partial_machine_layouts_that_add_nothing_are_hidden():
    out = json.loads(topoplan("plan", *A100_PLAN, "--json", "--top", "0").stdout)
    shown = [(e["tp"], e["pp"], e["dp"]) for e in out["layouts"]]
    assert shown[:3] == [(8, 1, 1), (4, 1, 2), (4, 2, 1)]  # tp4 dp1 (identical numbers to tp4 dp2) is hidden
    assert len({(tp, pp) for tp, pp, _ in shown}) == len(shown)  # no (tp, pp) twice
    hidden = {(e["tp"], e["pp"], e["dp"]): e for e in out["hidden"]}
    assert {(4, 1, 1), (2, 1, 3), (2, 1, 2), (2, 1, 1)} <= set(hidden)
    assert hidden[(2, 1, 1)]["dominated_by"] == "tp=2,pp=1,dp=4" and "dominated_by" not in out["layouts"][0]
    for (tp, pp, dp), entry in hidden.items():
        better = next(e for e in out["layouts"] if f"tp={e['tp']},pp={e['pp']},dp={e['dp']}" == entry["dominated_by"])
        assert (better["tp"], better["pp"]) == (tp, pp) and better["dp"] > dp
        assert better["request_ms"] <= entry["request_ms"] and better["tokens_per_s"] > entry["tokens_per_s"]
    table = topoplan("plan", *A100_PLAN, "--top", "8")
    assert f"{len(hidden)} layout(s) hidden: a layout with the same tp and pp but more DP replicas" in table.stdout
    fixed = json.loads(topoplan("plan", *A100_PLAN, "--json", "--dp", "1", "--top", "0").stdout)
    assert fixed["hidden"] == [] and (4, 1, 1) in [(e["tp"], e["pp"], e["dp"]) for e in fixed["layouts"]]


def test_a_node_spanning_tp_group_on_part_of_the_nodes_is_hidden():
    """405B on 4 nodes: tp8 pp2 dp1 (4 GPUs a node, TP across nodes) loses to tp8 pp2 dp2 (TP inside a node)."""
    out = json.loads(topoplan("plan", "-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--nodes", "4",
                              "--json", "--top", "0").stdout)
    spanning = next(e for e in out["hidden"] if (e["tp"], e["pp"], e["dp"]) == (8, 2, 1))
    assert spanning["dominated_by"] == "tp=8,pp=2,dp=2" and spanning["reasons"][0].startswith("TP8 spans nodes")
    assert (8, 2, 2) in [(e["tp"], e["pp"], e["dp"]) for e in out["layouts"]]


def test_table_is_readable_at_80_columns():
    result = CliRunner().invoke(app, ["plan", *A100_PLAN, "--top", "8"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    row = ["1", "tp8", "pp1", "dp1", "yes", "1", "16.5", "65.9"]  # #, layout, fits, batch, GiB/GPU, TTFT
    assert any(line.split()[:8] == row for line in lines if line.strip())
    # each row's GPU groups unbroken and its reason under the table, numbered as the rows, one phrase a line
    assert "#1 [0,1,2,3,4,5,6,7]\n   TP8 on NVLink: ring bottleneck 192 GB/s\n" in result.stdout
    assert "#4 [0,1] | [2,3] | [4,5] | [6,7]\n   TP2 on NVLink" in result.stdout


def test_planner_and_runner_share_the_tp_rule(tmp_path):
    """An MLP width tp cannot split: the planner never proposes that tp, and the runner refuses it the same way."""
    from topoplan.runner.config import check_tp, parse_hf_config

    raw = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8,
           "num_hidden_layers": 2, "intermediate_size": 300, "vocab_size": 1000}  # 300 = 4 x 75: tp 8 cannot split
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw))
    out = json.loads(topoplan("plan", "-m", str(config), "--topo", DGX_A100, "--gpu", "a100-80gb", "--json",
                              "--top", "0").stdout)
    assert {e["tp"] for e in out["layouts"] + out["hidden"]} == {1, 2, 4}
    run = topoplan("plan", "-m", str(config), "--topo", DGX_A100, "--gpu", "a100-80gb", "--tp", "8")
    assert run.returncode == 2 and "intermediate_size=300 is not divisible by tp=8; possible tp: 1, 2, 4" in run.stderr
    with pytest.raises(TopoplanError, match="intermediate_size=300 is not divisible by tp=8"):
        check_tp(parse_hf_config(raw), 8)
    with pytest.raises(TopoplanError, match="vocab_size=1000 is not divisible by tp=16"):  # the runner pads nothing
        check_tp(parse_hf_config({**raw, "num_attention_heads": 16, "intermediate_size": 320}), 16)


def test_misleading_inputs_are_warned_on_stderr(tmp_path):
    recording = "fixtures/nvml/hgx-h100-8gpu-nvswitch.json"
    run = topoplan("plan", "-m", "70b", "--topo", recording, "--gpu", "a100-80gb", "--json", "--top", "1")
    warning = "--gpu a100-80gb (a100-sxm4-80gb) overrides the h100-sxm the source named"
    assert run.returncode == 0 and f"topoplan: warning: {warning}\n" == run.stderr
    assert json.loads(run.stdout)["warnings"] == [warning]
    assert topoplan("plan", "-m", "70b", "--topo", recording, "--top", "1").stderr == ""  # no --gpu: nothing
    cpu = tmp_path / "cpu.json"
    probes = {"stream_gbps": 9.0, "gemv_gbps": 12.0, "gemm_tflops": 0.05, "layer_overhead_us": 100.0,
              "matmul_tflops": {"1": 0.05}}  # what `calibrate` writes on a CPU (every section is read and checked)
    cpu.write_text(json.dumps({"version": 1, "flop_efficiency": 1.0, "cpu": {
        "cores": 2, "memory_bytes": 8e9, "threads": {"1": probes, "2": probes}}}))
    run = topoplan("plan", *A100_PLAN, "--top", "1", "--calibration", str(cpu))
    assert run.returncode == 0 and run.stderr == (f"topoplan: warning: {cpu} was measured on a CPU (it has a `cpu` "
                                                  "entry): its efficiencies and link constants describe that CPU, "
                                                  "not this plan's a100-sxm4-80gb\n")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    run = topoplan("plan", *A100_PLAN, "--json", "--top", "1", "--calibration", str(empty))
    assert run.returncode == 0 and run.stderr == f"topoplan: warning: {empty} sets no constant: the defaults apply\n"
    default = topoplan("plan", *A100_PLAN, "--json", "--top", "1")
    assert json.loads(run.stdout)["layouts"] == json.loads(default.stdout)["layouts"]
    gpu = tmp_path / "gpu.json"  # what `calibrate` writes on a GPU machine: accepted, no warning
    gpu.write_text(json.dumps({"version": 1, "flop_efficiency": 0.6, "gpu": {"name": "NVIDIA A100-SXM4-80GB"}}))
    assert topoplan("plan", *A100_PLAN, "--top", "1", "--calibration", str(gpu)).stderr == ""


def test_config_missing_fields_and_topology_without_gpus(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    run = topoplan("plan", "-m", str(config), "--topo", H100_NVL, "--gpu", "h100-nvl")
    assert run.returncode == 2 and f"{config}: missing key 'num_attention_heads'" in run.stderr
    empty = tmp_path / "topo.txt"
    empty.write_text("        NIC0\nNIC0     X \n")
    run = topoplan("plan", "-m", "8b", "--topo", str(empty), "--gpu", "h100")
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1


def test_plan_modules_do_not_import_torch():
    code = ("import sys, topoplan.cli, topoplan.plan.rank, topoplan.plan.plan_table, topoplan.plan.frontend; "
            "assert 'torch' not in sys.modules and 'pynvml' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
