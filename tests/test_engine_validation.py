"""Each engine profile against published measurements of that engine (tests/data/engine_measurements.json,
NVIDIA's silicon samples shipped with aiconfigurator 0.12): the checking rows, which the fit never saw
(benchmarks/engine_fit.py uses only role "fit"), within 15% of the measured TPOT, and the measured order of
TP layouts kept. docs/engines.md prints the table (benchmarks/engine_table.py)."""

from __future__ import annotations

from itertools import groupby

import pytest

from tests.engine_cases import PUBLISHED, engine_rows, in_scope, model_of, price
from topoplan.engines import resolve
from topoplan.layout import Layout
from topoplan.plan.cost import Workload

ROWS = engine_rows()


def _id(r):
    return f"{r.engine} {r.model} {r.dtype} TP{r.layout.tp} B{r.batch} {r.prompt}/{r.gen}"


CHECK = [r for r in ROWS if r.role == "check" and in_scope(r)]


def test_the_data_is_published_rows_kept_apart():
    """Fitting and checking rows are disjoint, every engine has both, and each row names its source row."""
    rows = PUBLISHED["rows"]
    assert all(r["id"] and r["role"] in ("fit", "check") for r in rows)
    for engine in {r["engine"] for r in rows}:
        roles = {r["role"] for r in rows if r["engine"] == engine}
        assert roles == {"fit", "check"}, engine
    assert len(CHECK) >= 60  # most checking rows are within the model's scope


@pytest.mark.parametrize("row", CHECK, ids=[_id(r) for r in CHECK])
def test_checking_rows_within_15_percent(row):
    assert abs(row.error) <= 0.15, (row.predicted, row.measured)


def _groups(rows):
    key = lambda r: (r.engine, r.model, r.dtype, r.batch, r.prompt, r.gen)  # noqa: E731
    return [list(g) for _, g in groupby(sorted(rows, key=key), key=key)]


SWEEPS = [g for g in _groups([r for r in ROWS if in_scope(r)]) if len(g) > 1]


@pytest.mark.parametrize("sweep", SWEEPS, ids=[_id(g[0]).rsplit(" TP", 1)[0] + f" B{g[0].batch} "
                                                f"{g[0].prompt}/{g[0].gen}" for g in SWEEPS])
def test_tp_order_matches_the_measurement(sweep):
    """Faster measured TP layouts are predicted faster: the order of TP degrees by TPOT is the same."""
    by_measured = [r.layout.tp for r in sorted(sweep, key=lambda r: r.measured)]
    by_predicted = [r.layout.tp for r in sorted(sweep, key=lambda r: r.predicted)]
    assert by_predicted == by_measured, [(r.layout.tp, round(r.measured, 2), round(r.predicted, 2)) for r in sweep]


PREFILL = PUBLISHED["prefill"]["rows"]


@pytest.mark.parametrize("row", [r for r in PREFILL if r["in_scope"]],
                         ids=[f"{r['model']} TP{r['tp']} {r['prompt']}" for r in PREFILL if r["in_scope"]])
def test_long_prompt_prefill_within_15_percent(row):
    """TensorRT-LLM's published batch-1 first-token latency (v0.5) at 2048 tokens on A100 fp16, priced with
    trtllm@1.0's flop_efficiency (sourced, not fitted to these rows)."""
    cost = price(resolve("trtllm"), row["gpu"], model_of(row["model"]), Layout(row["tp"]),
                 Workload(1, row["prompt"], 1, row["dtype"]))
    assert abs(cost.prefill_ms / row["ttft_ms"] - 1) <= 0.15, (cost.prefill_ms, row["ttft_ms"])
