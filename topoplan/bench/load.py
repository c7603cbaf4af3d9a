"""Is this machine busy? `calibrate` and `validate` time things; on a shared machine other processes take the
cores, and a figure measured then (a layer overhead 20x the quiet one, at load 8.6 on 2 cores) misleads the
planner without a word. Two readings, each checked against a threshold:

  before: the 1-minute load average per core. Above BUSY_LOAD_PER_CORE, other processes already keep that
      share of the cores runnable: our probes would get what is left. Refused without --force.
  during: the CPU time other processes took while a step ran, as a share of the machine's CPU time over
      the step: /proc/stat's busy time of every CPU minus our own (this process and the ranks it waited
      for). Above BUSY_OTHERS_SHARE the step's figures are suspect: said, and recorded in the result.

The readings come through `Sources`, the boundary tests replace with fakes. Imports no torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from topoplan.errors import TopoplanError

BUSY_LOAD_PER_CORE = 0.75  # docs/bench.md: the reference runs began near 0.5 per core; above 1 per core (load > 2 on
# 2 cores) validate's decode times drifted by 2-5x
BUSY_OTHERS_SHARE = 0.25  # others took a quarter of the CPU time while we measured


def proc_stat_busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine spent busy since boot (/proc/stat; None where there is none)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait is busy
    ticks = [int(v) for v in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (the ranks)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True)
class Sources:
    """What the monitor reads: the boundary a test replaces."""

    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg
    machine_busy_s: Callable[[], float | None] = proc_stat_busy_seconds
    own_cpu_s: Callable[[], float] = own_cpu_seconds
    clock: Callable[[], float] = time.monotonic
    cores: Callable[[], int] = lambda: os.cpu_count() or 1


@dataclass
class LoadMonitor:
    """The readings of one `calibrate` or `validate` run; `report()` is what the result records."""

    what: str  # the command, for the messages
    sources: Sources = field(default_factory=Sources)
    load_before: float | None = None
    others_share: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def cores(self) -> int:
        return self.sources.cores()

    def check_quiet(self, force: bool) -> None:
        """Read the load before measuring; busy: refused, or with `force` a warning."""
        self.load_before = self.sources.loadavg()[0]
        limit = BUSY_LOAD_PER_CORE * self.cores
        if self.load_before <= limit:
            return
        message = (f"this machine is busy: load average {self.load_before:.2f} over the last minute on "
                   f"{self.cores} core(s), above {limit:.2f} ({BUSY_LOAD_PER_CORE} per core); {self.what} would "
                   "time other processes' work too")
        if not force:
            raise TopoplanError(f"{message}: wait for a quieter moment, or pass --force to measure anyway")
        self.warnings.append(f"{message} (--force: measuring anyway)")

    @contextmanager
    def window(self, label: str) -> Iterator[None]:
        """Measure the share of CPU time other processes took while the block ran."""
        s = self.sources
        machine0, own0, clock0 = s.machine_busy_s(), s.own_cpu_s(), s.clock()
        yield
        machine1, own1, wall = s.machine_busy_s(), s.own_cpu_s(), s.clock() - clock0
        if machine0 is None or machine1 is None or wall <= 0:
            return
        others = max(0.0, (machine1 - machine0) - (own1 - own0))
        share = min(1.0, others / (wall * self.cores))
        self.others_share[label] = share
        if share > BUSY_OTHERS_SHARE:
            self.warnings.append(f"other processes took {share:.0%} of the CPU time while {label} ran (above "
                                 f"{BUSY_OTHERS_SHARE:.0%}): its figures are likely too slow")

    @property
    def busy(self) -> bool:
        return bool(self.warnings)

    def report(self) -> dict[str, Any]:
        return {"cores": self.cores, "load_before": self.load_before, "load_after": self.sources.loadavg()[0],
                "others_share": self.others_share, "busy": self.busy, "warnings": list(self.warnings),
                "thresholds": {"load_per_core": BUSY_LOAD_PER_CORE, "others_share": BUSY_OTHERS_SHARE}}
