"""Machine topology: the graph model, link table, readers (smi text, p2p, NVML, recordings), renderers."""

from topoplan.topology.links import LinkKind
from topoplan.topology.model import Gpu, Link, Nic, Topology, build_topology

__all__ = ["Gpu", "Link", "LinkKind", "Nic", "Topology", "build_topology"]
