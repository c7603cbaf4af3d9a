"""`plan`: enumerate layouts, place and price each, rank them by the objective; the JSON contract.

Layouts that fit come first; among them latency ranks by one request's end-to-end time (TTFT plus every
output token), throughput by decode tokens/s per GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from topoplan.engines import DEFAULT_ENGINE, resolve
from topoplan.engines.profile import EngineProfile
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, check_nodes, layer_split_json
from topoplan.models import ModelSpec, check_context
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.cost import CostModel, LayoutCost, Workload, replica_rings
from topoplan.plan.device import DeviceSpec
from topoplan.plan.engine import engine_calibration, memory_policy
from topoplan.plan.layouts import enumerate_layouts
from topoplan.plan.placement import NodePlacer, cuda_visible_devices, expand
from topoplan.topology.model import Topology

OBJECTIVES = ("latency", "throughput")


@dataclass
class RankedLayout:
    cost: LayoutCost
    order: tuple[str, ...]  # the per-node GPU order (every node the same)
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
    engine: EngineProfile = field(default_factory=lambda: resolve(DEFAULT_ENGINE))  # what the layouts are priced for


def rank_key(objective: str, cost: LayoutCost) -> tuple:
    """Sort key, best first: layouts that fit, then the objective, then throughput, then fewer stages."""
    score = cost.request_ms if objective == "latency" else -cost.tokens_per_s_per_gpu
    return (not cost.fits, round(score, 9), -cost.tokens_per_s, cost.layout.pp, cost.layout.tp)


def _no_worse(better: LayoutCost, other: LayoutCost) -> bool:
    return (better.fits >= other.fits and better.request_ms <= other.request_ms * (1 + 1e-9)
            and better.tokens_per_s_per_gpu >= other.tokens_per_s_per_gpu * (1 - 1e-9))


def mark_dominated(ranked: list[RankedLayout]) -> None:
    """Mark each layout that a layout with the same tp and pp but more DP replicas matches or beats on fit,
    request time and tokens/s per GPU: the larger one serves more requests at no cost, so the smaller one is
    only a subset of the machine left idle."""
    for entry in ranked:
        own = entry.cost.layout
        entry.dominated_by = next((other.cost.layout for other in ranked
                                   if (other.cost.layout.tp, other.cost.layout.pp) == (own.tp, own.pp)
                                   and other.cost.layout.dp > own.dp and _no_worse(other.cost, entry.cost)), None)


def check_objective(objective: str) -> None:
    """`--objective` names one the planner ranks by (plan, and launch --rank)."""
    if objective not in OBJECTIVES:
        raise TopoplanError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")


def check_search(*, nodes: int, objective: str, max_tp: int | None, tp: int | None, pp: int | None,
                 dp: int | None) -> None:
    """The checks of what the planner searches: nodes, objective, and each given degree (None: free) >= 1."""
    check_nodes(nodes)
    check_objective(objective)
    for name, value in (("max-tp", max_tp), ("tp", tp), ("pp", pp), ("dp", dp)):
        if value is not None and value < 1:
            raise TopoplanError(f"--{name} must be >= 1, got {value}")


def plan(topology: Topology, model: ModelSpec, device: DeviceSpec, workload: Workload, *,
         calibration: Calibration | None = None, nodes: int = 1, objective: str = "latency",
         max_tp: int | None = None, tp: int | None = None, pp: int | None = None, dp: int | None = None,
         engine: EngineProfile | None = None) -> Plan:
    """Every candidate layout placed on the topology and priced for `engine` (None: the default engine), ranked
    best first. `calibration` None: the engine's constants; given, it replaces them (its memory reserve and
    all), while the engine still sets the memory policy, the all-reduce path and the layout rules."""
    check_search(nodes=nodes, objective=objective, max_tp=max_tp, tp=tp, pp=pp, dp=dp)
    context = workload.prompt_len + workload.gen_len
    check_context(model.max_context, context, f"--prompt-len {workload.prompt_len} + --gen-len {workload.gen_len} "
                  f"= {context} tokens", model.name)
    engine = engine or resolve(DEFAULT_ENGINE)
    calibration = calibration or engine_calibration(engine)
    placer = NodePlacer(topology)
    pricer = LinkPricer(topology, calibration, device.nic_gbps, device.nvlink_domain_gpus, engine.allreduce)
    costs = CostModel(model, device, workload, calibration, pricer, memory_policy(engine, calibration))
    ranked = []
    for layout in enumerate_layouts(model, len(topology.gpus), nodes, max_tp=max_tp, tp=tp, pp=pp, dp=dp,
                                    rules=engine.parallelism, engine=str(engine)):
        order = placer.local_order(layout, nodes)
        ranked.append(RankedLayout(costs.price(layout, replica_rings(layout, order)), order))
    ranked.sort(key=lambda r: rank_key(objective, r.cost))
    mark_dominated(ranked)
    return Plan(model, device, topology, nodes, workload, objective, calibration,
                [r for r in ranked if r.dominated_by is None], [r for r in ranked if r.dominated_by is not None],
                engine=engine)


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


def layout_json(entry: RankedLayout, nodes: int) -> dict[str, Any]:
    c, layout = entry.cost, entry.cost.layout
    placements = expand(layout, nodes, entry.order)
    return {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "gpus": c.gpus, "fits": c.fits,
        "memory_per_gpu_gb": round(c.memory_per_gpu / 1e9, 3), "max_batch": c.max_batch,
        "prefill_ms": round(c.prefill_ms, 3), "decode_ms_per_token": round(c.decode_ms_per_token, 4),
        "request_ms": round(c.request_ms, 2), "tokens_per_s": round(c.tokens_per_s, 2),
        "tokens_per_s_per_gpu": round(c.tokens_per_s_per_gpu, 2),
        "stages": layer_split_json(c.stage_layers),
        "placement": [{"rank": p.rank, "node": p.node, "gpu": p.gpu, "tp_rank": p.tp_rank, "pp_rank": p.pp_rank,
                       "dp_rank": p.dp_rank} for p in placements],
        "cuda_visible_devices": cuda_visible_devices(placements, 0),
        "reasons": c.reasons,
        **({"dominated_by": str(entry.dominated_by)} if entry.dominated_by else {}),
    }


def plan_json(result: Plan, top: int | None = None) -> dict[str, Any]:
    """The `--json` contract: model, topology, layouts ranked best first (top N)."""
    m, t = result.model, result.topology
    layouts = result.layouts[:top] if top else result.layouts
    return {
        "model": {"name": m.name, "params": m.params, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                  "kv_heads": m.kv_heads, "dtype": result.workload.dtype,
                  "weight_gb": round(m.weight_bytes(result.workload.dtype) / 1e9, 3),
                  "kv_bytes_per_token": m.kv_bytes_per_token(result.workload.dtype)},
        "topology": {"source": t.source, "gpus": [g.id for g in t.gpus], "nodes": result.nodes,
                     "gpu": result.device.name, "memory_gb": result.device.memory_bytes / 1e9,
                     "nic_gbps": result.device.nic_gbps, "notes": list(t.notes)},
        "workload": asdict(result.workload),
        "objective": result.objective,
        "engine": str(result.engine),
        "calibration": result.calibration.source,
        "warnings": list(result.warnings),
        "layouts": [layout_json(entry, result.nodes) for entry in layouts],
        "hidden": [layout_json(entry, result.nodes) for entry in (result.hidden[:top] if top else result.hidden)],
    }
