"""Rank order (TP fastest, then PP, then DP), the rank grid's groups, the pipeline layer split; parse."""

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankCoords, RankGrid, layer_split_json, split_layers


def test_rank_order_tp_fastest_then_pp_then_dp():
    grid = RankGrid(Layout(tp=2, pp=2, dp=2))
    assert [grid.coords(r) for r in range(4)] == [
        RankCoords(0, 0, 0), RankCoords(1, 0, 0), RankCoords(0, 1, 0), RankCoords(1, 1, 0)]
    assert grid.tp_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.pp_groups == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.dp_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.groups("pp") == grid.pp_groups and grid.group_of("dp", 5) == [1, 5]
    with pytest.raises(TopoplanError, match="group kind 'xp'"):
        grid.groups("xp")
    with pytest.raises(TopoplanError, match="rank 8 is outside a world of 8"):
        grid.coords(8)


def test_expert_parallel_groups_span_tp_and_dp_of_one_stage():
    grid = RankGrid(Layout(tp=2, pp=2, dp=2, ep=4))  # vLLM: ep = tp x dp, per pipeline stage
    assert grid.ep_groups == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert RankGrid(Layout(tp=4, pp=1, dp=2, ep=2)).ep_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert RankGrid(Layout(tp=2, dp=2)).ep_groups == [[0], [1], [2], [3]]
    assert str(Layout(2, 1, 2, 4)) == "tp=2,pp=1,dp=2,ep=4" and str(Layout(2)) == "tp=2,pp=1,dp=1"
    assert Layout.parse("ep=4,tp=2,dp=2") == Layout(2, 1, 2, 4)
    for bad in (dict(tp=2, dp=2, ep=3), dict(tp=4, dp=2, ep=6), dict(tp=2, ep=4)):
        with pytest.raises(TopoplanError, match="ep=.* must divide tp="):
            Layout(**bad)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_ep_groups_are_the_torch_view_of_each_stage_plane(tp, pp, dp, data):
    ep = data.draw(st.sampled_from([e for e in range(1, tp * dp + 1) if (tp * dp) % e == 0
                                    and (e % tp == 0 or tp % e == 0)]))
    plane = torch.arange(tp * pp * dp).view(dp, pp, tp).permute(1, 0, 2).reshape(pp, dp * tp)
    expected = plane.reshape(pp * dp * tp // ep, ep).tolist()
    assert RankGrid(Layout(tp, pp, dp, ep)).ep_groups == expected


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.data())
def test_rank_inverts_coords(tp, pp, dp, data):
    grid = RankGrid(Layout(tp, pp, dp))
    rank = data.draw(st.integers(0, grid.layout.world - 1))
    assert grid.rank(grid.coords(rank)) == rank


@pytest.mark.parametrize("tp,pp,dp", [l for l in itertools.product(range(1, 5), repeat=3) if l[0] * l[1] * l[2] <= 24])
def test_grid_agrees_with_torch_arange_view(tp, pp, dp):
    """design.md's statement of the order, `torch.arange(world).view(dp, pp, tp)`, read independently."""
    layout = Layout(tp, pp, dp)
    view = torch.arange(layout.world).view(dp, pp, tp)
    grid = RankGrid(layout)
    assert grid.tp_groups == view.reshape(-1, tp).tolist()
    assert grid.pp_groups == view.permute(0, 2, 1).reshape(-1, pp).tolist()
    assert grid.dp_groups == view.permute(1, 2, 0).reshape(-1, dp).tolist()
    for rank in range(layout.world):
        c = grid.coords(rank)
        assert int(view[c.dp_rank, c.pp_rank, c.tp_rank]) == rank


def sizes(layers: int, pp: int) -> list[int]:
    return [len(r) for r in split_layers(layers, pp)]


def test_split_layers_matches_vllm_get_pp_indices():
    """Expected values worked out by hand from vLLM's get_pp_indices (vllm/distributed/utils.py, v0.32):
    `layers // pp` each, then partitions[-2], partitions[-3], ... take one extra layer each."""
    assert sizes(126, 4) == [31, 32, 32, 31]  # Llama-3.1-405B
    assert sizes(126, 5) == [25, 25, 25, 26, 25]
    assert sizes(4, 3) == [1, 2, 1]  # tiny
    assert sizes(5, 3) == [2, 2, 1]
    assert sizes(5, 2) == [3, 2]
    assert sizes(11, 5) == [2, 2, 2, 3, 2]
    assert sizes(7, 7) == [1] * 7
    assert sizes(80, 1) == [80]
    assert split_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert layer_split_json(split_layers(5, 3)) == [
        {"pp_rank": 0, "first_layer": 0, "last_layer": 1, "layers": 2},
        {"pp_rank": 1, "first_layer": 2, "last_layer": 3, "layers": 2},
        {"pp_rank": 2, "first_layer": 4, "last_layer": 4, "layers": 1}]
    with pytest.raises(TopoplanError, match="pp=6 is more stages than the model's 5 layers"):
        split_layers(5, 6)


@given(st.integers(1, 300), st.integers(1, 64))
def test_split_layers_is_contiguous_and_even(layers, pp):
    if pp > layers:
        return
    stages = split_layers(layers, pp)
    assert [i for r in stages for i in r] == list(range(layers))
    assert max(map(len, stages)) - min(map(len, stages)) <= 1
    assert len(stages[-1]) == layers // pp  # the last stage (norm + LM head) never takes an extra layer


def test_parse_layout():
    assert Layout.parse("tp=4, pp=2") == Layout(4, 2, 1)
    assert str(Layout.parse("dp=2,tp=1")) == "tp=1,pp=1,dp=2"
    for bad in ("tp=4,tp=2", "tp=x", "", "tp=0", "foo=1"):
        with pytest.raises(TopoplanError):
            Layout.parse(bad)
