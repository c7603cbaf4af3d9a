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

from topoplan.layout import Layout, RankCoords, RankGrid
from topoplan.plan.collectives import Ring


def group_replicas(layout: Layout) -> int:
    """DP replicas whose tokens meet in one EP group (ep = tp x dp: all of them; ep <= tp: one)."""
    return max(1, layout.ep // layout.tp)


def imbalance(assignments: float, ranks: int) -> float:
    """Expected load of the busiest of `ranks` ranks over the mean, for `assignments` (token, expert) pairs routed
    uniformly at random: the maximum of `ranks` binomial loads, mean + sqrt(2 ln n) standard deviations
    (Raab & Steger, "Balls into bins: a simple and tight analysis", RANDOM 1998, for m >> n log n), at most all
    of them on one rank. Trained routers are more skewed than uniform (DeepSeek-V3 report §3.4 replicates hot
    experts for that reason, EPLB), so this is a lower bound on the straggler factor."""
    if ranks < 2 or assignments <= 0:
        return 1.0
    mean = assignments / ranks
    spread = math.sqrt(2 * math.log(ranks) * mean * (1 - 1 / ranks))
    return min(float(ranks), (mean + spread) / mean)


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
