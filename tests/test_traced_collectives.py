"""The TP collectives under torch.compile: one opaque op each (topoplan.runner.dist.traced_all_reduce), so a
compiled decode step has no graph break at them. The end-to-end check (TP2 compiled, the same tokens and logits
as one eager rank) is tests/test_runner_dist.py's `-compiled` TP2 variant; here the boundary, in one process:
a gloo world of one rank whose TP group is that rank."""

import torch
import torch.distributed as dist

from topoplan.layout import Layout, RankGrid
from topoplan.runner.dist import Dist


def test_collectives_compile_without_a_graph_break_and_keep_their_results(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        layout = Layout()
        d = Dist(layout, 0, RankGrid(layout).coords(0), torch.device("cpu"), "gloo", tp_group=dist.new_group([0]),
                 pp_group=None, pp_ranks=[0])

        def step(x: torch.Tensor) -> torch.Tensor:
            return d.all_gather_last_dim(d.all_reduce(x * 2.0) + 1.0).sum(-1)

        x = torch.arange(6.0).view(2, 3)
        expected = (x * 2.0 + 1.0).sum(-1)
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
        got = compiled(x)
        assert torch.equal(got, expected)
        assert torch.equal(x, torch.arange(6.0).view(2, 3))  # the input is not reduced in place under compile
        before = d.timer.seconds
        compiled(x)
        assert d.timer.seconds > before  # the op's body runs Dist's own collective, which times itself
    finally:
        dist.destroy_process_group()
