"""A machine: its topology (topoplan.topology, from a file or read live) and which GPU it has, from the
catalog (topoplan.hardware). The topology layer knows no catalog; this is where the two meet."""

from __future__ import annotations

from pathlib import Path

from topoplan.hardware import apply_gpu
from topoplan.topology.model import Topology
from topoplan.topology.sources import read_source


def load_topology(file: str | None, p2p: str | None = None, source: str = "auto", save: str | Path | None = None,
                  gpu: str | None = None, cpu: str | None = None) -> Topology:
    """The topology from `file` (a paste or recording; `-` is stdin), or from this machine when None:
    NVML, `nvidia-smi topo -m`, or (auto) NVML and then nvidia-smi. `save` writes the NVML recording; `gpu`
    names the GPU when the source cannot (topo -m text), which is otherwise inferred from the links; `cpu` the
    CPU family (topology.links.CPU_LINKS) for the SYS-hop estimates, over the one a recording's CPU model gives."""
    return apply_gpu(read_source(file, p2p, source, save), gpu).with_cpu(cpu)
