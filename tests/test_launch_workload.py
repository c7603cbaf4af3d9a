"""`launch` takes `plan`'s workload and limit options (--batch, --prompt-len, --gen-len, --dtype, --kv-dtype,
--max-ttft-ms, --max-tpot-ms) and plans with them wherever it plans: `--rank N` launches `plan`'s row N for the same
options (and gives a serving engine that row's batch, lengths and KV dtype), `--disagg` launches the deployment
`plan --disagg` chooses for them, and `--disagg --rank N` its N-th candidate. Where nothing is planned (--layout) or
the plan is a file's (--plan FILE), they are refused in one line.

The options below are chosen so that they move the plan: on the H100 NVL pairs (fixture 17) a 8192-token prompt with
an fp8 KV cache, a 40 ms TPOT limit and the throughput objective put tp=2 first where the default workload puts tp=4
(TensorRT-LLM: tp=2,pp=2 where tp=4); on the H200 box (fixture 41) a 4096 + 256-token request with an fp8 KV cache
and a 30 ms TPOT limit gives decode workers tp=2 where the default workload gives tp=1,pp=2. A launch that dropped
them would launch the default's rows, and these tests would fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.launch_support import FIXTURES
from tests.test_engine_lines import NVL_PAIRS, after_module, sglang_parser, vllm_parse
from topoplan.cli import app

H200 = str(FIXTURES / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt")
ROWS = ["--prompt-len", "8192", "--max-tpot-ms", "40", "--kv-dtype", "fp8", "--objective", "throughput"]
DISAGG = ["--prompt-len", "4096", "--gen-len", "256", "--max-tpot-ms", "30", "--kv-dtype", "fp8"]
# each engine's options for what the plan priced: (requests in flight, prompt + generated tokens, KV dtype)
SETTINGS = {"vllm": ("--max-num-seqs", "--max-model-len", ("--kv-cache-dtype", "fp8")),
            "sglang": ("--max-running-requests", "--context-length", ("--kv-cache-dtype", "fp8_e4m3")),
            "trtllm": ("--max_batch_size", "--max_seq_len", None)}


def invoke(*args: str) -> dict:
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def refused(*args: str) -> str:
    """The one line a refused command prints; it exits 2 without a traceback."""
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 2 and (done.exception is None or isinstance(done.exception, SystemExit)), done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("topoplan: error: "), done.stderr
    return lines[0]


def word_after(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


@pytest.mark.parametrize(("engine", "first", "default_first"), [
    ("topoplan", (2, 1, 4), (4, 1, 2)), ("vllm", (2, 1, 4), (4, 1, 2)), ("sglang", (2, 1, 4), (4, 1, 2)),
    ("trtllm", (2, 2, 1), (4, 1, 1))])
def test_launch_rank_n_with_workload_and_limits_launches_plans_row_n(engine: str, first: tuple,
                                                                     default_first: tuple) -> None:
    """`launch --engine E --rank N` with --prompt-len/--kv-dtype/--max-tpot-ms/--objective launches row N of `plan`
    with the same options (layout and every rank's GPU), and a serving engine gets that row's requests in flight,
    8192 + 128 = 8320 tokens and the fp8 KV cache."""
    base = ["--topo", NVL_PAIRS, "--gpu", "h100-nvl", "--model", "70b", "--engine", engine]
    rows = invoke("plan", *base, *ROWS, "--json")["layouts"]
    default = invoke("plan", *base, "--json")["layouts"]
    assert (rows[0]["tp"], rows[0]["pp"], rows[0]["dp"]) == first
    assert (default[0]["tp"], default[0]["pp"], default[0]["dp"]) == default_first
    for n, row in enumerate(rows[:3], start=1):
        document = invoke("launch", *base, *ROWS, "--rank", str(n), "--checkpoint", "/models/llama", "--format",
                          "json")
        layout = document["layout"]
        assert (layout["tp"], layout["pp"], layout["dp"]) == (row["tp"], row["pp"], row["dp"])
        assert {r["rank"]: r["gpu"] for r in document["ranks"]} == {p["rank"]: p["gpu"] for p in row["placement"]}
        if engine == "topoplan":
            continue
        seqs, length, kv = SETTINGS[engine]
        for node in document["nodes"]:
            argv = node["argv"]
            assert word_after(argv, seqs) == str(row["served"]["concurrency_per_replica"])
            assert word_after(argv, length) == "8320"
            if kv is not None:
                assert word_after(argv, kv[0]) == kv[1]


def test_rank_n_engine_lines_with_the_plans_settings_parse() -> None:
    """The settings --rank N now hands the engine are options its parser takes: SGLang 0.5.23's recorded parser, and
    vLLM's own (its venv)."""
    base = ["--topo", NVL_PAIRS, "--gpu", "h100-nvl", "--model", "70b", *ROWS, "--rank", "1", "--checkpoint", "/m",
            "--format", "json"]
    sglang = invoke("launch", *base, "--engine", "sglang")["nodes"][0]["argv"]
    args = sglang_parser().parse_args(after_module(tuple(sglang), "sglang.launch_server"))
    assert (args.context_length, args.kv_cache_dtype, args.tp_size) == ("8320", "fp8_e4m3", 2)  # as recorded
    vllm = invoke("launch", *base, "--engine", "vllm")["nodes"][0]["argv"]
    parsed = vllm_parse([after_module(tuple(vllm), "vllm.entrypoints.cli.main")[1:]])[0]
    assert (parsed["max_model_len"], parsed["kv_cache_dtype"], parsed["tensor_parallel_size"]) == (8320, "fp8", 2)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_launch_disagg_with_workload_and_limits_is_plan_disaggs_deployment(engine: str) -> None:
    """`launch --disagg` with the workload and limits writes the deployment `plan --disagg` chooses for them: its
    P:D, each worker's layout and GPUs, and 4096 + 256 = 4352 tokens on every worker."""
    base = ["--engine", engine, "--topo", H200, "--gpu", "h200", "--model", "llama-3.1-70b"]
    planned = invoke("plan", "--disagg", *base, *DISAGG, "--json")["disagg"]
    assert planned["decode_layout"] == "tp=2,pp=1,dp=1"
    default = invoke("plan", "--disagg", *base, "--json")["disagg"]  # the options move the plan: another TPOT
    assert default["served"]["tpot_ms"] != pytest.approx(planned["served"]["tpot_ms"], rel=0.05)
    launched = invoke("launch", "--disagg", *base, *DISAGG, "--checkpoint", "/m", "--format", "json")
    assert launched["disagg"] == planned["ratio"]
    workers = [p for p in launched["processes"] if p["role"] != "router"]
    assert [(p["name"], p["gpus"]) for p in workers] == [(w["name"], w["gpus"]) for w in planned["workers"]]
    length, tp = ("--context-length", "--tp-size") if engine == "sglang" else ("--max-model-len",
                                                                               "--tensor-parallel-size")
    for p, w in zip(workers, planned["workers"]):
        assert word_after(p["argv"], length) == "4352"
        assert word_after(p["argv"], tp) == str(w["layout"]["tp"])


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_launch_disagg_rank_n_is_plan_disaggs_candidate_n(engine: str, tmp_path: Path) -> None:
    """`launch --disagg --rank N` writes `plan --disagg --json`'s candidates[N-1] (1: the chosen one): its P:D and
    each role's TP x PP; `--plan FILE --rank N` the saved file's; a rank past the list is refused in one line."""
    base = ["--engine", engine, "--topo", H200, "--gpu", "h200", "--model", "llama-3.1-70b", *DISAGG]
    saved = tmp_path / "disagg.json"
    candidates = invoke("plan", "--disagg", *base, "--json", "-o", str(saved))["disagg"]["candidates"]
    assert len(candidates) == 8 and candidates[3]["ratio"] == [1, 1]  # the 4th: tp=4 prefill, tp=2,pp=2 decode
    tp, pp = ("--tp-size", "--pp-size") if engine == "sglang" else ("--tensor-parallel-size",
                                                                    "--pipeline-parallel-size")
    for n in (1, 4):
        want = candidates[n - 1]
        for source in (base, ["--plan", str(saved)]):
            launched = invoke("launch", "--disagg", *source, "--rank", str(n), "--checkpoint", "/m", "--format",
                              "json")
            assert [launched["disagg"]["prefill"], launched["disagg"]["decode"]] == want["ratio"]
            for p in launched["processes"]:
                if p["role"] == "router":
                    continue
                layout = f"tp={word_after(p['argv'], tp)},pp={word_after(p['argv'], pp)},dp=1"
                assert layout == want[f"{p['role']}_layout"], (n, p["name"])
    line = refused("launch", "--disagg", *base, "--rank", "9", "--checkpoint", "/m")
    assert "--rank 9" in line and "8 deployment(s)" in line
    document = json.loads(saved.read_text())
    document["disagg"]["candidates"][3]["ratio"] = [2, 1]
    saved.write_text(json.dumps(document))
    line = refused("launch", "--disagg", "--plan", str(saved), "--rank", "4", "--checkpoint", "/m")
    assert "stale plan: candidate 4 is now" in line


def test_workload_options_are_refused_where_nothing_is_planned_with_them(tmp_path: Path) -> None:
    """--layout is not planned and --plan FILE holds what priced it: the workload and limit options would reach
    nothing there, so they are refused, each named, in one line."""
    topo = ["--topo", NVL_PAIRS, "--gpu", "h100-nvl", "--model", "70b"]
    line = refused("launch", *topo, "--layout", "tp=2", "--prompt-len", "4096", "--max-tpot-ms", "30")
    assert "--layout tp=2,pp=1,dp=1 is launched without a plan, so --prompt-len, --max-tpot-ms" in line
    assert "your own COMMAND" in line
    line = refused("launch", *topo, "--engine", "vllm", "--layout", "tp=2", "--kv-dtype", "fp8", "--checkpoint", "/m")
    assert "--kv-dtype would change nothing" in line and "--max-model-len" in line
    saved = tmp_path / "plan.json"
    invoke("plan", *topo, "-o", str(saved), "--json")
    line = refused("launch", "--plan", str(saved), "--rank", "1", "--batch", "4", "--max-ttft-ms", "500")
    assert "--plan FILE holds the options that priced it: drop --batch, --max-ttft-ms" in line
    disagg = tmp_path / "disagg.json"
    invoke("plan", "--disagg", "--engine", "sglang", "--topo", H200, "--gpu", "h200", "--model", "llama-3.1-70b",
           "-o", str(disagg), "--json")
    line = refused("launch", "--disagg", "--plan", str(disagg), "--gen-len", "64", "--checkpoint", "/m")
    assert "does not take --gen-len" in line


def test_launch_help_lists_each_workload_and_limit_option_once() -> None:
    """The options come from plan's own declarations (Workload, Limits nested in LaunchRequest), each once."""
    command = typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]
    flags = [name for param in command.params for name in param.opts]
    for flag in ("--batch", "--prompt-len", "--gen-len", "--dtype", "--kv-dtype", "--max-ttft-ms", "--max-tpot-ms",
                 "--prompt", "--rank"):
        assert flags.count(flag) == 1, flag
    done = CliRunner().invoke(app, ["launch", "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0
    assert "--max-tpot-ms" in done.stdout and "candidates" in done.stdout


def test_plan_disagg_table_numbers_the_candidates_as_launch_rank_takes_them() -> None:
    """The table lists the placed candidates in `--json`'s `candidates` order, numbered from 1: what --rank N
    indexes."""
    base = ["plan", "--disagg", "--engine", "sglang", "--topo", H200, "--gpu", "h200", "--model", "llama-3.1-70b",
            *DISAGG]
    candidates = invoke(*base, "--json")["disagg"]["candidates"]
    done = CliRunner().invoke(app, base, env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    table = done.stdout.split("launch --disagg --rank N` launches #N")[1]
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()][:len(candidates)]
    assert [(int(r[0]), r[1]) for r in rows] == [(n, f"{c['ratio'][0]}:{c['ratio'][1]}")
                                                 for n, c in enumerate(candidates, start=1)]


def test_a_python_caller_giving_a_layout_and_a_workload_is_refused_too() -> None:
    """LaunchRequest built in Python: a fixed layout with a workload that nothing would price is refused, as on the
    command line."""
    from topoplan.errors import TopoplanError
    from topoplan.launch.command import LaunchRequest
    from topoplan.layout import Layout
    from topoplan.plan.cost import Workload

    with pytest.raises(TopoplanError, match="is launched without a plan, so a workload or limits would change"):
        LaunchRequest(layout=Layout.parse("tp=2"), workload=Workload(prompt_len=4096))
