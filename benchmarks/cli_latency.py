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
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURE = ROOT / "fixtures/topo/00_dgx-a100-8gpu-nv12-10nic-gpu-rows-only.txt"
REFERENCE = [sys.executable, "-c", "import typer, rich.console, networkx"]
TARGET = 1.25
# A second, informative reference: what typer itself costs to *run* a command with one string option
# (typer >= 0.2x coerces every option through pydantic, imported on first use), plus networkx.
TYPER_RUN = [sys.executable, "-c", "import sys, typer, networkx\n"
             "app = typer.Typer()\n"
             "@app.command()\n"
             "def inspect(file: str = typer.Option(None, '--file')) -> None: pass\n"
             "sys.argv = ['x', '--file', 'f']\n"
             "app()\n"]


def wall_time(command: list[str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the child: the latter shrugs off a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    args = parser.parse_args()
    inspect = [sys.executable, "-m", "topoplan", "inspect", "--file", str(args.fixture), "--json"]
    commands = {"ours": inspect, "reference": REFERENCE, "typer_run": TYPER_RUN}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for command in commands.values():
        wall_time(command)  # warm the page cache and .pyc files; not counted
    for _ in range(args.runs):  # interleaved, so a burst of load on the machine hits all alike
        for name, command in commands.items():
            times[name].append(wall_time(command))
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in times.items()}
    ratio = wall["ours"] / wall["reference"]
    print(f"topoplan inspect --json (python -m topoplan): median {wall['ours'] * 1000:.0f} ms wall, "
          f"{cpu['ours'] * 1000:.0f} ms CPU over {args.runs} runs")
    print(f"reference (import typer, rich.console, networkx): median {wall['reference'] * 1000:.0f} ms wall, "
          f"{cpu['reference'] * 1000:.0f} ms CPU")
    print(f"ratio (wall): {ratio:.2f}x (target <= {TARGET}x) {'OK' if ratio <= TARGET else 'ABOVE TARGET'}; "
          f"ratio (CPU): {cpu['ours'] / cpu['reference']:.2f}x")
    print(f"for scale: a bare typer command with one str option (+ networkx): {wall['typer_run'] * 1000:.0f} ms "
          f"wall; topoplan / that = {wall['ours'] / wall['typer_run']:.2f}x wall, "
          f"{cpu['ours'] / cpu['typer_run']:.2f}x CPU")


if __name__ == "__main__":
    main()
