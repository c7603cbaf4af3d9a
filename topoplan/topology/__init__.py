"""Machine topology: the graph model, link table, readers (smi text, p2p, NVML, recordings), renderers.

The graph model (and networkx under it, ~0.2 s to import) loads on first use of a name below, not when a
submodule such as sysfs_nics or nvml_query is imported: `topoplan doctor` reads sysfs through those without
building a graph, within its 1 s budget."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {"LinkKind": "topoplan.topology.links", "Gpu": "topoplan.topology.model", "Link": "topoplan.topology.model",
         "Nic": "topoplan.topology.model", "Topology": "topoplan.topology.model",
         "build_topology": "topoplan.topology.model"}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)
