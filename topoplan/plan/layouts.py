"""Every (tp, pp, dp) worth pricing for a model on `nodes` identical nodes of `gpus_per_node` GPUs.

tp must divide the attention heads (and, for GQA, either divide the KV heads or be a multiple of them, so
KV heads replicate evenly) and the MLP widths (column-parallel GEMMs split evenly; vLLM and Megatron
require the same). The vocabulary is not checked here: vLLM pads it to a multiple of tp; the bundled
runner does not, so it adds vocab_size to the same check (`tp_problems`). pp at most the layer count
(uneven splits are priced); groups must tile the nodes. Fewer GPUs than present are allowed: a node may
run k <= gpus_per_node ranks. An engine's rules narrow this (topoplan.engines Parallelism): one that does not
pad the vocabulary needs tp to divide it too (the bundled runner), one without pipeline parallelism runs pp=1.
"""

from __future__ import annotations

from topoplan.engines.engine import Parallelism
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, tp_problems
from topoplan.models import ModelSpec
from topoplan.plan.placement import node_blocks


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _model_tp_problems(model: ModelSpec, tp: int, pads_vocab: bool = True) -> list[str]:
    widths = {"intermediate_size": model.intermediate}
    if model.is_moe:
        widths["moe_intermediate_size"] = model.expert_intermediate
    if not pads_vocab:
        widths["vocab_size"] = model.vocab
    return tp_problems(tp, model.heads, None if model.is_mla else model.kv_heads, widths)


def check_tp(model: ModelSpec, tp: int, pads_vocab: bool = True) -> None:
    """Refuse a TP degree the model cannot be split by, listing the degrees that work."""
    if tp < 1:
        raise TopoplanError(f"tp must be >= 1, got {tp}")
    problems = _model_tp_problems(model, tp, pads_vocab)
    if problems:
        possible = [d for d in _divisors(model.heads) if not _model_tp_problems(model, d, pads_vocab)]
        raise TopoplanError(f"{model.name}: {'; '.join(problems)}; possible tp: {', '.join(map(str, possible))}")


def _tiles(layout: Layout, k: int) -> bool:
    try:
        node_blocks(layout, k)
    except TopoplanError:
        return False
    return True


def expert_degrees(model: ModelSpec, tp: int, dp: int, ep: int | None = None) -> list[int]:
    """The EP degrees worth pricing with tp x dp ranks per stage: 1 (experts TP-sharded) and, for an MoE model
    whose routed experts split evenly, vLLM's ep = tp x dp; `ep` (--ep) picks one of them."""
    wanted = [1] + ([tp * dp] if model.is_moe and tp * dp > 1 and model.experts % (tp * dp) == 0 else [])
    return wanted if ep is None else [e for e in wanted if e == ep]


def check_ep(model: ModelSpec, ep: int | None) -> None:
    """--ep: at least 1, and more than 1 only for an MoE model whose experts it divides."""
    if ep is None or ep == 1:
        return
    if ep < 1:
        raise TopoplanError(f"ep must be >= 1, got {ep}")
    if not model.is_moe:
        raise TopoplanError(f"ep={ep}: {model.name} has no experts (expert parallelism needs an MoE model)")
    if model.experts % ep:
        raise TopoplanError(f"ep={ep} does not divide the {model.experts} routed experts of {model.name}")


def enumerate_layouts(model: ModelSpec, gpus_per_node: int, nodes: int = 1, *, max_tp: int | None = None,
                      tp: int | None = None, pp: int | None = None, dp: int | None = None,
                      ep: int | None = None, rules: Parallelism | None = None,
                      engine: str = "the engine") -> list[Layout]:
    """Candidate layouts; fixed degrees (--tp/--pp/--dp/--ep) are checked and raise a clear error when
    impossible. An MoE model gets each (tp, pp, dp) twice: experts TP-sharded, and expert-parallel.
    `rules`: the engine's (None: pad the vocabulary, every parallelism); `engine` names it in errors."""
    if gpus_per_node < 1:
        raise TopoplanError("the topology has no GPUs")
    rules = rules or Parallelism()
    if not rules.pp:
        if pp not in (None, 1):
            raise TopoplanError(f"{engine} does not run pipeline parallelism: --pp {pp} needs another engine "
                                "or version")
        pp = 1
    total = gpus_per_node * nodes
    if tp is not None:
        check_tp(model, tp, rules.pads_vocab)
    check_ep(model, ep)
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
        degrees = expert_degrees(model, tp, dp, ep)
        if not degrees:
            raise TopoplanError(f"ep={ep}: expert parallelism runs over tp x dp = {tp * dp} ranks per stage "
                                "(vLLM's semantics); pass --ep 1 or the matching --dp")
        runnable = [Layout(tp, pp, dp, e) for e in degrees if rules.runs(Layout(tp, pp, dp, e), model.is_moe)]
        if not runnable:
            raise TopoplanError(f"{engine} runs no data-parallel replicas in one launch (--dp {dp}) except as "
                                f"attention DP of an MoE model (tp={rules.attention_dp_tp}, ep = dp): start one "
                                "server per replica, or plan for another engine" if rules.attention_dp_tp else
                                f"{engine} runs no data-parallel replicas in one launch (--dp {dp}): start one "
                                "server per replica, or plan for another engine")
        return runnable
    found = []
    for k in range(1, gpus_per_node + 1):
        world = nodes * k
        for t in _divisors(world):
            if (tp is not None and t != tp) or (max_tp is not None and t > max_tp):
                continue
            if _model_tp_problems(model, t, rules.pads_vocab):
                continue
            for p in _divisors(world // t):
                if (pp is not None and p != pp) or p > model.layers:
                    continue
                layout = Layout(t, p, world // (t * p))
                if (dp is None or layout.dp == dp) and _tiles(layout, k):
                    found.extend(chosen for e in expert_degrees(model, t, layout.dp, ep)
                                 if rules.runs(chosen := Layout(t, p, layout.dp, e), model.is_moe))
    if not found:
        asked = ", ".join(f"{n}={v}" for n, v in (("tp", tp), ("pp", pp), ("dp", dp), ("ep", ep)) if v is not None)
        raise TopoplanError(f"no layout{' with ' + asked if asked else ''} fits {nodes} node(s) x "
                            f"{gpus_per_node} GPUs for {model.name}")
    return found


def fewer_node_layouts(model: ModelSpec, gpus_per_node: int, nodes: int, min_nodes: int, *,
                       max_tp: int | None = None, tp: int | None = None, pp: int | None = None,
                       dp: int | None = None, ep: int | None = None,
                       rules: Parallelism | None = None) -> list[tuple[Layout, int]]:
    """One-replica layouts on n < `nodes` full nodes, the rest left free, as (layout, n).

    Only those no layout over every node offers: when n divides `nodes`, the same tp x pp with nodes/n replicas
    uses them all, as fast and serving more. And only from `min_nodes` (the fewest whose memory can hold the
    weights) to twice that: one replica gains nothing from a deeper pipeline than it needs to fit (each stage
    adds a hand-off), so farther counts would only be priced to lose. A fully fixed layout (--tp, --pp and
    --dp) that does not split over every node is offered on the full nodes it fills, if fewer. An MoE model
    gets each layout with experts TP-sharded and expert-parallel (enumerate_layouts); `rules`: the engine's."""
    rules = rules or Parallelism()
    if None not in (tp, pp, dp):
        fixed, n = Layout(tp, pp, dp), (tp * pp * dp) // gpus_per_node  # type: ignore[operator]
        fills = fixed.world == n * gpus_per_node and 0 < n < nodes and nodes % n != 0
        valid = (pp <= model.layers and (rules.pp or pp == 1)  # type: ignore[operator]
                 and not _model_tp_problems(model, tp, rules.pads_vocab))  # type: ignore[arg-type]
        if not (fills and valid and _tiles(fixed, gpus_per_node)):
            return []
        return [(Layout(fixed.tp, fixed.pp, fixed.dp, e), n) for e in expert_degrees(model, fixed.tp, fixed.dp, ep)]
    if dp not in (None, 1):
        return []
    found = []
    for n in range(max(min_nodes, 1), min(nodes, 2 * max(min_nodes, 1) + 1)):
        if nodes % n == 0:
            continue
        world = n * gpus_per_node
        for t in _divisors(world):
            p = world // t
            if (tp is not None and t != tp) or (max_tp is not None and t > max_tp) or (pp is not None and p != pp):
                continue
            if p > model.layers or (p > 1 and not rules.pp) or _model_tp_problems(model, t, rules.pads_vocab):
                continue
            if _tiles(Layout(t, p, 1), gpus_per_node):
                found.extend((Layout(t, p, 1, e), n) for e in expert_degrees(model, t, 1, ep))
    return found
