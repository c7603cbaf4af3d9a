"""The mixture-of-experts MLP of Mixtral and Qwen2-MoE, TP-sharded or expert-parallel.

Routing is HF's: softmax over the router logits in fp32, the top-k experts, their weights renormalised
(Mixtral always; Qwen2-MoE when norm_topk_prob) and kept in fp32 (Mixtral) or cast to the activations'
dtype (Qwen2-MoE), each token's output the weighted sum of its k experts' SwiGLU outputs; Qwen2-MoE adds
a shared expert scaled by sigmoid(shared_expert_gate(x)).

Two ways to shard the routed experts (topoplan.layout.Layout.ep):
  ep 1   every expert's width is split over the TP group like a dense MLP; the partial sums of all experts
         (and of the shared expert) meet in one all-reduce.
  ep > 1 each rank of the EP group (ep ranks inside a TP group, which all hold the same tokens after
         attention) holds E/ep whole experts. Each takes its 1/ep slice of the tokens, sends every
         (token, expert) pair's hidden state to the expert's owner (all-to-all dispatch), the owners run their
         experts, the results come back (all-to-all combine) and are summed with the routing weights, and an
         all-gather over the EP group gives every rank all the tokens again. This is vLLM's EP data path
         (all-to-all dispatch/combine, as DeepEP and pplx-kernels implement it) on torch.distributed.
Shapes: N tokens (batch x new positions), D hidden, F local expert width, K experts per token.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from topoplan.models import ARCHITECTURES
from topoplan.runner.config import ModelConfig
from topoplan.runner.layers import ColumnParallelLinear, NoComm, Part, RowParallelLinear, TpComm, block

# HF module names per model type: the MoE block, and an expert's (gate, up, down) projections.

def moe_names(model_type: str) -> tuple[str, tuple[str, str, str]]:
    """The HF names of a family's MoE block and its experts' gate, up and down matrices (topoplan.models)."""
    names = ARCHITECTURES[model_type].moe_names
    assert names is not None, model_type  # config.parse_hf_config runs only families with an MoE layout here
    return names


class EpComm(Protocol):
    """The EP group's collectives (topoplan.runner.dist.Dist implements them)."""

    def all_to_all(self, tensor: torch.Tensor, counts: list[list[int]]) -> torch.Tensor: ...

    def ep_all_gather(self, tensor: torch.Tensor) -> torch.Tensor: ...


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) over columns `cols` of the width; `comm` sums partial outputs (NoComm: the
    caller reduces). Parameter names are the HF ones given."""

    def __init__(self, dim: int, width: int, cols: range, names: tuple[str, str, str], comm: TpComm):
        super().__init__()
        gate, up, self.down_name = names
        self.gate_up_proj = ColumnParallelLinear(dim, [Part(gate, width, cols), Part(up, width, cols)], bias=False)
        self.add_module(self.down_name, RowParallelLinear(width, cols, dim, bias=False, comm=comm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.gate_up_proj.sizes, dim=-1)  # [N, F] each
        return getattr(self, self.down_name)(F.silu(gate) * up)  # [N, D]


class MoE(nn.Module):
    """One MoE layer on one rank: the router (replicated), this rank's experts, the shared expert (TP-sharded)."""

    def __init__(self, config: ModelConfig, tp_rank: int, tp_size: int, ep_rank: int, ep_size: int, comm: TpComm):
        super().__init__()
        self.top_k, self.normalise, self.n_experts = config.experts_per_tok, config.norm_topk_prob, config.n_experts
        self.fp32_weights = ARCHITECTURES[config.model_type].router_fp32  # as transformers' router (no cast)
        self.ep_rank, self.ep_size, self.comm = ep_rank, ep_size, comm  # with ep > 1, comm is an EpComm too
        expert_names = moe_names(config.model_type)[1]
        self.gate = nn.Linear(config.dim, config.n_experts, bias=False)  # the router: [E, D], every rank
        width = config.moe_intermediate_size
        cols = range(width) if ep_size > 1 else block(width, tp_rank, tp_size)
        self.local = block(config.n_experts, ep_rank, ep_size)  # this rank's experts (all of them at ep 1)
        self.experts = nn.ModuleDict({str(e): GatedMLP(config.dim, width, cols, expert_names, NoComm())
                                      for e in self.local})
        shared = config.shared_expert_intermediate_size
        if shared:  # Qwen2-MoE: HF names gate_proj/up_proj/down_proj
            self.shared_expert = GatedMLP(config.dim, shared, block(shared, tp_rank, tp_size),
                                          moe_names("qwen2_moe")[1], NoComm())
            self.shared_expert_gate = nn.Linear(config.dim, 1, bias=False)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [N, K], expert ids [N, K]) exactly as HF computes them."""
        probs = F.softmax(F.linear(h, self.gate.weight), dim=-1, dtype=torch.float)  # [N, E] in fp32
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_weights else weights.to(h.dtype)), ids

    def run_experts(self, h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sum over each row's experts (all held here) of weight x expert(row): h [N, D], ids/weights [N, K].

        The (row, expert) pairs are sorted by expert once, so each expert runs on one contiguous slice and
        the weighted outputs are added back in one index_add_: a decode step's few rows pay a handful of
        small ops per touched expert, not a search of the ids per expert. Each row's terms are added in
        increasing expert order, as HF's expert loop adds them."""
        if ids.numel() == 0:  # an EP rank no token was sent to
            return torch.zeros_like(h)
        k = ids.shape[1]
        order = torch.argsort(ids.reshape(-1), stable=True)
        counts = torch.bincount(ids.reshape(-1), minlength=self.n_experts).tolist()
        rows = order // k  # the row of each pair, grouped by expert
        picked = h[rows]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                outs.append(self.experts[str(e)](picked[start:start + n]))
                start += n
        scaled = torch.cat(outs) * weights.reshape(-1)[order, None]
        return torch.zeros_like(h).index_add_(0, rows, scaled.to(h.dtype))

    def _shared(self, h: torch.Tensor) -> torch.Tensor:
        """The shared expert's partial (TP-sharded) output, scaled by its sigmoid gate."""
        return torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = x.reshape(-1, d)  # [N, D]
        weights, ids = self.route(h)
        shared = self._shared(h) if hasattr(self, "shared_expert") else None
        if self.ep_size == 1:
            out = self.run_experts(h, ids, weights)
            return self.comm.all_reduce(out if shared is None else out + shared).view(b, n, d)
        out = self._expert_parallel(h, ids, weights)
        if shared is not None:
            out = out + self.comm.all_reduce(shared)
        return out.view(b, n, d)

    def _expert_parallel(self, h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Dispatch this rank's slice of the tokens to the experts' owners, run the experts received, combine,
        and all-gather the slices so every rank of the EP group has every token's output."""
        comm: EpComm = self.comm  # type: ignore[assignment]
        device = h.device
        per_rank = -(-h.shape[0] // self.ep_size)  # slices padded to one size for the all-gather
        mine = range(min(self.ep_rank * per_rank, h.shape[0]), min((self.ep_rank + 1) * per_rank, h.shape[0]))
        # one row per (token, expert) pair of my slice, sorted by expert (so grouped by owner)
        rows = torch.arange(mine.start, mine.stop, device=device).repeat_interleave(self.top_k)
        expert = ids[mine.start:mine.stop].reshape(-1)
        order = torch.argsort(expert, stable=True)
        # table[i][e]: rows member i sends for expert e. Knowing it, every member knows the whole split and the
        # expert of every row it receives, so only the hidden states travel.
        table = comm.ep_all_gather(torch.bincount(expert, minlength=self.n_experts)[None]).tolist()
        local = self.n_experts // self.ep_size
        counts = [[sum(row[j * local:(j + 1) * local]) for j in range(self.ep_size)] for row in table]
        back_counts = [list(column) for column in zip(*counts)]  # the combine runs the other way
        got_h = comm.all_to_all(h[rows[order]], counts)  # [R, D] rows for my experts, by sender, each by expert
        held = list(self.local)
        got_e = torch.tensor([e for row in table for e in held for _ in range(row[e])], dtype=torch.long,
                             device=device)
        done = self.run_experts(got_h, got_e[:, None], torch.ones(len(got_e), 1, dtype=h.dtype, device=device))
        back = comm.all_to_all(done, back_counts)  # [n_mine*K, D] in `order`
        slot_weights = weights[mine.start:mine.stop].reshape(-1)[order]
        out = torch.zeros(per_rank, h.shape[1], dtype=h.dtype, device=device)
        out.index_add_(0, rows[order] - mine.start, (back * slot_weights[:, None]).to(h.dtype))
        return comm.ep_all_gather(out)[:h.shape[0]]  # [N, D]
