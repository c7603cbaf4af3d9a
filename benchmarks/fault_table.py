"""Fault table: signal a running `topoplan run` (a rank or the parent) and time until every process is gone.

    python3 benchmarks/fault_table.py [--repeats 3]

Each row starts `topoplan run --model tiny --tp 2` decoding long enough to be caught mid-run, waits until both
ranks are up, sends the signal, then polls until the parent and both ranks have exited. It prints the seconds
from the signal to the last process gone (range over repeats), the parent's exit code and its last stderr line.
Reference: the shell convention (128 + signal) and "no orphaned rank".
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "topoplan", "run", "--model", "tiny", "--tp", "2", "--prompt-ids", "1,2,3",
       "--max-new-tokens", "4000", "--ignore-eos", "--timeout", "20"]


def ranks_of(parent: int) -> list[int]:
    """The parent's child processes (the ranks), from /proc."""
    found = []
    for task in Path(f"/proc/{parent}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def one(target: str, sig: signal.Signals, home: str) -> tuple[float, int | None, str]:
    env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": f"{home}/cache", "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(RUN, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(ranks := ranks_of(parent.pid)) < 2 or not all(alive(r) for r in ranks):
        if time.monotonic() > deadline or parent.poll() is not None:
            raise SystemExit(f"the run did not start its ranks: {parent.stderr.read()[-300:]}")
        time.sleep(0.1)
    time.sleep(3.0)  # past start-up: the ranks are decoding
    victim = parent.pid if target == "parent" else ranks[1]
    start = time.monotonic()
    os.kill(victim, sig)
    code = None
    while alive(parent.pid) or any(alive(r) for r in ranks):
        if code is None and parent.poll() is not None:
            code = parent.returncode
        if time.monotonic() - start > 120:
            break
        time.sleep(0.02)
    gone = time.monotonic() - start
    if code is None:
        code = parent.poll()
    for rank in ranks:  # a stopped rank, if the run left it behind
        if alive(rank):
            os.kill(rank, signal.SIGKILL)
    last = (parent.stderr.read().strip().splitlines() or [""])[-1]
    return gone, code, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [("rank", signal.SIGKILL), ("parent", signal.SIGINT), ("parent", signal.SIGTERM),
            ("parent", signal.SIGKILL), ("rank", signal.SIGSTOP)]
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"{'signal':<16} {'seconds until all gone':>24} {'exit':>5}  last line")
    with tempfile.TemporaryDirectory() as home:
        for target, sig in rows:
            results = [one(target, sig, home) for _ in range(args.repeats)]
            times = [r[0] for r in results]
            print(f"{sig.name + ' ' + target:<16} {min(times):>11.2f} - {max(times):<10.2f} {results[-1][1]!s:>5}  "
                  f"{results[-1][2][:70]}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
