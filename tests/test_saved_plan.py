"""`plan -o FILE` then `launch --plan FILE --rank N`: the row planned is the row launched, with what priced it on the
engine's command line, and a stale file is refused in one line (issue 33, item 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topoplan.cli import app

ROOT = Path(__file__).resolve().parents[1]
DGX = ROOT / "fixtures" / "topo" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
runner = CliRunner()


def saved_plan(tmp_path: Path, *extra: str) -> tuple[Path, dict]:
    topo = tmp_path / "topo.txt"
    shutil.copy(DGX, topo)
    out = tmp_path / "plan.json"
    done = runner.invoke(app, ["plan", "--model", "70b", "--topo", str(topo), "--gpu", "a100-80gb", "--top", "3",
                               "-o", str(out), *extra])
    assert done.exit_code == 0, done.output
    return out, json.loads(out.read_text())


def launched(plan: Path, rank: int, *extra: str) -> dict:
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", str(rank), "--checkpoint", "/models/llama",
                               "--format", "json", *extra])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def words_after(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_launch_plan_runs_the_planned_row_with_what_priced_it(tmp_path: Path, engine: str) -> None:
    plan, document = saved_plan(tmp_path, "--engine", engine, "--objective", "throughput", "--max-tpot-ms", "50",
                                "--max-ttft-ms", "2000", "--prompt-len", "1000", "--gen-len", "200",
                                "--kv-dtype", "fp8")
    assert document["request"]["engine"].startswith(engine) and document["request"]["sha256"]["topo"]
    for rank, row in enumerate(document["layouts"], start=1):
        data = launched(plan, rank)
        assert (data["layout"]["tp"], data["layout"]["pp"], data["layout"]["dp"]) == (row["tp"], row["pp"],
                                                                                      row["dp"])
        assert {r["rank"]: r["gpu"] for r in data["ranks"]} == {p["rank"]: p["gpu"] for p in row["placement"]}
        argv = data["nodes"][0]["argv"]
        seqs = str(row["served"]["concurrency_per_replica"] if "served" in row else row["batch"])
        if engine == "vllm":
            assert words_after(argv, "--max-num-seqs") == seqs and words_after(argv, "--max-model-len") == "1200"
            assert words_after(argv, "--kv-cache-dtype") == "fp8"
            assert words_after(argv, "--gpu-memory-utilization") == "0.9"
        elif engine == "sglang":
            assert words_after(argv, "--max-running-requests") == seqs
            assert words_after(argv, "--context-length") == "1200"
            assert words_after(argv, "--kv-cache-dtype") == "fp8_e4m3"
        else:
            assert words_after(argv, "--max_batch_size") == seqs and words_after(argv, "--max_seq_len") == "1200"
            assert "--config" in argv  # the fp8 KV cache goes through the YAML the script writes
            script = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", str(rank), "--checkpoint",
                                         "/m"]).stdout
            assert "kv_cache_config:\n  dtype: fp8\n" in script
        reasons = [o["reason"] for o in data["nodes"][0]["options"]]
        assert all(reasons) and any("plan row" in r for r in reasons)


def test_a_stale_plan_is_refused_in_one_line(tmp_path: Path) -> None:
    plan, document = saved_plan(tmp_path, "--engine", "vllm")
    topo = Path(document["request"]["topo"])
    topo.write_text(topo.read_text().replace("NV12", "NV6", 1))
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", "1", "--checkpoint", "/m"])
    assert done.exit_code == 2 and "stale plan: topo file" in done.output and done.output.count("\n") == 1
    shutil.copy(DGX, topo)
    document["request"]["topoplan_version"] = "0.0.1"
    plan.write_text(json.dumps(document))
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", "1", "--checkpoint", "/m"])
    assert done.exit_code == 2 and "priced by topoplan '0.0.1'" in done.output


def test_plan_options_are_not_given_twice(tmp_path: Path) -> None:
    plan, _ = saved_plan(tmp_path, "--engine", "sglang")
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", "1", "--checkpoint", "/m", "--model", "8b"])
    assert done.exit_code == 2 and "drop --model" in done.output
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--checkpoint", "/m"])
    assert done.exit_code == 2 and "add --rank N" in done.output
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", "9", "--checkpoint", "/m"])
    assert done.exit_code == 2 and "lists 3 layout(s)" in done.output


def test_vllm_parses_the_settings_a_saved_plan_adds(tmp_path: Path) -> None:
    """vLLM 0.32's own parser reads what the plan assumed: fp8 weights and KV cache, lengths, sequences."""
    from tests.test_engine_lines import after_module, vllm_parse

    plan, document = saved_plan(tmp_path, "--engine", "vllm", "--dtype", "fp8", "--kv-dtype", "fp8",
                                "--prompt-len", "2048", "--gen-len", "128", "--batch", "16")
    row = document["layouts"][0]
    argv = launched(plan, 1)["nodes"][0]["argv"]
    (args,) = vllm_parse([after_module(argv, "vllm.entrypoints.cli.main")[1:]])
    seqs = row["served"]["concurrency_per_replica"] if "served" in row else row["batch"]
    assert (args["max_num_seqs"], args["max_model_len"]) == (seqs, 2176)
    assert (args["kv_cache_dtype"], args["quantization"], args["dtype"]) == ("fp8", "fp8", "bfloat16")
    assert args["gpu_memory_utilization"] == 0.9


def test_a_checkpoint_folder_model_is_stale_when_its_config_changes(tmp_path: Path) -> None:
    """A `--model` folder is priced from its config.json: editing that file makes the saved plan stale."""
    from topoplan.models import CATALOG

    folder = tmp_path / "llama-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CATALOG["Llama-3.1-8B"]))
    topo = tmp_path / "topo.txt"
    shutil.copy(DGX, topo)
    plan = tmp_path / "plan.json"
    done = runner.invoke(app, ["plan", "--model", str(folder), "--topo", str(topo), "--gpu", "a100-80gb",
                               "--engine", "vllm", "--top", "2", "-o", str(plan)])
    assert done.exit_code == 0, done.output
    assert json.loads(plan.read_text())["request"]["sha256"]["model"]
    launched(plan, 1)  # fresh: launches
    (folder / "config.json").write_text(json.dumps({**CATALOG["Llama-3.1-8B"], "num_hidden_layers": 30}))
    done = runner.invoke(app, ["launch", "--plan", str(plan), "--rank", "1", "--checkpoint", "/m"])
    assert done.exit_code == 2 and "stale plan: model file" in done.output


def test_a_plan_made_with_a_relative_topology_launches_from_another_folder(tmp_path: Path, monkeypatch) -> None:
    """The record keeps the topology file's absolute path, so `launch --plan` run elsewhere finds the file it
    checks; a catalog model name stays a name."""
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir()
    elsewhere.mkdir()
    shutil.copy(DGX, made / "topo.txt")
    monkeypatch.chdir(made)
    done = runner.invoke(app, ["plan", "--model", "70b", "--topo", "topo.txt", "--gpu", "a100-80gb", "--top", "2",
                               "-o", "plan.json"])
    assert done.exit_code == 0, done.output
    record = json.loads((made / "plan.json").read_text())["request"]
    assert record["topo"] == str(made / "topo.txt") and record["model"] == "70b"
    monkeypatch.chdir(elsewhere)
    assert launched(made / "plan.json", 2)["layout"]["tp"] == json.loads((made / "plan.json").read_text())[
        "layouts"][1]["tp"]
