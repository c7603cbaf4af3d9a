"""Mixture-of-experts in the sharded runner on real processes over gloo: Mixtral and Qwen2-MoE checkpoints with
experts TP-sharded (ep 1) or expert-parallel (ep 2, 4: all-to-all dispatch and combine), with TP and PP,
token for token against HF transformers and the unsharded run; each EP rank reads only its own experts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runner_models import hf_generate, hf_model, run_jobs
from safetensors import safe_open

from topoplan.layout import Layout, RankGrid

ROOT = Path(__file__).resolve().parents[1]
FP32_LOGIT_TOL = 1e-4  # absolute; sharding only reorders fp32 sums
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 20, 21], [1, 30, 31, 32, 33, 34]]
KINDS = ("mixtral", "qwen2_moe")
# (tp, pp, ep) per world size: EP 1/2/4, with TP and with PP
LAYOUTS = {1: [(1, 1, 1)], 2: [(2, 1, 2), (1, 2, 1)],
           4: [(4, 1, 4), (4, 1, 2), (2, 2, 2), (4, 1, 1), (2, 2, 1)]}
CASES = [(kind, world, layout) for kind in KINDS for world, layouts in LAYOUTS.items() for layout in layouts]


def _name(kind: str, tp: int, pp: int, ep: int) -> str:
    return f"{kind}-tp{tp}-pp{pp}-ep{ep}"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    for kind in KINDS:
        hf_model(kind).save_pretrained(root / kind)
    return root


@pytest.fixture(scope="module")
def launch(checkpoints, tmp_path_factory):
    """launch(world) -> {job name: (result, per-prompt logits)}; one launch per world size runs all its jobs."""
    cache: dict[int, dict] = {}
    ids = [",".join(map(str, p)) for p in PROMPTS]

    def run_world(world: int) -> dict:
        if world not in cache:
            jobs = [{"name": _name(kind, tp, pp, ep),
                     "options": {"model": str(checkpoints / kind), "tp": tp, "pp": pp, "ep": ep, "prompt_ids": ids,
                                 "max_new_tokens": 10, "backend": "gloo", "timeout": 120}}
                    for kind in KINDS for tp, pp, ep in LAYOUTS[world]]
            if world == 2:  # EP over gloo instead of shared memory (the default between CPU ranks of one host)
                jobs += [{"name": _name(kind, 2, 1, 2) + "-gloo",
                          "options": {**job["options"], "no_shared_memory": True}}
                         for kind in KINDS for job in jobs if job["name"] == _name(kind, 2, 1, 2)]
            cache[world] = run_jobs(world, jobs, tmp_path_factory.mktemp(f"moe-world{world}"))
        return cache[world]

    return run_world


@pytest.fixture(scope="module")
def reference():
    """HF transformers' greedy tokens and logits per kind."""
    out = {}
    for kind in KINDS:
        hf = hf_model(kind)
        out[kind] = hf_generate(hf, PROMPTS, 10, eos=hf.config.eos_token_id)
    return out


@pytest.mark.parametrize("kind, world, layout", CASES,
                         ids=[_name(k, *layout) for k, _, layout in CASES])
def test_moe_layout_matches_transformers_and_unsharded(launch, reference, kind, world, layout):
    tp, pp, ep = layout
    got, got_logits = launch(world)[_name(kind, tp, pp, ep)]
    ref, ref_logits = launch(1)[_name(kind, 1, 1, 1)]
    expected, hf_logits = reference[kind]
    assert got["layout"] == {"tp": tp, "pp": pp, "dp": 1, "ep": ep}
    assert got["tokens"] == expected == ref["tokens"]
    for i, (mine, unsharded) in enumerate(zip(got_logits, ref_logits)):
        torch.testing.assert_close(mine, unsharded, rtol=0, atol=FP32_LOGIT_TOL)
        torch.testing.assert_close(mine, hf_logits[i, :len(mine)], rtol=0, atol=FP32_LOGIT_TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_ep_over_gloo_matches_shared_memory_and_transformers(launch, reference, kind):
    shm, shm_logits = launch(2)[_name(kind, 2, 1, 2)]
    gloo, gloo_logits = launch(2)[_name(kind, 2, 1, 2) + "-gloo"]
    assert gloo["tokens"] == shm["tokens"] == reference[kind][0]
    for mine, theirs in zip(gloo_logits, shm_logits):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=FP32_LOGIT_TOL)


def _expert_bytes(folder: Path) -> dict[int, int]:
    """Bytes of each routed expert's tensors in layer 0 (every expert of a kind is the same size)."""
    sizes: dict[int, int] = {}
    with safe_open(next(folder.glob("*.safetensors")), framework="pt") as f:
        for name in f.keys():
            parts = name.split(".")
            if name.startswith("model.layers.0.") and "experts" in parts:
                expert = int(parts[parts.index("experts") + 1])
                shape = f.get_slice(name).get_shape()
                sizes[expert] = sizes.get(expert, 0) + shape[0] * shape[1] * 4
    return sizes


@pytest.mark.parametrize("kind", KINDS)
def test_each_ep_rank_reads_only_its_experts(launch, checkpoints, kind):
    """tp4 ep4 vs tp4 ep2: a rank's read shrinks by exactly the experts it no longer holds; EP experts are read
    whole, so tp4 ep1 (each expert's width over 4 ranks) reads one quarter of every expert instead."""
    moe_layers = {"mixtral": 3, "qwen2_moe": 2}[kind]
    experts = _expert_bytes(checkpoints / kind)
    per_expert = experts[0]
    n = len(experts)
    ep4 = launch(4)[_name(kind, 4, 1, 4)][0]["bytes_read_per_rank"]
    ep2 = launch(4)[_name(kind, 4, 1, 2)][0]["bytes_read_per_rank"]
    ep1 = launch(4)[_name(kind, 4, 1, 1)][0]["bytes_read_per_rank"]
    assert len(set(ep4)) == 1 and len(set(ep2)) == 1 and len(set(ep1)) == 1  # the same share on every rank
    assert ep2[0] - ep4[0] == moe_layers * (n // 2 - n // 4) * per_expert
    assert ep2[0] - ep1[0] == moe_layers * (n // 2 - n / 4) * per_expert


def test_ep_groups_are_the_planners(launch):
    """The runner built its EP groups from RankGrid, so ranks of one EP group share a TP group here."""
    grid = RankGrid(Layout(tp=4, ep=2))
    assert grid.ep_groups == [[0, 1], [2, 3]]
    got = launch(4)[_name("mixtral", 4, 1, 2)][0]
    assert got["layout"]["ep"] == 2


def test_cli_run_ep_refuses_what_the_runner_cannot_run(checkpoints, tmp_path):
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "topoplan", "run", *args, "--prompt-ids", "1,2,3",
                               "--max-new-tokens", "2"], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)

    done = run("--model", str(checkpoints / "mixtral"), "--tp", "1", "--dp", "2", "--ep", "2")
    assert done.returncode == 2 and "ep=2 must divide tp=1 in the bundled runner" in done.stderr
    done = run("--model", str(checkpoints / "mixtral"), "--tp", "2", "--ep", "3")
    assert done.returncode == 2 and "ep=3 must divide tp=2" in done.stderr
    done = run("--model", "tiny", "--tp", "2", "--ep", "2")
    assert done.returncode == 2 and "the model has no experts" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_run_ep2_equals_transformers(checkpoints, reference, tmp_path):
    """The done-when check: `topoplan run --model <small MoE checkpoint> --ep 2 --tp 2` gives transformers' tokens."""
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    args = [sys.executable, "-m", "topoplan", "run", "--model", str(checkpoints / "mixtral"), "--tp", "2", "--ep", "2",
            "--max-new-tokens", "10", "--backend", "gloo", "--json"]
    for ids in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, ids))]
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == reference["mixtral"][0]
