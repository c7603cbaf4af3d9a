"""A rank's intra-op thread count on a shared host: one thread fewer while that decodes faster.

Why: a rank runs one OpenMP thread per core it owns, and each matrix product splits its rows evenly over them.
When another process takes one of those cores, the thread that shares it gets part of a core, and every product
waits at its barrier for that thread: on the 2-core Intel VM, `small` at TP1 beside one spinning process decoded
at 37.9-38.8 ms/token with 2 threads and 29.6-30.5 with 1 (quiet: 16.0 against 28.8-30.5). No count is right in
advance, since the other process comes and goes, so the rank measures: each decode step is timed, and

- a step's time at the current count is compared with that count's quiet level (the lowest median of WINDOW
  consecutive steps seen at it); when the latest WINDOW run more than SLOWER times that (looked at once every
  PROBE_EVERY steps after a try), the next step runs one thread fewer, and the fewer is kept if that step took
  less than FASTER x the latest median;
- below the rank's own count, every PROBE_EVERY steps one step tries one thread more (the other process may
  have ended), kept on the same test;
- the first window is always followed by a try of one fewer, so a host already busy at start-up is seen.

A try that loses costs one step at the other count. On a quiet host the count stays (the warm-up, before the
timed run, holds the first try), and steps only run slower than SLOWER x the quiet level when something else
takes the cores. Only ranks with no collective in their step use it (tp = pp = 1, as one DP replica): a TP or PP
rank's step time includes waiting for its peers, which would steer its count by theirs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

WINDOW = 4  # steps whose median is compared
SLOWER = 1.3  # the latest median over the quiet level above which one thread fewer is tried
FASTER = 0.9  # a try is kept when its step takes less than this x the latest median
PROBE_EVERY = 16  # steps between tries of one thread more while below the rank's count


class ThreadTuner:
    """`on_step` for topoplan.runner.generate: called after each step with its index (0: a prefill), it times the
    decode steps and sets torch's intra-op threads between 1 and `threads` (module docstring). `changes` holds
    (decode steps seen, new count) for every change, for the run's JSON."""

    def __init__(self, threads: int, clock: Callable[[], float] = time.perf_counter,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        self.most = self.count = threads
        self.clock, self.set_threads = clock, set_threads
        self.recent: list[float] = []  # decode step times at `count` since it was set
        self.quiet: dict[int, float] = {}  # count -> lowest WINDOW median seen at it
        self.trying: int | None = None  # the count of the step being timed, when it is a try
        self.tried_fewer = False
        self.since_try = 0  # steps
        self.steps = 0  # decode steps seen, over every generation
        self.last = 0.0
        self.changes: list[tuple[int, int]] = []

    def __call__(self, step: int) -> None:
        now = self.clock()
        before, self.last = self.last, now
        if step == 0:  # the prefill ended: decode steps are timed from here
            return
        self.steps += 1
        self.since_try += 1
        if self.trying is None:
            self._observe(now - before)
            return
        tried, self.trying = self.trying, None
        if now - before < FASTER * statistics.median(self.recent[-WINDOW:]):
            self.count, self.recent = tried, []
            self.changes.append((self.steps, tried))
        else:
            self.set_threads(self.count)

    def _observe(self, took: float) -> None:
        self.recent.append(took)
        if len(self.recent) < WINDOW:
            return
        median = statistics.median(self.recent[-WINDOW:])
        self.quiet[self.count] = min(self.quiet.get(self.count, median), median)
        if self.count > 1 and not self.tried_fewer:
            self._try(self.count - 1)
        elif self.since_try < PROBE_EVERY:
            return
        elif self.count > 1 and median > SLOWER * self.quiet[self.count]:
            self._try(self.count - 1)
        elif self.count < self.most:
            self._try(self.count + 1)

    def _try(self, count: int) -> None:
        self.tried_fewer = self.tried_fewer or count < self.count
        self.trying, self.since_try = count, 0
        self.set_threads(count)
