"""The planner prices what the runner runs: the same layer split on every pipeline stage, the same groups.

Each side is driven through its own entry point (the planner from a ModelSpec, the runner from its
ModelConfig and a rank's Dist), so a side that stops using topoplan.layout makes this fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from topoplan.layout import Layout, RankGrid
from topoplan.models import CATALOG, spec_from_config
from topoplan.plan.cost import stages_of
from topoplan.runner.config import parse_hf_config
from topoplan.runner.dist import Dist
from topoplan.runner.worker import shard_of

ROOT = Path(__file__).resolve().parents[1]


def runner_dist(layout: Layout, rank: int) -> Dist:
    """A rank's Dist as build_dist makes it, without process groups (none are needed to pick layers)."""
    grid = RankGrid(layout)
    return Dist(layout, rank, grid.coords(rank), torch.device("cpu"), "gloo", None, None,
                grid.group_of("pp", rank))


def test_planner_stage_sizes_equal_the_runners_for_every_split():
    differ = []
    for layers in range(1, 129):
        raw = {**CATALOG["tiny"], "num_hidden_layers": layers}
        spec, config = spec_from_config(raw, "tiny"), parse_hf_config(raw)
        for pp in range(1, min(16, layers) + 1):
            layout = Layout(pp=pp)
            priced = [range(s.start, s.end) for s in stages_of(spec, pp)]
            ran = [shard_of(config, runner_dist(layout, rank)).layers for rank in range(pp)]
            if priced != ran:
                differ.append((layers, pp, priced, ran))
    assert differ == []


def test_run_reports_the_split_it_ran(tmp_path):
    """tiny (4 layers) on 3 stages: vLLM's split 1/2/1, read back from the layers each rank built."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "topoplan", "run", "--model", "tiny", "--pp", "3", "--prompt-ids",
                           "256,1,2", "--max-new-tokens", "2", "--json"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stages"] == [
        {"pp_rank": 0, "first_layer": 0, "last_layer": 0, "layers": 1},
        {"pp_rank": 1, "first_layer": 1, "last_layer": 2, "layers": 2},
        {"pp_rank": 2, "first_layer": 3, "last_layer": 3, "layers": 1}]


def test_planner_expert_share_equals_the_experts_each_runner_rank_builds():
    """Expert parallelism: the routed-expert weights the planner prices per rank are the ones the runner builds
    on that rank (its EP position from the same RankGrid.ep_groups), with and without EP, with TP and PP."""
    from dataclasses import replace

    from topoplan.plan.cost import StageModel
    from topoplan.plan.moe import group_replicas
    from topoplan.runner.model import Transformer

    raw = {"model_type": "mixtral", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 48,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8,
           "num_experts_per_tok": 2}
    spec, config = spec_from_config(raw, "mixtral"), parse_hf_config(raw)
    for layout in (Layout(tp=2), Layout(tp=2, ep=2), Layout(tp=4, ep=2), Layout(tp=4, pp=2, ep=4)):
        grid = RankGrid(layout)
        for rank in range(layout.world):
            d = replace(runner_dist(layout, rank), ep_rank=grid.group_of("ep", rank).index(rank))
            with torch.device("meta"):
                built = Transformer(config, shard_of(config, d))
            ran = sum(p.numel() for name, p in built.named_parameters() if ".experts." in name)
            stage = stages_of(spec, layout.pp)[d.coords.pp_rank]
            priced = StageModel(spec, stage, layout.tp, 1, 1, 1, ep=layout.ep,
                                replicas=group_replicas(layout)).expert_bytes()
            assert ran == priced, (layout, rank)
