"""benchmarks/runner_decode.py's bookkeeping (no timing): ranges, ratios paired by round, verdicts on the worst
round, the targets table, the size of the model it builds, its option checks, and that a busy cell runs beside
its spinning processes."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "runner_decode.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("runner_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_span_prints_the_range_or_one_figure(bench):
    assert bench.span([3.0, 1.25, 2.0]) == "1.25–3.00"
    assert bench.span([1.001, 0.999]) == "1.00"  # both ends print alike
    assert bench.span([12.04, 9.96], "{:.1f}", " ms") == "10.0–12.0 ms"
    assert bench.span([]) == "—"


def test_ratios_pair_rounds_and_the_verdict_takes_the_worst(bench):
    ours, hf = [10.0, 20.0, 10.0], [12.0, 21.0, 30.0]  # round 2: ours 20 ms against HF 21 ms
    ratios = bench.paired_ratios(ours, hf)
    assert ratios == pytest.approx([1.2, 1.05, 3.0])
    assert bench.verdict(ratios, 1.1) == "MISS"  # the best (3.0x) and the median (1.2x) pass; round 2 does not
    assert bench.verdict(ratios, 1.05) == "PASS"
    assert bench.verdict([1.0, 1.2], 1.0, strict=True) == "MISS"  # "faster than": equal is not faster
    assert bench.verdict([], 1.0) == "n/a"
    assert bench.verdict(ratios, None) == "n/a"
    assert bench.ratio_text([0.88, 0.93], percent=True) == "88–93%"
    assert bench.ratio_text([1.5], percent=False) == "1.50x"


def test_targets_table_rows(bench):
    report = bench.Report()
    report.series[("small", "TP1, 2 thread(s)")] = {"ours": [30.0, 40.0], "ours compiled": [20.0, 30.0],
                                                    "HF": [36.0, 42.0], "limit": [28.0, 38.0]}
    report.series[("tiny", "TP2, 2 ranks x 1 thread(s)")] = {"ours TP2": [5.0], "ours TP1": [4.0], "limit": [0.3]}
    report.keys.update({"TP1, 2 thread(s)": "tp1", "TP2, 2 ranks x 1 thread(s)": "tp2"})
    rows = bench.targets_table(report, 2)[2:]
    assert rows == [
        "| small | TP1, 2 thread(s) | ours / HF tok/s | 1.05–1.20x | ≥ 1.1x | MISS |",
        "| small | TP1, 2 thread(s) | ours --compile / HF tok/s | 1.40–1.80x | ≥ 1.1x | PASS |",
        "| small | TP1, 2 thread(s) | ours --compile / ours tok/s | 1.33–1.50x | — | n/a |",  # no target: shown
        "| small | TP1, 2 thread(s) | ours / vLLM tok/s | — | ≥ 1x | n/a |",  # not measured: shown, no verdict
        "| small | TP1, 2 thread(s) | ours: of the weight-streaming limit | 93–95% | ≥ 90% | PASS |",
        "| small | TP1, 2 thread(s) | ours --compile: of the weight-streaming limit | 127–140% | ≥ 90% | PASS |",
        "| tiny | TP2, 2 ranks x 1 thread(s) | ours TP2 / ours TP1 tok/s | 0.80x | — | n/a |",  # no target for tiny
    ]


def test_busy_targets_compare_the_ratio_to_vllm_busy_and_quiet_round_by_round(bench):
    report = bench.Report()
    title = "TP1, 2 thread(s), quiet and beside 1 spinning process(es)"
    # round 1: quiet ours 10 / vLLM 12 ms (1.2x), busy 20 / 30 (1.5x); round 2: quiet 10 / 11 (1.1x), busy 30 / 22
    report.series[("small", title)] = {"ours": [10.0, 10.0], "vLLM": [12.0, 11.0], "ours busy": [20.0, 30.0],
                                       "vLLM busy": [30.0, 22.0], "limit": [9.0, 9.0]}
    report.keys[title] = "busy"
    rows = bench.targets_table(report, 2)[2:]
    assert rows == [
        f"| small | {title} | ours: busy / quiet tok/s | 0.33–0.50x | — | n/a |",
        f"| small | {title} | vLLM: busy / quiet tok/s | 0.40–0.50x | — | n/a |",
        f"| small | {title} | ours / vLLM tok/s, busy | 0.73–1.50x | — | n/a |",
        f"| small | {title} | ours / vLLM: busy over quiet | 0.67–1.25x | ≥ 1x | MISS |",  # round 2: 0.73 / 1.1
    ]


def test_a_busy_cell_runs_beside_spinning_processes(bench):
    """The spinners are running while the cell is measured."""

    def busy_cpu_seconds() -> float:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return (fields[0] + fields[2]) / os.sysconf("SC_CLK_TCK")  # user + system, all CPUs

    def cell() -> float:
        before = busy_cpu_seconds()
        time.sleep(0.5)
        return busy_cpu_seconds() - before

    spun = bench.under_load(cell, 1)
    assert spun >= 0.3  # one process spun a core for most of the half second this cell slept


def test_figures_table_counts_a_batch_per_step(bench):
    report = bench.Report(stream_bytes={"tiny": 2_000_000})
    for batch, ms in ((4, 10.0), (64, 40.0)):  # two PP2 groups of one model: each its own rows and batch
        title = f"PP2 batch {batch}"
        report.series[("tiny", title)] = {"micro-batched": [ms], "not micro-batched": [2 * ms], "limit": [1.0]}
        report.keys[title], report.batches[title] = "pp2", batch
    rows = bench.figures_table(report, 1)[2:]
    assert rows == ["| tiny | PP2 batch 4 | micro-batched | 10.00 | 400.0 | 10% |",
                    "| tiny | PP2 batch 4 | not micro-batched | 20.00 | 200.0 | 5% |",
                    "| tiny | PP2 batch 4 | limit | 1.00 | 4000.0 | read once: 2.00 GB/s |",
                    "| tiny | PP2 batch 64 | micro-batched | 40.00 | 1600.0 | 2% |",
                    "| tiny | PP2 batch 64 | not micro-batched | 80.00 | 800.0 | 1% |",
                    "| tiny | PP2 batch 64 | limit | 1.00 | 64000.0 | read once: 2.00 GB/s |"]
    targets = bench.targets_table(report, 1)[2:]
    assert targets == ["| tiny | PP2 batch 4 | micro-batched / not tok/s | 2.00x | ≥ 1.5x | PASS |",
                       "| tiny | PP2 batch 64 | micro-batched / not tok/s | 2.00x | ≥ 1.5x | PASS |"]


def test_batch_list_parses(bench):
    assert bench.parse_args(["--batch", "4,64"]).batch == [4, 64]
    assert bench.parse_args([]).batch == [4, 64]
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch", "4,x"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch", "0"])


def test_big_is_memory_bound_and_byte_vocabulary(bench):
    c = bench.BIG
    head = c["hidden_size"] // c["num_attention_heads"]
    layer = (2 * c["hidden_size"] * c["num_attention_heads"] * head  # q, o
             + 2 * c["hidden_size"] * c["num_key_value_heads"] * head  # k, v
             + 3 * c["hidden_size"] * c["intermediate_size"])  # gate, up, down
    params = c["num_hidden_layers"] * layer + 2 * c["vocab_size"] * c["hidden_size"]
    assert 4 * params >= 600e6
    assert c["topoplan_byte_tokenizer"] and c["vocab_size"] > 258  # prompt ids are bytes; 256-258 BOS/EOS/PAD


def test_options(bench, capsys):
    args = bench.parse_args(["--models", "tiny,big", "--engines", "ours", "--threads", "3"])
    assert args.models == ["tiny", "big"] and args.engines == ["ours"]
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--models", "huge"])
    assert exit_info.value.code == 2
    assert bench.wanted_groups(args) == ["tp1", "1thread", "busy"]  # 3 threads do not split over 2 ranks
    assert "TP2: skipped" in capsys.readouterr().out


def test_vllm_column_says_why_it_is_skipped(bench, tmp_path):
    args = bench.parse_args(["--vllm-python", str(tmp_path / "missing")])
    python, why = bench.vllm_python_or_why(args, {"ours", "vllm"}, args.threads)
    assert python is None and "not found" in why
    args = bench.parse_args([])
    args.vllm_python = None
    assert bench.vllm_python_or_why(args, {"vllm"}, args.threads) == (
        None, "no vLLM Python: pass --vllm-python PATH or set TOPOPLAN_VLLM_PYTHON")
