"""The memory (NUMA) node each rank binds to; its CPUs come from topoplan.cpuset.split_cpus.

Why this matters: a rank whose memory sits across the socket from its CPUs pays the SMP hop on every
access, so each rank allocates on the node of the CPUs it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

from topoplan.cpuset import CpuFacts


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
