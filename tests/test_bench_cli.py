"""`topoplan bench` end to end: 2 gloo ranks on this machine, tiny sizes."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.bench.definitions import OPS

ROOT = Path(__file__).resolve().parent.parent


def topoplan(*args: str, timeout: float = 180, progress: bool = False) -> subprocess.CompletedProcess:
    """The CLI with stdout and stderr piped; `progress`: TOPOPLAN_PROGRESS=1, drawn as on a terminal."""
    env = {k: v for k, v in os.environ.items() if k != "TOPOPLAN_PROGRESS"} | (
        {"TOPOPLAN_PROGRESS": "1"} if progress else {})
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    svg = tmp_path_factory.mktemp("bench") / "busbw.svg"
    done = topoplan("bench", "--ranks", "2", "--backend", "gloo", "--sizes", "4K:16K", "--iters", "2", "--warmup", "1",
                    "--json", "--plot", str(svg), progress=True)
    assert done.returncode == 0, done.stderr
    assert "sweeping" not in done.stderr  # --json: no progress bar, even where one could be drawn
    return json.loads(done.stdout), svg


def test_json_shape_every_op_every_size(sweep):
    result, _ = sweep
    assert result["backend"] == "gloo" and result["world"] == 2 and result["group_size"] == 2
    assert result["sizes"] == [4096, 8192, 16384]
    measured = {(r["op"], r["size_bytes"]) for r in result["results"]}
    skipped = {s["op"] for s in result["skipped"]}
    for op in OPS:  # every op is either measured at every size or listed as skipped, never dropped
        assert op in skipped or all((op, size) in measured for size in (4096, 8192, 16384)), op
    for row in result["results"]:
        assert row["time_us"] > 0 and row["median_us"] > 0 and row["count"] * 4 == row["size_bytes"]
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["time_us"] / 1e3)
        factor = {"all_reduce": 1.0, "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}.get(row["op"], 0.5)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)


def test_plot_is_an_svg_with_one_line_per_op(sweep):
    result, svg = sweep
    text = svg.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert text.count("<polyline") == len({r["op"] for r in result["results"]})


def test_ops_the_backend_lacks_are_skipped_with_the_reason():
    # gloo has no fp8 reductions or gathers; point-to-point still moves the bytes
    done = topoplan("bench", "--ranks", "2", "--backend", "gloo", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                    "--ops", "all_reduce,all_gather,sendrecv", "--dtype", "float8_e4m3fn", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    reasons = {s["op"]: s["reason"] for s in result["skipped"]}
    assert set(reasons) == {"all_reduce", "all_gather"}
    assert all(r.startswith("gloo cannot run") and "float8_e4m3fn" in r for r in reasons.values())
    assert [r["op"] for r in result["results"]] == ["sendrecv"]


def test_check_reports_no_wrong_value_on_real_ranks_in_both_forms():
    # nccl-tests' -c, -o, -r: 2 gloo ranks, every form the backend runs, a non-default reduction and root
    done = topoplan("bench", "--ranks", "2", "--backend", "gloo", "--sizes", "4K,12K", "--iters", "1", "--warmup",
                    "0", "-c", "-o", "max", "-r", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["check"] is True and result["redop"] == "max" and result["root"] == 1
    rows = result["results"]
    assert rows and all(r["wrong"] == 0 for r in rows)
    forms = {(r["op"], r["in_place"]) for r in rows}
    assert ("all_gather", False) in forms and ("all_gather", True) in forms  # gloo runs both
    assert {r["redop"] for r in rows if r["op"] == "all_reduce"} == {"max"}
    assert {r["redop"] for r in rows if r["op"] == "sendrecv"} == {"none"}
    assert {r["root"] for r in rows if r["op"] in ("broadcast", "reduce")} <= {1}
    assert {r["root"] for r in rows if r["op"] == "all_reduce"} == {-1}
    ag = [r["busbw_gbps"] for r in rows if r["op"] == "all_gather"]
    assert result["avg_busbw_gbps"]["all_gather"] == pytest.approx(sum(ag) / len(ag))


def test_table_has_nccl_tests_columns_and_closing_lines():
    done = topoplan("bench", "--ranks", "2", "--backend", "gloo", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                    "--ops", "all_gather,all_reduce", "-c")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "out-of-place" in out and "in-place" in out and "#wrong" in out and "algbw" in out
    assert "# Out of bounds values : 0 OK" in out
    assert "# Avg bus bandwidth    : " in out and "(all_gather)" in out and "(all_reduce)" in out
    assert "all_reduce, redop sum" in out


def test_one_rank_busbw_is_zero_as_nccl_tests_prints_it():
    done = topoplan("bench", "--ranks", "1", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                    "--ops", "all_reduce,all_gather,broadcast", "--json")
    assert done.returncode == 0, done.stderr
    rows = {(r["op"], r["in_place"]): r for r in json.loads(done.stdout)["results"]}
    assert rows[("all_reduce", True)]["busbw_gbps"] == 0.0 and rows[("all_gather", False)]["busbw_gbps"] == 0.0
    broadcast = rows[("broadcast", True)]
    assert broadcast["busbw_gbps"] == broadcast["algbw_gbps"] > 0  # factor 1, as nccl-tests


def test_all_skipped_says_so():
    done = topoplan("bench", "--ranks", "1", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--ops", "sendrecv")
    assert done.returncode == 0, done.stderr
    assert "nothing measured: every op was skipped" in done.stdout


def test_nccl_without_cuda_is_refused_in_the_parent():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nccl is runnable here")
    done = topoplan("bench", "--ranks", "2", "--backend", "nccl", "--sizes", "4K", timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("topoplan: error: --backend nccl: 2 rank(s) need a CUDA device each")
    assert done.stderr.count("\n") == 1 and "[rank" not in done.stderr


def test_progress_is_drawn_on_a_terminal_only():
    args = ("bench", "--ranks", "1", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--ops", "all_reduce")
    forced = topoplan(*args, progress=True)  # as if stderr were a terminal
    assert forced.returncode == 0, forced.stderr
    assert "sweeping" in forced.stderr and "\x1b[" in forced.stderr and "sweeping" not in forced.stdout


def test_one_rank_skips_sendrecv_and_table_lists_it():
    done = topoplan("bench", "--ranks", "1", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                    "--ops", "all_reduce,sendrecv")
    assert done.returncode == 0, done.stderr
    assert "sweeping" not in done.stderr  # piped: no progress bar
    assert "all_reduce" in done.stdout and "skipped sendrecv: sendrecv needs at least 2 ranks" in done.stdout


def test_layout_groups(tmp_path):
    done = topoplan("bench", "--layout", "tp=1,dp=2", "--groups", "dp", "--sizes", "4K", "--iters", "1",
                    "--warmup", "0", "--ops", "all_reduce", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["groups"] == [[0, 1]] and result["group"] == "dp"


@pytest.mark.parametrize("args, message", [
    (["--sizes", "4Q"], "size '4Q'"),
    (["--ops", "allreduce"], "unknown allreduce"),
    (["--ranks", "2", "--layout", "tp=2"], "pass one"),
    (["--plot", "/nonexistent-dir/x.svg"], "/nonexistent-dir: the folder does not exist"),
    (["--ranks", "2", "--root", "2", "--ops", "broadcast"], "--root 2: the groups have 2 rank(s)"),
    (["--redop", "mean"], "--redop 'mean': expected one of sum, prod, min, max, avg"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    done = topoplan("bench", *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="shared memory is x86-64 only")
def test_shared_memory_all_reduce_sendrecv_and_all_to_all_pass_the_data_check():
    """--shared-memory: what the runner's TP groups, pipeline stages and EP groups pay, each result checked; 2 MiB
    is above a pipeline slot (1 MiB), so sendrecv there takes gloo after its shared-memory header."""
    done = topoplan("bench", "--ranks", "2", "--ops", "all_reduce,sendrecv,all_to_all", "--sizes", "4K:2M",
                    "--iters", "2", "--warmup", "1", "--check", "--shared-memory", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["shared_memory"] is True and result["skipped"] == []
    rows = {(r["op"], r["size_bytes"]): r["wrong"] for r in result["results"]}
    assert set(rows) == {(op, 4096 << k) for op in ("all_reduce", "sendrecv", "all_to_all") for k in range(10)}
    assert set(rows.values()) == {0}
