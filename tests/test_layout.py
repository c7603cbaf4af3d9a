"""Rank order: TP fastest, then PP, then DP; parse and inverse."""

import pytest
from hypothesis import given, strategies as st

from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankCoords, coords_of, dp_groups, pp_groups, rank_of, tp_groups


def test_rank_order_tp_fastest_then_pp_then_dp():
    layout = Layout(tp=2, pp=2, dp=2)
    assert [coords_of(layout, r) for r in range(4)] == [
        RankCoords(0, 0, 0), RankCoords(1, 0, 0), RankCoords(0, 1, 0), RankCoords(1, 1, 0)]
    assert tp_groups(layout) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pp_groups(layout) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dp_groups(layout) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.data())
def test_rank_of_inverts_coords_of(tp, pp, dp, data):
    layout = Layout(tp, pp, dp)
    rank = data.draw(st.integers(0, layout.world - 1))
    assert rank_of(layout, coords_of(layout, rank)) == rank


def test_parse_layout():
    assert Layout.parse("tp=4, pp=2") == Layout(4, 2, 1)
    assert str(Layout.parse("dp=2,tp=1")) == "tp=1,pp=1,dp=2"
    for bad in ("tp=4,tp=2", "tp=x", "", "tp=0", "foo=1"):
        with pytest.raises(TopoplanError):
            Layout.parse(bad)
