"""A rank's intra-op thread count on a shared host: one thread fewer while that decodes faster.

Why: a rank runs one OpenMP thread per core it owns, and each matrix product splits its rows evenly over them.
When another process takes one of those cores, the thread that shares it gets part of a core, and every product
waits at its barrier for that thread: on the 2-core Intel VM, `small` at TP1 beside one spinning process decoded
at 37.9-38.8 ms/token with 2 threads and 29.6-30.5 with 1 (quiet: 16.0 against 28.8-30.5). No count is right in
advance, since the other process comes and goes, so the rank measures: each decode step is timed, and

- the first window of WINDOW steps is followed by FIRST_TRIES tries of one thread fewer, each one step, so a
  host already busy at start-up is seen (the second try runs with the lower count's kernels already set up, in
  case the first paid for that); a try of fewer is kept if its step took less than FASTER x the latest median;
- after that, a step's time at the current count is compared with that count's level (the lowest median of
  WINDOW consecutive steps seen at it, or the median when a try of fewer last lost); when the latest WINDOW run
  more than SLOWER times that (looked at once every PROBE_EVERY steps after a try), the next step runs one
  thread fewer, on the same test;
- below the rank's own count, every PROBE_EVERY steps one step tries one thread more (the other process may
  have ended), kept if it was any faster than the latest median (one thread more of many gains little);
- a try still open when a generation ends is undone (`end`), so the next prefill runs at the kept count.

A try that loses costs one step at the other count. On a quiet host the count stays (the warm-up, before the
timed run, holds the first tries). A try of fewer that loses makes the latest median the count's level: its
steps are slow for a reason one thread fewer does not mend (a context that grows, every core taken), so the next
try waits until they run SLOWER x slower again, instead of one losing try every PROBE_EVERY steps.

Only ranks with no collective in their step use it (tp = pp = ep = 1, as one DP replica; not under torch.compile,
whose generated kernels may fix their thread count): a TP, PP or EP rank's step time includes waiting for its
peers, which would steer its count by theirs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

WINDOW = 4  # steps whose median is compared
FIRST_TRIES = 2  # tries of one thread fewer after the first window
SLOWER = 1.3  # the latest median over the count's level above which one thread fewer is tried
FASTER = 0.9  # a try of fewer threads is kept when its step takes less than this x the latest median
PROBE_EVERY = 16  # steps between tries of one thread more while below the rank's count
WARM_UP_STEPS = WINDOW + 2 * FIRST_TRIES - 1  # decode steps that hold the first tries (the window, then each
# try and a step to refill the window, but the last)


class ThreadTuner:
    """`on_step` for topoplan.runner.generate: called after each step with its index (0: a prefill), it times the
    decode steps and sets torch's intra-op threads between 1 and `threads` (module docstring); `end()` after each
    generation. `changes` holds (decode steps seen, new count) for every change, for the run's JSON."""

    def __init__(self, threads: int, clock: Callable[[], float] = time.perf_counter,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        self.most = self.count = threads
        self.clock, self.set_threads = clock, set_threads
        self.recent: list[float] = []  # decode step times at `count` since it was set
        self.level: dict[int, float] = {}  # count -> lowest WINDOW median seen at it since a try of fewer lost
        self.trying: int | None = None  # the count of the step being timed, when it is a try
        self.first_tries = 0
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
        median = statistics.median(self.recent[-WINDOW:])
        if now - before < (FASTER if tried < self.count else 1.0) * median:
            self.count, self.recent = tried, []
            self.changes.append((self.steps, tried))
            return
        self.set_threads(self.count)
        self.recent = self.recent[-(WINDOW - 1):]  # one more step at the kept count before the next look
        if tried < self.count:  # slower for a reason fewer threads do not mend (a longer context, every core busy)
            self.level[self.count] = median

    def end(self) -> None:
        """The generation ended: undo a try it left open (the next one starts with a prefill at the kept count)."""
        if self.trying is not None:
            self.trying = None
            self.set_threads(self.count)

    def _observe(self, took: float) -> None:
        self.recent.append(took)
        if len(self.recent) < WINDOW:
            return
        median = statistics.median(self.recent[-WINDOW:])
        self.level[self.count] = min(self.level.get(self.count, median), median)
        if self.count > 1 and self.first_tries < FIRST_TRIES:
            self.first_tries += 1
            self._try(self.count - 1)
        elif self.since_try < PROBE_EVERY:
            return
        elif self.count > 1 and median > SLOWER * self.level[self.count]:
            self._try(self.count - 1)
        elif self.count < self.most:
            self._try(self.count + 1)

    def _try(self, count: int) -> None:
        self.trying, self.since_try = count, 0
        self.set_threads(count)
