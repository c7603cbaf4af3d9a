"""Fit the fitted constants of each engine profile on its published fitting rows
(tests/data/engine_measurements.json, role "fit"): the search behind the values in topoplan/engines.

    python benchmarks/engine_fit.py [vllm|sglang|trtllm ...]

Free: memory_bandwidth_efficiency (a grid of round values), graph_layer_overhead_us g, step_overhead_us s and
sequence_overhead_us q. The predicted TPOT is linear in g, s and q (each decode step of B sequences pays L x g + s
+ B x q, each prefill s + q once, shared by (B-1)/gen of the steps), so for each efficiency they come from
non-negative least squares on the relative error, then are rounded (g and q to 1 us, s to 50 us). Rows of one
model cannot tell L x g from s (L is the same in every row): then it all goes per layer, s = 0; rows of one
concurrency cannot tell B x q from s (or from L x g): then q = 0; docs/engines.md says which. Prints the best
set, its error on the fitting rows and on the checking rows, which the fit never saw. Everything else stays as
the profile has it (sourced).

A profile with an empirical TTFT factor (Scheduler.ttft_factor, aiconfigurator's form) gets its divisor fitted
too: the served TTFT of its fitting rows priced without the factor, the divisor from a grid minimising RMS(log)
error. A multiplier on a wait set before the request decodes cannot describe runs whose TTFT grows with the
output length (a request always waiting for admission: benchmarks/ttft_output_slope.py, admission_waits), so
their rows are left out of this fit. aiconfigurator's form also adds a dispatch cost per layer inside the
factor; whether that second constant is kept is decided on the fitting rows alone, by leave-one-out error of
the one- and two-constant fits.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.served_validation import point, served_rows  # noqa: E402
from benchmarks.ttft_output_slope import admission_waits  # noqa: E402
from tests.engine_cases import PUBLISHED, engine_rows, in_scope, model_of, with_overheads  # noqa: E402
from topoplan.engines import resolve  # noqa: E402

EFFICIENCIES = [0.70, 0.75, 0.80, 0.85, 0.90]


def rms(errors: list[float]) -> float:
    return math.sqrt(sum(math.log1p(e) ** 2 for e in errors) / len(errors)) if errors else 0.0


def least_squares(rows, layers: dict[str, int]) -> tuple[float, float, float]:
    """(g, s, q) >= 0 minimising sum ((base + a g + b s + c q) / measured - 1)^2, base priced with g = s = q = 0:
    the best of the non-negative solutions over the subsets of the constants the rows can tell apart."""
    columns = {"g": [layers[r.model] / 1e3 / r.measured for r in rows],  # ms per us of g
               "s": [(1 + (r.batch - 1) / r.gen) / 1e3 / r.measured for r in rows],  # ms per us of s
               "q": [(r.batch + (r.batch - 1) / r.gen) / 1e3 / r.measured for r in rows]}  # ms per us of q
    residual = torch.tensor([1 - r.predicted / r.measured for r in rows], dtype=torch.float64)
    free = ["g"] + ["s"] * (len({layers[r.model] for r in rows}) > 1) + ["q"] * (len({r.batch for r in rows}) > 1)
    best: tuple[float, dict[str, float]] = (float(residual @ residual), {})
    for size in range(1, len(free) + 1):
        for names in itertools.combinations(free, size):
            a = torch.tensor([columns[n] for n in names], dtype=torch.float64).T
            if int(torch.linalg.matrix_rank(a)) < size:  # these constants move together on these rows
                continue
            x = torch.linalg.lstsq(a, residual[:, None]).solution[:, 0]
            left = a @ x - residual
            if float(x.min()) >= 0 and float(left @ left) < best[0]:
                best = (float(left @ left), dict(zip(names, x.tolist())))
    found = best[1]
    return round(found.get("g", 0.0)), round(found.get("s", 0.0) / 50) * 50, round(found.get("q", 0.0))


def fit(name: str) -> None:
    base = resolve(name)
    if name not in {resolve(r["engine"]).name for r in PUBLISHED["rows"]}:
        print(f"{name}: no published rows to fit")
        return
    layers = {r.model: r.layers for r in engine_rows({name: base}, role="fit") if r.profile == str(base)}
    best = None
    for eff in EFFICIENCIES:
        zero = with_overheads(base, memory_bandwidth_efficiency=eff, graph_layer_overhead_us=0.0, step_overhead_us=0.0,
                              sequence_overhead_us=0.0)
        rows = [r for r in engine_rows({name: zero}, role="fit") if r.profile == str(base) and in_scope(r)]
        g, s, q = least_squares(rows, layers)
        profile = with_overheads(base, memory_bandwidth_efficiency=eff, graph_layer_overhead_us=float(g),
                                 step_overhead_us=float(s), sequence_overhead_us=float(q))
        fitted = [r for r in engine_rows({name: profile}, role="fit") if r.profile == str(base) and in_scope(r)]
        score = rms([r.error for r in fitted])
        if best is None or score < best[0]:
            best = (score, eff, g, s, q, profile)
    score, eff, g, s, q, profile = best
    check = [r for r in engine_rows({name: profile}, role="check") if r.profile == str(base) and in_scope(r)]
    worst = max(check, key=lambda r: abs(r.error))
    print(f"{base}: memory_bandwidth_efficiency={eff} graph_layer_overhead_us={g} step_overhead_us={s} "
          f"sequence_overhead_us={q}; "
          f"fit RMS(log) {score:.3f}; check RMS(log) "
          f"{rms([r.error for r in check]):.3f} over {len(check)} rows, worst {100 * worst.error:+.0f}% "
          f"({worst.model} TP{worst.layout.tp} B{worst.batch} {worst.prompt}/{worst.gen})")


DIVISORS = [d / 20 for d in range(10, 401)]  # 0.5 to 20 by 0.05
LAYER_MS = [a / 20 for a in range(0, 61)]  # aiconfigurator's per-layer dispatch term, 0 to 3 ms by 0.05


def ttft_predicted(row: dict, layer_ms: float, divisor: float) -> float:
    """aiconfigurator's form on our served TTFT priced without the factor: (TTFT + L x a) x (1 + log2 C / d)."""
    factor = replace(row["factor"], divisor=divisor).at(row["concurrency"])
    return (row["bare"] + row["layers"] * layer_ms) * factor


def ttft_rms(rows: list[dict], layer_ms: float, divisor: float) -> float:
    return rms([ttft_predicted(r, layer_ms, divisor) / r["ttft_ms"] - 1 for r in rows])


def best_ttft(rows: list[dict], layer_grid: list[float]) -> tuple[float, float]:
    return min(((a, d) for a in layer_grid for d in DIVISORS), key=lambda p: ttft_rms(rows, *p))


def leave_one_out(rows: list[dict], layer_grid: list[float]) -> float:
    """RMS(log) error of each fitting row predicted by the constants fitted on the other rows."""
    errors = []
    for i, held in enumerate(rows):
        a, d = best_ttft(rows[:i] + rows[i + 1:], layer_grid)
        errors.append(ttft_predicted(held, a, d) / held["ttft_ms"] - 1)
    return rms(errors)


def ttft_factor_fit(name: str) -> tuple[float, float, float, float, list[float]] | None:
    """(per-layer ms, divisor, leave-one-out RMS(log) with the divisor alone, with both, the checking rows'
    errors) for a profile with an empirical TTFT factor; None for one without. Only fitting rows choose, and of
    them only those without an admission wait."""
    base = resolve(name)
    factor = base.scheduler.ttft_factor
    if factor is None:
        return None
    bare = replace(base, scheduler=replace(base.scheduler, ttft_factor=None))
    rows = [{**r, "bare": r["ours"]["TTFT"], "factor": factor, "layers": model_of(r["model"]).layers}
            for r in served_rows(only=bare)]
    waiting = admission_waits(rows)
    fitting = [r for r in rows if r["role"] == "fit" and point(r) not in waiting]
    checking = [r for r in rows if r["role"] == "check"]
    one, two = leave_one_out(fitting, [0.0]), leave_one_out(fitting, LAYER_MS)
    a, d = best_ttft(fitting, [0.0] if one <= two else LAYER_MS)
    return a, d, one, two, [ttft_predicted(r, a, d) / r["ttft_ms"] - 1 for r in checking]


def fit_ttft_factor(name: str) -> None:
    found = ttft_factor_fit(name)
    if found is None:
        return
    a, d, one, two, check = found
    print(f"{resolve(name)}: TTFT factor 1 + log2(C) / {d} with {a} ms per layer (leave-one-out RMS(log) on the "
          f"fitting rows: divisor alone {one:.3f}, with the per-layer term {two:.3f}); check mean |error| "
          f"{100 * sum(map(abs, check)) / len(check):.1f}%, worst {100 * max(map(abs, check)):.0f}% over "
          f"{len(check)} rows")

if __name__ == "__main__":
    for engine in sys.argv[1:] or ["vllm", "sglang", "trtllm"]:
        fit(engine)
        fit_ttft_factor(engine)
