"""Topologies of the bundled `topo -m` fixtures, built from their hand-checked expected parses.

Used by the planner tests so they test placement on the real machines independently of the text parser.
"""

from __future__ import annotations

import json
from pathlib import Path

from topoplan.topology.model import Gpu, Nic, Topology, build_topology

EXPECTED = Path(__file__).resolve().parent.parent / "fixtures" / "topo" / "expected"


def fixture_topology(prefix: str, arch: str | None = None) -> Topology:
    """The fixture whose file name starts with `prefix` ("17_"), links estimated for `arch`."""
    (path,) = EXPECTED.glob(f"{prefix}*.json")
    data = json.loads(path.read_text())
    gpus = [Gpu(g["id"], i, numa_node=g.get("numa_node")) for i, g in enumerate(data["gpus"])]
    nics = [Nic(n["id"], i, name=n.get("name")) for i, n in enumerate(data["nics"])]
    codes = {tuple(pair.split("-")): code for pair, code in data["links"].items()}
    return build_topology(gpus, nics, codes, arch=arch, source=data["file"])
