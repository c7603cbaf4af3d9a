"""`plan`: enumerate layouts, place and price each, rank them by the objective; the JSON contract.

Every layout is served (topoplan.plan.served) at some requests in flight per replica, its concurrency: the
asked `--batch`, or for the throughput objective the largest that fits and meets the latency limits
(searched per layout: a layout is worth what it serves at its own best concurrency, not at the user's).
Layouts that fit come first, then those meeting the limits (--max-ttft-ms, --max-tpot-ms, on the served TTFT
and TPOT); among them latency ranks by the served request latency, throughput by the delivered output
tokens/s per GPU of the machine (idle GPUs count).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from topoplan.engines import default_engine
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, RankGrid, check_nodes, layer_split_json
from topoplan.models import ModelSpec, check_context
from topoplan.option_fields import option
from topoplan.plan.aic_estimator import AicKernels, KernelCostModel
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer, Ring
from topoplan.plan.cost import CostModel, LayoutCost, Workload, replica_rings
from topoplan.plan.device import DeviceSpec
from topoplan.plan.engine_costs import engine_calibration, memory_policy
from topoplan.plan.layouts import enumerate_layouts, fewer_node_layouts
from topoplan.plan.moe import ep_rings
from topoplan.plan.placement import NodePlacer, cuda_visible_devices, expand
from topoplan.plan.served import Served, ServedCost, ServedModel, largest_concurrency
from topoplan.topology.diagnose import Warning, diagnose
from topoplan.topology.model import Topology

OBJECTIVES = ("latency", "throughput")


@dataclass(frozen=True)
class Limits:
    """Latency limits a priced batch must meet (`--max-ttft-ms`, `--max-tpot-ms`); None: no limit."""

    ttft_ms: float | None = field(default=None, metadata=option(
        "--max-ttft-ms", help="Latency limit on time to first token (the batch's prefill) that the priced batch must "
        "meet."))
    tpot_ms: float | None = field(default=None, metadata=option("--max-tpot-ms", help="Latency limit on time per "
                                                                "output token."))

    def __post_init__(self) -> None:
        for flag, value in (("--max-ttft-ms", self.ttft_ms), ("--max-tpot-ms", self.tpot_ms)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise TopoplanError(f"{flag} must be a positive number of milliseconds, got {value}")

    @property
    def bounded(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def miss(self, served: Served) -> str:
        """Which limit the served figures miss, as a reason line; "" when they meet them all."""
        missed = [f"{name} {value:.1f} ms > {option} {limit:g}"
                  for name, value, option, limit in (("TTFT", served.ttft_ms, "--max-ttft-ms", self.ttft_ms),
                                                     ("TPOT", served.tpot_ms, "--max-tpot-ms", self.tpot_ms))
                  if limit is not None and value > limit]
        return f"misses the latency limits at {served.concurrency} in flight: {'; '.join(missed)}" if missed else ""


def _served(costs: CostModel, layout: Layout, replicas: list[list[Ring]], ep_groups: list[list[Ring]] | None,
            concurrency: int, serving: ServedModel, limits: Limits) -> LayoutCost:
    """The layout priced (its static figures) and served at `concurrency` requests in flight per replica."""
    cost = costs.price(layout, replicas, ep_groups, concurrency)
    cost.served = serving.serve(cost.steps, concurrency, layout.dp)
    cost.slo_miss = limits.miss(cost.served.replica)
    return cost


def best_concurrency(costs: CostModel, layout: Layout, replicas: list[list[Ring]], limits: Limits,
                     serving: ServedModel, ep_groups: list[list[Ring]] | None = None) -> LayoutCost:
    """The layout served at the most requests in flight per replica that fit (its KV cache, the engine's
    max_seqs) and meet `limits` (binary search: served TTFT and TPOT only grow with the concurrency, and so
    does delivered throughput, so the largest such concurrency is the best). A layout that does not fit, or
    misses a limit even at 1, is served at 1 and says why. `ep_groups`: the EP groups' rings, for an
    expert-parallel layout (CostModel.price)."""
    first = _served(costs, layout, replicas, ep_groups, 1, serving, limits)
    top = serving.max_concurrency(first.max_batch)
    if not first.fits or first.slo_miss or top <= 1:
        return first
    steps = first.steps  # a step's time depends on the rings, not on the batch priced: search on the steps

    best = largest_concurrency(lambda c: not limits.miss(serving.replica(steps, c)), top)  # 1 meets them: >= 1
    cost = _served(costs, layout, replicas, ep_groups, best, serving, limits)
    bound = ("the largest that fits" if best == first.max_batch else "the engine's max_seqs" if best == top
             else "the largest within the latency limits")
    cost.notes.append(f"{best} requests in flight per replica: {bound} (memory allows {first.max_batch})")
    return cost


@dataclass
class RankedLayout:
    cost: LayoutCost
    order: tuple[str, ...]  # the per-node GPU order (every node the same)
    nodes: int = 1  # nodes it runs on (fewer than the plan's when that wins; the rest are left free)
    tp_network: bool = False  # a TP group spans nodes over the network: every layer's all-reduces cross it
    dominated_by: Layout | None = None  # a layout with more replicas that is no worse: this one is hidden


@dataclass
class Plan:
    model: ModelSpec
    device: DeviceSpec
    topology: Topology
    nodes: int
    workload: Workload
    objective: str
    calibration: Calibration
    layouts: list[RankedLayout]  # best first, the ones worth choosing (`launch --rank N` counts these)
    hidden: list[RankedLayout] = field(default_factory=list)  # dominated layouts, best first
    warnings: tuple[str, ...] = ()  # inputs that may mislead the plan (printed on stderr, kept in the JSON)
    engine: Engine = field(default_factory=default_engine)  # what the layouts are priced for
    limits: Limits = field(default_factory=Limits)  # the latency limits every layout was checked against
    batch_searched: bool = False  # each layout priced at its best batch (the throughput objective), not workload.batch
    serving: ServedModel | None = None  # how the layouts were served (None: the CPU planner's static figures)
    # which estimator priced the kernels: "builtin", or what `plan --estimator aiconfigurator` used (its
    # AicKernels.describe(); the layouts then carry the built-in figures beside it, LayoutCost.estimates)
    estimator: str | dict[str, str] = "builtin"


def rank_key(objective: str, entry: RankedLayout) -> tuple:
    """Sort key, best first: layouts that fit, then those meeting the latency limits, then TP groups off the
    network (vLLM's and Megatron-LM's rule: TP within a node, PP across nodes; an all-reduce over the network on
    every layer is slower and noisier than the ring model prices), then the objective, then throughput, then
    fewer stages."""
    cost = entry.cost
    delivered = _delivered(cost)
    score = _request_ms(cost) if objective == "latency" else -delivered
    return (not cost.fits, bool(cost.slo_miss), entry.tp_network, round(score, 9), -round(delivered, 9),
            cost.layout.pp, cost.layout.tp, entry.nodes)


def _no_worse(better_entry: RankedLayout, other_entry: RankedLayout) -> bool:
    better, other = better_entry.cost, other_entry.cost
    return (better.fits >= other.fits and bool(better.slo_miss) <= bool(other.slo_miss)
            and better_entry.tp_network <= other_entry.tp_network
            and _request_ms(better) <= _request_ms(other) * (1 + 1e-9)
            and _delivered(better) >= _delivered(other) * (1 - 1e-9))


def _request_ms(cost: LayoutCost) -> float:
    """The served request latency; the static one for a layout priced without the served model (the CPU
    planner's)."""
    return cost.served.replica.request_ms if cost.served else cost.request_ms


def _delivered(cost: LayoutCost) -> float:
    """Delivered output tokens/s of all replicas; the decode-phase rate without the served model."""
    return cost.served.output_tokens_per_s if cost.served else cost.tokens_per_s


def mark_dominated(ranked: list[RankedLayout]) -> None:
    """Mark each layout that a layout with the same tp and pp but more DP replicas matches or beats on fit,
    served request latency and delivered tokens/s: the larger one serves more requests at no cost, so the
    smaller one is only a subset of the machine left idle."""
    for entry in ranked:
        own = entry.cost.layout
        entry.dominated_by = next((other.cost.layout for other in ranked
                                   if (other.cost.layout.tp, other.cost.layout.pp, other.cost.layout.ep > 1)
                                   == (own.tp, own.pp, own.ep > 1)
                                   and other.cost.layout.dp > own.dp and _no_worse(other, entry)), None)


def check_objective(objective: str) -> None:
    """`--objective` names one the planner ranks by (plan, and launch --rank)."""
    if objective not in OBJECTIVES:
        raise TopoplanError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")


def check_search(*, nodes: int, objective: str, max_tp: int | None, tp: int | None, pp: int | None,
                 dp: int | None, ep: int | None = None) -> None:
    """The checks of what the planner searches: nodes, objective, and each given degree (None: free) >= 1."""
    check_nodes(nodes)
    check_objective(objective)
    for name, value in (("max-tp", max_tp), ("tp", tp), ("pp", pp), ("dp", dp), ("ep", ep)):
        if value is not None and value < 1:
            raise TopoplanError(f"--{name} must be >= 1, got {value}")


def plan(topology: Topology, model: ModelSpec, device: DeviceSpec, workload: Workload, *,
         calibration: Calibration | None = None, nodes: int = 1, objective: str = "latency",
         max_tp: int | None = None, tp: int | None = None, pp: int | None = None, dp: int | None = None,
         ep: int | None = None, engine: Engine | None = None, limits: Limits | None = None,
         search_batch: bool | None = None, kernels: AicKernels | None = None) -> Plan:
    """Every candidate layout placed on the topology and priced for `engine` (None: the default engine), ranked
    best first. `calibration` None: the engine's constants; given, it replaces them (its memory reserve and
    all), while the engine still sets the memory policy, the all-reduce path and the layout rules.

    `search_batch` (default: on for the throughput objective) prices each layout at its best batch
    (best_concurrency) instead of `workload.batch`. `kernels` (topoplan.plan.aic_estimator.load): price each stage's
    compute from aiconfigurator's kernel times and serve each layout with topoplan's built-in model too, at the
    same concurrency, for comparison (LayoutCost.estimates); an MoE model is then planned without expert
    parallelism, which that estimator does not price."""
    check_search(nodes=nodes, objective=objective, max_tp=max_tp, tp=tp, pp=pp, dp=dp, ep=ep)
    tp_experts = kernels is not None and model.is_moe and ep is None
    if kernels is not None and model.is_moe:
        if ep not in (None, 1):
            raise TopoplanError(f"--estimator aiconfigurator prices MoE experts TP-sharded only: --ep {ep} needs "
                                "the built-in estimator")
        ep = 1
    context = workload.prompt_len + workload.gen_len
    check_context(model.max_context, context, f"--prompt-len {workload.prompt_len} + --gen-len {workload.gen_len} "
                  f"= {context} tokens", model.name)
    engine = engine or default_engine()
    calibration = calibration or engine_calibration(engine)
    placer = NodePlacer(topology)
    pricer = LinkPricer(topology, calibration, device.nic_gbps, device.nvlink_domain_gpus, engine.allreduce)
    policy = memory_policy(engine, calibration)
    builtin = CostModel(model, device, workload, calibration, pricer, policy)
    costs = builtin if kernels is None else KernelCostModel(model, device, workload, calibration, pricer, policy,
                                                            kernels=kernels)
    limits = limits or Limits()
    search = objective == "throughput" if search_batch is None else search_batch
    k = len(topology.gpus)
    scheduler = engine.scheduler
    serving = ServedModel(scheduler, scheduler.budget(device.name, device.memory_bytes), workload.prompt_len,
                          workload.gen_len, k * nodes)
    total = device.memory_bytes  # the most weights one GPU may hold under the engine's policy, at any TP degree
    node_memory = k * max(policy.usable_bytes(total, total, t) for t in range(1, k + 1))
    min_nodes = -(-model.weight_bytes(workload.dtype) // node_memory)
    fewer = fewer_node_layouts(model, k, nodes, int(min_nodes), max_tp=max_tp, tp=tp, pp=pp, dp=dp, ep=ep,
                               rules=engine.parallelism)
    try:
        every = enumerate_layouts(model, k, nodes, max_tp=max_tp, tp=tp, pp=pp, dp=dp, ep=ep,
                                  rules=engine.parallelism, engine=str(engine))
    except TopoplanError:
        if not fewer:  # e.g. --tp 8 --pp 2 on 3 nodes: none over all 3, but one on 2 of them
            raise
        every = []
    candidates = [(layout, nodes) for layout in every] + fewer
    ranked = []
    for layout, used in candidates:
        order = placer.local_order(layout, used)
        replicas = replica_rings(layout, order)
        groups = ep_rings(layout, order) if layout.ep > 1 else None
        if search:
            cost = best_concurrency(costs, layout, replicas, limits, serving, groups)
        else:
            cost = _served(costs, layout, replicas, groups, workload.batch, serving, limits)
        if kernels is not None:
            twin = builtin.price(layout, replicas, groups, cost.batch)
            cost.estimates = {"aiconfigurator": cost.served,
                              "builtin": serving.serve(twin.steps, cost.batch, layout.dp)}
            cost.notes.append(f"kernels: {kernels.label}")
        most = serving.max_concurrency(cost.max_batch)
        cost.offline = serving.serve(cost.steps, most, layout.dp) if cost.fits and most >= 1 else None
        if used < nodes:
            cost.notes.append(f"runs on {used} of the {nodes} nodes ({nodes - used} left free)")
        network = any(hop.link_class == "net" for stage in replicas for ring in stage for hop in pricer.ring_hops(ring))
        ranked.append(RankedLayout(cost, order, used, network))
    ranked.sort(key=lambda r: rank_key(objective, r))
    explain_advice(ranked, diagnose(topology), objective)
    mark_dominated(ranked)
    shown = [r for r in ranked if r.dominated_by is None]
    return Plan(model, device, topology, nodes, workload, objective, calibration, shown,
                [r for r in ranked if r.dominated_by is not None], engine=engine, limits=limits,
                batch_searched=search, serving=serving,
                warnings=(*(("--estimator aiconfigurator prices MoE experts TP-sharded: no expert-parallel layouts "
                             "(the built-in estimator prices both)",) if tp_experts else ()),
                          *unbounded_warning(shown, search, limits)),
                estimator=kernels.describe() if kernels else "builtin")


def explain_advice(ranked: list[RankedLayout], warnings: list[Warning], objective: str) -> None:
    """Give each layout whose TP size an `inspect` warning advises against (nvlink-split: keep TP <= 2) a reason
    (after its TP finding; the table shows both) saying so and how it compares with the best-ranked layout
    that follows the advice (`ranked` is best first). Nothing is said when no layout within the advice was
    priced (--tp fixed it): the user chose."""
    for warning in (w for w in warnings if w.max_tp is not None):
        cap = warning.max_tp
        within = next((r for r in ranked if r.cost.layout.tp <= cap), None)
        for entry in ranked if within else ():
            cost = entry.cost
            if cost.layout.tp <= cap or cost.advice:
                continue
            advised = f"TP{cost.layout.tp} against inspect's {warning.code} advice (TP <= {cap})"
            if not within.cost.fits or within.cost.slo_miss:
                miss = "fits" if not within.cost.fits else "meets the latency limits"
                cost.advice = f"{advised}: none with TP <= {cap} {miss} (best: {within.cost.layout})"
            else:
                cost.advice = (f"{advised}: {_compare(cost, within.cost, objective)} for {within.cost.layout}, "
                               f"the best within it")


def _compare(cost: LayoutCost, other: LayoutCost, objective: str) -> str:
    """This layout's objective figure against another's, as a phrase."""
    if objective == "latency":
        return f"request latency {_request_ms(cost):.0f} ms here vs {_request_ms(other):.0f} ms"
    return f"delivers {_delivered(cost):.0f} tokens/s here vs {_delivered(other):.0f}"


def unbounded_warning(shown: list[RankedLayout], searched: bool, limits: Limits) -> tuple[str, ...]:
    """A concurrency searched with no latency limit grows until memory or the engine stops it: say so, with
    the TTFT that buys, and how to bound it."""
    if not searched or limits.bounded or not shown or shown[0].cost.served is None:
        return ()
    best = shown[0].cost.served.replica
    return (f"no --max-ttft-ms or --max-tpot-ms: each layout serves as many requests at once as memory and the "
            f"engine allow (#1: {best.concurrency} in flight per replica, TTFT {best.ttft_ms / 1e3:.1f} s, TPOT "
            f"{best.tpot_ms:.0f} ms); set a limit to bound the batch",)


def nothing_fits(result: Plan) -> TopoplanError | None:
    """The error for a plan none of whose layouts fits in memory, naming the closest one; None when one fits.

    The command still prints the table (or JSON) first, to show how far off each layout is, then exits 2.
    """
    every = result.layouts + result.hidden
    if not every or any(entry.cost.fits for entry in every):
        return None
    closest = min(every, key=lambda entry: entry.cost.memory_per_gpu).cost
    return TopoplanError(f"no layout of {result.model.name} fits in GPU memory on {result.nodes} node(s) x "
                         f"{len(result.topology.gpus)} GPUs; closest: {closest.layout} {closest.reasons[0]}")


def layout_json(entry: RankedLayout, per_rank: bool = False) -> dict[str, Any]:
    """One layout. `placement` lists every rank with `per_rank`; otherwise node 0's ranks only: every node
    runs the same shape (node n holds ranks n*k .. n*k+k-1 on the same GPUs in the same order), and at 1024
    nodes the rank list is megabytes per layout."""
    c, layout = entry.cost, entry.cost.layout
    k = len(entry.order)
    placements = expand(layout, entry.nodes, entry.order, None if per_rank else k)
    return {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "gpus": c.gpus, "nodes": entry.nodes,
        "ranks_per_node": k, "fits": c.fits, "batch": c.batch,
        "memory_per_gpu_gib": round(c.memory_per_gpu / 2**30, 3), "max_batch": c.max_batch,
        **({"slo_miss": c.slo_miss} if c.slo_miss else {}),
        "prefill_ms": round(c.prefill_ms, 3), "decode_ms_per_token": round(c.decode_ms_per_token, 4),
        "request_ms": round(c.request_ms, 2), "tokens_per_s": round(c.tokens_per_s, 2),
        **({"served": served_json(c.served)} if c.served else {}),
        **({"offline": served_json(c.offline)} if c.offline else {}),
        **({"estimates": {name: served_json(s) for name, s in c.estimates.items()}} if c.estimates else {}),
        "tokens_per_s_per_gpu": round(c.tokens_per_s_per_gpu, 2), "all_to_all_ms": round(c.all_to_all_ms, 4),
        "stages": layer_split_json(c.stage_layers),
        "placement_scope": "every rank" if per_rank or entry.nodes == 1 else "node 0 (every node the same shape)",
        "placement": [{"rank": p.rank, "node": p.node, "gpu": p.gpu, "tp_rank": p.tp_rank, "pp_rank": p.pp_rank,
                       "dp_rank": p.dp_rank} for p in placements],
        "cuda_visible_devices": cuda_visible_devices(placements, 0),
        **({"ep_groups": RankGrid(layout).ep_groups} if layout.ep > 1 else {}),
        "reasons": c.reasons,
        **({"dominated_by": str(entry.dominated_by)} if entry.dominated_by else {}),
    }


def served_json(served: ServedCost) -> dict[str, Any]:
    """A layout's served figures (topoplan.plan.served): per replica, then delivered over its replicas."""
    r = served.replica
    return {"concurrency_per_replica": r.concurrency, "ttft_ms": round(r.ttft_ms, 3), "tpot_ms": round(r.tpot_ms, 4),
            "request_latency_ms": round(r.request_ms, 2),
            "output_tokens_per_s_per_replica": round(r.output_tokens_per_s, 2),
            "output_tokens_per_s": round(served.output_tokens_per_s, 2),
            "output_tokens_per_s_per_gpu": round(served.output_tokens_per_s_per_gpu, 2),
            "requests_per_s": round(served.requests_per_s, 4), "token_budget_bound": r.budget_bound}


def serving_json(serving: ServedModel) -> dict[str, Any]:
    """How the engine's scheduler batches (topoplan.engines.scheduling) on this GPU, and the empirical TTFT factor
    its served TTFT carries, if any (fitted, not a mechanism: said so in the JSON, not only in the docs)."""
    b, factor = serving.budget, serving.scheduler.ttft_factor
    empirical = {"divisor": factor.divisor, "saturates_at": factor.saturates_at} if factor else None
    return {"scheduler": serving.scheduler.mode, "max_batched_tokens": b.max_batched_tokens, "max_seqs": b.max_seqs,
            "machine_gpus": serving.machine_gpus, "empirical_ttft_factor": empirical}


def plan_json(result: Plan, top: int | None = None, per_rank: bool = False) -> dict[str, Any]:
    """The `--json` contract: model, topology, layouts ranked best first (top N); `per_rank` lists every
    rank's placement rather than one node's."""
    m, t = result.model, result.topology
    layouts = result.layouts[:top] if top else result.layouts
    return {
        "model": {"name": m.name, "params": m.params, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                  "kv_heads": m.kv_heads, "dtype": result.workload.dtype,
                  "weight_gb": round(m.weight_bytes(result.workload.dtype) / 1e9, 3),
                  "kv_dtype": result.workload.kv.short,
                  "kv_bytes_per_token": m.kv_bytes_per_token(result.workload.kv.short)},
        "topology": {"source": t.source, "gpus": [g.id for g in t.gpus], "nodes": result.nodes,
                     "gpu": result.device.name, "memory_mib": round(result.device.memory_bytes / 2**20),
                     "nic_gbps": result.device.nic_gbps, "notes": list(t.notes)},
        "workload": asdict(result.workload),
        "objective": result.objective,
        "limits": {"max_ttft_ms": result.limits.ttft_ms, "max_tpot_ms": result.limits.tpot_ms},
        "engine": str(result.engine),
        **({"serving": serving_json(result.serving)} if result.serving else {}),
        "calibration": result.calibration.source,
        "estimator": result.estimator,
        "warnings": list(result.warnings),
        "layouts": [layout_json(entry, per_rank) for entry in layouts],
        "hidden": [layout_json(entry, per_rank) for entry in (result.hidden[:top] if top else result.hidden)],
    }
