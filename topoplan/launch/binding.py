"""CPU cores and memory node for each rank: split a GPU's CPU affinity between the ranks that share it.

Why this matters: a rank bound to CPUs across the socket from its GPU pays the SMP hop on every host copy,
and two ranks on the same cores fight over them. So each rank gets CPUs from its own GPU's affinity set,
no CPU is given twice, and whole physical cores (all SMT threads of a core) are handed out before a core's
threads are split between ranks.

Which logical CPUs are SMT siblings:
- on the live machine, `/sys/devices/system/cpu/cpu*/topology/thread_siblings_list` (`CpuFacts.read_sysfs`);
- from a `nvidia-smi topo -m` paste there is only a CPU list, so we assume Linux's standard numbering:
  a list made of exactly two equally long runs (`48-63,176-191`) is one run of cores followed by their
  SMT siblings (cpu c pairs with c + 128 there); any other list (`0-71`, `4,6,9,15,17`) is one CPU per core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from topoplan.errors import TopoplanError
from topoplan.topology.render.cpuset import format_cpu_list
from topoplan.topology.smi_text import parse_cpu_list

Core = tuple[int, ...]  # the logical CPUs (SMT threads) of one physical core, sorted


def read_cpu_list(path: Path) -> tuple[int, ...]:
    """A sysfs cpulist file (`0-3,8,10-11`) -> (0, 1, 2, 3, 8, 10, 11); blank (a memory-only node) -> ()."""
    text = path.read_text()
    try:
        return parse_cpu_list(text)
    except ValueError as error:
        raise TopoplanError(f"expected a CPU list such as 0-3,8, got {str(error)!r} in {text.strip()!r}",
                            source=path) from None


@dataclass(frozen=True)
class CpuFacts:
    """What the live machine says about its CPUs: SMT siblings and which NUMA nodes have CPUs."""

    siblings: Mapping[int, Core]  # logical CPU -> all threads of its core
    node_cpus: Mapping[int, tuple[int, ...]]  # NUMA node -> its CPUs (empty for memory-only nodes)
    online: tuple[int, ...] | None = None  # /sys/devices/system/cpu/online; None: not known

    @classmethod
    def read_sysfs(cls, root: Path = Path("/sys/devices/system")) -> "CpuFacts":
        siblings: dict[int, Core] = {}
        for path in sorted((root / "cpu").glob("cpu[0-9]*/topology/thread_siblings_list")):
            cpu = int(path.parent.parent.name[3:])
            siblings[cpu] = read_cpu_list(path)
        node_cpus = {int(p.parent.name[4:]): read_cpu_list(p)
                     for p in sorted((root / "node").glob("node[0-9]*/cpulist"))}
        online_path = root / "cpu" / "online"
        return cls(siblings, node_cpus, read_cpu_list(online_path) if online_path.exists() else None)

    def check_online(self, cpus: Sequence[int], source: str | None) -> None:
        """Refuse to bind to CPUs this machine does not have online: a paste from another machine, read as if
        it were this one (--this-machine), would make numactl fail on every rank."""
        if self.online is None:
            return
        missing = sorted(set(cpus) - set(self.online))
        if missing:
            raise TopoplanError(f"the topology's GPUs are near CPUs {format_cpu_list(missing)}, which are not online on "
                                f"this machine (online: {format_cpu_list(self.online)}): is it a paste from another "
                                "machine? Drop --this-machine", source=source)


def assumed_cores(cpus: Sequence[int]) -> list[Core]:
    """Cores of an affinity list read from a paste, under the numbering assumption in the module docstring."""
    cpus = sorted(cpus)
    half = len(cpus) // 2
    runs = format_cpu_list(cpus).split(",")
    if len(runs) == 2 and len(cpus) == 2 * half and half:
        offset = cpus[half] - cpus[0]
        if all(cpus[i + half] - cpus[i] == offset for i in range(half)):
            return [(cpus[i], cpus[i + half]) for i in range(half)]
    return [(cpu,) for cpu in cpus]


def physical_cores(cpus: Sequence[int], facts: CpuFacts | None) -> list[Core]:
    """The affinity set grouped into physical cores (threads outside the set dropped), lowest CPU first."""
    if facts is None or not facts.siblings:
        return assumed_cores(cpus)
    wanted = set(cpus)
    cores = {tuple(c for c in facts.siblings.get(cpu, (cpu,)) if c in wanted) or (cpu,) for cpu in wanted}
    return sorted(cores)


@dataclass(frozen=True)
class CpuShare:
    """The CPUs one rank gets and how many whole physical cores they make up."""

    cpus: tuple[int, ...]
    physical_cores: int


def _chunks(items: Sequence, parts: int) -> list[list]:
    """Split into `parts` contiguous chunks whose sizes differ by at most one (bigger chunks first)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def split_cpus(requests: Mapping[int, Sequence[int]], facts: CpuFacts | None, *, where: str,
               source: str | None = None) -> dict[int, CpuShare]:
    """Give every rank (key) CPUs from its own affinity set (value), without overlap, whole cores first.

    Ranks with the same affinity set share it evenly in contiguous blocks. Where sets overlap only in
    part, the smaller set is served first and leaves the later sets a share of the common cores in
    proportion to their rank counts. `where` names the node in errors.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, cpus in sorted(requests.items()):
        groups.setdefault(tuple(sorted(set(cpus))), []).append(rank)
    order = sorted(groups, key=lambda s: (len(s), s))
    taken: set[int] = set()
    shares: dict[int, CpuShare] = {}
    for position, cpu_set in enumerate(order):
        ranks = groups[cpu_set]
        free = [core for core in physical_cores(cpu_set, facts) if not taken.intersection(core)]
        later = order[position + 1:]
        contended = [core for core in free if any(set(core) & set(s) for s in later)]
        contended_cpus = {cpu for core in contended for cpu in core}
        waiting = sum(len(groups[s]) for s in later if contended_cpus.intersection(s))
        keep = len(contended) * len(ranks) // (len(ranks) + waiting) if waiting else len(contended)
        kept = set(contended[:keep])
        mine = [core for core in free if core not in contended or core in kept]
        if len(mine) >= len(ranks):
            blocks = _chunks(mine, len(ranks))
            given = [(tuple(sorted(c for core in block for c in core)), len(block)) for block in blocks]
        else:
            threads = [c for core in mine for c in core]
            if len(threads) < len(ranks):
                raise TopoplanError(
                    f"{where}: {len(ranks)} ranks share CPU affinity {format_cpu_list(cpu_set)}, but only "
                    f"{len(threads)} of its CPUs are free to bind; every rank needs at least one CPU "
                    "(use fewer ranks per node, or a machine whose GPUs have larger CPU affinity)", source=source)
            given = [(tuple(sorted(block)), 1) for block in _chunks(threads, len(ranks))]
        for rank, (cpus, cores) in zip(ranks, given):
            shares[rank] = CpuShare(cpus, cores)
            taken.update(cpus)
    return shares


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
