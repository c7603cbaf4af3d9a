"""`--device cpu`: the "devices" of a CPU-only launch, one slot per rank of a node, spread over NUMA nodes.

A CPU cluster has no `nvidia-smi topo -m` to read, so the node is described by this machine's /sys: its NUMA
nodes with the CPUs this process may use (launch from a node like the compute nodes). Slots fill the NUMA
nodes in blocks (ranks 0..k/2-1 on the first of two nodes), so neighbouring ranks, which share TP groups,
share a memory node; topoplan.cpuset.split_cpus then gives each slot its own cores of that node.
"""

from __future__ import annotations

from topoplan.cpuset import CpuFacts, cpu_cores
from topoplan.errors import TopoplanError
from topoplan.topology.model import Gpu, Topology, build_topology

SOURCE = "this machine's CPUs (--device cpu)"


def cpu_slots(per_node: int, facts: CpuFacts) -> Topology:
    """A topology of `per_node` CPU slots ("CPU0".."CPUk-1"), each with its NUMA node's usable CPUs."""
    allowed = set(cpu_cores())
    nodes = [(node, tuple(c for c in cpus if c in allowed)) for node, cpus in sorted(facts.node_cpus.items())]
    domains: list[tuple[int | None, tuple[int, ...]]] = [(n, c) for n, c in nodes if c]
    if not domains:  # no /sys/devices/system/node (some containers): one domain of every usable CPU
        domains = [(None, tuple(sorted(allowed)))]
    if per_node > len(allowed):
        raise TopoplanError(f"--device cpu: {per_node} rank(s) per node, but this machine lets this process use "
                            f"{len(allowed)} CPU(s); every rank needs one (use more --nodes or a smaller layout)")
    slots = []
    for i in range(per_node):
        node, cpus = domains[i * len(domains) // per_node]
        slots.append(Gpu(f"CPU{i}", i, cpus=cpus, numa_node=node))
    # the `topo -m` classes of a pair of CPU processes: same NUMA node, or across the SMP interconnect
    codes = {(a.id, b.id): "NODE" if a.numa_node == b.numa_node else "SYS" for a in slots for b in slots
             if a.index < b.index}
    return build_topology(slots, [], codes, source=SOURCE)
