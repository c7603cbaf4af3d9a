"""The sharded runner on real processes over gloo (loopback), never mocked collectives.

Jobs are grouped by world size: one launch per world size runs every job of that size (each job builds
its own process groups for its layout in the joined world), so the whole grid costs four launches.
Each parametrised test then checks one job's output against the unsharded run and HF transformers."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runner_models import hf_generate, hf_model, run_jobs, save_byte_model
from safetensors import safe_open

from topoplan.layout import split_layers
from topoplan.runner.spawn import free_port

ROOT = Path(__file__).resolve().parents[1]
FP32_LOGIT_TOL = 1e-4  # absolute; sharding only reorders fp32 sums (observed differences ~1e-6)
GRID = [l for l in itertools.product(range(1, 5), repeat=3) if l[0] * l[1] * l[2] <= 4 and l != (1, 1, 1)]
BYTE_PROMPTS = ["256,72,101,108,108,111,44,32,119,111,114,108,100", "256,104,105", "256,1,2,3,4,5"]
HF_PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 20, 21], [1, 30, 31, 32, 33, 34]]
HF_KINDS = ["llama", "mistral", "qwen2"]
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
MICRO_BATCHES = (1, 3)  # besides the default (one per stage): none, and one per prompt
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")  # torch.compile's CPU code needs one


def _opts(model: Path, tp=1, pp=1, dp=1, prompts=BYTE_PROMPTS, new=8, **extra) -> dict:
    return {"model": str(model), "tp": tp, "pp": pp, "dp": dp, "prompt_ids": list(prompts), "max_new_tokens": new,
            "backend": "gloo", "timeout": 120, **extra}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = {"grid": save_byte_model(root / "grid"),  # 12 heads, 2 KV heads: tp=4 replicates KV heads
             "grid3": save_byte_model(root / "grid3", num_key_value_heads=6)}  # for tp=3
    ids = [",".join(map(str, p)) for p in HF_PROMPTS]
    for kind in HF_KINDS:
        hf_model(kind).save_pretrained(root / kind)
        paths[kind] = root / kind
    hf_model("llama").save_pretrained(root / "sharded", max_shard_size="100KB")
    paths["sharded"] = root / "sharded"
    paths["hf_prompts"] = ids
    return paths


def _jobs(world: int, m: dict) -> list[dict]:
    jobs = []
    if world == 1:
        jobs += [{"name": "grid-tp1-pp1-dp1-compiled", "options": _opts(m["grid"], compile=True)}] if CXX else []
        jobs += [{"name": "grid-ref", "options": _opts(m["grid"])},
                 {"name": "grid3-ref", "options": _opts(m["grid3"])},
                 {"name": "sample-ref", "options": _opts(m["grid"], **SAMPLING)}]
    for tp, pp, dp in GRID:
        if tp * pp * dp == world:
            model = m["grid3"] if tp == 3 else m["grid"]
            jobs.append({"name": f"grid-tp{tp}-pp{pp}-dp{dp}", "options": _opts(model, tp, pp, dp)})
    if world == 2:
        jobs.append({"name": "grid-tp2-bf16", "options": _opts(m["grid"], 2, 1, 1, dtype="bfloat16")})
        jobs += [{"name": f"grid-tp1-pp2-dp1-mb{mb}", "options": _opts(m["grid"], 1, 2, 1, micro_batches=mb)}
                 for mb in MICRO_BATCHES]
        jobs += [{"name": f"grid-tp{tp}-pp{pp}-dp1-gloo", "options": _opts(m["grid"], tp, pp, 1, no_shared_memory=True)}
                 for tp, pp in ((2, 1), (1, 2))]
        if CXX:  # TP2: the collectives are ops of the compiled graph (topoplan.runner.dist.traced_all_reduce)
            jobs += [{"name": f"grid-tp{tp}-pp{pp}-dp1-compiled", "options": _opts(m["grid"], tp, pp, 1, compile=True)}
                     for tp, pp in ((1, 2), (2, 1))]
    if world == 4:
        for kind in HF_KINDS:
            jobs.append({"name": f"{kind}-tp2-pp2", "options": _opts(m[kind], 2, 2, 1, m["hf_prompts"], 10)})
        jobs += [{"name": "qwen2-tp4", "options": _opts(m["qwen2"], 4, 1, 1, m["hf_prompts"], 10)},
                 {"name": "sharded-tp2-pp2", "options": _opts(m["sharded"], 2, 2, 1, m["hf_prompts"], 10)},
                 {"name": "sample-tp2-pp2", "options": _opts(m["grid"], 2, 2, 1, **SAMPLING)}]
    return jobs


@pytest.fixture(scope="module")
def launch(models, tmp_path_factory):
    """launch(world) -> {job name: (result dict, per-prompt logits)}; each world size runs once."""
    cache: dict[int, dict] = {}

    def run_world(world: int) -> dict:
        if world not in cache:
            cache[world] = run_jobs(world, _jobs(world, models), tmp_path_factory.mktemp(f"world{world}"))
        return cache[world]

    return run_world


RUNS = ([(tp, pp, dp, "") for tp, pp, dp in GRID] + [(1, 2, 1, f"-mb{mb}") for mb in MICRO_BATCHES]
        + [(2, 1, 1, "-gloo"), (1, 2, 1, "-gloo"), (1, 1, 1, "-compiled"), (1, 2, 1, "-compiled"),
           (2, 1, 1, "-compiled")])


@pytest.mark.parametrize("tp,pp,dp,variant", RUNS, ids=[f"tp{t}-pp{p}-dp{d}{v}" for t, p, d, v in RUNS])
def test_layout_matches_unsharded(launch, tp, pp, dp, variant):
    """Every layout, the default pipeline schedule (one micro-batch per stage) and others (-mb1: none, -mb3: one
    per prompt), TP and PP over gloo instead of shared memory (-gloo), and the stages under torch.compile
    (-compiled, warmed up before the timed run): the same tokens and logits as one eager rank."""
    if variant == "-compiled" and not CXX:
        pytest.skip("torch.compile needs a C++ compiler (g++ or c++ on PATH, or $CXX); .ci/run installs g++")
    ref_name = "grid3-ref" if tp == 3 else "grid-ref"
    ref, ref_logits = launch(1)[ref_name]
    got, got_logits = launch(tp * pp * dp)[f"grid-tp{tp}-pp{pp}-dp{dp}{variant}"]
    assert got["layout"] == {"tp": tp, "pp": pp, "dp": dp, "ep": 1}
    assert got["tokens"] == ref["tokens"]
    assert [len(t) for t in got["tokens"]] == [len(t) for t in ref["tokens"]]
    for mine, theirs in zip(got_logits, ref_logits):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=FP32_LOGIT_TOL)
    assert got["text"] is not None and len(got["bytes_read_per_rank"]) == tp * pp * dp
    assert ("compile_s_per_rank" in got["timing"]) == (variant == "-compiled")
    # every rank of a replica given prompts ran an untimed warm-up generation before the timed one (a compiled
    # stage's is in compile_s)
    warm_up = got["timing"]["warm_up_s_per_rank"]
    busy = tp * pp * min(dp, len(got["tokens"])) if variant != "-compiled" else 0
    assert len(warm_up) == tp * pp * dp and sum(s > 0 for s in warm_up) == busy
    if tp * pp > 1:  # every model-parallel rank reads less than the whole model
        assert max(got["bytes_read_per_rank"]) < ref["bytes_read_per_rank"][0]


def test_bfloat16_on_gloo(launch):
    """gloo reduces bf16 on this torch, so the run stays in bf16 (older torch falls back to fp32 and says so)."""
    ref, ref_logits = launch(1)["grid-ref"]
    got, got_logits = launch(2)["grid-tp2-bf16"]
    assert got["dtype"] == "bfloat16" and ref["dtype"] == "float32"
    assert [len(t) for t in got["tokens"]] and got["tokens"][0][0] == ref["tokens"][0][0]
    first = torch.stack([l[0] for l in got_logits]), torch.stack([l[0] for l in ref_logits])
    torch.testing.assert_close(*first, rtol=0, atol=0.3)  # bf16 keeps ~3 significant digits
    assert not torch.equal(*first)  # and it really ran in bf16


def test_reference_batch_has_unequal_prompts_and_generates(launch):
    ref, _ = launch(1)["grid-ref"]
    assert len({len(p.split(",")) for p in BYTE_PROMPTS}) == 3
    assert all(1 <= len(t) <= 8 for t in ref["tokens"])


@pytest.mark.parametrize("name", [f"{k}-tp2-pp2" for k in HF_KINDS] + ["qwen2-tp4"])
def test_sharded_matches_transformers(launch, name):
    """tp=2 pp=2 on Llama 3.1 RoPE / Mistral sliding window / Qwen2 bias + tied embeddings (split across
    stages), and tp=4 on Qwen2 with 2 KV heads (TP > KV heads, tied head on the same stage)."""
    got, got_logits = launch(4)[name]
    hf = hf_model(name.split("-")[0])
    expected, hf_logits = hf_generate(hf, HF_PROMPTS, 10, eos=hf.config.eos_token_id)
    assert got["tokens"] == expected
    for i, logits in enumerate(got_logits):  # HF keeps stepping finished rows; compare the steps we ran
        torch.testing.assert_close(logits, hf_logits[i, :len(logits)], rtol=0, atol=FP32_LOGIT_TOL)


def test_sampling_agrees_across_tp_ranks_and_layouts(launch):
    ref, _ = launch(1)["sample-ref"]
    got, _ = launch(4)["sample-tp2-pp2"]  # the runner itself refuses a result where ranks disagree
    greedy, _ = launch(1)["grid-ref"]
    assert got["tokens"] == ref["tokens"]
    assert ref["tokens"] != greedy["tokens"]  # it really sampled


def _expected_slice_bytes(shape: list[int], name: str, tp: int, tp_rank: int, kv_heads: int, head_dim: int) -> int:
    rows, cols = (shape + [1])[:2]
    if any(k in name for k in ("q_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")):
        return rows // tp * cols * 4
    if "k_proj" in name or "v_proj" in name:
        return max(1, kv_heads // tp) * head_dim * cols * 4
    if "o_proj" in name or "down_proj" in name:
        return rows * (cols // tp) * 4
    return rows * cols * 4  # norms: replicated


def test_sharded_checkpoint_reads_only_each_ranks_slices(launch, models):
    got, _ = launch(4)["sharded-tp2-pp2"]
    folder = models["sharded"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    all_files = set(index.values())
    assert len(all_files) >= 3
    config = json.loads((folder / "config.json").read_text())
    stages = split_layers(config["num_hidden_layers"], 2)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    full_size = sum((folder / f).stat().st_size for f in all_files)
    for rank, (nbytes, files) in enumerate(zip(got["bytes_read_per_rank"], got["files_read_per_rank"])):
        tp_rank, pp_rank = rank % 2, rank // 2

        def wanted(name: str) -> bool:
            if name.startswith("model.layers."):
                return int(name.split(".")[2]) in stages[pp_rank]
            return (pp_rank == 0) == name.startswith("model.embed_tokens")

        names = [n for n in index if wanted(n)]
        assert set(files) == {index[n] for n in names} and set(files) < all_files
        expected = 0
        for n in names:
            with safe_open(folder / index[n], framework="pt") as f:
                shape = list(f.get_slice(n).get_shape())
            expected += _expected_slice_bytes(shape, n, 2, tp_rank, config["num_key_value_heads"], head_dim)
        assert nbytes == expected and nbytes < full_size / 2


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_lost_rank_ends_every_rank_without_hanging(models, sig):
    """SIGKILL (peer gone: gloo sees the socket close) or SIGSTOP (peer silent: only --timeout can tell) one
    rank mid-generation: every other rank must exit non-zero with a one-line error, within the timeout."""
    timeout = 8
    port = free_port()
    procs = []
    for rank in range(4):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "topoplan.runner", "--model", str(models["grid"]), "--tp", "2", "--pp", "2",
                "--prompt-ids", "256,1,2", "--max-new-tokens", "3000", "--ignore-eos", "--timeout", str(timeout)]
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    # rank 0 announces generation on stderr once loaded
    line = procs[0].stderr.readline().decode()
    assert "generating" in line, line
    time.sleep(1.0)
    procs[3].send_signal(sig)
    start = time.monotonic()
    codes = []
    for proc in procs[:3]:
        try:
            codes.append(proc.wait(timeout=timeout + 30 - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a rank hung after its peer was killed")
    procs[3].kill()
    procs[3].wait()
    errors = [p.stderr.read().decode() for p in procs[:3]]
    assert all(code != 0 for code in codes), (codes, errors)
    for rank, text in enumerate(errors):
        assert f"topoplan-runner: rank {rank}: failed:" in text, text
