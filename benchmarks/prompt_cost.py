"""What a prompt costs an engine under load, read from closed-loop serving runs: the time-weighted view of TPOT.

In a closed loop of C requests the engine is never idle, so it completes one request every L / C ms (Little's law,
L = TTFT + (G - 1) x TPOT the measured request latency). Of that, a request's G tokens take G / C of a decode step
of C sequences (topoplan's step price, `decode(C)`); the rest is what its prompt cost the engine:

    prompt = L / C - G x decode(C) / C

set beside topoplan's price of that prompt prefilled alone, `prefill(1)` (one step of P prompt tokens), and, where
the optional extra is installed, aiconfigurator's measured-kernel price of it over topoplan's (its silicon data
for the engine, `plan --estimator aiconfigurator`). A ratio near 1 says the served model's steps cost what the
runs spent; the served model's TPOT adds each prompt to the decode steps at less than prefill(1) (the weights are
read once for the decodes and the prompt tokens in one step, docs/planner.md section 4), so its TPOT falls short
where the ratio is well above 1. One line per (profile, model, dtype, TP, prompt): the median ratio over the runs
at concurrency >= `--min-c` (default 32: there the prompts are a large share of the steps) and its range.

    python benchmarks/prompt_cost.py [--min-c N]   # served_validation.silicon_rows (needs the optional extra:
                                                   # pip install 'topoplan[aiconfigurator]')
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.served_validation import layout_cost, silicon_rows  # noqa: E402
from tests.engine_cases import model_of  # noqa: E402
from topoplan.engines import resolve  # noqa: E402
from topoplan.plan import aic_estimator  # noqa: E402


def prompt_ms(ttft_ms: float, tpot_ms: float, c: int, gen: int, decode_ms: float) -> float:
    """The engine time a closed loop of c requests spends per request beyond its gen tokens' share of the decode
    steps of c sequences (decode_ms each): L / c - gen x decode_ms / c, L = ttft + (gen - 1) x tpot."""
    return (ttft_ms + (gen - 1) * tpot_ms - gen * decode_ms) / c


def prompt_ratios(rows: list[dict], min_c: int) -> dict[tuple, tuple[float, list[float]]]:
    """Per (profile, model, dtype, TP, prompt): our prefill(1) ms and each run's prompt_ms / prefill(1), over the
    rows at concurrency >= min_c."""
    out: dict[tuple, tuple[float, list[float]]] = {}
    for r in rows:
        if r["concurrency"] < min_c:
            continue
        key = (str(resolve(r["engine"])), r["model"], r["dtype"], r["tp"], r["prompt"])
        ours = layout_cost(r).steps
        prefill = ours.step_ms(0, r["prompt"])
        implied = prompt_ms(r["ttft_ms"], r["tpot_ms"], r["concurrency"], r["gen"], ours.step_ms(r["concurrency"]))
        out.setdefault(key, (prefill, []))[1].append(implied / prefill)
    return out


def main() -> None:
    min_c = int(sys.argv[sys.argv.index("--min-c") + 1]) if "--min-c" in sys.argv else 32
    rows = silicon_rows()
    found = prompt_ratios(rows, min_c)
    print(f"| profile | model | dtype | TP | prompt | runs (C >= {min_c}) | ours: prefill(1) ms | "
          "measured prompt / prefill(1): median | range | aiconfigurator's prefill(1) / ours |")
    print("|---" * 10 + "|")
    kernels: dict[tuple, aic_estimator.AicKernels] = {}
    for key in sorted(found):
        prefill, ratios = found[key]
        r = next(r for r in rows if (str(resolve(r["engine"])), r["model"], r["dtype"], r["tp"], r["prompt"]) == key)
        kind = (r["engine"], r["model"], r["dtype"])
        if kind not in kernels:
            kernels[kind] = aic_estimator.load(model_of(r["model"]), r["gpu"].replace("_", "-"),
                                               resolve(r["engine"]), r["dtype"], r["dtype"])
        aic = layout_cost(r, kernels=kernels[kind]).steps.step_ms(0, r["prompt"]) / prefill
        print(f"| {' | '.join(map(str, key))} | {len(ratios)} | {prefill:.1f} | {statistics.median(ratios):.2f} | "
              f"{min(ratios):.2f}-{max(ratios):.2f} | {aic:.2f} |")


if __name__ == "__main__":
    main()
