"""The cost model against published measurements (tests/data/published_measurements.json), one set of
constants for every case. Tolerances are the ones the model honestly meets; docs/planner.md explains each,
and the known misses are strict xfails so a fix shows up."""

import pytest

from tests.validation_cases import allreduce_rows, busbw_rows, ft_13b_rows, ft_gpt20b_rows, mixtral_rows


def _ids(rows):
    return [f"{r.case}: {r.quantity}" for r in rows]


BATCH1 = [r for r in ft_gpt20b_rows() if "batch 1 " in r.case]
BATCH256 = [r for r in ft_gpt20b_rows() if "batch 256" in r.case]
FT13_DECODE = [r for r in ft_13b_rows() if r.quantity.startswith("decode")]
FT13_PREFILL = [r for r in ft_13b_rows() if r.quantity.startswith("prefill")]


@pytest.mark.parametrize("row", BATCH1 + FT13_DECODE, ids=_ids(BATCH1 + FT13_DECODE))
def test_decode_time_per_token_within_15_percent(row):
    assert abs(row.error) <= 0.15, (row.predicted, row.published)


@pytest.mark.parametrize("row", BATCH256, ids=_ids(BATCH256))
def test_large_batch_time_per_token_within_25_percent(row):
    # batch 256: per-GPU GEMMs shrink with TP and run below the single FLOP efficiency the model uses
    assert abs(row.error) <= 0.25, (row.predicted, row.published)


@pytest.mark.parametrize("row", FT13_PREFILL, ids=_ids(FT13_PREFILL))
def test_prefill_within_25_percent(row):
    assert abs(row.error) <= 0.25, (row.predicted, row.published)


def test_tp_scaling_shape_matches_published():
    """Decode time keeps falling from TP4 to TP8, but by far less than half (the all-reduce latency)."""
    by_tp = {r.case.split()[-1]: r.predicted for r in BATCH1}
    assert by_tp["TP1"] > by_tp["TP2"] > by_tp["TP4"] > by_tp["TP8"] > 0.75 * by_tp["TP4"]


ALLREDUCE = allreduce_rows()
LARGE = [r for r in ALLREDUCE if not r.quantity.startswith("64 KiB")]
SMALL = [r for r in ALLREDUCE if r.quantity.startswith("64 KiB")]


@pytest.mark.parametrize("row", LARGE, ids=_ids(LARGE))
def test_allreduce_from_1_mib_within_25_percent(row):
    assert abs(row.error) <= 0.25, (row.predicted, row.published)


@pytest.mark.xfail(strict=True, reason="small all-reduces: the model's fixed cost is the decode-loop cost fitted "
                   "to FasterTransformer, not the kernel-only time vidur measured (docs/planner.md)")
@pytest.mark.parametrize("row", SMALL, ids=_ids(SMALL))
def test_allreduce_64_kib_within_25_percent(row):
    assert abs(row.error) <= 0.25, (row.predicted, row.published)


BUSBW = busbw_rows()
BUSBW_MISSES = {"2x H100 PCIe NVLink-bridged", "8x RTX 5090 PCIe 5"}


@pytest.mark.parametrize("row", [r for r in BUSBW if r.case not in BUSBW_MISSES],
                         ids=_ids([r for r in BUSBW if r.case not in BUSBW_MISSES]))
def test_bus_bandwidth_within_15_percent(row):
    assert abs(row.error) <= 0.15, (row.predicted, row.published)


@pytest.mark.xfail(strict=True, reason="link-table estimates above what these systems measured "
                   "(docs/planner.md); a calibration file fixes them")
@pytest.mark.parametrize("row", [r for r in BUSBW if r.case in BUSBW_MISSES],
                         ids=_ids([r for r in BUSBW if r.case in BUSBW_MISSES]))
def test_bus_bandwidth_known_misses(row):
    assert abs(row.error) <= 0.15, (row.predicted, row.published)


MIXTRAL = mixtral_rows()


@pytest.mark.xfail(strict=True, reason="MoE known gap (docs/planner.md §6, MoE): Baseten's int8 Mixtral "
                   "on one A100 runs 12.3 ms/token and 127 ms TTFT; the roofline of 2 experts' 1-byte weights "
                   "predicts 9.3 ms (-25%) and 60 ms (-52%): TensorRT-LLM's int8 weight-only MoE kernels at batch 1 "
                   "run below the HBM and FLOP efficiencies fitted on dense fp16 models")
@pytest.mark.parametrize("row", MIXTRAL, ids=_ids(MIXTRAL))
def test_moe_batch1_within_15_percent(row):
    assert abs(row.error) <= 0.15, (row.predicted, row.published)

