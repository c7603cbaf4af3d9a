"""`topoplan bench` end to end: 2 gloo ranks on this machine, tiny sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.bench.definitions import OPS

ROOT = Path(__file__).resolve().parent.parent


def topoplan(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    svg = tmp_path_factory.mktemp("bench") / "busbw.svg"
    done = topoplan("bench", "--ranks", "2", "--backend", "gloo", "--sizes", "4K:16K", "--iters", "2", "--warmup", "1",
                    "--json", "--plot", str(svg))
    assert done.returncode == 0, done.stderr
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


def test_one_rank_skips_sendrecv_and_table_lists_it():
    done = topoplan("bench", "--ranks", "1", "--sizes", "4K", "--iters", "1", "--warmup", "0",
                    "--ops", "all_reduce,sendrecv")
    assert done.returncode == 0, done.stderr
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
])
def test_bad_input_is_one_line_exit_2(args, message):
    done = topoplan("bench", *args, timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
