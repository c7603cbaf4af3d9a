"""`topoplan validate`: for every layout that fits this machine, the planner's prediction next to what the
runner measured, and whether the planner ranks the layouts in the measured order.

On a CPU machine the layouts are CPU-process layouts: one rank with every core as threads (TP1), and
every tp x pp x dp over one single-threaded rank per core; for an MoE checkpoint also the expert-parallel
layouts the bundled runner runs (ep = tp with dp 1, where the planner's ep = tp x dp and the runner's EP
inside a TP group coincide). Each is priced by the planner on the CPU
topology and device of the calibration's `cpu` entry (topoplan.plan.cpu_entry), then run by the runner with
the same batch, prompt length and new-token count. Runs are interleaved across layouts (round-robin
over `repeats`) so a burst of load from other processes does not land on one layout only; the median of
the repeats is kept.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topoplan.bench.launch import spawn_json
from topoplan.bench.load import LoadMonitor, Sources
from topoplan.bench.machine_limits import gib, physical_memory_bytes
from topoplan.cpuset import cpu_cores
from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json
from topoplan.layout import Layout, layer_split_json
from topoplan.limits import check_count
from topoplan.models import ModelSpec, check_context, spec_from_config
from topoplan.plan.calibration_file import CalibrationFile, ConstantValues, read_calibration_file
from topoplan.plan.cost import Workload
from topoplan.plan.cpu_layouts import CPU_DTYPE, Candidate, cpu_candidates, price_cpu
from topoplan.run_options import RunOptions


def model_spec(model: str) -> ModelSpec:
    """The planner's view of the runner's model: a built-in name or a checkpoint folder's config.json."""
    from topoplan.runner.worker import model_folder  # writes a built-in model's folder on first use

    folder = model_folder(model)
    path = Path(folder) / "config.json"
    raw = read_json(path, "the model's HF config.json")
    return spec_from_config(raw, model, source=path)


def check_counts(batch: int, prompt_len: int, gen_len: int, repeats: int) -> None:
    """validate's count options within topoplan.limits' bounds (either engine), before anything is read or run."""
    for option, value in (("--batch", batch), ("--prompt-len", prompt_len), ("--gen-len", gen_len),
                          ("--repeats", repeats)):
        check_count(option, value)
    if gen_len < 2:
        raise TopoplanError("--gen-len must be at least 2: the first new token is prefill, decode starts after it")


def check_sizes(spec: ModelSpec, batch: int, prompt_len: int, gen_len: int) -> None:
    """Refuse a workload the model or this machine cannot hold, before any prompt is built: prompt + new tokens
    within max_position_embeddings, and one rank's fp32 KV cache (TP1 holds all of it) within half the RAM."""
    check_context(spec.max_context, prompt_len + gen_len, f"--prompt-len {prompt_len} + --gen-len {gen_len}",
                  spec.name)
    kv, have = batch * (prompt_len + gen_len) * spec.kv_bytes_per_token("fp32"), physical_memory_bytes()
    if kv > have // 2:
        raise TopoplanError(f"--batch {batch} x {prompt_len + gen_len} tokens need a {gib(kv)} KV cache, more than "
                            f"half of this machine's {gib(have)} of memory")


def parse_layouts(text: str) -> list[Layout] | None:
    """`all` -> None (every layout that fits); else layouts separated by `;` (`tp=2;pp=2;tp=1,dp=2`)."""
    if text.strip().lower() == "all":
        return None
    layouts = [Layout.parse(part) for part in text.split(";") if part.strip()]
    if not layouts:
        raise TopoplanError(f"--layouts {text!r}: expected `all` or layouts like tp=2;pp=2;dp=2")
    return layouts


@dataclass(frozen=True)
class Prediction:
    prefill_ms: float
    decode_ms_per_token: float
    reasons: list[str]
    stages: list[dict[str, int]]  # the layer split it priced, as `plan --json` reports it


def predict(spec: ModelSpec, cand: Candidate, calibration: CalibrationFile, batch: int,
            prompt_len: int, gen_len: int, overheads: ConstantValues | None = None,
            micro_batched: bool = True) -> Prediction:
    """The planner's price of one CPU layout for `batch` prompts split over its replicas
    (topoplan.plan.cpu_layouts.price_cpu).
    `overheads` and `micro_batched` describe another engine than the runner (topoplan.bench.vllm_cpu)."""
    cost = price_cpu(spec, cand, calibration.cpu_entry(), calibration.calibration(),
                     Workload(batch // cand.layout.dp, prompt_len, gen_len, CPU_DTYPE), overheads=overheads,
                     micro_batched=micro_batched)
    return Prediction(cost.prefill_ms, cost.decode_ms_per_token, cost.reasons, layer_split_json(cost.stage_layers))


def prompts(batch: int, prompt_len: int) -> list[str]:
    """Deterministic prompts of exactly prompt_len byte tokens each (the same for every layout)."""
    return [",".join(str((7 * i + 13 * b) % 256) for i in range(prompt_len)) for b in range(batch)]


def measure(model: str, cand: Candidate, batch: int, prompt_len: int, gen_len: int, timeout_s: float) -> dict:
    """One runner run of the layout: its result's "timing" and "stages" (the layer split it ran). Its ranks keep
    their thread counts (--fixed-threads): the planner priced the layout at those."""
    layout = cand.layout
    opts = RunOptions(model=model, tp=layout.tp, pp=layout.pp, dp=layout.dp, ep=layout.ep,
                      prompt_ids=prompts(batch, prompt_len), max_new_tokens=gen_len, backend="gloo", ignore_eos=True,
                      json=True, timeout=timeout_s, fixed_threads=True)
    return spawn_json(layout.world, "topoplan.runner", opts.to_argv(), echo=False,
                      what=f"runner {layout}", timeout_s=timeout_s)


DRIFT_WARN = 0.15  # the machine's bandwidth this far from the calibration's: its prices no longer hold


def bandwidth_probe(calibration: CalibrationFile) -> Callable[[], float]:
    """A probe of this machine's weight-streaming rate now, GB/s: the calibration's GEMV probe, on every core and
    over the same buffer size as the calibration used (a smaller one would partly sit in the cache)."""
    import torch

    from topoplan.bench import probes

    cores = calibration.cpu_entry().cores
    probe_mib = (calibration.measured.probe_mib if calibration.measured else None) or 256

    def now() -> float:
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(cores)
            return probes.gemv_gbps(torch.device("cpu"), torch.float32, nbytes=probe_mib * probes.MiB)
        finally:
            torch.set_num_threads(threads)

    return now


def calibrated_gemv_gbps(calibration: CalibrationFile) -> float:
    """The GEMV rate the calibration measured on every core (what `drift` compares with)."""
    entry = calibration.cpu_entry()
    return entry.probes(entry.cores).gemv_gbps


def drift(calibrated: float, before: float, after: float) -> dict[str, Any]:
    """The GEMV rate the calibration measured on every core (`calibrated`, GB/s) against now, before and after
    the runs: a shared VM's neighbours can halve its memory bandwidth for minutes without any load this machine
    can see, and then every price is off by as much. `warning` says so above DRIFT_WARN."""
    worst = max(abs(before - calibrated), abs(after - calibrated)) / calibrated
    warning = (f"memory bandwidth {before:.1f} GB/s before and {after:.1f} after the runs, {calibrated:.1f} in the "
               f"calibration ({worst:.0%} apart): the machine's speed changed, recalibrate") if worst > DRIFT_WARN \
        else None
    return {"gemv_gbps_calibrated": calibrated, "gemv_gbps_before": before, "gemv_gbps_after": after,
            "worst": worst, "warning": warning}


def _rel(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def validate(model: str, layouts: str, calibration: str | None, *, batch: int = 2, prompt_len: int = 32,
             gen_len: int = 32, repeats: int = 3, timeout_s: float = 300.0, force: bool = False,
             sources: Sources | None = None,
             on_step: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Predict and measure every candidate layout; the `--json` contract of docs/bench.md.

    A busy machine (topoplan.bench.load) is refused before any run unless `force`; runs other processes
    disturbed are reported in the result's "load" warnings. `on_step(label, done, total)` reports progress."""
    check_counts(batch, prompt_len, gen_len, repeats)
    if calibration is None:
        raise TopoplanError("--calibration FILE is needed on CPU: run `topoplan calibrate` first (the planner has "
                            "no built-in CPU figures)")
    file = read_calibration_file(calibration)
    file.cpu_entry()  # a file without one is refused before the model is built
    spec = model_spec(model)
    check_sizes(spec, batch, prompt_len, gen_len)
    cores = len(cpu_cores())
    candidates = cpu_candidates(spec, cores, parse_layouts(layouts), batch)
    predicted = [predict(spec, c, file, batch, prompt_len, gen_len) for c in candidates]
    monitor = LoadMonitor("validate", sources or Sources())
    monitor.check_quiet(force)
    bandwidth_now = bandwidth_probe(file)
    before = bandwidth_now()
    runs: list[list[dict]] = [[] for _ in candidates]
    total = repeats * len(candidates)
    for round_ in range(repeats):
        for i, cand in enumerate(candidates):
            label = f"run {round_ + 1}/{repeats} of {cand.layout}"
            if on_step:
                on_step(label, round_ * len(candidates) + i, total)
            with monitor.window(label):
                runs[i].append(measure(model, cand, batch, prompt_len, gen_len, timeout_s))
    if on_step:
        on_step("done", total, total)
    speed = drift(calibrated_gemv_gbps(file), before, bandwidth_now())
    rows = []
    for cand, cost, results in zip(candidates, predicted, runs):
        timings = [r["timing"] for r in results]
        decode = statistics.median(t["decode_ms_per_token"] for t in timings)
        prefill = statistics.median(t["prefill_ms"] for t in timings)
        comm = statistics.median(t["comm_ms"] for t in timings)
        rows.append({"tp": cand.layout.tp, "pp": cand.layout.pp, "dp": cand.layout.dp, "ep": cand.layout.ep,
                     "threads_per_rank": cand.threads,
                     "predicted_decode_ms": cost.decode_ms_per_token, "measured_decode_ms": decode,
                     "predicted_prefill_ms": cost.prefill_ms, "measured_prefill_ms": prefill,
                     "error": _rel(cost.decode_ms_per_token, decode),
                     "prefill_error": _rel(cost.prefill_ms, prefill),
                     "measured_comm_ms": comm,
                     "measured_decode_ms_runs": [t["decode_ms_per_token"] for t in timings],
                     "stages_priced": cost.stages, "stages_run": results[0]["stages"],
                     "reasons": cost.reasons})
    load = monitor.report()
    return {"model": model, "params": spec.params, "weight_mb_fp32": spec.weight_bytes("fp32") / 1e6,
            "batch": batch, "prompt_len": prompt_len, "gen_len": gen_len, "repeats": repeats, "cores": cores,
            "calibration": calibration, "load_average": [load["load_before"], load["load_after"]], "load": load,
            "drift": speed, **summarize(rows)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows with the planner's best, the measured best and both orders (by decode ms/token)."""
    by_pred = sorted(rows, key=lambda r: r["predicted_decode_ms"])
    by_meas = sorted(rows, key=lambda r: r["measured_decode_ms"])
    name = lambda r: str(Layout(r["tp"], r["pp"], r["dp"], r["ep"]))  # noqa: E731
    pick = lambda r: {k: r[k] for k in ("tp", "pp", "dp", "ep", "threads_per_rank", "predicted_decode_ms",  # noqa: E731
                                        "measured_decode_ms")}
    return {"rows": rows, "best_predicted": pick(by_pred[0]), "best_measured": pick(by_meas[0]),
            "predicted_order": [name(r) for r in by_pred], "measured_order": [name(r) for r in by_meas],
            "order_matches": [name(r) for r in by_pred] == [name(r) for r in by_meas]}
