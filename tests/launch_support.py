"""Shared helpers for the launch tests: topologies from the fixtures' expected JSON, simple placements."""

from __future__ import annotations

import json
from pathlib import Path

from topoplan.layout import Layout, RankPlacement, coords_of
from topoplan.topology.model import Gpu, Nic, Topology, build_topology

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
EXPECTED = sorted((FIXTURES / "expected").glob("*.json"))
DGX_A100 = FIXTURES / "expected" / "00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.json"


def expected_topology(path: Path) -> Topology:
    """The topology a fixture's hand-checked expectation describes (independent of any parser)."""
    data = json.loads(path.read_text())
    gpus = [Gpu(g["id"], i, cpus=tuple(g["cpus"]) if g.get("cpus") else None, numa_node=g.get("numa_node"),
                gpu_numa_id=g.get("gpu_numa_id")) for i, g in enumerate(data["gpus"])]
    nics = [Nic(n["id"], i, name=n.get("name")) for i, n in enumerate(data["nics"])]
    codes = {tuple(pair.split("-")): code for pair, code in data["links"].items()}
    return build_topology(gpus, nics, codes, source=data["file"])


def block_placements(layout: Layout, gpu_ids: list[str], nodes: int = 1) -> list[RankPlacement]:
    """Ranks node by node, rank r of a node on gpu_ids[r]: what a launcher does without a planner."""
    per_node = layout.world // nodes
    out = []
    for rank in range(layout.world):
        c = coords_of(layout, rank)
        out.append(RankPlacement(rank, rank // per_node, gpu_ids[rank % per_node], c.tp_rank, c.pp_rank, c.dp_rank))
    return out
