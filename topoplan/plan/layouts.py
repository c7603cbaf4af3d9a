"""Every (tp, pp, dp) worth pricing for a model on `nodes` identical nodes of `gpus_per_node` GPUs.

tp must divide the attention heads (and, for GQA, either divide the KV heads or be a multiple of them, so
KV heads replicate evenly); pp at most the layer count (uneven splits are priced); groups must tile the
nodes. Fewer GPUs than present are allowed: a node may run k <= gpus_per_node ranks.
"""

from __future__ import annotations

from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.models import ModelSpec
from topoplan.plan.placement import node_blocks


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_tp(model: ModelSpec, tp: int) -> None:
    """Refuse a TP degree the model's heads cannot be split over."""
    if tp < 1:
        raise TopoplanError(f"tp must be >= 1, got {tp}")
    if model.heads % tp:
        raise TopoplanError(f"tp={tp} does not divide the {model.heads} attention heads of {model.name}; "
                            f"possible: {', '.join(map(str, _divisors(model.heads)))}")
    if not model.is_mla and model.kv_heads % tp and tp % model.kv_heads:
        raise TopoplanError(f"tp={tp} neither divides nor is a multiple of the {model.kv_heads} KV heads of "
                            f"{model.name}")


def _tiles(layout: Layout, k: int) -> bool:
    try:
        node_blocks(layout, k)
    except TopoplanError:
        return False
    return True


def enumerate_layouts(model: ModelSpec, gpus_per_node: int, nodes: int = 1, *, max_tp: int | None = None,
                      tp: int | None = None, pp: int | None = None, dp: int | None = None) -> list[Layout]:
    """Candidate layouts; fixed degrees (--tp/--pp/--dp) are checked and raise a clear error when impossible."""
    if gpus_per_node < 1:
        raise TopoplanError("the topology has no GPUs")
    total = gpus_per_node * nodes
    if tp is not None:
        check_tp(model, tp)
    if pp is not None and pp > model.layers:
        raise TopoplanError(f"pp={pp} exceeds the {model.layers} layers of {model.name}")
    least = (tp or 1) * (pp or 1) * (dp or 1)
    if least > total:
        raise TopoplanError(f"tp={tp or 1} x pp={pp or 1} x dp={dp or 1} needs {least} GPUs; {nodes} node(s) x "
                            f"{gpus_per_node} GPUs have {total}")
    if None not in (tp, pp, dp):
        fixed = Layout(tp, pp, dp)
        if fixed.world % nodes or not _tiles(fixed, fixed.world // nodes):
            raise TopoplanError(f"{fixed} does not split evenly over {nodes} node(s) of {gpus_per_node} GPUs")
        return [fixed]
    found = []
    for k in range(1, gpus_per_node + 1):
        world = nodes * k
        for t in _divisors(world):
            if (tp is not None and t != tp) or (max_tp is not None and t > max_tp):
                continue
            if model.heads % t or (not model.is_mla and model.kv_heads % t and t % model.kv_heads):
                continue
            for p in _divisors(world // t):
                if (pp is not None and p != pp) or p > model.layers:
                    continue
                layout = Layout(t, p, world // (t * p))
                if (dp is None or layout.dp == dp) and _tiles(layout, k):
                    found.append(layout)
    if not found:
        asked = ", ".join(f"{n}={v}" for n, v in (("tp", tp), ("pp", pp), ("dp", dp)) if v is not None)
        raise TopoplanError(f"no layout{' with ' + asked if asked else ''} fits {nodes} node(s) x "
                            f"{gpus_per_node} GPUs for {model.name}")
    return found
