"""CPU sets, the one place that parses, formats and splits them: launch binds ranks with them, the runner
and the bench start local ranks on them, topology reads and draws them.

Lists are written as Linux writes them (`0-15,64-79`: nvidia-smi's affinity column, sysfs `cpulist`
files, `taskset -c`, `numactl --physcpubind`). Splitting gives ranks that share a GPU's affinity set their
own CPUs: a rank bound across the socket from its GPU pays the SMP hop on every host copy, and two ranks
on the same cores fight over them. So no CPU is given twice, and whole physical cores (all SMT threads of
a core) are handed out before a core's threads are split between ranks.

Which logical CPUs are SMT siblings:
- on the live machine, `/sys/devices/system/cpu/cpu*/topology/thread_siblings_list` (`CpuFacts.read_sysfs`);
- from a `nvidia-smi topo -m` paste there is only a CPU list, so we assume Linux's standard numbering:
  a list made of exactly two equally long runs (`48-63,176-191`) is one run of cores followed by their
  SMT siblings (cpu c pairs with c + 128 there); any other list (`0-71`, `4,6,9,15,17`) is one CPU per core.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from topoplan.errors import TopoplanError

MAX_CPU = 65535  # beyond any Linux NR_CPUS; a larger number in a list is damage
# How long a thread of torch's OpenMP pool (GNU libgomp in torch's CPU builds) spins at a barrier before it sleeps
# (GOMP_SPINCOUNT), for CPU ranks: `topoplan run` sets it (topoplan.runner.local), `topoplan launch --device cpu`
# emits it. libgomp's default, 300,000 spins, lets a waiting thread hold its core while the sibling it waits for has
# been descheduled by another process's work: on the 2-core VM, beside one process spinning a core, `small` decoded
# at 117-225 ms a token instead of 16 (vLLM-CPU: 42). At 10,000 spins: 39-44 ms busy and the same 16 ms quiet;
# 3,000 cost 15% quiet (`tiny` 45%); OMP_WAIT_POLICY=PASSIVE (no spin) cost 23% quiet (docs/runner.md).
GOMP_SPIN_COUNT = 10_000
_NUMBER = re.compile(r"[0-9]{1,5}")  # MAX_CPU has 5 digits


def cpu_cores() -> list[int]:
    """The CPUs this process may run on (the affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The Linux cpulist format (nvidia-smi's affinity column, sysfs `cpulist` files): `0-63,128-191` /
    `4,6,9` / `0-0,8-8` -> sorted CPU numbers; blank -> (). ValueError if bad.

    The work is bounded by the CPUs, not by how the list repeats them: at most one range per possible CPU, and
    the ranges are merged before any is expanded, so `0-65535` given 100,000 times costs one expansion."""
    text = text.strip()
    if not text:
        return ()
    parts = text.split(",", MAX_CPU + 1)
    if len(parts) > MAX_CPU + 1:
        raise ValueError(f"more than {MAX_CPU + 1} ranges")
    ranges: list[tuple[int, int]] = []
    for part in parts:
        low, dash, high = part.partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise ValueError(part)
        a, b = int(low), int(high or low)
        if a > b or b > MAX_CPU:
            raise ValueError(part)
        ranges.append((a, b))
    cpus: list[int] = []
    for a, b in sorted(ranges):
        start = max(a, cpus[-1] + 1) if cpus else a  # overlaps with what is already in are skipped, not re-added
        cpus.extend(range(start, b + 1))
    return tuple(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 8]` -> `"0-3,8"`, the form numactl and taskset accept; no CPUs -> `""`."""
    ranges: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def compact_cpus(cpus: Iterable[int] | None) -> str:
    """`format_cpu_list` for a table cell: None or no CPUs -> `"-"` (no affinity known)."""
    return format_cpu_list(cpus or ()) or "-"


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
    def read_sysfs(cls, root: Path = Path("/sys/devices/system")) -> CpuFacts:
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
            raise TopoplanError(f"the topology's GPUs are near CPUs {format_cpu_list(missing)}, which are not online "
                                f"on this machine (online: {format_cpu_list(self.online)}): is it a paste from another "
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
