"""topoplan.runner.threads: a CPU rank's thread count follows what decodes faster, on a simulated host whose step
times depend on the count and on whether another process holds a core."""

from __future__ import annotations

from topoplan.runner.threads import FIRST_TRIES, PROBE_EVERY, WARM_UP_STEPS, WINDOW, ThreadTuner

QUIET = {2: 16.0, 1: 29.0}  # ms a step, by thread count: the 2-core VM's `small` (docs/runner.md)
BUSY = {2: 38.0, 1: 30.0}  # beside one spinning process


class Host:
    """A fake clock and thread setting: each step lasts what the current count costs on the host as it is, plus
    `first_call_ms` the first time a count runs (kernels setting themselves up for it)."""

    def __init__(self, threads: int = 2, first_call_ms: float = 0.0) -> None:
        self.now, self.threads, self.calls = 0.0, threads, []
        self.first_call_ms, self.seen = first_call_ms, {threads}

    def clock(self) -> float:
        return self.now

    def set_threads(self, count: int) -> None:
        self.calls.append(count)
        self.threads = count

    def run(self, tuner: ThreadTuner, steps: int, costs: dict[int, float] | None = None,
            prefill_ms: float = 500.0, growth_ms: float = 0.0) -> tuple[int, list[int]]:
        """One generation: a prefill then `steps` decode steps, then `end`; the count the prefill and each decode
        step ran at. `growth_ms`: what each step adds to the next, at any count (attention over a longer context)."""
        prefill_at, counts = self.threads, []
        self.now += prefill_ms
        tuner(0)
        for step in range(1, steps + 1):
            counts.append(self.threads)
            self.now += ((costs or QUIET)[self.threads] + step * growth_ms
                         + (0.0 if self.threads in self.seen else self.first_call_ms))
            self.seen.add(self.threads)
            tuner(step)
        tuner.end()
        return prefill_at, counts


def tuner_on(host: Host) -> ThreadTuner:
    return ThreadTuner(host.threads, clock=host.clock, set_threads=host.set_threads)


def test_a_quiet_host_keeps_every_thread_after_the_first_tries():
    """FIRST_TRIES tries of a thread fewer after the first window (each loses: 29 against 16 ms), within the
    warm-up's steps, then nothing in 200 steps."""
    host = Host()
    tuner = tuner_on(host)
    _, counts = host.run(tuner, 200)
    assert host.calls == [1, 2] * FIRST_TRIES and counts.count(1) == FIRST_TRIES
    assert max(i for i, c in enumerate(counts) if c == 1) < WARM_UP_STEPS
    assert tuner.count == 2 and tuner.changes == []


def test_a_host_busy_from_the_start_drops_a_thread_at_the_first_try_and_keeps_probing():
    """Beside a spinning process one thread is faster (30 against 38 ms): kept from the first try on; every
    PROBE_EVERY steps a step tries two again and loses."""
    host = Host()
    tuner = tuner_on(host)
    _, counts = host.run(tuner, 100, BUSY)
    assert tuner.changes == [(WINDOW + 1, 1)] and tuner.count == 1
    assert counts[:WINDOW] == [2] * WINDOW and counts[WINDOW] == 1
    tries = [i for i, c in enumerate(counts) if c == 2 and i > WINDOW]
    assert len(tries) >= 3 and all(b - a >= PROBE_EVERY for a, b in zip(tries, tries[1:]))
    assert sum(BUSY[c] for c in counts) < sum(BUSY[2] for _ in counts) * 0.85  # the run is faster than with 2


def test_a_first_try_that_pays_the_lower_counts_set_up_gets_a_second():
    """The first step at one thread costs 20 ms more (set-up) and loses; the second try, set up, wins."""
    host = Host(first_call_ms=20.0)
    tuner = tuner_on(host)
    host.run(tuner, 40, BUSY)
    assert tuner.count == 1 and tuner.changes == [(WINDOW + 3, 1)]


def test_a_process_that_comes_and_goes_is_followed_both_ways():
    """Quiet, then busy, then quiet again, in one generation after another: one thread while the other process
    runs, both threads before and after, each within a window and a probe period of the change."""
    host = Host()
    tuner = tuner_on(host)
    host.run(tuner, 60)
    assert tuner.count == 2
    _, busy = host.run(tuner, 60, BUSY)
    assert tuner.count == 1 and busy.index(1) <= PROBE_EVERY + WINDOW
    _, quiet = host.run(tuner, 60)
    assert tuner.count == 2 and quiet.index(2) <= PROBE_EVERY + 1
    assert [count for _, count in tuner.changes] == [1, 2]


def test_a_context_that_grows_costs_a_losing_try_per_level_not_per_probe():
    """Steps growing 0.05 ms each, at any count, over 400 quiet steps (16 -> 36 ms at two threads): one thread is
    never faster. Each losing try makes the latest median the level, so a try comes only when the steps have grown
    SLOWER x again (16 -> 20.8 -> 27 -> 35.2: three), not every PROBE_EVERY steps past 20.8 ms (19 before this rule)."""
    host = Host()
    tuner = tuner_on(host)
    _, counts = host.run(tuner, 400, growth_ms=0.05)
    late_tries = [i for i, c in enumerate(counts) if c == 1 and i >= WARM_UP_STEPS]
    assert tuner.count == 2 and tuner.changes == []
    assert 2 <= len(late_tries) <= 3
    assert all(b - a > 3 * PROBE_EVERY for a, b in zip(late_tries, late_tries[1:]))


def test_many_threads_climb_back_for_a_small_gain():
    """8 threads: one more thread of many gains ~5%, under the 10% a thread fewer must win by; once the other
    process has gone the rank climbs back all the same."""
    quiet = {n: 16.0 * 8 / n ** 0.25 / 8 ** 0.75 for n in range(1, 9)}  # 7 -> 8 threads: 3% faster
    busy = {**quiet, 8: quiet[8] * 1.6}  # beside another process 8 threads are slowest
    host = Host(threads=8)
    tuner = tuner_on(host)
    host.run(tuner, 60, busy)
    assert tuner.count == 7
    host.run(tuner, 60, quiet)
    assert tuner.count == 8 and [count for _, count in tuner.changes] == [7, 8]


def test_a_try_left_open_when_a_generation_ends_is_undone():
    """A generation that ends right after the window (WINDOW decode steps) leaves the first try open: `end`
    sets the kept count back, so the next prefill runs on every thread and the try's step is not judged."""
    host = Host()
    tuner = tuner_on(host)
    host.run(tuner, WINDOW)
    assert host.calls == [1, 2] and tuner.count == 2
    prefill_at, _ = host.run(tuner, 10)
    assert prefill_at == 2 and tuner.changes == []


def test_prefills_are_not_decode_steps():
    """A prefill 30x a step does not enter the window, nor does the time between generations."""
    host = Host()
    tuner = tuner_on(host)
    for _ in range(10):
        host.run(tuner, 3, prefill_ms=500.0)
        host.now += 10_000.0  # idle between requests
    assert tuner.count == 2 and tuner.changes == [] and tuner.steps == 30
    assert set(tuner.recent) == {QUIET[2]}


def test_one_thread_is_never_changed():
    host = Host(threads=1)
    tuner = tuner_on(host)
    host.run(tuner, 100, BUSY)
    assert host.calls == [] and tuner.count == 1
