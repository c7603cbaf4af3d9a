"""nccl-tests' definitions (doc/PERFORMANCE.md) against hand-computed values, and the size/op parsers."""

import pytest

from topoplan.bench.definitions import (
    OPS,
    algbw_gbps,
    avg_busbw,
    bus_factor,
    busbw_gbps,
    element_count,
    human_size,
    one_per_point,
    parse_ops,
    parse_size,
    parse_sizes,
    point_count,
)
from topoplan.errors import TopoplanError


def test_algbw_is_size_over_time():
    # 1 GB in 1 s is 1 GB/s; 256 MiB in 20 ms is 13.42 GB/s
    assert algbw_gbps(10**9, 1e6) == pytest.approx(1.0)
    assert algbw_gbps(256 * 2**20, 20_000) == pytest.approx(13.4217728)


@pytest.mark.parametrize("op, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 2, 0.5),
    ("gather", 4, 0.75), ("scatter", 8, 0.875),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("sendrecv", 2, 1.0),
    # one rank: nothing crosses a link; nccl-tests' (n-1) factors give busbw 0, the others keep algbw
    ("all_reduce", 1, 0.0), ("all_gather", 1, 0.0), ("reduce_scatter", 1, 0.0), ("all_to_all", 1, 0.0),
    ("gather", 1, 0.0), ("scatter", 1, 0.0), ("broadcast", 1, 1.0), ("reduce", 1, 1.0),
])
def test_bus_factor(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_busbw_all_reduce_eight_ranks():
    # nccl-tests' example shape: 8 ranks, 128 MiB all-reduce in 1000 us -> algbw 134.2 GB/s, busbw x 7/4
    algbw = 128 * 2**20 / 1e-3 / 1e9
    assert busbw_gbps("all_reduce", 8, 128 * 2**20, 1000.0) == pytest.approx(algbw * 1.75)
    assert busbw_gbps("all_gather", 8, 128 * 2**20, 1000.0) == pytest.approx(algbw * 0.875)


def test_busbw_hand_values_per_collective():
    # 4 ranks, 1 MB in 100 us: algbw 10 GB/s
    hand = {"all_reduce": 15.0, "all_gather": 7.5, "reduce_scatter": 7.5, "all_to_all": 7.5, "gather": 7.5,
            "scatter": 7.5, "broadcast": 10.0, "reduce": 10.0, "sendrecv": 10.0}
    assert set(hand) == set(OPS)
    for op, busbw in hand.items():
        assert busbw_gbps(op, 4, 10**6, 100.0) == pytest.approx(busbw), op
    assert busbw_gbps("all_reduce", 1, 10**6, 100.0) == 0.0


def test_avg_busbw_and_one_row_per_point():
    rows = [{"op": "all_gather", "size_bytes": 4096, "in_place": False, "busbw_gbps": 1.0},
            {"op": "all_gather", "size_bytes": 4096, "in_place": True, "busbw_gbps": 3.0},
            {"op": "all_reduce", "size_bytes": 4096, "in_place": True, "busbw_gbps": 5.0}]
    assert avg_busbw(rows) == {"all_gather": 2.0, "all_reduce": 5.0}  # both forms count, as in nccl-tests
    assert one_per_point(rows) == [rows[0], rows[2]]  # out of place where both ran


def test_points_count_every_form():
    assert point_count(["all_reduce", "all_gather", "sendrecv"], 3) == (1 + 2 + 1) * 3


def test_element_count_chunks_whole():
    assert element_count("all_reduce", 4096, 3, 4) == 1024
    assert element_count("all_gather", 4096, 3, 4) == 1023  # 3 chunks of 341
    assert element_count("reduce_scatter", 4, 8, 4) == 8  # at least one element per rank
    assert element_count("broadcast", 1, 8, 4) == 1


def test_sizes():
    assert parse_size("4K") == 4096 and parse_size("256M") == 256 * 2**20 and parse_size("1G") == 2**30
    assert parse_size("100") == 100 and parse_size("4KB") == 4096
    assert parse_sizes("4K:64K") == [4096, 8192, 16384, 32768, 65536]
    assert parse_sizes("1K:4M", factor=4) == [1024 * 4**i for i in range(7)]
    assert parse_sizes("1M,4K") == [4096, 2**20]
    assert [human_size(s) for s in (4096, 2**20, 3 * 2**30, 100)] == ["4K", "1M", "3G", "100"]


@pytest.mark.parametrize("bad", ["", "0", "4X", "-4K", "64K:4K", "K"])
def test_bad_sizes(bad):
    with pytest.raises(TopoplanError, match="size|--sizes"):
        parse_sizes(bad)


def test_ops():
    assert parse_ops("all_reduce, sendrecv") == ["all_reduce", "sendrecv"]
    assert parse_ops(",".join(OPS)) == list(OPS)
    with pytest.raises(TopoplanError, match="unknown allreduce"):
        parse_ops("allreduce")
