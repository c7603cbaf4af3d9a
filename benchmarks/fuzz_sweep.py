"""Fuzz sweep: N hostile inputs through the CLI in-process; count tracebacks, time per input, peak memory.

    python3 benchmarks/fuzz_sweep.py [--count 10000] [--start 0]
    python3 benchmarks/fuzz_sweep.py --grammar [--count 40] [--start 0]   # per format, by shape

With --grammar the inputs are tests/grammar_cases.py's instead: per format (smi text, p2p, NCCL XML, AMD text,
NVML JSON, HF config, calibration), --count structurally valid but extreme inputs drawn by hypothesis (seeded
by --start), and a table per class (format/shape) of inputs, exit 0, exit 2, tracebacks, runs over 10 s, over
256 MiB of Python allocations, errors of more than one line, raw escapes on the terminal, p99 and max seconds.

The inputs are tests/fuzz_cases.py's (damaged real pastes and NVML recordings, wrong-typed HF configs and
calibrations, option sets at and beyond their ranges), the same the CI fuzz test draws from. Reference: the
contract of docs/limits.md: exit 0, or exit 2 with one `topoplan: error:` line; never a traceback; each
input within 10 s and 256 MiB. Spawning ranks is replaced by a stand-in (an input that reaches it passed every
parent-side check). Prints the counts per kind, the time p50/p99/max and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fuzz_cases import broken, make_case, materialise, no_ranks, run_within_budget  # noqa: E402

import topoplan.bench.launch  # noqa: E402
import topoplan.runner.local  # noqa: E402


def one(seed: int, folder: Path) -> tuple[str, str | None, float]:
    """(kind, what went wrong or None, seconds) for one seed."""
    case = make_case(seed)
    outcome = run_within_budget(materialise(case, folder))
    problems = broken(outcome)
    detail = outcome.traceback.strip().splitlines()[-1] if outcome.traceback else outcome.err[-200:]
    return case.kind, f"{', '.join(problems)}: {detail}" if problems else None, outcome.seconds


COLUMNS = ("traceback", "over 10 s", "over 256 MiB", "error of more than one line", "raw escape in output")


def grammar(count: int, seed: int, home: str) -> None:
    """--count inputs per format from tests/grammar_cases.py; one row per class."""
    from grammar_cases import FORMATS
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    rows: dict[str, Counter] = {}
    times: dict[str, list[float]] = {}
    peaks: dict[str, int] = {}
    examples: list[str] = []
    for fmt, strategy in FORMATS.items():
        @hypothesis_seed(seed)
        @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def one_input(case):
            folder = Path(tempfile.mkdtemp(dir=home))
            outcome = run_within_budget(materialise(case, folder))
            row = rows.setdefault(case.kind, Counter())
            row["inputs"] += 1
            row[f"exit {outcome.code}"] += 1
            problems = broken(outcome)
            row.update(problems)
            if problems and len(examples) < 20:
                examples.append(f"  {case.kind}: {', '.join(problems)}: {(outcome.traceback or outcome.err)[-200:]!r}")
            times.setdefault(case.kind, []).append(outcome.seconds)
            peaks[case.kind] = max(peaks.get(case.kind, 0), outcome.peak)
            shutil.rmtree(folder)

        one_input()
    head = ["class", "inputs", "exit 0", "exit 2", "tracebacks", "> 10 s", "> 256 MiB", "> 1 line", "escapes",
            "p99 s", "max s", "max MiB"]
    print(" | ".join(head))
    total: Counter = Counter()
    for kind in sorted(rows):
        row, spent = rows[kind], sorted(times[kind])
        total.update(row)
        print(" | ".join([kind, str(row["inputs"]), str(row["exit 0"]), str(row["exit 2"]),
                          *(str(row[c]) for c in COLUMNS), f"{spent[int(0.99 * (len(spent) - 1))]:.2f}",
                          f"{spent[-1]:.2f}", f"{peaks[kind] / 2**20:.0f}"]))
    print(f"all {len(rows)} classes: {total['inputs']} inputs; " + ", ".join(f"{c}: {total[c]}" for c in COLUMNS))
    print("\n".join(examples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--grammar", action="store_true", help="extreme shapes per format (tests/grammar_cases.py)")
    args = parser.parse_args()
    topoplan.runner.local.spawn_ranks = no_ranks
    topoplan.bench.launch.spawn_ranks = no_ranks
    if args.grammar:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as home:
            os.environ.update(HOME=home, XDG_CACHE_HOME=f"{home}/cache")
            grammar(args.count, args.start, home)
        print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; --count {args.count} "
              f"per format, seed {args.start}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB")
        return
    kinds: Counter = Counter()
    problems: list[tuple[int, str, str]] = []
    times: list[float] = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(HOME=home, XDG_CACHE_HOME=f"{home}/cache")
        for seed in range(args.start, args.start + args.count):
            folder = Path(home) / str(seed)
            folder.mkdir()
            kind, problem, seconds = one(seed, folder)
            kinds[kind] += 1
            times.append(seconds)
            if problem:
                problems.append((seed, kind, problem))
    times.sort()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.count} inputs (seeds {args.start}..{args.start + args.count - 1}); load average "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("per kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print(f"tracebacks or broken contract: {len(problems)}")
    for seed, kind, problem in problems[:20]:
        print(f"  seed {seed} ({kind}): {problem[:200]}")
    print(f"seconds per input: p50 {statistics.median(times):.3f}, p99 {times[int(0.99 * (len(times) - 1))]:.3f}, "
          f"max {times[-1]:.3f}; peak RSS {peak_mib:.0f} MiB (limit: 10 s and 256 MiB per input)")


if __name__ == "__main__":
    main()
