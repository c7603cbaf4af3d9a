"""The one definition of rank order, shared by the planner, the launcher and the runner.

TP varies fastest, then PP, then DP (Megatron-LM, vLLM and TensorRT-LLM all use this order):
`rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank`. The runner's torch twin is
`torch.arange(world).view(dp, pp, tp)`; tests check both agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topoplan.errors import TopoplanError


@dataclass(frozen=True, order=True)
class Layout:
    """A parallel layout: tensor-parallel degree x pipeline stages x data-parallel replicas."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            if getattr(self, name) < 1:
                raise TopoplanError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}"

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Read `tp=4,pp=2,dp=1` (any order, missing degrees are 1)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(tp|pp|dp)\s*=\s*(\d+)", part)
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


def rank_of(layout: Layout, coords: RankCoords) -> int:
    """Global rank of the process at these coordinates."""
    return (coords.dp_rank * layout.pp + coords.pp_rank) * layout.tp + coords.tp_rank


def coords_of(layout: Layout, rank: int) -> RankCoords:
    """Inverse of `rank_of`."""
    if not 0 <= rank < layout.world:
        raise TopoplanError(f"rank {rank} is outside a world of {layout.world} ({layout})")
    rest, tp_rank = divmod(rank, layout.tp)
    dp_rank, pp_rank = divmod(rest, layout.pp)
    return RankCoords(tp_rank, pp_rank, dp_rank)


def tp_groups(layout: Layout) -> list[list[int]]:
    """Ranks of each tensor-parallel group (consecutive ranks)."""
    return [[rank_of(layout, RankCoords(t, p, d)) for t in range(layout.tp)]
            for d in range(layout.dp) for p in range(layout.pp)]


def pp_groups(layout: Layout) -> list[list[int]]:
    """Ranks of each pipeline (one per (dp, tp) pair), stage 0 first."""
    return [[rank_of(layout, RankCoords(t, p, d)) for p in range(layout.pp)]
            for d in range(layout.dp) for t in range(layout.tp)]


def dp_groups(layout: Layout) -> list[list[int]]:
    """Ranks holding the same shard in each replica (one group per (pp, tp) pair)."""
    return [[rank_of(layout, RankCoords(t, p, d)) for d in range(layout.dp)]
            for p in range(layout.pp) for t in range(layout.tp)]


@dataclass(frozen=True)
class RankPlacement:
    """Which physical GPU one rank runs on: the planner's output, the launcher's input."""

    rank: int
    node: int  # 0-based node (host) index
    gpu: str  # the GPU's id on that node, "GPU5" (nvidia-smi / NVML numbering)
    tp_rank: int
    pp_rank: int
    dp_rank: int
