"""A machine: its topology (topoplan.topology, from a file or read live) and which GPU it has, from the
catalog (topoplan.hardware). The topology layer knows no catalog; this is where the two meet."""

from __future__ import annotations

from pathlib import Path

from topoplan.hardware import apply_gpu
from topoplan.topology.model import Gpu, Topology, build_topology
from topoplan.topology.sources import read_source


def load_topology(file: str | None, p2p: str | None = None, source: str = "auto", save: str | Path | None = None,
                  gpu: str | None = None, cpu: str | None = None) -> Topology:
    """The topology from `file` (a paste or recording; `-` is stdin), or from this machine when None:
    NVML, `nvidia-smi topo -m`, or (auto) NVML and then nvidia-smi. `save` writes the NVML recording; `gpu`
    names the GPU when the source cannot (topo -m text), which is otherwise inferred from the links; `cpu` the
    CPU family (topology.links.CPU_LINKS) for the SYS-hop estimates, over the one a recording's CPU model gives."""
    return apply_gpu(read_source(file, p2p, source, save), gpu).with_cpu(cpu)


CPU_LINK = "NODE"  # the `topo -m` code, and so the calibration link class (`node`), of CPU rank pairs


def cpu_topology(devices: int, cpus: tuple[int, ...] | None = None) -> Topology:
    """`devices` CPU "devices" (one per CPU-process rank) on one NUMA node, all pairs linked by the `node` class.

    gloo between processes of one NUMA node goes through loopback TCP and shared memory, never a PCIe path: the
    class only carries what `topoplan calibrate` measured for it. `cpus`: the CPUs every device may use (this
    machine's, for `launch --device cpu`, which splits them between the ranks); None: no affinity known."""
    gpus = [Gpu(f"CPU{i}", i, name="cpu", cpus=cpus, numa_node=0) for i in range(devices)]
    codes = {(a.id, b.id): CPU_LINK for a in gpus for b in gpus if a.index < b.index}
    return build_topology(gpus, [], codes, source="cpu")
