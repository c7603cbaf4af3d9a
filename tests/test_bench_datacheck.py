"""`bench -c`'s data check: hand-written expected values, and a wrong result caught (a one-rank gloo world
in this process, so a value can be corrupted between the operation and the check)."""

import pytest
import torch
import torch.distributed as dist

from topoplan.bench import datacheck
from topoplan.bench.collectives import Group, make_case
from topoplan.bench.definitions import OPS, PLACES

CPU = torch.device("cpu")


def test_pattern_and_reductions_by_hand():
    # rank j holds 1 + (i + 3j) mod 4: rank 0: 1 2 3 4, rank 1: 4 1 2 3
    assert datacheck.pattern(0, 0, 4, 2, "sum", CPU).tolist() == [1, 2, 3, 4]
    assert datacheck.pattern(1, 0, 4, 2, "sum", CPU).tolist() == [4, 1, 2, 3]
    assert datacheck.reduced(0, 4, 2, "sum", CPU).tolist() == [5, 3, 5, 7]
    assert datacheck.reduced(0, 4, 2, "avg", CPU).tolist() == [2.5, 1.5, 2.5, 3.5]
    assert datacheck.reduced(0, 4, 2, "min", CPU).tolist() == [1, 1, 2, 3]
    assert datacheck.reduced(0, 4, 2, "max", CPU).tolist() == [4, 2, 3, 4]
    assert datacheck.reduced(0, 4, 3, "prod", CPU).tolist() == [2, 2, 2, 2]  # one 2 per index, whatever n
    assert datacheck.reduced(2, 2, 2, "sum", CPU).tolist() == [5, 7]  # an offset: reduce_scatter's chunk 1
    # all_gather of 2 chunks of 2: rank 0's first chunk, then rank 1's second
    assert datacheck.gathered(2, 2, CPU).tolist() == [1, 2, 2, 3]
    # all_to_all, rank 1 receives chunk 1 of every rank
    assert datacheck.exchanged(1, 2, 2, CPU).tolist() == [3, 4, 2, 3]


def test_wrong_counts_elements_off_by_more_than_rounding():
    expected = torch.tensor([5.0, 3.0, 5.0, 7.0], dtype=torch.float64)
    assert datacheck.wrong(torch.tensor([5.0, 3.0, 5.0, 7.0]), expected, 2) == 0
    assert datacheck.wrong(torch.tensor([5.0, 3.5, 0.0, 7.0]), expected, 2) == 2
    assert datacheck.wrong(torch.tensor([5.0, 3.0, 5.0, 7.0], dtype=torch.bfloat16), expected, 2) == 0


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield Group((0,), None)
    dist.destroy_process_group()


FORMS = [(op, place) for op in OPS if op != "sendrecv" for place, offered in zip((False, True), PLACES[op]) if offered]


@pytest.mark.parametrize("op, in_place", FORMS)
def test_a_corrupted_result_is_caught(one_rank_world, op, in_place):
    case = make_case(op, 64, one_rank_world, 0, CPU, torch.float32, in_place=in_place)
    case.fill()
    case.call()
    assert case.check() == 0, "a correct run checks clean"
    case.result.view(-1)[5] += 100.0  # what a broken transport would leave
    case.result.view(-1)[9] = float("nan")
    assert case.check() == 2


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter"])
def test_an_operation_that_writes_nothing_is_caught(one_rank_world, op):
    case = make_case(op, 64, one_rank_world, 0, CPU, torch.float32)
    case.fill()  # outputs start at 0 (no input holds 0); with the call skipped the output stays wrong
    case.result.zero_()
    assert case.check() == case.result.numel()


@pytest.mark.parametrize("redop", ["sum", "prod", "min", "max"])
def test_each_reduction_checks_clean(one_rank_world, redop):
    case = make_case("all_reduce", 64, one_rank_world, 0, CPU, torch.float32, redop=redop)
    case.fill()
    case.call()
    assert case.check() == 0
