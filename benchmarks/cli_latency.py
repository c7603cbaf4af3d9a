"""Start-up cost of `topoplan inspect --json` against its libraries' own start-up.

Prints the ratio of the median wall time of

    python -m topoplan inspect --file <fixture> --json        (the module entry point, same as the console script)

to the median wall time of the reference

    python -c "import typer, rich.console, networkx"

over several interleaved runs. Target: <= 1.25 (topoplan adds little on top of the libraries it chose).
Run from the repository root: `python benchmarks/cli_latency.py [--runs N] [--fixture PATH]`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURE = ROOT / "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
REFERENCE = [sys.executable, "-c", "import typer, rich.console, networkx"]
TARGET = 1.25


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    args = parser.parse_args()
    inspect = [sys.executable, "-m", "topoplan", "inspect", "--file", str(args.fixture), "--json"]
    wall_time(inspect), wall_time(REFERENCE)  # warm the page cache and .pyc files; not counted
    ours, ref = [], []
    for _ in range(args.runs):  # interleaved, so a burst of load on the machine hits both alike
        ours.append(wall_time(inspect))
        ref.append(wall_time(REFERENCE))
    ours_s, ref_s = statistics.median(ours), statistics.median(ref)
    ratio = ours_s / ref_s
    print(f"topoplan inspect --json (python -m topoplan): median {ours_s * 1000:.0f} ms over {args.runs} runs")
    print(f"reference (import typer, rich.console, networkx): median {ref_s * 1000:.0f} ms")
    print(f"ratio: {ratio:.2f}x (target <= {TARGET}x) {'OK' if ratio <= TARGET else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
