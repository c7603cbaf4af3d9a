"""Write what `inspect`, `plan` and `launch` print for every bundled fixture, engine and format into one folder,
so a refactor can be checked byte for byte: run it before and after, then `diff -r BEFORE AFTER`.

    python3 benchmarks/output_snapshot.py /tmp/before   # on the old commit
    python3 benchmarks/output_snapshot.py /tmp/after    # on the new one
    diff -r /tmp/before /tmp/after

Each file holds the exit code, stdout and stderr of one command, run in-process through typer's runner (a few
hundred commands, about a minute on 2 cores).
"""

from __future__ import annotations

import sys
from pathlib import Path

from typer.testing import CliRunner

from topoplan.cli import app

ROOT = Path(__file__).resolve().parents[1]
GPU_OF = {"amd": "mi300x"}  # pastes name no GPU: one stands in per folder (NVML recordings name their own)
ENGINES = ("topoplan", "vllm", "sglang", "trtllm")
FORMATS = ("shell", "json", "srun", "sbatch", "torchrun", "mpirun")
LAYOUTS = ("tp=2", "tp=2,dp=2", "tp=4,pp=2")


def fixtures() -> list[Path]:
    found = []
    for folder in ("topo", "nccl", "amd", "nvml"):
        found += sorted(p for p in (ROOT / "fixtures" / folder).iterdir()
                        if p.suffix in (".txt", ".xml", ".json") and not p.name.endswith(".p2p.txt"))
    return found


def commands() -> list[tuple[str, list[str]]]:
    out = []
    for path in fixtures():
        rel = str(path.relative_to(ROOT))
        gpu = [] if path.suffix == ".json" else ["--gpu", GPU_OF.get(path.parent.name, "h100-sxm")]
        key = path.stem
        out.append((f"inspect-{key}-json", ["inspect", "--file", rel, "--json"]))
        for engine in ENGINES:
            out.append((f"plan-{key}-{engine}", ["plan", "--model", "70b", "--topo", rel, *gpu, "--engine", engine,
                                                "--json", "--top", "5"]))
            ckpt = [] if engine == "topoplan" else ["--checkpoint", "/models/llama"]
            for layout in LAYOUTS:
                for fmt in FORMATS:
                    if engine != "topoplan" and fmt in ("torchrun", "mpirun"):
                        continue
                    out.append((f"launch-{key}-{engine}-{layout}-{fmt}",
                                ["launch", "--topo", rel, "--layout", layout, "--engine", engine, *ckpt,
                                 "--format", fmt, "--nodes", "2", "--hosts", "a,b"]))
            out.append((f"launch-{key}-{engine}-rank1",
                        ["launch", "--topo", rel, "--rank", "1", "--model", "70b", *gpu, "--engine", engine, *ckpt]))
    return out


def main() -> None:
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    for name, argv in commands():
        result = runner.invoke(app, argv)
        stderr = getattr(result, "stderr", "") if result.stderr_bytes is not None else ""
        (target / f"{name.replace('/', '_')}.txt").write_text(
            f"$ topoplan {' '.join(argv)}\nrc={result.exit_code}\n--- stdout\n{result.stdout}\n--- stderr\n{stderr}")
    print(f"wrote {len(commands())} outputs to {target}")


if __name__ == "__main__":
    main()
