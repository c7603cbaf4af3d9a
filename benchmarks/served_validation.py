"""The served model against published serving measurements: every row of tests/data/engine_measurements.json
(NVIDIA aiconfigurator 0.12's silicon_sample.csv: TTFT and TPOT of real vLLM, SGLang and TensorRT-LLM
deployments on H100 at closed-loop concurrency) served by topoplan.plan.served under its engine version's
profile and scheduler, on an 8-GPU NVSwitch board of its GPU.

Prints one line per row: source, engine and version, the point (model, dtype, TP, concurrency, prompt/gen),
then measured, ours and the error for TPOT, TTFT and delivered output tokens/s per replica (the measured one
derived from the measured TTFT and TPOT by Little's law: C x gen / (TTFT + (gen - 1) x TPOT)); then mean and
worst |error| per engine, fitting rows (role 'fit', which the engine profiles' constants were fitted on) and
checking rows apart. Where the optional extra is installed (pip install 'topoplan[aiconfigurator]'), each metric
also gets aiconfigurator's own in-flight ("agg") estimate of the row and its error (AIC_COLUMNS).

With --silicon (needs the extra), every agg row of silicon_sample.csv for the engine versions, GPU, models and
dtypes of the data file instead: the same runs at more concurrencies (C16-C128), as extrapolation checks. A row
of the data file keeps its role; the others are "extra C<concurrency>" (no aiconfigurator columns: its agg
estimate is the plain run above).

    python benchmarks/served_validation.py [--summary] [--silicon]
"""

from __future__ import annotations

import csv
import importlib.resources
import importlib.util
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_cases import PUBLISHED, board, model_of  # noqa: E402
from topoplan.engines import resolve  # noqa: E402
from topoplan.engines.engine import Engine  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.hardware import find_gpu  # noqa: E402
from topoplan.plan import aic_estimator  # noqa: E402
from topoplan.plan.cost import Workload  # noqa: E402
from topoplan.plan.device import DeviceSpec  # noqa: E402
from topoplan.plan.rank import plan  # noqa: E402

SOURCE = "aiconfigurator 0.12 silicon_sample.csv"
METRICS = ("TPOT", "TTFT", "tok/s")
AIC_COLUMNS = importlib.util.find_spec(aic_estimator.PACKAGE) is not None  # the optional extra is installed


def point(r: dict) -> tuple:
    """What identifies a run: engine version, model, dtype, GPU, TP, concurrency, prompt and output lengths."""
    return r["engine"], r["model"], r["dtype"], r["gpu"], r["tp"], r["concurrency"], r["prompt"], r["gen"]


def silicon_rows() -> list[dict]:
    """silicon_sample.csv's agg rows of the engine versions, GPUs, models and dtypes in the data file, as its rows:
    a run the data file has keeps its role, the others are "extra C<concurrency>"."""
    roles = {point(r): r["role"] for r in PUBLISHED["rows"]}
    wanted = {(r["engine"], r["gpu"], r["model"], r["dtype"]) for r in PUBLISHED["rows"]}
    text = importlib.resources.files(aic_estimator.PACKAGE).joinpath("systems/silicon_sample.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        if r["mode"] != "agg":
            continue
        row = {"engine": f"{r['backend']}@{r['backend_version']}", "gpu": r["system"],
               "model": r["model_path"].split("/")[-1].removesuffix("-Instruct"), "dtype": r["precision"] or "bf16",
               "tp": int(r["tp_size"]), "pp": int(r["pp_size"]), "concurrency": int(r["batch_size"]),
               "prompt": int(r["isl"]), "gen": int(r["osl"]), "ttft_ms": float(r["silicon_ttft_ms"]),
               "tpot_ms": float(r["silicon_tpot_ms"])}
        if (row["engine"], row["gpu"], row["model"], row["dtype"]) in wanted:
            out.append({**row, "role": roles.get(point(row), f"extra C{row['concurrency']}")})
    return out


def served_rows(only: Engine | None = None, rows: list[dict] | None = None) -> list[dict]:
    """Each published row (or each of `rows`) with our served figures beside the measured ones; with `only`, the
    rows of that profile alone, priced with it (benchmarks/engine_fit.py prices variants of a profile)."""
    out = []
    for r in PUBLISHED["rows"] if rows is None else rows:
        profile, gpu = resolve(r["engine"]), r["gpu"].replace("_", "-")
        if only is not None:
            if str(profile) != str(only):
                continue
            profile = only
        work = Workload(r["concurrency"], r["prompt"], r["gen"], r["dtype"])
        result = plan(board(gpu), model_of(r["model"]), DeviceSpec.from_gpu(find_gpu(gpu)), work, tp=r["tp"],
                      pp=r["pp"], dp=1, engine=profile)
        ours = result.layouts[0].cost.served.replica
        c, gen = r["concurrency"], r["gen"]
        measured_rate = c * gen / (r["ttft_ms"] + (gen - 1) * r["tpot_ms"]) * 1e3
        out.append({**r, "profile": str(profile), "scheduler": result.serving.scheduler.mode,
                    "max_batch": result.layouts[0].cost.max_batch,  # requests its KV cache holds, whole output each
                    "measured": {"TPOT": r["tpot_ms"], "TTFT": r["ttft_ms"], "tok/s": measured_rate},
                    "ours": {"TPOT": ours.tpot_ms, "TTFT": ours.ttft_ms, "tok/s": ours.output_tokens_per_s}})
    return out


def error(row: dict, metric: str, whose: str = "ours") -> float:
    return row[whose][metric] / row["measured"][metric] - 1


def aiconfigurator_agg(r: dict) -> dict | None:
    """aiconfigurator's own agg estimate of a row (TPOT, TTFT, output tok/s of the replica) on its data nearest
    the row's engine version, for topoplan's config.json of the model; None where it cannot price the row."""
    import tempfile

    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.common import GEMMQuantMode
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database_view, get_version_slots

    logging.getLogger(aic_estimator.PACKAGE).setLevel(logging.ERROR)  # its data-provenance notes
    profile, system = resolve(r["engine"]), aic_estimator.SYSTEMS[r["gpu"].replace("_", "-")]
    try:
        version = aic_estimator.pick_version(get_version_slots(system, profile.name) or {}, profile)
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text(json.dumps(aic_estimator.hf_config(model_of(r["model"]))))
            model = get_model(folder, ModelConfig(tp_size=r["tp"], pp_size=r["pp"],
                                                  gemm_quant_mode=GEMMQuantMode[aic_estimator.GEMM_MODES[r["dtype"]]]),
                              profile.name)
        agg = get_backend(profile.name).run_agg(  # a backend per row: its agg cache is keyed without the model
            model, get_database_view(system, profile.name, version),
            RuntimeConfig(batch_size=r["concurrency"], isl=r["prompt"], osl=r["gen"]), ctx_tokens=r["prompt"])
    except (TopoplanError, ValueError, KeyError, RuntimeError):
        return None
    agg = agg.get_result_dict()
    return {"TPOT": agg["tpot"], "TTFT": agg["ttft"], "tok/s": agg["tokens/s"]}


def aic_cells(r: dict, m: str) -> str:
    """The row's aiconfigurator cells for metric `m` ("-" where it could not price it); "" without the extra."""
    if not AIC_COLUMNS:
        return ""
    return f" | {r['aic'][m]:.1f} | {100 * error(r, m, 'aic'):+.0f}%" if r["aic"] else " | - | -"


def main() -> None:
    silicon = "--silicon" in sys.argv
    rows = served_rows(rows=silicon_rows() if silicon else None)
    for r in rows if AIC_COLUMNS and not silicon else ():
        r["aic"] = aiconfigurator_agg(r)
    aic_head = " | aiconfigurator's | error" if AIC_COLUMNS and not silicon else ""
    if "--summary" not in sys.argv:
        print("| source | engine | profile (scheduler) | point | role | " + " | ".join(
            f"{m} measured | ours | error{aic_head}" for m in METRICS) + " |")
        print("|---" * (5 + (5 if aic_head else 3) * len(METRICS)) + "|")
        for r in rows:
            point = f"{r['model']} {r['dtype']} {r['gpu']} TP{r['tp']} C{r['concurrency']} {r['prompt']}/{r['gen']}"
            cells = " | ".join(f"{r['measured'][m]:.1f} | {r['ours'][m]:.1f} | {100 * error(r, m):+.0f}%"
                               f"{aic_cells(r, m) if 'aic' in r else ''}" for m in METRICS)
            print(f"| {SOURCE} | {r['engine']} | {r['profile']} ({r['scheduler']}) | {point} | {r['role']} | "
                  f"{cells} |")
        print()
    print("| profile | role | rows | " + " | ".join(f"{m} mean abs error | worst" for m in METRICS) + " |")
    print("|---" * (3 + 2 * len(METRICS)) + "|")
    for profile in sorted({r["profile"] for r in rows}):
        extra = sorted({r["role"] for r in rows} - {"fit", "check"}, key=lambda role: int(role.split("C")[-1]))
        for role in ("fit", "check", *extra):
            mine = [r for r in rows if r["profile"] == profile and r["role"] == role]
            if not mine:
                continue
            cells = " | ".join(f"{100 * sum(abs(error(r, m)) for r in mine) / len(mine):.1f}% | "
                               f"{100 * max(abs(error(r, m)) for r in mine):.0f}%" for m in METRICS)
            print(f"| {profile} | {role} | {len(mine)} | {cells} |")
    admission_table(rows)
    priced = [r for r in rows if r.get("aic")]
    if priced:
        print("\n| aiconfigurator's agg estimate | rows | " + " | ".join(f"{m} mean abs error | worst" for m in METRICS)
              + " |\n" + "|---" * (2 + 2 * len(METRICS)) + "|")
        for engine in sorted({r["engine"] for r in priced}):
            mine = [r for r in priced if r["engine"] == engine]
            cells = " | ".join(f"{100 * sum(abs(error(r, m, 'aic')) for r in mine) / len(mine):.1f}% | "
                               f"{100 * max(abs(error(r, m, 'aic')) for r in mine):.0f}%" for m in METRICS)
            print(f"| {engine} | {len(mine)} | {cells} |")


def admission_table(rows: list[dict]) -> None:
    """TTFT apart for the runs whose TTFT grows with the output length as a request waiting for admission does
    (benchmarks/ttft_output_slope.py): where they are, what the served model prices and what it cannot."""
    from benchmarks.ttft_output_slope import admission_waits

    waiting = admission_waits(rows)
    if not waiting:
        return
    print("\n| profile | role | TTFT, no admission wait: rows | mean abs error | worst | admission wait: rows | "
          "mean abs error | worst |\n" + "|---" * 8 + "|")
    for profile in sorted({r["profile"] for r in rows if point(r) in waiting}):
        for role in sorted({r["role"] for r in rows if r["profile"] == profile}, key=lambda x: (len(x), x)):
            cells = []
            for apart in (False, True):
                mine = [abs(error(r, "TTFT")) for r in rows
                        if r["profile"] == profile and r["role"] == role and (point(r) in waiting) == apart]
                cells.append(f"{len(mine)} | {100 * sum(mine) / len(mine):.1f}% | {100 * max(mine):.0f}%" if mine
                             else "0 | - | -")
            print(f"| {profile} | {role} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
