"""The whole `topoplan doctor` run against its contract of at most 1 s on this machine (issue 36).

Times, over several runs (after one untimed warm-up for the page cache and .pyc files):
- `python3 -m topoplan doctor --json` end to end, as a user runs it (process start, imports, reading, checks);
- `python3 -m topoplan doctor --for tp=2,dp=8 --nodes 2 --topo <fixture 17> --file <healthy recording> --json`,
  which also places the layout (the planner's placement);
- the reading and checking alone, in this process (read_machine + run_checks).
Prints each one's range (min-max) and median, the load average, and whether the slowest end-to-end run kept to 1 s.
Run from the repository root: `python3 benchmarks/doctor_time.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.doctor.checks import run_checks  # noqa: E402
from topoplan.doctor.reader import read_machine  # noqa: E402

LIMIT_S = 1.0
FOR_LAYOUT = ["--for", "tp=2,dp=8", "--nodes", "2", "--topo",
              str(ROOT / "fixtures/topo/17_h100-nvl-8gpu-nv12-pairs-2nic.txt"),
              "--file", str(ROOT / "fixtures/doctor/healthy-h100-nvl-8gpu.json")]


def run_s(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "topoplan", "doctor", *argv, "--json"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 3, 4):
        raise SystemExit(f"doctor failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def in_process_s() -> float:
    start = time.perf_counter()
    run_checks(read_machine())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cases = {"doctor (this machine)": lambda: run_s([]), "doctor --for (replayed)": lambda: run_s(FOR_LAYOUT),
             "read + checks in-process": in_process_s}
    for case in cases.values():
        case()  # warm-up, not counted
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):  # interleaved: a burst of load hits every case alike
        for name, case in cases.items():
            times[name].append(case())
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs; {args.runs} runs")
    for name, values in times.items():
        print(f"{name:28s} {min(values) * 1000:7.1f}-{max(values) * 1000:7.1f} ms (median "
              f"{statistics.median(values) * 1000:.1f})")
    slowest = max(max(times["doctor (this machine)"]), max(times["doctor --for (replayed)"]))
    print(f"slowest end-to-end run {slowest:.3f} s: {'within' if slowest <= LIMIT_S else 'OVER'} the {LIMIT_S:.0f} s "
          "contract")


if __name__ == "__main__":
    main()
