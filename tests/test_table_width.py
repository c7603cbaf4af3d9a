"""Every table (plan, launch --explain, inspect, list, bench, validate) at 80 columns and at a wide width: no
line longer than the width, no value cut to '…', no trailing blanks, and the wide rendering uses the room it is
given (issue 12, "80 columns")."""

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from topoplan.bench.report import print_bench, print_validate
from topoplan.bench.validate import drift
from topoplan.cli import app
from topoplan.plan.catalog import gpu_rows, model_rows

DGX_A100 = "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
OCI = "fixtures/topo/26_oci-bm-gpu4-a100-8gpu-nv12-18nic-nps4.txt"
WIDTHS = (80, 200)


def check(text: str, width: int) -> None:
    lines = text.splitlines()
    assert lines, "nothing was printed"
    too_long = [line for line in lines if len(line) > width]
    assert too_long == [], f"{len(too_long)} line(s) over {width} columns: {too_long[0]!r}"
    assert "…" not in text, "a value was cut"
    trailing = [line for line in lines if line != line.rstrip()]
    assert trailing == [], f"trailing blanks: {trailing[0]!r}"


def cli(width: int, *args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code in (0, 2), result.output
    return result


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", [
    ("-m", "llama-3-8b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--top", "0"),
    ("-m", "70b", "--topo", OCI, "--gpu", "a100-80gb", "--nodes", "2", "--batch", "8", "--objective", "throughput"),
    ("-m", "405b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--top", "3"),  # nothing fits: rows marked "no"
])
def test_plan(width, args):
    check(cli(width, "plan", *args).stdout, width)


def test_plan_uses_a_wide_terminal():
    args = ("plan", "-m", "llama-3-8b", "--topo", DGX_A100, "--gpu", "a100-80gb", "--top", "3")
    wide, narrow = cli(200, *args).stdout, cli(80, *args).stdout
    assert "GPU groups" in wide.splitlines()[2] and max(map(len, wide.splitlines())) > 100  # one table, all columns
    assert "GPU groups, then why:" in narrow


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", [
    ("--topo", DGX_A100, "--layout", "tp=8"),
    ("--topo", OCI, "--layout", "tp=8,dp=2", "--nodes", "2", "--hosts", "node-a.example.com,node-b.example.com"),
])
def test_launch_explain(width, args):
    result = cli(width, "launch", "--model", "tiny", "--explain", *args)
    assert result.exit_code == 0, result.stderr
    check(result.stderr, width)
    assert "NCCL_IB_HCA" in result.stderr  # the long values are all there, folded rather than cut


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect(width):
    result = cli(width, "inspect", "-f", OCI)
    assert result.exit_code == 0, result.stderr
    check(result.stdout, width)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("catalog", ["gpus", "models"])
def test_list(width, catalog):
    result = cli(width, "list", catalog)
    assert result.exit_code == 0, result.stderr
    check(result.stdout, width)
    assert "[10]" in result.stdout  # the two-digit source numbers are whole
    rows = gpu_rows() if catalog == "gpus" else model_rows()
    words = set(result.stdout.split())
    for row in rows:  # every name and alias whole, none folded into pieces
        assert {row.get("key", row.get("name")), *row["aliases"]} <= words, row["aliases"]


def render(printer, result: dict, width: int) -> str:
    buffer = io.StringIO()
    printer(result, Console(file=buffer, width=width, color_system=None))
    return buffer.getvalue()


def bench_result(check_data: bool) -> dict:
    """The largest figures a GPU sweep prints: 8 GiB buffers, seconds-long points, both forms."""
    rows = []
    for op, places in (("all_reduce", (True,)), ("all_gather", (False, True)), ("broadcast", (True,)),
                       ("sendrecv", (False,))):
        for place in places:
            for size in (4096, 8 << 30):
                rows.append({"op": op, "size_bytes": size, "count": size // 4, "in_place": place,
                             "redop": "sum" if op == "all_reduce" else "none",
                             "root": 0 if op == "broadcast" else -1, "time_us": 2225678.4 if size > 4096 else 12.3,
                             "median_us": 12.0, "algbw_gbps": 3859.86, "busbw_gbps": 6754.76,
                             "wrong": 123456 if check_data else None})
    return {"backend": "nccl", "device": "cuda", "group_size": 8, "group": "world", "dtype": "bfloat16",
            "iters": 20, "results": rows, "skipped": [{"op": "gather", "in_place": False,
                                                       "reason": "nccl cannot run gather on bfloat16: " + "x" * 90}],
            "check": check_data, "avg_busbw_gbps": {"all_reduce": 6754.76, "all_gather": 6754.76}}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("check_data", [False, True])
def test_bench(width, check_data):
    text = render(print_bench, bench_result(check_data), width)
    check(text, width)
    assert "2147483648" in text or width == 80  # the element count: there when the width holds it
    assert "2225678" in text and "6754.76" in text and ("123456" in text) == check_data


CALIBRATED_GEMV_GBPS = 20.0


def validate_result() -> dict:
    rows = []
    for tp, pp, dp in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)):
        ran = [{"layers": 24 // pp}] * pp
        priced = ran if pp == 1 else [{"layers": 13}, {"layers": 11}]
        rows.append({"tp": tp, "pp": pp, "dp": dp, "threads_per_rank": 2 if tp * pp * dp == 1 else 1,
                     "predicted_prefill_ms": 685.6234, "measured_prefill_ms": 12345.678, "prefill_error": -0.9445,
                     "predicted_decode_ms": 123.4567, "measured_decode_ms": 1098.7654, "error": -0.8876,
                     "stages_run": ran, "stages_priced": priced})
    return {"model": "small", "batch": 2, "prompt_len": 32, "gen_len": 32, "best_predicted": rows[0],
            "best_measured": rows[1], "rows": rows, "load_average": [8.6, 9.1], "cores": 2, "order_matches": False,
            "predicted_order": ["tp=1,pp=1,dp=1", "tp=2,pp=1,dp=1", "tp=1,pp=2,dp=1", "tp=1,pp=1,dp=2"],
            "measured_order": ["tp=2,pp=1,dp=1", "tp=1,pp=1,dp=1", "tp=1,pp=1,dp=2", "tp=1,pp=2,dp=1"],
            "drift": drift(CALIBRATED_GEMV_GBPS, 11.0, 9.5)}


@pytest.mark.parametrize("width", WIDTHS)
def test_validate(width):
    text = render(print_validate, validate_result(), width)
    check(text, width)
    for value in ("685.62", "12345.68", "-94%", "123.457", "1098.765", "tp1 pp2 dp1 "):
        assert value in text
    assert "12/12 | 13/11 DIFFER" in text and "[red]" not in text  # the mismatch, in the table or under it
