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

With --unseen (needs the extra), every agg row of silicon_sample.csv that no fit has seen: the runs of dense
models topoplan prices (Llama-3.1-8B/70B, Qwen3-32B) outside the data file's (engine version, GPU, model, dtype)
sets, role "unseen" (other engine versions, H200, B200 and GB200, fp8), each with aiconfigurator's agg estimate,
summarised per engine version, GPU, model and dtype; the rows it leaves out are counted with the reason (NVFP4
weights, which the planner has no dtype for; MoE models). A run whose backend_version is empty is priced as the
engine release current on its measurement date (UNDATED), and says so.

    python benchmarks/served_validation.py [--summary] [--silicon | --unseen]
"""

from __future__ import annotations

import csv
import importlib.resources
import importlib.util
import json
import logging
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_cases import PUBLISHED, board, model_of  # noqa: E402
from topoplan.dtypes import PLAN_DTYPES, dtype_of  # noqa: E402
from topoplan.engines import resolve  # noqa: E402
from topoplan.engines.engine import Engine  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.hardware import GpuSpec, find_gpu  # noqa: E402
from topoplan.plan import aic_estimator  # noqa: E402
from topoplan.plan.cost import LayoutCost, Workload  # noqa: E402
from topoplan.plan.device import DeviceSpec  # noqa: E402
from topoplan.plan.rank import plan  # noqa: E402

SOURCE = "aiconfigurator 0.12 silicon_sample.csv"
METRICS = ("TPOT", "TTFT", "tok/s")
AIC_COLUMNS = importlib.util.find_spec(aic_estimator.PACKAGE) is not None  # the optional extra is installed


def point(r: dict) -> tuple:
    """What identifies a run: engine version, model, dtype, GPU, TP, concurrency, prompt and output lengths."""
    return r["engine"], r["model"], r["dtype"], r["gpu"], r["tp"], r["concurrency"], r["prompt"], r["gen"]


# The engine release current on the measurement date of a run whose backend_version is empty (its
# silicon_data_source says "measured=<date>"): vLLM v0.11.0 (downstream projects moved to it from 2025-10-08;
# v0.11.1 came 2025-11-19); TensorRT-LLM a 1.1 release candidate or 1.2.0rc0/rc1 (triton-inference-server/
# tensorrtllm_backend tagged v1.1.0rc4 on 2025-09-10 and v1.2.0rc2 on 2025-11-07): one profile covers both.
UNDATED = {("vllm", "2025-10-29"): "0.11.0", ("trtllm", "2025-10-29"): "1.1"}
# a quantised checkpoint's name tail -> the precision column it must carry (nvidia/Llama-3.1-8B-Instruct-FP8: fp8)
CHECKPOINTS = {"-FP8": "fp8", "-NVFP4": "fp4"}


def agg_rows() -> list[dict]:
    """Every agg (in-flight batching) row of the installed silicon_sample.csv in the data file's row shape, plus
    the GEMM quantisation it ran ("gemm") and, for a run without an engine version, its measurement date
    ("undated"; its engine version then from UNDATED, or "" where none is known)."""
    text = importlib.resources.files(aic_estimator.PACKAGE).joinpath("systems/silicon_sample.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        if r["mode"] != "agg":
            continue
        name = r["model_path"].split("/")[-1]
        for tail, precision in CHECKPOINTS.items():
            if name.endswith(tail):
                if r["precision"] != precision:
                    raise ValueError(f"{r['id']}: a {tail[1:]} checkpoint measured at {r['precision'] or 'bf16'}")
                name = name.removesuffix(tail)
        version, undated = r["backend_version"], ""
        if not version:
            found = re.search(r"measured=(\d{4}-\d{2}-\d{2})", r["silicon_data_source"])
            undated = found.group(1) if found else "no date"
            version = UNDATED.get((r["backend"], undated), "")
        out.append({"engine": f"{r['backend']}@{version}", "gpu": r["system"],
                    "model": name.removesuffix("-Instruct"), "dtype": r["precision"] or "bf16",
                    "tp": int(r["tp_size"]), "pp": int(r["pp_size"]), "concurrency": int(r["batch_size"]),
                    "prompt": int(r["isl"]), "gen": int(r["osl"]), "ttft_ms": float(r["silicon_ttft_ms"]),
                    "tpot_ms": float(r["silicon_tpot_ms"]), "gemm": r["gemm_quant_mode"], "undated": undated})
    return out


def gpu_of(r: dict) -> GpuSpec:
    """The catalog GPU of a row: its aiconfigurator system name (h200_sxm) is a topoplan alias with a hyphen."""
    return find_gpu(r["gpu"].replace("_", "-"))


def group(r: dict) -> tuple:
    """A row's engine version, GPU, model and dtype: what tells the data file's runs from the unseen ones."""
    return r["engine"], r["gpu"], r["model"], r["dtype"]


def silicon_rows() -> list[dict]:
    """silicon_sample.csv's agg rows of the engine versions, GPUs, models and dtypes in the data file, as its rows:
    a run the data file has keeps its role, the others are "extra C<concurrency>"."""
    roles = {point(r): r["role"] for r in PUBLISHED["rows"]}
    wanted = {group(r) for r in PUBLISHED["rows"]}
    return [{**row, "role": roles.get(point(row), f"extra C{row['concurrency']}")} for row in agg_rows()
            if group(row) in wanted]


def unpriced(r: dict) -> str:
    """Why topoplan's served model does not price this run ("" where it does): a MoE model or one outside the
    catalog, a dtype the planner has no format for (NVFP4) or the GPU lacks, an engine version no profile covers."""
    try:
        if model_of(r["model"]).is_moe:
            return "MoE model (--unseen serves the dense ones)"
    except TopoplanError:
        return "model not in topoplan's catalog"
    if r["dtype"] not in PLAN_DTYPES:
        return (f"{r['gemm'] or r['dtype']} weights: no planner dtype (its 4-bit formats are int4 AWQ/GPTQ and "
                "mxfp4, topoplan/dtypes.py)")
    if r["engine"].endswith("@"):
        return f"no engine version recorded and none known for {r['undated']} (UNDATED)"
    try:
        resolve(r["engine"])
        DeviceSpec.from_gpu(gpu_of(r)).compute_dtype(dtype_of(r["dtype"]))
    except TopoplanError as e:
        return str(e)
    return ""


def unseen_rows() -> tuple[list[dict], Counter]:
    """The agg rows no fit has seen: those outside the data file's (engine version, GPU, model, dtype) sets that
    topoplan prices, role "unseen"; and the count of the others, by (engine, GPU, model, dtype, why left out)."""
    seen = {group(r) for r in PUBLISHED["rows"]}
    rows, skipped = [], Counter()
    for row in agg_rows():
        why = "the data file's set (--silicon serves it)" if group(row) in seen else unpriced(row)
        if why:
            skipped[(*group(row), why)] += 1
        else:
            rows.append({**row, "role": "unseen"})
    return rows, skipped


def layout_cost(r: dict, profile: Engine | None = None, kernels: aic_estimator.AicKernels | None = None) -> LayoutCost:
    """The row's layout (its TP and PP, one replica) priced on an 8-GPU NVSwitch board of its GPU under `profile`
    (default: the one covering its engine version), built-in or with aiconfigurator's `kernels`."""
    gpu = gpu_of(r)
    result = plan(board(gpu.key), model_of(r["model"]), DeviceSpec.from_gpu(gpu),
                  Workload(r["concurrency"], r["prompt"], r["gen"], r["dtype"]), tp=r["tp"], pp=r["pp"], dp=1,
                  engine=profile or resolve(r["engine"]), kernels=kernels)
    return result.layouts[0].cost


def served_rows(only: Engine | None = None, rows: list[dict] | None = None) -> list[dict]:
    """Each published row (or each of `rows`) with our served figures beside the measured ones; with `only`, the
    rows of that profile alone, priced with it (benchmarks/engine_fit.py prices variants of a profile)."""
    out = []
    for r in PUBLISHED["rows"] if rows is None else rows:
        profile = resolve(r["engine"])
        if only is not None:
            if str(profile) != str(only):
                continue
            profile = only
        cost = layout_cost(r, profile)
        ours = cost.served.replica
        c, gen = r["concurrency"], r["gen"]
        measured_rate = c * gen / (r["ttft_ms"] + (gen - 1) * r["tpot_ms"]) * 1e3
        out.append({**r, "profile": str(profile), "scheduler": profile.scheduler.mode,
                    "max_batch": cost.max_batch,  # requests its KV cache holds, whole output each
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
    profile, system = resolve(r["engine"]), aic_estimator.SYSTEMS[gpu_of(r).key]
    gemm = r.get("gemm") or aic_estimator.GEMM_MODES[r["dtype"]]  # the run's own (fp8_block) where it has one
    try:
        version = aic_estimator.pick_version(get_version_slots(system, profile.name) or {}, profile)
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text(json.dumps(aic_estimator.hf_config(model_of(r["model"]))))
            model = get_model(folder, ModelConfig(tp_size=r["tp"], pp_size=r["pp"],
                                                  gemm_quant_mode=GEMMQuantMode[gemm]), profile.name)
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


def engine_label(r: dict) -> str:
    """The row's engine and version; for a run without one, the version it is priced as and its date."""
    return f"{r['engine']} (version not recorded: current on {r['undated']})" if r.get("undated") else r["engine"]


def role_rank(role: str) -> tuple[int, int]:
    """fit, check, then extra C<n> by n: the order of the summary's rows."""
    return (("fit", "check").index(role), 0) if role in ("fit", "check") else (2, int(role.split("C")[-1]))


def summary(rows: list[dict], key: Callable[[dict], tuple], head: tuple[str, ...], whose: str = "ours") -> None:
    """One line per group of rows (`key`, its cells under `head`, in the order the rows come): how many, and the
    mean and worst |error| of `whose` figures (ours or aiconfigurator's) for each metric."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    print(f"| {' | '.join(head)} | rows | " + " | ".join(f"{m} mean abs error | worst" for m in METRICS) + " |")
    print("|---" * (len(head) + 1 + 2 * len(METRICS)) + "|")
    for label, mine in groups.items():
        cells = " | ".join(f"{100 * sum(abs(error(r, m, whose)) for r in mine) / len(mine):.1f}% | "
                           f"{100 * max(abs(error(r, m, whose)) for r in mine):.0f}%" for m in METRICS)
        print(f"| {' | '.join(label)} | {len(mine)} | {cells} |")


def left_out(skipped: Counter) -> None:
    """The rows --unseen does not serve: each group of a dense catalog model with its count and why (the data
    file's sets, NVFP4 weights); the MoE models and those outside the catalog, one line per reason."""
    print("\n| left out: engine | GPU | model | dtype | rows | why |\n|---|---|---|---|---|---|")
    wide: dict[str, Counter] = {}
    for (engine, gpu, model, dtype, why), n in sorted(skipped.items()):
        if why.startswith(("MoE", "model not")):
            wide.setdefault(why, Counter())[model] += n
        else:
            print(f"| {engine} | {gpu} | {model} | {dtype} | {n} | {why} |")
    for why, models in wide.items():
        print(f"| all | all | {', '.join(sorted(models))} | all | {sum(models.values())} | {why} |")


def main() -> None:
    silicon, unseen = "--silicon" in sys.argv, "--unseen" in sys.argv
    if silicon and unseen:
        sys.exit("served_validation: --silicon and --unseen select different rows: pass one")
    if (silicon or unseen) and not AIC_COLUMNS:
        sys.exit(f"served_validation: {'--silicon' if silicon else '--unseen'} reads silicon_sample.csv from the "
                 f"optional extra: {aic_estimator.INSTALL}")
    picked, skipped = unseen_rows() if unseen else (None, Counter())
    rows = served_rows(rows=silicon_rows() if silicon else picked)
    for r in rows if unseen else ():  # where the planner says C requests do not fit (their queueing is not priced)
        r["role"] = "unseen" if r["max_batch"] >= r["concurrency"] else f"unseen, KV holds {r['max_batch']}"
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
            print(f"| {SOURCE} | {engine_label(r)} | {r['profile']} ({r['scheduler']}) | {point} | {r['role']} | "
                  f"{cells} |")
        print()
    if unseen:  # per engine version, GPU, model and dtype, ours and aiconfigurator's on the rows it priced
        head = ("engine", "profile", "GPU", "model", "dtype", "rows the KV cache holds")
        by = lambda r: (engine_label(r), r["profile"], r["gpu"], r["model"], r["dtype"],  # noqa: E731
                        "all C" if r["role"] == "unseen" else "fewer than C")
        summary(sorted(rows, key=by), by, head)
        priced = sorted((r for r in rows if r.get("aic")), key=by)
        aic_by, aic_head_cells = by, ("aiconfigurator's agg estimate: engine", *head[1:])
    else:
        summary(sorted(rows, key=lambda r: (r["profile"], role_rank(r["role"]))),
                lambda r: (r["profile"], r["role"]), ("profile", "role"))
        admission_table(rows)
        priced = sorted((r for r in rows if r.get("aic")), key=lambda r: r["engine"])
        aic_by, aic_head_cells = (lambda r: (r["engine"],)), ("aiconfigurator's agg estimate",)
    if priced:
        print()
        summary(priced, aic_by, aic_head_cells, "aic")
    if unseen:
        left_out(skipped)


def admission_table(rows: list[dict]) -> None:
    """The profiles with runs whose TTFT grows with the output length as a request waiting for admission does
    (benchmarks/ttft_output_slope.py) again, those runs apart: what the served model prices and what it cannot."""
    from benchmarks.ttft_output_slope import admission_waits

    waiting = admission_waits(rows)
    profiles = {r["profile"] for r in rows if point(r) in waiting}
    if not profiles:
        return
    key = lambda r: (r["profile"], r["role"], "yes" if point(r) in waiting else "no")  # noqa: E731
    print()
    summary(sorted((r for r in rows if r["profile"] in profiles), key=lambda r: (r["profile"], role_rank(r["role"]),
                                                                                  point(r) in waiting)),
            key, ("profile", "role", "a request waits for admission"))


if __name__ == "__main__":
    main()
