"""topoplan's engine profiles beside NVIDIA's aiconfigurator for the same configurations, and beside the
published measurements where there are some (tests/data/engine_measurements.json).

    python benchmarks/aiconfigurator_compare.py [--aic PATH] [--only issue|check|fit] [--json OUT] [--reuse JSON]

--reuse takes aiconfigurator's figures from an earlier --json file (its estimates do not change; they take
~1 min each) and prices topoplan's side again, e.g. after a profile's constants change.

aiconfigurator 0.12 (pip `aiconfigurator==0.12`, in its own virtual environment: it pins pandas, pydantic...)
runs offline: `aiconfigurator cli estimate` reads its bundled kernel tables and a local config.json. Found
as --aic, $AICONFIGURATOR, `aiconfigurator` on PATH, or /work/aic-venv/bin/aiconfigurator. Without it the
script says so and prints topoplan's side only. Each estimate takes ~10 s of CPU (~45 s on a loaded box).

Configurations: the issue's (Llama-2-70B fp16, batch 1, prompt 2048, TP2/4/8 on H100 for vLLM and
TensorRT-LLM, on A100 for vLLM), and one TP sweep of checking rows per engine from its published
measurements (CHECK_SWEEPS: rows topoplan's fit never saw), whose measured TPOT says who is closer;
`--only fit` runs the fitting rows instead (topoplan was fitted on them: not a fair contest).
aiconfigurator prices its own current kernel data (vLLM 0.24.0, TensorRT-LLM 1.3.0rc20, SGLang 0.5.14 on
H100), newer than the measured engines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_cases import PUBLISHED, model_of, serving_tpot  # noqa: E402
from topoplan.engines import resolve  # noqa: E402
from topoplan.layout import Layout  # noqa: E402
from topoplan.models import CATALOG  # noqa: E402

AIC_DEFAULT = "/work/aic-venv/bin/aiconfigurator"
# topoplan GPU key -> aiconfigurator system name
SYSTEMS = {"h100-sxm": "h100_sxm", "a100-sxm4-80gb": "a100_sxm", "h200": "h200_sxm"}
# topoplan model -> what aiconfigurator's --model-path takes (a bundled HF id, or None: write a config.json)
AIC_MODELS = {"Qwen3-32B": "Qwen/Qwen3-32B", "Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B", "Llama-2-70B": None}
GEN_ISSUE = 128  # the issue quotes TPOT at prompt 2048 without an output length; TPOT barely depends on it
# (engine as measured, model, concurrency, prompt, gen): one checking sweep per engine, every TP it was run at
CHECK_SWEEPS = [("vllm@0.12.0", "Qwen3-32B", 8, 4096, 1024), ("trtllm@1.0.0rc3", "Llama-3.1-8B", 8, 2048, 512),
                ("sglang@0.5.1.post1", "Qwen3-32B", 16, 2048, 512)]


@dataclass
class Case:
    engine: str  # topoplan profile name (NAME or NAME@VERSION)
    gpu: str
    model: str
    dtype: str
    tp: int
    batch: int
    prompt: int
    gen: int
    measured: float | None = None  # published TPOT, ms
    topoplan: float | None = None
    aiconfigurator: float | None = None
    note: str = ""


def cases(only: str | None) -> list[Case]:
    out = []
    if only in (None, "issue"):
        for engine, gpu in (("vllm", "h100-sxm"), ("trtllm", "h100-sxm"), ("vllm", "a100-sxm4-80gb")):
            out += [Case(engine, gpu, "Llama-2-70B", "fp16", tp, 1, 2048, GEN_ISSUE) for tp in (2, 4, 8)]
    def measured(pick) -> list[Case]:
        return [Case(resolve(r["engine"]).name, r["gpu"].replace("_", "-"), r["model"], r["dtype"], r["tp"],
                     r["concurrency"], r["prompt"], r["gen"], measured=r["tpot_ms"])
                for r in PUBLISHED["rows"] if pick(r)]

    if only in (None, "check"):
        out += measured(lambda r: (r["engine"], r["model"], r["concurrency"], r["prompt"], r["gen"]) in CHECK_SWEEPS)
    if only == "fit":
        out += measured(lambda r: r["role"] == "fit" and r["dtype"] == "bf16")
    return out


def find_aic(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("AICONFIGURATOR"), shutil.which("aiconfigurator"), AIC_DEFAULT):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def model_path(name: str, workdir: Path) -> str:
    """aiconfigurator's bundled HF id, or a folder with the catalog's config.json (offline)."""
    if AIC_MODELS.get(name):
        return AIC_MODELS[name]
    folder = workdir / name
    folder.mkdir(exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float16", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, **CATALOG[name]}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def run_aic(aic: str, case: Case, workdir: Path) -> tuple[float | None, str]:
    """(TPOT ms, "" or why not) from one `aiconfigurator cli estimate` run, aggregated serving mode."""
    cmd = [aic, "cli", "estimate", "--model-path", model_path(case.model, workdir), "--system", SYSTEMS[case.gpu],
           "--backend", case.engine, "--isl", str(case.prompt), "--osl", str(case.gen), "--batch-size",
           str(case.batch), "--tp-size", str(case.tp), "--estimate-mode", "agg", "--save-dir", str(workdir / "out")]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return None, "aiconfigurator timed out (900 s)"
    found = re.search(r"TPOT:\s+([0-9.]+) ms", done.stdout)
    if found:
        return float(found.group(1)), ""
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"aiconfigurator exit {done.returncode}: {tail[0][:160]}"


def pct(value: float | None, ref: float | None) -> str:
    return f"{100 * (value / ref - 1):+.0f}%" if value is not None and ref else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aic", help="the aiconfigurator executable")
    ap.add_argument("--only", choices=("issue", "check", "fit"))
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--reuse", action="append", default=[], help="an earlier --json file: its aiconfigurator "
                    "figures are reused for the same configurations (repeatable)")
    args = ap.parse_args()
    aic = find_aic(args.aic)
    rows = cases(args.only)
    key = lambda c: (c["engine"], c["gpu"], c["model"], c["tp"], c["batch"], c["prompt"], c["gen"])  # noqa: E731
    earlier = {key(c): c["aiconfigurator"] for path in args.reuse
               for c in json.loads(Path(path).read_text())["rows"] if c["aiconfigurator"] is not None}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for case in rows:
            case.topoplan, _ = serving_tpot(resolve(case.engine), case.gpu, model_of(case.model), Layout(case.tp),
                                            case.batch, case.prompt, case.gen, case.dtype)
            if key(asdict(case)) in earlier:
                case.aiconfigurator = earlier[key(asdict(case))]
            elif aic:
                case.aiconfigurator, case.note = run_aic(aic, case, Path(tmp))
            else:
                case.note = "aiconfigurator not installed"
    print(f"aiconfigurator: {aic or 'not found'}; load average {load:.1f}; topoplan profiles: "
          + ", ".join(sorted({str(resolve(c.engine)) for c in rows})))
    print("| engine | GPU | model | TP | batch | prompt/gen | measured TPOT ms | topoplan | aiconfigurator 0.12 | "
          "topoplan err | aiconfigurator err | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        measured = f"{c.measured:.2f}" if c.measured else "-"
        aicv = f"{c.aiconfigurator:.2f}" if c.aiconfigurator is not None else "-"
        print(f"| {c.engine} | {c.gpu} | {c.model} {c.dtype} | {c.tp} | {c.batch} | {c.prompt}/{c.gen} | {measured} | "
              f"{c.topoplan:.2f} | {aicv} | {pct(c.topoplan, c.measured)} | {pct(c.aiconfigurator, c.measured)} | "
              f"{c.note} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"aiconfigurator": aic, "load_average": load,
                                               "rows": [asdict(c) for c in rows]}, indent=1))


if __name__ == "__main__":
    main()
