"""topoplan.runner.threads: a CPU rank's thread count follows what decodes faster, on a simulated host whose step
times depend on the count and on whether another process holds a core."""

from __future__ import annotations

from topoplan.runner.threads import PROBE_EVERY, WINDOW, ThreadTuner

QUIET = {2: 16.0, 1: 29.0}  # ms a step, by thread count: the 2-core VM's `small` (docs/runner.md)
BUSY = {2: 38.0, 1: 30.0}  # beside one spinning process


class Host:
    """A fake clock and thread setting: each step lasts what the current count costs on the host as it is."""

    def __init__(self) -> None:
        self.now, self.threads, self.calls = 0.0, 2, []

    def clock(self) -> float:
        return self.now

    def set_threads(self, count: int) -> None:
        self.calls.append(count)
        self.threads = count

    def run(self, tuner: ThreadTuner, steps: int, costs: dict[int, float] | None = None,
            prefill_ms: float = 500.0) -> list[int]:
        """One generation: a prefill then `steps` decode steps; the count each decode step ran at."""
        counts = []
        self.now += prefill_ms
        tuner(0)
        for step in range(1, steps + 1):
            counts.append(self.threads)
            self.now += (costs or QUIET)[self.threads]
            tuner(step)
        return counts


def tuner_on(host: Host, threads: int = 2) -> ThreadTuner:
    return ThreadTuner(threads, clock=host.clock, set_threads=host.set_threads)


def test_a_quiet_host_keeps_every_thread_after_one_try():
    """One try of a thread fewer after the first window (it loses: 29 against 16 ms), then nothing in 200 steps."""
    host = Host()
    tuner = tuner_on(host)
    counts = host.run(tuner, 200)
    assert host.calls == [1, 2] and counts[WINDOW] == 1 and counts.count(1) == 1
    assert tuner.count == 2 and tuner.changes == []


def test_a_host_busy_from_the_start_drops_a_thread_at_the_first_try_and_keeps_probing():
    """Beside a spinning process one thread is faster (30 against 38 ms): kept from the first try on; every
    PROBE_EVERY steps a step tries two again and loses."""
    host = Host()
    tuner = tuner_on(host)
    counts = host.run(tuner, 100, BUSY)
    assert tuner.changes == [(WINDOW + 1, 1)] and tuner.count == 1
    assert counts[:WINDOW] == [2] * WINDOW and counts[WINDOW] == 1
    tries = [i for i, c in enumerate(counts) if c == 2 and i > WINDOW]
    assert len(tries) >= 3 and all(b - a >= PROBE_EVERY for a, b in zip(tries, tries[1:]))
    assert sum(BUSY[c] for c in counts) < sum(BUSY[2] for _ in counts) * 0.85  # the run is faster than with 2


def test_a_process_that_comes_and_goes_is_followed_both_ways():
    """Quiet, then busy, then quiet again, in one generation after another: one thread while the other process
    runs, both threads before and after, each within a window and a probe period of the change."""
    host = Host()
    tuner = tuner_on(host)
    host.run(tuner, 60)
    assert tuner.count == 2
    busy = host.run(tuner, 60, BUSY)
    assert tuner.count == 1 and busy.index(1) <= PROBE_EVERY + WINDOW
    quiet = host.run(tuner, 60)
    assert tuner.count == 2 and quiet.index(2) <= PROBE_EVERY + 1
    assert [count for _, count in tuner.changes] == [1, 2]


def test_prefills_are_not_decode_steps():
    """A prefill 30x a step does not enter the window, nor does the time between generations."""
    host = Host()
    tuner = tuner_on(host)
    for _ in range(10):
        host.run(tuner, 3, prefill_ms=500.0)
        host.now += 10_000.0  # idle between requests
    assert tuner.count == 2 and tuner.changes == [] and tuner.steps == 30
    assert set(tuner.recent) <= set(QUIET.values())


def test_one_thread_is_never_changed():
    host = Host()
    host.threads = 1
    tuner = tuner_on(host, 1)
    host.run(tuner, 100, BUSY)
    assert host.calls == [] and tuner.count == 1
