"""The JSON form of a topology: the contract other tools read (`topoplan inspect --json`, and the planner's
output embeds it). Keys documented in docs/topology.md; new keys may be added, existing ones never change.
"""

from __future__ import annotations

import json
import re
from typing import Any

from topoplan.topology.diagnose import Warning, diagnose
from topoplan.topology.model import Topology


def device_order(topo: Topology) -> dict[str, int]:
    """GPUs by index, then NICs by index: the order of `topo -m`'s columns."""
    return {d.id: i for i, d in enumerate([*topo.gpus, *topo.nics])}


def topology_dict(topo: Topology, warnings: list[Warning] | None = None) -> dict[str, Any]:
    """A JSON-ready dict: gpus, nics, links (one per unordered pair, `a` before `b` in column order),
    nvlink_islands, warnings, notes, arch. `warnings` defaults to `diagnose(topo)`."""
    order = device_order(topo)
    warnings = diagnose(topo) if warnings is None else warnings
    island_of = {g: i for i, island in enumerate(topo.nvlink_islands()) for g in island}
    gpus = [
        {
            "id": g.id,
            "index": g.index,
            "cpus": list(g.cpus) if g.cpus is not None else None,
            "numa_node": g.numa_node,
            "gpu_numa_id": g.gpu_numa_id,
            "name": g.name,
            "pci_bus_id": g.pci_bus_id,
            "uuid": g.uuid,
            "memory_bytes": g.memory_bytes,
            "cuda_index_pci_bus": g.cuda_index_pci_bus,
            "cuda_index_default": g.cuda_index_default,
            "visible": g.visible,
            "error": g.error,
            "fabric_domain": g.fabric_domain,
            "nearest_nics": [n.id for n in topo.nearest_nics(g.id)],
            "nvlink_island": island_of.get(g.id),
        }
        for g in topo.gpus
    ]
    nics = [
        {"id": n.id, "index": n.index, "name": n.name, "pci_bus_id": n.pci_bus_id, "numa_node": n.numa_node,
         "nearest_gpus": [g.id for g in topo.nearest_gpus(n.id)]}
        for n in topo.nics
    ]
    links = []
    for link in topo.links():
        a, b = sorted((link.a, link.b), key=order.__getitem__)
        links.append({
            "a": a,
            "b": b,
            "code": link.code,
            "kind": link.kind.value,
            "nvlinks": link.nvlinks,
            "bandwidth_gbps": link.bandwidth_gbps,
            "latency_us": link.latency_us,
            "p2p": dict(link.p2p) if link.p2p is not None else None,
            "evidence": link.evidence,
        })
    return {
        "source": topo.source or None,
        "arch": topo.arch,
        "gpu_name": topo.gpu_name,
        "vendor": topo.vendor,
        "gpus": gpus,
        "nics": nics,
        "links": links,
        "nvlink_islands": topo.nvlink_islands(),
        "warnings": [w.as_dict() for w in warnings],
        "notes": list(topo.notes),
    }


_INT_LIST = re.compile(r"\[\n\s+(-?\d+(?:,\n\s+-?\d+)*)\n\s*\]")


def dumps(data: Any) -> str:
    """JSON indented for people, with lists of integers (CPU lists) kept on one line."""
    text = json.dumps(data, indent=2)
    return _INT_LIST.sub(lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]", text) + "\n"
