"""`topoplan bench --kv-transfer` (2 ranks on this machine, the tiny model) and the published P/D table's reader."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.bench.definitions import parse_sizes
from topoplan.bench.kv_request import DEFAULT_MODEL, DEFAULT_PROMPTS, FIT_SIZES
from topoplan.bench.published_pd import DEFAULT_FILE, published_rows

ROOT = Path(__file__).resolve().parent.parent
# tiny: 4 layers, 4 KV heads, head_dim 128 / 8 heads = 16; fp32 K and V: 2 x 4 x 16 x 4 B = 512 B a token a layer
TINY_LAYERS, TINY_LAYER_BYTES_PER_TOKEN = 4, 512
SLOT = 4 << 20  # topoplan.bench.kv_worker.SLOT_BYTES, written out: a shared-memory message


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "TOPOPLAN_PROGRESS"})


@pytest.fixture(scope="module")
def measured():
    done = run("-m", "topoplan", "bench", "--kv-transfer", "-m", "tiny", "--prompt-len", "64,4K", "--dtype",
               "float32", "--iters", "2", "--warmup", "1", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_path_mode_and_prompt_moves_the_hand_counted_bytes(measured):
    paths = ["shm", "gloo"] if platform.machine() in ("x86_64", "AMD64") else ["gloo"]
    assert measured["paths"] == paths and measured["model"] == "tiny" and measured["layers"] == TINY_LAYERS
    rows = {(r["path"], r["mode"], r["prompt_tokens"]): r for r in measured["rows"]}
    assert set(rows) == {(p, m, t) for p in paths for m in ("whole", "per-layer") for t in (64, 4096)}
    for (path, mode, tokens), row in rows.items():
        layer = TINY_LAYER_BYTES_PER_TOKEN * tokens  # 32 KiB at 64 tokens, 2 MiB at 4096
        assert row["layer_bytes"] == layer and row["layers"] == TINY_LAYERS
        assert row["kv_bytes"] == row["bytes_moved"] == TINY_LAYERS * layer, (path, mode, tokens)
        assert row["wrong"] == 0, (path, mode, tokens)  # every byte landed where the prefill rank had it
        if mode == "per-layer":
            expected_messages = TINY_LAYERS * (-(-layer // SLOT) if path == "shm" else 1)
        else:
            expected_messages = -(-TINY_LAYERS * layer // SLOT) if path == "shm" else 1  # 8 MiB: 2 slot messages
        assert row["messages"] == expected_messages, (path, mode, tokens)
        assert row["gbps"] == pytest.approx(row["bytes_moved"] / row["measured_ms"] / 1e6)
        assert row["held_out"] == (TINY_LAYERS * layer > max(parse_sizes(FIT_SIZES)))
        assert row["priced_ms"] > 0 and row["priced_ratio"] == pytest.approx(row["measured_ms"] / row["priced_ms"])


def test_the_price_is_the_fitted_link_over_the_cache(measured):
    """price_transfer on the cpu machine: the path's fitted alpha plus the whole cache at its fitted bandwidth."""
    fit_sizes = parse_sizes(FIT_SIZES)
    for path in measured["paths"]:
        points = [p for p in measured["fit_points"] if p["path"] == path]
        assert [p["bytes_moved"] for p in points] == fit_sizes and all(p["wrong"] == 0 for p in points)
        link = measured["links"][path]
        assert link["alpha_us"] >= 0 and link["bandwidth_gbps"] > 0
        for row in (r for r in measured["rows"] if r["path"] == path):
            hand = (link["alpha_us"] + row["kv_bytes"] / (link["bandwidth_gbps"] * 1e3)) / 1e3
            assert row["priced_ms"] == pytest.approx(hand)


@pytest.mark.parametrize(("args", "says"), [
    (("--kv-transfer", "--ops", "all_reduce"), "--ops: the collective sweep's option"),
    (("--model", "tiny"), "--model needs --kv-transfer"),
    (("--kv-transfer", "-m", "Llama-3.1-405B", "--prompt-len", "1G"), "more than half of this machine's"),
    (("--kv-transfer", "-m", "tiny", "--prompt-len", "0"), "--prompt-len"),
])
def test_bad_kv_options_are_one_line_before_any_rank_starts(args, says):
    done = run("-m", "topoplan", "bench", *args, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("topoplan: error: ") and says in done.stderr


def test_published_table_prices_mooncakes_32k_request_by_hand():
    """Qwen3-8B bf16: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 147456 B a token; TP 8 -> TP 8 across two
    nodes, each GPU's eighth through its own PIX NIC at the stated 25 GB/s x bus efficiency 0.8 = 20 GB/s, plus
    the PIX, network and PIX latencies (5 + 8 + 5 us)."""
    row = next(r for r in published_rows() if r["id"] == "mooncake-vllm-qwen3-8b-32768")
    assert row["priced_bytes"] == 32768 * 147456
    hand_ms = (32768 * 147456 / 8 / 20e9 * 1e6 + 18 + 400) / 1e3  # bytes, 3 hops' alphas, connector setup
    assert row["priced_ms"] == pytest.approx(hand_ms)
    assert row["measured_ms"] == 31.65 and row["error"] == pytest.approx((hand_ms - 31.65) / 31.65)
    assert row["source"].startswith("https://github.com/kvcache-ai/Mooncake/")


def test_every_published_case_has_a_source_and_is_priced_or_says_why():
    rows = published_rows()
    assert len(rows) == len(json.loads(DEFAULT_FILE.read_text())["cases"])
    for row in rows:
        assert row["source"].startswith("https://") and row["what"]
        assert ("error" in row) != bool(row["not_priced"]), row["id"]


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d["cases"][0]["price"].update(nic_gbps=-1), "cases[0].price.nic_gbps: expected a positive number"),
    (lambda d: d["cases"][1].pop("measured"), "cases[1].measured: expected"),
    (lambda d: d["cases"][2]["price"].update(topology="fixtures/topo/nope.txt"), "cases[2].price.topology"),
    (lambda d: d["cases"][-1].pop("not_priced"), "not_priced: expected a non-empty string"),
    (lambda d: d.update(version=2), "\"version\": 1"),
])
def test_published_reader_rejects_a_bad_file_in_one_line(tmp_path, edit, says):
    document = json.loads(DEFAULT_FILE.read_text())
    edit(document)
    bad = tmp_path / "pd.json"
    bad.write_text(json.dumps(document))
    done = run("benchmarks/kv_transfer.py", "--published", "--file", str(bad), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"topoplan: error: {bad}: ")
    assert says in done.stderr


def test_published_reader_rejects_a_file_that_is_not_json(tmp_path):
    bad = tmp_path / "pd.json"
    bad.write_text("{not json")
    done = run("benchmarks/kv_transfer.py", "--published", "--file", str(bad), timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and str(bad) in done.stderr


def test_a_calibration_files_node_link_prices_too(tmp_path):
    """--calibration: the file's `node` link (what `plan --device cpu` prices with) gives a second price."""
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"version": 1, "links": {"node": {"alpha_us": 40.0, "bandwidth_gbps": 2.5}}}))
    done = run("-m", "topoplan", "bench", "--kv-transfer", "-m", "tiny", "--prompt-len", "64", "--dtype", "float32",
               "--iters", "1", "--warmup", "0", "--calibration", str(calibration), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["links"]["calibration"]["alpha_us"] == 40.0
    hand_ms = (40.0 + TINY_LAYERS * TINY_LAYER_BYTES_PER_TOKEN * 64 / 2.5e3) / 1e3  # 40 us + 131072 B at 2.5 GB/s
    for row in result["rows"]:
        assert row["calibration_ms"] == pytest.approx(hand_ms)
        assert row["calibration_ratio"] == pytest.approx(row["measured_ms"] / hand_ms)


def test_a_calibration_without_a_measured_node_bandwidth_is_refused(tmp_path):
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"version": 1, "links": {"node": {"alpha_us": 40.0}}}))
    done = run("-m", "topoplan", "bench", "--kv-transfer", "-m", "tiny", "--calibration", str(calibration),
               timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"{calibration}: links.node: no bandwidth_gbps" in done.stderr


def test_the_cli_help_names_the_requests_own_defaults():
    """cli.py writes the defaults into --model's and --prompt-len's help without importing kv_request (start-up
    time): they must stay the request's."""
    from dataclasses import fields

    from topoplan.cli import KvTransferView

    helps = {f.name: f.metadata["cli"].help for f in fields(KvTransferView)}
    assert f"(default {DEFAULT_MODEL})" in helps["model"]
    assert f"(default {DEFAULT_PROMPTS})" in helps["prompt_len"]
