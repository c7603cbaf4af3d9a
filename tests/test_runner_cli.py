"""`topoplan run` end to end: real local ranks, the --json contract, --save, tokenizer.json prompts, and
one-line errors (exit 2) for runs that cannot work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runner_models import save_hf

from topoplan.cpuset import cpu_cores

ROOT = Path(__file__).resolve().parents[1]


def topoplan(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_run_json_contract_and_tp2_equals_tp1(tmp_path):
    args = ["run", "--model", "tiny", "--prompt", "Hello", "--prompt-ids", "256,1,2", "--max-new-tokens", "6", "--json"]
    one = topoplan(*args, cache=tmp_path)
    assert one.returncode == 0, one.stderr
    two = topoplan(*args, "--tp", "2", cache=tmp_path)
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert b["layout"] == {"tp": 2, "pp": 1, "dp": 1, "ep": 1}
    assert b["tokens"] == a["tokens"] and [len(t) for t in a["tokens"]] == [6, 6]
    assert b["text"] == a["text"] and len(b["text"]) == 2
    assert set(b["timing"]) >= {"prefill_ms", "decode_ms_per_token", "tokens_per_s", "comm_ms"}
    assert b["timing"]["comm_ms"] > 0 and a["timing"]["comm_ms"] == 0
    assert len(b["bytes_read_per_rank"]) == 2 and max(b["bytes_read_per_rank"]) < a["bytes_read_per_rank"][0]
    assert b["cpu_kernel_per_rank"] == [{"kernel": None, "mkl_ms": 0.0, "onednn_ms": 0.0}] * 2  # no weight streams
    assert two.stderr == ""  # --json is quiet
    # a TP rank's step waits for its peers: only the TP1 rank of several threads tunes its count
    assert b["cpu_threads_per_rank"] == [None, None]
    cores = len(cpu_cores())
    [threads] = a["cpu_threads_per_rank"]
    assert threads is None if cores == 1 else (threads["start"] == cores and 1 <= threads["end"] <= cores
                                               and all(1 <= count <= cores for _, count in threads["changes"]))


@pytest.mark.skipif(len(cpu_cores()) < 2, reason="one core: no rank has threads to tune")
def test_fixed_threads_keeps_every_ranks_count(tmp_path):
    done = topoplan("run", "--model", "tiny", "--prompt-ids", "1,2,3", "--max-new-tokens", "12", "--json",
                    "--fixed-threads", cache=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cpu_threads_per_rank"] == [None]


def test_saved_builtin_is_the_same_model(tmp_path):
    saved = topoplan("run", "--model", "tiny", "--save", str(tmp_path / "tiny"), cache=tmp_path)
    assert saved.returncode == 0, saved.stderr
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["config.json", "model.safetensors"]
    common = ["--prompt-ids", "256,5,6,7", "--max-new-tokens", "5", "--json", "--pp", "2"]
    from_dir = topoplan("run", "--model", str(tmp_path / "tiny"), *common, cache=tmp_path)
    builtin = topoplan("run", "--model", "tiny", *common, cache=tmp_path)
    assert json.loads(from_dir.stdout)["tokens"] == json.loads(builtin.stdout)["tokens"]
    again = topoplan("run", "--model", "tiny", "--save", str(tmp_path / "tiny"), cache=tmp_path)
    assert again.returncode == 2 and "already exists and is not empty" in again.stderr


def test_text_prompt_uses_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    folder = save_hf("llama", tmp_path / "llama")
    vocab = {f"w{i}": i for i in range(96)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="w3"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    text = topoplan("run", "--model", str(folder), "--prompt", "w1 w40 w41 w7", "--max-new-tokens", "4", "--json",
                    cache=tmp_path)
    ids = topoplan("run", "--model", str(folder), "--prompt-ids", "1,40,41,7", "--max-new-tokens", "4", "--json",
                   cache=tmp_path)
    assert text.returncode == 0, text.stderr
    got, expected = json.loads(text.stdout), json.loads(ids.stdout)
    assert got["tokens"] == expected["tokens"]
    assert got["text"] == [tokenizer.decode(got["tokens"][0])]


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny", "--tp", "3", "--prompt", "x"], "num_attention_heads=8 is not divisible by tp=3"),
    (["--model", "tiny", "--pp", "9", "--prompt", "x"], "pp=9 is more stages than the model's 4 layers"),
    (["--model", "/no/such/dir", "--prompt", "x"], "not a folder"),
    (["--model", "tiny"], "no prompt"),
    (["--model", "tiny", "--prompt-ids", "1,a"], "expected comma-separated token ids"),
    (["--model", "tiny", "--tp", "0", "--prompt", "x"], "tp must be at least 1"),
    (["--model", "tiny", "--prompt", "x", "--cuda-graphs", "--compile"], "--cuda-graphs and --compile: pick one"),
    (["--model", "tiny", "--prompt", "x", "--cuda-graphs", "--backend", "gloo"], "it needs the nccl backend"),
])
def test_unworkable_runs_fail_in_one_line(tmp_path, args, message):
    result = topoplan("run", *args, cache=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_text_prompt_without_tokenizer_is_refused(tmp_path):
    folder = save_hf("llama", tmp_path / "llama")
    result = topoplan("run", "--model", str(folder), "--prompt", "hello", cache=tmp_path)
    assert result.returncode == 2 and "has no tokenizer.json: pass token ids with --prompt-ids" in result.stderr


def test_module_entry_under_torchrun_and_mpirun(tmp_path):
    """`python -m topoplan.runner` finds its rank from torchrun's and Open MPI's environments."""
    from topoplan.runner.spawn import free_port

    args = ["--model", "tiny", "--prompt-ids", "256,7,8,9", "--max-new-tokens", "4", "--json"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    reference = topoplan("run", *args, cache=tmp_path)
    assert reference.returncode == 0, reference.stderr
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", str(free_port()), "-m", "topoplan.runner", "--tp", "2", *args],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert torchrun.returncode == 0, torchrun.stderr
    assert json.loads(torchrun.stdout)["tokens"] == json.loads(reference.stdout)["tokens"]
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed (CI installs openmpi-bin)")
    mpirun = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                             "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", "-x", "XDG_CACHE_HOME",
                             "-x", "PYTHONPATH", sys.executable, "-m", "topoplan.runner", "--pp", "2", *args],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert mpirun.returncode == 0, mpirun.stderr
    result = json.loads(mpirun.stdout)
    assert result["layout"]["pp"] == 2 and result["tokens"] == json.loads(reference.stdout)["tokens"]


def test_token_id_outside_the_vocabulary_is_a_user_error(tmp_path):
    message = "prompt token id 264 is outside the model's vocabulary of 264"
    result = topoplan("run", "--model", "tiny", "--prompt-ids", "1,264", "--max-new-tokens", "2", cache=tmp_path)
    assert result.returncode == 2 and result.stderr == f"topoplan: error: {message}\n"
    from topoplan.runner.spawn import free_port

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT),  # a lone rank checks it too
           "MASTER_PORT": str(free_port())}
    rank = subprocess.run([sys.executable, "-m", "topoplan.runner", "--prompt-ids", "1,264"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert rank.returncode == 2 and rank.stderr.strip() == f"topoplan-runner: rank 0: error: {message}"


def test_cuda_graphs_refuse_an_moe_checkpoint(tmp_path):
    folder = save_hf("mixtral", tmp_path / "mixtral")
    result = topoplan("run", "--model", str(folder), "--prompt-ids", "1,2,3", "--cuda-graphs", cache=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "topoplan-runner: rank 0: error: --cuda-graphs: an MoE layer reads its experts' row counts on the host, "
        "which a CUDA graph cannot record; run MoE checkpoints without it"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here runs --cuda-graphs")
def test_cuda_graphs_without_a_gpu_is_one_line(tmp_path):
    result = topoplan("run", "--model", "tiny", "--prompt", "x", "--cuda-graphs", cache=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "topoplan-runner: rank 0: error: --cuda-graphs records GPU kernels; this rank runs on cpu (backend gloo)"]
