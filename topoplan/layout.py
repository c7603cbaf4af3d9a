"""What the planner, the launcher and the runner must agree on about a layout: rank order and the layer split.

Rank order: TP varies fastest, then PP, then DP (Megatron-LM, vLLM and TensorRT-LLM all use this order):
`rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank`. `RankGrid` is its one definition: coordinates <-> rank
and the TP/PP/DP groups as lists of ranks, which the runner and the bench build their process groups from.
tests/test_layout.py checks it against `torch.arange(world).view(dp, pp, tp)`.

Layer split: `split_layers` is the one policy; the cost model prices it and the runner runs it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_NODES


@dataclass(frozen=True, order=True)
class Layout:
    """A parallel layout: tensor-parallel degree x pipeline stages x data-parallel replicas, and the expert-
    parallel degree of the MoE layers.

    Expert parallelism (vLLM's `--enable-expert-parallel`): each MoE layer's routed experts are split, whole,
    over `ep` ranks of one pipeline stage while attention stays TP. vLLM uses ep = tp x dp (the DP replicas'
    attention runs data-parallel and their tokens meet in the MoE layers); ep may also divide tp (the
    experts split inside each TP group and replicated across TP groups). ep 1: experts are TP-sharded.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            if getattr(self, name) < 1:
                raise TopoplanError(f"{name} must be at least 1, got {getattr(self, name)}")
        plane = self.tp * self.dp
        if plane % self.ep or (self.ep % self.tp and self.tp % self.ep):
            raise TopoplanError(f"ep={self.ep} must divide tp={self.tp} or be a multiple of it dividing "
                                f"tp x dp = {plane}")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}" + (f",ep={self.ep}" if self.ep > 1 else "")

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read `tp=4,pp=2,dp=1[,ep=4]` (any order, missing degrees are 1)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(tp|pp|dp|ep)\s*=\s*(\d{1,9})", part)  # 9 digits: no int-string limit
            if not match or match.group(1) in values:
                raise TopoplanError(f"layout {text!r}: expected tp=N,pp=N,dp=N (each at most once), got {part!r}")
            values[match.group(1)] = int(match.group(2))
        if not values:
            raise TopoplanError(f"layout {text!r}: expected tp=N,pp=N,dp=N")
        return cls(**values)


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits in the layout."""

    tp_rank: int
    pp_rank: int
    dp_rank: int


def check_nodes(nodes: int) -> None:
    """A layout spreads over at least one node, at most MAX_NODES (`--nodes` of plan and launch)."""
    if not 1 <= nodes <= MAX_NODES:
        raise TopoplanError(f"--nodes must be from 1 to {MAX_NODES}, got {nodes}")


GROUP_KINDS = ("tp", "pp", "dp", "ep")


@dataclass(frozen=True)
class RankGrid:
    """The ranks of a layout on their (dp, pp, tp) grid: rank <-> coordinates, and every TP/PP/DP group.

    A TP group is a row of consecutive ranks, a pipeline the ranks at one (dp, tp) across the stages (stage 0
    first), a DP group the ranks at one (pp, tp) in every replica. Groups are listed in the order every rank
    must create them (torch's new_group is collective over the world).
    """

    layout: Layout

    def rank(self, coords: RankCoords) -> int:
        """Global rank of the process at these coordinates."""
        return (coords.dp_rank * self.layout.pp + coords.pp_rank) * self.layout.tp + coords.tp_rank

    def coords(self, rank: int) -> RankCoords:
        """Inverse of `rank`."""
        layout = self.layout
        if not 0 <= rank < layout.world:
            raise TopoplanError(f"rank {rank} is outside a world of {layout.world} ({layout})")
        rest, tp_rank = divmod(rank, layout.tp)
        dp_rank, pp_rank = divmod(rest, layout.pp)
        return RankCoords(tp_rank, pp_rank, dp_rank)

    @property
    def tp_groups(self) -> list[list[int]]:
        """Ranks of each tensor-parallel group (consecutive ranks), replica by replica, stage by stage."""
        t, p, d = self.layout.tp, self.layout.pp, self.layout.dp
        return [[self.rank(RankCoords(i, s, r)) for i in range(t)] for r in range(d) for s in range(p)]

    @property
    def pp_groups(self) -> list[list[int]]:
        """Ranks of each pipeline (one per (dp, tp) pair), stage 0 first."""
        t, p, d = self.layout.tp, self.layout.pp, self.layout.dp
        return [[self.rank(RankCoords(i, s, r)) for s in range(p)] for r in range(d) for i in range(t)]

    @property
    def dp_groups(self) -> list[list[int]]:
        """Ranks holding the same shard in each replica (one group per (pp, tp) pair)."""
        t, p, d = self.layout.tp, self.layout.pp, self.layout.dp
        return [[self.rank(RankCoords(i, s, r)) for r in range(d)] for s in range(p) for i in range(t)]

    @property
    def ep_groups(self) -> list[list[int]]:
        """Ranks sharing one MoE layer's experts: per stage, the (dp, tp) plane in rank order cut into blocks of
        ep (ep = tp x dp: the stage's TP groups of every replica; ep dividing tp: a slice of one TP group)."""
        t, p, d, e = self.layout.tp, self.layout.pp, self.layout.dp, self.layout.ep
        plane = [[self.rank(RankCoords(i, s, r)) for r in range(d) for i in range(t)] for s in range(p)]
        return [ranks[j:j + e] for ranks in plane for j in range(0, t * d, e)]

    def groups(self, kind: str) -> list[list[int]]:
        """The groups of one kind: "tp", "pp", "dp" or "ep"."""
        if kind not in GROUP_KINDS:
            raise TopoplanError(f"group kind {kind!r}: expected one of {', '.join(GROUP_KINDS)}")
        return getattr(self, f"{kind}_groups")

    def group_of(self, kind: str, rank: int) -> list[int]:
        """The group of `kind` that `rank` belongs to."""
        return next(group for group in self.groups(kind) if rank in group)


def split_layers(layers: int, pp: int) -> list[range]:
    """The decoder layers each pipeline stage holds: as even as possible, as vLLM splits them.

    vLLM (vllm.distributed.utils.get_pp_indices) gives the remainder to the stages just before the last one,
    counting back from there: the last stage also holds the final norm and the LM head, and with few extra
    layers the first stage (embedding) is spared too, which lowers the largest stage's memory. Pricing the
    split vLLM runs keeps a plan true for the engine users deploy; the bundled runner runs the same split.
    E.g. 126 layers on 4 stages: 31/32/32/31; 4 layers on 3 stages: 1/2/1; 5 on 3: 2/2/1.
    """
    if layers < 1 or pp < 1:
        raise TopoplanError(f"cannot split {layers} layers into {pp} pipeline stages")
    if pp > layers:
        raise TopoplanError(f"pp={pp} is more stages than the model's {layers} layers")
    base, extra = divmod(layers, pp)
    counts = [base + (1 if pp - 1 - extra <= stage < pp - 1 else 0) for stage in range(pp)]
    bounds = [0, *accumulate(counts)]
    return [range(bounds[s], bounds[s + 1]) for s in range(pp)]


def layer_split_json(stages: Sequence[Sequence[int]]) -> list[dict[str, int]]:
    """The JSON form of a layer split (`plan --json`, the runner's result, `validate`): per stage its first and
    last layer (inclusive) and how many it holds."""
    return [{"pp_rank": i, "first_layer": layers[0], "last_layer": layers[-1], "layers": len(layers)}
            for i, layers in enumerate(stages)]


@dataclass(frozen=True)
class RankPlacement:
    """Which physical GPU one rank runs on: the planner's output, the launcher's input."""

    rank: int
    node: int  # 0-based node (host) index
    gpu: str  # the GPU's id on that node, "GPU5" (nvidia-smi / NVML numbering)
    tp_rank: int
    pp_rank: int
    dp_rank: int


# Schedule facts the planner prices and the runner runs, written once below both.

# A weight of this size or more streams from memory (above a core's L2, 512 KiB on this project's VM): its
# product pays Calibration.matmul_call_us, and the runner times MKL and packed oneDNN on it and keeps the faster
# (topoplan.runner.cpu_linear); one that fits in a core's cache is a small kernel, priced in layer_overhead_us
# (whose probe runs such a model).
STREAMED_WEIGHT_BYTES = 1 << 20


def micro_batches(stages: int, batch: int, requested: int = 0) -> int:
    """Pipeline micro-batches in flight: `requested` of them (0: one per stage), at most one per sequence."""
    return max(1, min(requested or stages, batch))


def tp_problems(tp: int, heads: int, kv_heads: int | None, widths: dict[str, int]) -> list[str]:
    """Why `tp` cannot split a model: heads, KV heads (None: MLA, replicated) and each named width must divide
    evenly. The one TP rule of the planner and the runner (which passes its vocabulary as a width too)."""
    problems = [f"{name}={value} is not divisible by tp={tp}"
                for name, value in {"num_attention_heads": heads, **widths}.items() if value % tp]
    if kv_heads is not None and kv_heads % tp and tp % kv_heads:
        problems.append(f"num_key_value_heads={kv_heads} neither divides nor is divisible by tp={tp}")
    return problems
