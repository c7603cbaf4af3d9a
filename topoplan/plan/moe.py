"""What expert parallelism changes in a stage's price: whose tokens meet in an EP group, how many each rank
dispatches, how uneven the experts' load is, and the EP groups as placed.

vLLM's expert parallelism (docs "Expert Parallel Deployment"; vllm/model_executor/layers/fused_moe): attention
stays tensor-parallel; in each MoE layer every rank of the EP group sends each of its tokens' hidden state to
the ranks holding that token's top-k experts (dispatch) and gets the k results back (combine). Attention
output is replicated across a TP group, so each TP rank dispatches its 1/tp slice of the tokens and an
all-gather over the TP group rebuilds the full set after combine (the MLP's all-reduce is gone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from topoplan.layout import Layout, RankCoords, RankGrid
from topoplan.plan.collectives import Ring


def group_replicas(layout: Layout) -> int:
    """DP replicas whose tokens meet in one EP group (ep = tp x dp: all of them; ep <= tp: one)."""
    return max(1, layout.ep // layout.tp)


def busiest(mean: float, sd: float, ranks: int) -> float:
    """The expected largest of `ranks` independent loads of this mean and standard deviation (normal
    approximation), by Blom's formula for the expected largest of n standard normals,
    Phi^-1((n - 0.375) / (n + 0.25)) (G. Blom, "Statistical Estimates and Transformed Beta-Variables", 1958):
    0.59 sd for 2 ranks, 1.43 for 8 (exact 0.56, 1.42), where the asymptotic sqrt(2 ln n) gives 1.18 and 2.04.
    A simulation of top-k routing (8 of 256 experts, EP8, 8 tokens: busiest rank 10.7 experts, Blom 10.6) agrees."""
    if ranks < 2:
        return mean
    return mean + NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25)) * sd


def imbalance(assignments: float, ranks: int) -> float:
    """Expected load of the busiest of `ranks` ranks over the mean, for `assignments` (token, expert) pairs routed
    uniformly at random: the largest of `ranks` binomial loads (`busiest`), at most all of them on one rank.
    Trained routers are more skewed than uniform (DeepSeek-V3 report §3.4 replicates hot experts for that
    reason, EPLB), so this is a lower bound on the straggler factor."""
    if ranks < 2 or assignments <= 0:
        return 1.0
    mean = assignments / ranks
    return min(float(ranks), busiest(mean, math.sqrt(mean * (1 - 1 / ranks)), ranks) / mean)


def busiest_experts(touched: float, experts: int, ranks: int) -> float:
    """Distinct experts the busiest of `ranks` EP ranks runs in a layer when `touched` of the `experts` are in
    use: each rank holds experts / ranks of them, each in use with probability touched / experts (uniform
    routing), so a rank's count is binomial and the busiest is `busiest` of them, at most all it holds. Decode
    streams these experts' weights: the step waits for the rank that reads the most."""
    local, used = experts / ranks, touched / experts
    return min(local, busiest(local * used, math.sqrt(local * used * (1 - used)), ranks))


def ep_rings(layout: Layout, order: Sequence[str]) -> list[list[Ring]]:
    """The EP group of each stage of the replicas `replica_rings` prices (the group holding the stage's
    tp_rank 0), members in rank order, as (node, GPU) slots; ranks are node-major, k to a node."""
    k, grid = len(order), RankGrid(layout)
    count = max(1, min(layout.dp, k // (layout.tp * layout.pp)))
    out = []
    for d in range(count):
        stages = []
        for p in range(layout.pp):
            group = grid.group_of("ep", grid.rank(RankCoords(0, p, d)))
            stages.append(Ring.of([(rank // k, order[rank % k]) for rank in group]))
        out.append(stages)
    return out
