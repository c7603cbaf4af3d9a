"""`topoplan calibrate` writes a file the planner accepts and that moves its answers as documented;
`topoplan validate` runs the tiny model in two layouts and reports the JSON contract."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.bench.validate import DRIFT_WARN, drift, model_spec
from topoplan.errors import TopoplanError
from topoplan.plan.calibration_file import load_calibration, read_calibration_file
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.cost import Workload
from topoplan.plan.cpu_entry import cpu_calibration, cpu_device, cpu_topology
from topoplan.plan.rank import plan
from topoplan.runner import cpu_linear

ROOT = Path(__file__).resolve().parent.parent


def topoplan(*args: str, timeout: float = 300, progress: bool = False) -> subprocess.CompletedProcess:
    """The CLI with stderr piped; `progress`: TOPOPLAN_PROGRESS=1, as if stderr were a terminal."""
    env = {k: v for k, v in os.environ.items() if k != "TOPOPLAN_PROGRESS"} | (
        {"TOPOPLAN_PROGRESS": "1"} if progress else {})
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "calibration.json"
    # --force: the shared test machine is usually busy; the file then records why (test_busy_run_is_recorded)
    done = topoplan("calibrate", "--out", str(out), "--sizes", "1K:4M", "--iters", "5", "--warmup", "1",
                    "--probe-mib", "8", "--force", progress=True)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    # the progress bar, forced as on a terminal, named the steps on stderr (and left stdout alone)
    assert "the 2-rank sweep" in done.stderr and "the probes at 1 thread(s)" in done.stderr
    assert "sweep" not in done.stdout
    return out


def test_busy_run_is_recorded(calibration):
    load = json.loads(calibration.read_text())["measured"]["load"]
    assert set(load) >= {"cores", "load_before", "load_after", "others_share", "busy", "warnings"}
    assert set(load["others_share"]) >= {"the 2-rank sweep", "the probes at 1 thread(s)"}
    assert load["busy"] == bool(load["warnings"])
    socket = json.loads(calibration.read_text())["cpu"]["threads"]["1"]
    assert set(socket["spread"]) == {"overheads", "stream", "gemv", "gemm", "matmul", "call", "streamed"}


def test_file_is_accepted_by_the_planner(calibration):
    raw = json.loads(calibration.read_text())
    cal = load_calibration(calibration)  # the planner's own parser
    node = cal.link("node")
    assert node.alpha_us == pytest.approx(raw["links"]["node"]["alpha_us"]) and node.bandwidth_gbps > 0
    socket = raw["cpu"]["threads"][str(raw["cpu"]["cores"])]
    assert cal.layer_overhead_us == pytest.approx(socket["layer_overhead_us"])
    assert cal.step_overhead_us == pytest.approx(socket["step_overhead_us"])
    # a weight product's fixed cost, probed with the runner's kernels for one row and for more
    assert set(socket["matmul_call_us"]) == {"1", "2"} and all(v >= 0 for v in socket["matmul_call_us"].values())
    assert cal.matmul_call_us == pytest.approx(socket["matmul_call_us"]["1"])
    # the layer overhead at the cached probe's layer size (hidden 64) and at a `small`-sized layer that streams
    curve = socket["layer_overhead_by_bytes"]
    assert set(curve) == {"147456", "47185920"} and curve["147456"] == socket["layer_overhead_us"]
    assert curve["47185920"] >= 0
    # the FLOP-rate curve of each kernel the runner may keep (oneDNN where this torch has it); the plain curve
    # is the faster of them at each row count
    kernels = socket["matmul_tflops_by_kernel"]
    assert set(kernels) == ({"mkl", "onednn"} if cpu_linear.available() else {"mkl"})
    assert socket["matmul_tflops"] == {rows: max(c[rows] for c in kernels.values()) for rows in kernels["mkl"]}
    # an MoE layer's routing and per-expert overheads beyond a dense layer's, from the runner's own MoE layer
    for name in ("moe_layer_overhead_us", "expert_overhead_us"):
        assert socket[name] >= 0 and getattr(cal, name) == pytest.approx(socket[name])
    # what a collective waits inside a step, per stretch of compute before it (MiB): part of the base
    waits = raw["measured"]["sync_wait_us"]
    assert set(waits) == {"2", "8", "32"} and all(w >= 0 for w in waits.values())
    assert cal.collective_base_us >= sorted(waits.values())[1]
    entry = read_calibration_file(calibration).cpu_entry()
    assert entry.numa_nodes == 1 and set(entry.threads) >= {1}
    ops = {(f["op"], f["group_size"]) for f in raw["measured"]["fits"]}
    assert ("all_reduce", 2) in ops and ("sendrecv", 2) in ops and ("all_to_all", 2) in ops


def price(calibration: Path, tp: int, pp: int, cal=None):
    spec = model_spec("tiny")
    entry = read_calibration_file(calibration).cpu_entry()
    cal = cpu_calibration(cal or load_calibration(calibration), entry, 1, 2, spec.layer_params_per_rank(tp) * 4)
    result = plan(cpu_topology(2), spec, cpu_device(entry, 1, 2, 2), Workload(2, 8, 8, "fp32"), calibration=cal,
                  tp=tp, pp=pp, dp=1)
    return result.layouts[0].cost, spec


def test_calibration_moves_the_planner_as_documented(calibration, tmp_path):
    """links.node.alpha_us is charged 2(n-1) times per all-reduce (two per layer plus the embedding's) and n-1
    times per all-gather (the logits): TP2 decode pays (4 x layers + 3) x alpha. A PP2 step pays it twice:
    the activations' hand-off and the token ids sent back to the first stage. bandwidth_gbps replaces the
    link estimate."""
    raw = json.loads(calibration.read_text())
    raw["links"]["node"]["alpha_us"] += 100.0
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(raw))
    tp2, spec = price(calibration, 2, 1)
    tp2_slow, _ = price(calibration, 2, 1, load_calibration(slower))
    assert tp2_slow.decode_ms_per_token - tp2.decode_ms_per_token == pytest.approx((4 * spec.layers + 3) * 0.1,
                                                                                    rel=1e-6)
    pp2, _ = price(calibration, 1, 2)
    pp2_slow, _ = price(calibration, 1, 2, load_calibration(slower))
    assert pp2_slow.decode_ms_per_token - pp2.decode_ms_per_token == pytest.approx(2 * 0.1, rel=1e-6)
    raw = json.loads(calibration.read_text())
    raw["cpu"]["threads"]["1"]["step_overhead_us"] += 500.0
    busier = tmp_path / "busier.json"
    busier.write_text(json.dumps(raw))
    for tp, pp in ((1, 1), (2, 1), (1, 2)):  # the step overhead is paid once per step, whatever the layout
        base, _ = price(calibration, tp, pp)
        more, _ = price(busier, tp, pp)
        assert more.decode_ms_per_token - base.decode_ms_per_token == pytest.approx(0.5, rel=1e-6)
        assert more.prefill_ms - base.prefill_ms == pytest.approx(0.5, rel=1e-6)
    raw = json.loads(calibration.read_text())
    pricer = LinkPricer(cpu_topology(2), load_calibration(calibration), nic_gbps=1.0)
    hop = pricer.hop((0, "CPU0"), (0, "CPU1"))
    assert hop.link_class == "node" and hop.bandwidth_gbps == pytest.approx(raw["links"]["node"]["bandwidth_gbps"])


def test_missing_cpu_entry_is_a_clear_error(tmp_path):
    path = tmp_path / "gpu-only.json"
    path.write_text(json.dumps({"version": 1}))
    with pytest.raises(TopoplanError, match="no `cpu` entry"):
        read_calibration_file(path).cpu_entry()


def test_validate_tiny_three_layouts(calibration):
    done = topoplan("validate", "--model", "tiny", "--layouts", "tp=1;tp=2;pp=2", "--calibration", str(calibration),
                    "--batch", "2", "--prompt-len", "4", "--gen-len", "4", "--repeats", "1", "--json", "--force",
                    progress=True)
    assert done.returncode == 0, done.stderr
    # --json: no progress bar even where one could be drawn; stderr holds at most the busy-machine warnings
    assert "\x1b[" not in done.stderr
    assert all(line.startswith("topoplan: warning: ") for line in done.stderr.splitlines()), done.stderr
    result = json.loads(done.stdout)
    assert set(result["load"]["others_share"]) == {"run 1/1 of tp=1,pp=1,dp=1", "run 1/1 of tp=2,pp=1,dp=1",
                                                   "run 1/1 of tp=1,pp=2,dp=1"}
    assert [(r["tp"], r["pp"], r["dp"]) for r in result["rows"]] == [(1, 1, 1), (2, 1, 1), (1, 2, 1)]
    cores = result["cores"]
    assert [r["threads_per_rank"] for r in result["rows"]] == [cores, max(1, cores // 2), max(1, cores // 2)]
    # the split the runner ran is the one the planner priced (tiny: 4 layers)
    whole = [{"pp_rank": 0, "first_layer": 0, "last_layer": 3, "layers": 4}]
    halves = [{"pp_rank": 0, "first_layer": 0, "last_layer": 1, "layers": 2},
              {"pp_rank": 1, "first_layer": 2, "last_layer": 3, "layers": 2}]
    assert [(r["stages_run"], r["stages_priced"]) for r in result["rows"]] == [
        (whole, whole), (whole, whole), (halves, halves)]
    for row in result["rows"]:
        for key in ("predicted_decode_ms", "measured_decode_ms", "predicted_prefill_ms", "measured_prefill_ms"):
            assert row[key] > 0, key
        assert row["error"] == pytest.approx((row["predicted_decode_ms"] - row["measured_decode_ms"])
                                             / row["measured_decode_ms"])
    best_p = min(result["rows"], key=lambda r: r["predicted_decode_ms"])
    best_m = min(result["rows"], key=lambda r: r["measured_decode_ms"])
    assert [result["best_predicted"][k] for k in ("tp", "pp")] == [best_p[k] for k in ("tp", "pp")]
    assert [result["best_measured"][k] for k in ("tp", "pp")] == [best_m[k] for k in ("tp", "pp")]
    assert result["order_matches"] == (result["predicted_order"] == result["measured_order"])
    speed = result["drift"]  # the machine's GEMV rate now against the calibration's
    calibrated = json.loads(calibration.read_text())["cpu"]["threads"][str(cores)]["gemv_gbps"]
    assert speed["gemv_gbps_calibrated"] == calibrated and speed["gemv_gbps_before"] > 0
    assert speed["worst"] == pytest.approx(max(abs(speed[k] - calibrated) for k in ("gemv_gbps_before",
                                                                                    "gemv_gbps_after")) / calibrated)
    assert (speed["warning"] is None) == (speed["worst"] <= DRIFT_WARN)


def test_drift_warns_when_the_machine_slowed_since_calibration():
    assert drift(20.0, 19.0, 21.5)["warning"] is None  # within 15%
    slowed = drift(20.0, 18.0, 10.0)
    assert slowed["worst"] == pytest.approx(0.5)
    assert slowed["warning"] == ("memory bandwidth 18.0 GB/s before and 10.0 after the runs, 20.0 in the "
                                 "calibration (50% apart): the machine's speed changed, recalibrate")


def test_validate_moe_checkpoint_with_expert_parallel_rows(calibration, tmp_path):
    """A small Mixtral (byte-sized vocabulary for validate's prompts): TP2 with experts TP-sharded, and EP2."""
    import transformers as tf

    folder = tmp_path / "mixtral"
    config = tf.MixtralConfig(vocab_size=264, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                              num_experts_per_tok=2, max_position_embeddings=64)
    tf.MixtralForCausalLM(config).save_pretrained(folder)
    done = topoplan("validate", "--model", str(folder), "--layouts", "tp=2;tp=2,ep=2", "--calibration",
                    str(calibration), "--batch", "2", "--prompt-len", "4", "--gen-len", "4", "--repeats", "1", "--json",
                    "--force")  # --force: the shared test machine is usually busy
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(r["tp"], r["ep"]) for r in result["rows"]] == [(2, 1), (2, 2)]
    ep = result["rows"][1]
    assert ep["predicted_decode_ms"] > 0 and ep["measured_decode_ms"] > 0
    assert ep["reasons"][0].startswith("EP2 ")  # priced as expert-parallel, its all-to-alls on the CPU link
    assert "tp=2,pp=1,dp=1,ep=2" in result["predicted_order"]
    refused = topoplan("validate", "--model", str(folder), "--layouts", "tp=1,dp=2,ep=2", "--calibration",
                       str(calibration), "--json", "--force", timeout=60)
    assert refused.returncode == 2 and "runs ep dividing tp" in refused.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny"], "--calibration FILE is needed"),
    (["--model", "tiny", "--calibration", "nope.json"],
     "nope.json: cannot read it: No such file or directory; expected a topoplan calibration file"),
])
def test_validate_bad_input(args, message):
    done = topoplan("validate", *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_cpu_device_formulas(tmp_path):
    """Hand-computed: 2 cores, GEMV 12 GB/s on one thread and 16 GB/s on both."""
    path = tmp_path / "cal.json"
    probes = {"stream_gbps": 9.0, "gemm_tflops": 0.05, "layer_overhead_us": 100.0,
              "matmul_tflops": {"1": 0.004, "2": 0.004, "8": 0.02, "64": 0.05}}
    path.write_text(json.dumps({"version": 1, "cpu": {"cores": 2, "numa_nodes": 1, "memory_bytes": 8e9, "threads": {
        "1": {**probes, "gemv_gbps": 12.0}, "2": {**probes, "gemv_gbps": 16.0, "matmul_tflops": {"1": 0.09}}}}}))
    entry = read_calibration_file(path).cpu_entry()
    assert cpu_device(entry, 2, 1, 1).memory_bandwidth_gbps == 16.0  # TP1 on both cores: the whole socket
    assert cpu_device(entry, 1, 1, 1).memory_bandwidth_gbps == 12.0  # one stage of PP2 streams alone: its core's limit
    assert cpu_device(entry, 1, 2, 1).memory_bandwidth_gbps == 8.0  # TP2 / DP2: two ranks split the socket
    assert cpu_device(entry, 2, 1, 64).tflops["fp32"] == 0.09 and cpu_device(entry, 1, 2, 1).memory_bytes == 4e9
    # the FLOP rate follows the rows of the product: probed points, log2 interpolation, clamped at the ends
    rates = [cpu_device(entry, 1, 2, rows).tflops["fp32"] for rows in (1, 2, 4, 8, 32, 64, 1000)]
    assert rates == pytest.approx([0.004, 0.004, 0.012, 0.02, 0.04, 0.05, 0.05])
    topology = cpu_topology(3)
    assert [g.id for g in topology.gpus] == ["CPU0", "CPU1", "CPU2"] and topology.numa_nodes() == [0]
    assert {l.kind.value for l in topology.links()} == {"node"} and len(topology.links()) == 3


def test_gpu_calibration_sweeps_one_pair_per_link_class():
    from topoplan.bench.calibrate import gpu_pairs_by_class

    # H100 NVL: NVLink pairs, PCIe switches under one socket (NODE), and across sockets (SYS)
    assert gpu_pairs_by_class(str(ROOT / "fixtures/topo/17_h100-nvl-8gpu-nv12-pairs-2nic.txt")) == {
        "nvlink": (0, 1), "node": (0, 2), "sys": (0, 4)}
