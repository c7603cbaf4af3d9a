"""Where each rank's CPUs and host memory come from, and which memory policy binds them.

Why this matters: a rank whose memory sits across the socket from its CPUs pays the SMP hop on every
access, so each rank runs on the CPUs near its GPU and allocates on their NUMA node. The CPUs themselves are
split between ranks by topoplan.cpuset.split_cpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topoplan.cpuset import CpuFacts, format_cpu_list
from topoplan.errors import TopoplanError
from topoplan.topology.model import Gpu, Topology

# numactl's memory policies, by --mem-policy name: (the numactl option, or None for no policy; why).
MEM_POLICIES: dict[str, tuple[str | None, str]] = {
    "preferred": ("--preferred", "allocate on this node first and spill to the others when it is full, instead of "
                  "failing: loading a large checkpoint into pinned host buffers can outgrow one node "
                  "(numactl(8): --preferred)"),
    "bind": ("--membind", "allocate only on this node; an allocation that does not fit fails (the OOM killer), "
             "it never spills (numactl(8): --membind is strict)"),
    "none": (None, "no memory policy: the kernel's default, first touch on the node of the CPU that touches"),
}
DEFAULT_MEM_POLICY = "preferred"  # locality without the strict policy's out-of-memory failure mode


def check_mem_policy(policy: str) -> str:
    if policy not in MEM_POLICIES:
        raise TopoplanError(f"--mem-policy {policy!r}: expected one of {', '.join(MEM_POLICIES)}")
    return policy


@dataclass(frozen=True)
class CpuSource:
    """The CPUs a GPU's ranks may share: a list (`cpus`), or a whole NUMA node (`node`) when only its number is
    known (numactl --cpunodebind), or neither (not CPU-bound); `reason` says which and why."""

    cpus: tuple[int, ...] | None
    node: int | None
    reason: str


def cpu_source(gpu: Gpu, topology: Topology, facts: CpuFacts | None) -> CpuSource:
    """The GPU's CPU affinity; where the topology leaves it empty (seen on H200 boxes whose container cpuset
    holds no CPU of the GPU's socket), the CPUs of its NUMA node: from /sys when this is the machine, else those
    the topology lists for other GPUs on that node, else the node itself (numactl --cpunodebind)."""
    if gpu.cpus:
        return CpuSource(gpu.cpus, None, f"{gpu.id}'s CPU affinity")
    node = gpu.numa_node
    if node is None:
        return CpuSource(None, None, f"{gpu.id}: the topology gives neither CPU affinity nor a NUMA node, so the "
                                     "rank is not CPU-bound")
    empty = f"{gpu.id}'s CPU affinity is empty in the topology"
    if facts is not None and facts.node_cpus.get(node):
        return CpuSource(tuple(facts.node_cpus[node]), None,
                         f"{empty}: the CPUs of its NUMA node {node} (/sys/devices/system/node)")
    peers = sorted({c for g in topology.gpus if g.numa_node == node and g.cpus for c in g.cpus})
    if peers:
        return CpuSource(tuple(peers), None, f"{empty}: the CPUs listed for the other GPUs of its NUMA node {node}")
    return CpuSource(None, node, f"{empty}: bound to its NUMA node {node}'s CPUs (numactl --cpunodebind={node}), "
                                 "shared by the ranks there, as no CPU list of that node is known")


def describe_cpus(cpus: Sequence[int] | None, node: int | None) -> str:
    """The binding as --explain shows it."""
    if cpus is not None:
        return format_cpu_list(cpus)
    return f"NUMA node {node}" if node is not None else "(not bound)"


def memory_node(cpus: Sequence[int] | None, numa_node: int | None, memory_only: set[int],
                facts: CpuFacts | None) -> tuple[int | None, str]:
    """The NUMA node to allocate this rank's host memory on, and why; None means `--localalloc`.

    Never a memory-only node (a Grace GPU's own HBM node has no CPUs): host buffers there would sit in
    GPU memory and be read across the C2C link by the CPU.
    """
    if facts is not None and facts.node_cpus and cpus:
        with_cpus = {node: set(node_cpus) for node, node_cpus in facts.node_cpus.items() if node_cpus}
        best = max(sorted(with_cpus), key=lambda node: len(with_cpus[node].intersection(cpus)), default=None)
        if best is not None and with_cpus[best].intersection(cpus):
            return best, "the NUMA node holding this rank's CPUs (read from /sys/devices/system/node)"
    if numa_node is not None and numa_node not in memory_only:
        return numa_node, "the GPU's NUMA affinity in the topology; a node with CPUs, not a GPU-memory node"
    why = ("the topology gives no NUMA node for this GPU" if numa_node is None
           else f"NUMA node {numa_node} is a memory-only GPU node")
    return None, f"{why}: allocate locally to the bound CPUs instead (numactl --localalloc)"
