"""`plan --disagg`: prefill and decode on separate workers, how many of each, where, and whether it pays.

Each role's worker layouts (tp x pp, ep for MoE; dp 1, more workers being more DP, except an MoE worker's
attention DP: dp replicas with the experts over all tp x dp GPUs, ep = tp x dp) are priced once with the served
model's step times (topoplan.plan.cost): a prefill worker runs prefill-only steps (served.separate with one
generated token: TTFT with the queueing of its concurrency), a decode worker decode-only steps (TPOT). A pair of
layouts gets its KV transfer priced (topoplan.plan.kv_transfer), each role its concurrency (the most in flight
within --max-ttft-ms, TTFT = prefill + exposed transfer, and --max-tpot-ms), and the P:D that serves the most
requests on the GPUs (or `--pd P:D`). The best few are placed for real (topoplan.plan.disagg_placement), their
transfer re-priced between the actual workers (the slowest pair: a router sends any prefill to any decode),
and the best placed one is chosen. It is compared with the normal plan's best aggregated layout on the same GPUs.
docs/planner.md, "Disaggregated prefill/decode", has every formula and the search bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from topoplan.engines.engine import VIA_NIC
from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.plan import aic_estimator
from topoplan.plan.aic_estimator import KernelCostModel
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.cost import CostModel, ReplicaSteps, replica_rings
from topoplan.plan.disagg_placement import RolePlan, WorkerPlacer, route_warnings
from topoplan.plan.disagg_types import DisaggPlan, DisaggServed, KvTransfer, Worker
from topoplan.plan.engine_costs import memory_policy
from topoplan.plan.frontend import PlanRequest, plan_for
from topoplan.plan.kv_transfer import CONNECTORS, price_transfer
from topoplan.plan.layouts import enumerate_layouts
from topoplan.plan.moe import ep_rings
from topoplan.plan.placement import NodePlacer
from topoplan.plan.rank import Plan
from topoplan.plan.served import ServedModel, largest_concurrency, separate

# Every engine's default KV connector sends the whole cache once the prefill ends: SGLang's Mooncake and NIXL
# backends write a request's KV pages to the decode worker after its prefill (chunk) completes
# (python/sglang/srt/disaggregation/prefill.py), vLLM's NixlConnector has the decode worker read the blocks after
# the prefill finished (request_finished -> kv_transfer_params), TensorRT-LLM's cache transceiver sends after the
# context phase. Layer-by-layer sending (vLLM's P2pNcclConnector save_kv_layer, Mooncake's layer-wise mode,
# LMCache's use_layerwise) is the "per-layer" connector.
DEFAULT_CONNECTOR = "whole"
PLACED = 8  # candidates placed for real after the first ranking: the rest cannot overtake them by placement alone


@dataclass(frozen=True)
class RoleOption:
    """One worker layout of one role, priced: its step times and how many requests it holds in flight."""

    layout: Layout
    nodes: int  # nodes one worker spans (1 unless its layout needs more GPUs than a node)
    steps: ReplicaSteps
    max_concurrency: int  # its KV cache's sequences, capped by the engine's max_seqs
    where: tuple[str, ...]  # the GPUs (rank order, per node) it was priced on

    @property
    def gpus(self) -> int:
        return self.layout.world


@dataclass(frozen=True)
class Candidate:
    """A deployment the search priced: P prefill and D decode workers of these layouts."""

    prefill: RoleOption
    decode: RoleOption
    ratio: tuple[int, int]
    transfer: KvTransfer
    served: DisaggServed
    slo_miss: str  # which latency limit even one request in flight misses; "": none

    def key(self) -> tuple:
        """Best first: meets the limits, then delivered tokens/s per GPU, then TTFT, then TPOT (two deployments
        that deliver the same at the same TTFT: the one whose users see tokens sooner), then fewer GPUs."""
        p, d = self.ratio
        return (bool(self.slo_miss), -round(self.served.output_tokens_per_s_per_gpu, 6),
                round(self.served.ttft_ms, 6), round(self.served.tpot_ms, 6),
                p * self.prefill.gpus + d * self.decode.gpus)


@dataclass(frozen=True)
class Aggregated:
    """The normal plan's best layout on the same GPUs, as served (the throughput objective, same limits)."""

    layout: Layout
    nodes: int
    ttft_ms: float
    tpot_ms: float
    concurrency: int
    output_tokens_per_s_per_gpu: float
    slo_miss: str


@dataclass(frozen=True)
class DisaggResult:
    """What `plan --disagg` found: the chosen deployment, the candidates it beat, and the aggregated one."""

    deployments: tuple[DisaggPlan, ...]  # each placed candidate's deployment, in `candidates`' order
    candidates: tuple[Candidate, ...]  # the placed candidates, best first (the chosen one first)
    searched: int  # (prefill layout, decode layout, P:D) combinations weighed
    aggregated: Aggregated | None  # None: no aggregated layout fits
    verdict: str  # one line: whether disaggregation pays against `aggregated`
    pays: bool
    plan: Plan  # the normal plan (model, device, topology, workload, engine, limits it was made for)
    connector: str
    slo_miss: str = ""  # the chosen deployment misses a latency limit even at one request in flight

    @property
    def chosen(self) -> DisaggPlan:
        return self.deployments[0]

    def deployment(self, rank: int) -> DisaggPlan:
        """The `rank`-th placed candidate's deployment (1 = the chosen one): `plan --disagg --json`'s
        `candidates[rank - 1]`, which `launch --disagg --rank N` launches."""
        if not 1 <= rank <= len(self.deployments):
            raise TopoplanError(f"--rank {rank}: plan --disagg placed {len(self.deployments)} deployment(s) (its "
                                "JSON `candidates`), numbered from 1")
        return self.deployments[rank - 1]


@dataclass
class _Search:
    """What pricing a candidate needs: the plan's inputs, and caches shared by the candidates."""

    plan: Plan
    serving: ServedModel
    pricer: LinkPricer
    costs: CostModel
    connector: str
    gpus: int  # every GPU of the deployment: machine GPUs x nodes (idle ones count)

    steps: dict[Layout, ReplicaSteps] = field(default_factory=dict)  # each worker layout's, once priced

    def __post_init__(self) -> None:
        self.transfers: dict[tuple, KvTransfer] = {}
        self.figures: dict[tuple, tuple[float, float]] = {}  # (role, layout, in flight) -> (latency ms, requests/s)
        self.placer = WorkerPlacer(self.plan.topology, self.plan.nodes)

    @property
    def gen(self) -> int:
        return self.plan.workload.gen_len

    def prefill_served(self, option: RoleOption, c: int) -> tuple[float, float]:
        """(TTFT ms, requests/s) of one prefill worker at `c` prompts in flight per replica: prefill-only steps, the
        engine's token budget per step, a request leaving once its first token is out; a worker with attention DP
        runs layout.dp such replicas."""
        key = ("prefill", option.layout, option.where, c)
        if key not in self.figures:
            served = separate(option.steps, self.serving.budget, self.plan.workload.prompt_len, 1, c)
            self.figures[key] = (served.ttft_ms, served.requests_per_s * option.layout.dp)
        return self.figures[key]

    def decode_served(self, option: RoleOption, c: int) -> tuple[float, float]:
        """(TPOT ms, requests/s) of one decode worker at `c` sequences in flight per replica: decode-only steps,
        each request staying gen - 1 steps (its first token came from the prefill); layout.dp replicas."""
        key = ("decode", option.layout, option.where, c)
        if key not in self.figures:
            tpot = option.steps.step_ms(c)
            self.figures[key] = (tpot, c * option.layout.dp / (max(self.gen - 1, 1) * tpot) * 1e3)
        return self.figures[key]

    def priced(self, layout: Layout, order: tuple[str, ...], span: int) -> RoleOption | None:
        """A worker of `layout` on the GPUs `order` (on each of `span` nodes), priced; None when it does not fit."""
        groups = ep_rings(layout, order) if layout.ep > 1 else None
        cost = self.costs.price(layout, replica_rings(layout, order), groups, 1)
        top = self.serving.max_concurrency(cost.max_batch)
        return RoleOption(layout, span, cost.steps, top, order) if cost.fits and top >= 1 else None  # type: ignore

    def transfer(self, src: Worker, dst: Worker) -> KvTransfer:
        key = (src.layout, dst.layout, src.node == dst.node, src.gpus, dst.gpus)
        if key not in self.transfers:
            w = self.plan.workload
            alone = self.steps[src.layout].prefill_ms(1)  # the prompt's own prefill: what per-layer overlaps
            self.transfers[key] = price_transfer(self.pricer, self.plan.model, w.prompt_len, w.kv.short, src, dst,
                                                 self.connector, alone,
                                                 same_node=self.plan.engine.kv_transfer.same_node)
        return self.transfers[key]


def _costs(request: PlanRequest, plan: Plan, pricer: LinkPricer) -> CostModel:
    """The workers' cost model: the aggregated plan's, so that `--estimator aiconfigurator` prices the workers'
    kernels as it priced the layouts they are compared with (its data loads once per process)."""
    args = (plan.model, plan.device, plan.workload, plan.calibration, pricer,
            memory_policy(plan.engine, plan.calibration))
    if request.estimator != "aiconfigurator":
        return CostModel(*args)
    kernels = aic_estimator.load(plan.model, plan.device.name, plan.engine, plan.workload.dtype,
                                 plan.workload.kv.short)
    return KernelCostModel(*args, kernels=kernels)


def _options(search: _Search, request: PlanRequest) -> list[RoleOption]:
    """Every worker layout that fits in memory, priced once: those within a node, or, when none fits there,
    those on the fewest whole nodes that hold one (a worker never spans nodes unless it must). Each is priced on
    the GPUs the normal placement gives that layout alone (the best ones)."""
    plan, engine = search.plan, search.plan.engine
    k, placer = len(plan.topology.gpus), NodePlacer(plan.topology)
    for span in range(1, plan.nodes + 1):
        try:
            layouts = enumerate_layouts(plan.model, k, span, max_tp=request.max_tp, tp=request.tp, pp=request.pp,
                                        dp=1, ep=1 if isinstance(search.costs, KernelCostModel) else request.ep,
                                        rules=engine.parallelism, engine=str(engine))
        except TopoplanError:
            continue
        layouts += _attention_dp(search, request, k, span)
        found = [option for layout in layouts if span == 1 or layout.world == span * k
                 if (option := search.priced(layout, placer.local_order(layout, span), span)) is not None]
        if found:
            return found
    raise TopoplanError(f"no worker layout of {plan.model.name} fits in GPU memory on up to {plan.nodes} node(s) x "
                        f"{k} {plan.device.name} GPUs (pass more --nodes, a smaller --dtype or --kv-dtype)")


def _attention_dp(search: _Search, request: PlanRequest, k: int, span: int) -> list[Layout]:
    """An MoE model's workers with attention DP inside them (dp > 1 replicas of tp each, the experts over all
    tp x dp GPUs of a stage: SGLang --enable-dp-attention, vLLM --data-parallel-size with expert parallel, TensorRT-LLM
    enable_attention_dp): one server, so one worker, where the engine runs that layout (Parallelism.runs). Other
    dp > 1 layouts are more workers, which the P:D already counts. --dp fixes the degree, --ep 1 rules them out, and
    so does the aiconfigurator estimator, which prices MoE layers TP-sharded only."""
    plan = search.plan
    if not plan.model.is_moe or request.dp == 1 or request.ep == 1 or isinstance(search.costs, KernelCostModel):
        return []
    try:
        layouts = enumerate_layouts(plan.model, k, span, max_tp=request.max_tp, tp=request.tp, pp=request.pp,
                                    dp=request.dp, ep=request.ep, rules=plan.engine.parallelism,
                                    engine=str(plan.engine))
    except TopoplanError:
        return []
    return [layout for layout in layouts if layout.dp > 1 and layout.ep == layout.tp * layout.dp]


def _fixed(search: _Search, role: str, layout: Layout, source: str) -> RoleOption:
    """The one worker layout a role was given (an aiconfigurator result), checked against this machine and engine
    as the search's own are, and priced."""
    plan, engine = search.plan, search.plan.engine
    k = len(plan.topology.gpus)
    span = -(-layout.world // k)
    where = f"{role} workers' {layout} (from {source})"
    if span > plan.nodes or (span > 1 and layout.world % span):
        raise TopoplanError(f"{where} needs {layout.world} GPUs; {plan.nodes} node(s) x {k} {plan.device.name} GPUs "
                            "hold no such worker (pass --nodes)")
    try:
        enumerate_layouts(plan.model, k, span, tp=layout.tp, pp=layout.pp, dp=layout.dp, ep=layout.ep,
                          rules=engine.parallelism, engine=str(engine))
    except TopoplanError as error:
        raise TopoplanError(f"{where}: {error}") from None
    option = search.priced(layout, NodePlacer(plan.topology).local_order(layout, span), span)
    if option is None:
        raise TopoplanError(f"{where} does not fit in {plan.device.name} memory with {plan.workload.dtype} weights "
                            f"and a {plan.workload.kv.short} KV cache")
    return option


def _alone(search: _Search, role: str, layout: Layout) -> Worker:
    """One worker of `layout` placed alone (on the best GPUs of node 0 for it)."""
    return search.placer.place(RolePlan("prefill", layout, int(role == "prefill")),
                               RolePlan("decode", layout, int(role == "decode")))[0]


def _representative(search: _Search, p: RoleOption, d: RoleOption, cross: bool) -> KvTransfer:
    """The transfer between one prefill and one decode worker of these layouts, as the first ranking prices it:
    across nodes (each on its node's best GPUs) when the deployment spans nodes (a router pairs any prefill
    with any decode worker, so some pairs cross), else the two placed together on one node."""
    if cross or p.nodes > 1 or d.nodes > 1:
        src = _alone(search, "prefill", p.layout)
        return search.transfer(src, replace(_alone(search, "decode", d.layout), node=src.node + src.nodes))
    src, dst = search.placer.place(RolePlan("prefill", p.layout, 1), RolePlan("decode", d.layout, 1))
    return search.transfer(src, dst)


def _concurrencies(search: _Search, p: RoleOption, d: RoleOption, exposed: float) -> tuple[int, int, str]:
    """Each role's requests in flight per worker: prefill the most within --max-ttft-ms (TTFT = its prefill with
    queueing + the exposed transfer) up to one full token budget per step (beyond it a prefill worker only
    queues: its rate stays), decode the most within --max-tpot-ms; and which limit one request already misses."""
    limits, prompt = search.plan.limits, search.plan.workload.prompt_len
    tokens = search.serving.budget.max_batched_tokens
    full = min(p.max_concurrency, max(1, tokens // prompt)) if tokens else p.max_concurrency
    cp = largest_concurrency(
        lambda c: limits.ttft_ms is None or search.prefill_served(p, c)[0] + exposed <= limits.ttft_ms, full)
    cd = largest_concurrency(lambda c: limits.tpot_ms is None or search.decode_served(d, c)[0] <= limits.tpot_ms,
                             d.max_concurrency)
    missed = [what for what, c in (("--max-ttft-ms", cp), ("--max-tpot-ms", cd)) if not c]
    return max(cp, 1), max(cd, 1), " and ".join(missed)


def _served(search: _Search, p: RoleOption, d: RoleOption, ratio: tuple[int, int], cp: int, cd: int,
            exposed: float, steady: bool) -> DisaggServed:
    """The deployment serving R = min(P x prefill rate, D x decode rate) requests/s. `steady`: the side with room
    runs at the fewest in flight that still carries R, so its latency is what R costs it (worked out for the
    placed candidates only; the first ranking, by R, does not need it)."""
    np_, nd = ratio
    rate = min(np_ * search.prefill_served(p, cp)[1], nd * search.decode_served(d, cd)[1])
    at_p, at_d = cp, cd
    if steady:
        at_p = _fewest(lambda c: np_ * search.prefill_served(p, c)[1] >= rate * (1 - 1e-9), cp)
        at_d = _fewest(lambda c: nd * search.decode_served(d, c)[1] >= rate * (1 - 1e-9), cd)
    tokens = rate * search.gen
    return DisaggServed(search.prefill_served(p, at_p)[0] + exposed, search.decode_served(d, at_d)[0], tokens,
                        tokens / search.gpus, at_p, at_d, cp, cd)


def _fewest(ok: Callable[[int], bool], top: int) -> int:
    """The smallest c in [1, top] with ok(c) (ok only turns true as c grows); top when none smaller does."""
    low, high = 1, top
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return low


def best_split(g: int, gp: int, gd: int, rp: float, rd: float) -> tuple[tuple[int, int] | None, int]:
    """The P:D on `g` GPUs of prefill workers of `gp` GPUs serving `rp` requests/s each and decode workers of `gd`
    serving `rd` that serves the most requests (then the fewest GPUs, then fewer prefill workers), and how many
    P:D were weighed; None when not one of each fits. Weighed: each P within 2 of P* = g rd / (gp rd + gd rp)
    with the most decode workers the other GPUs hold, each D within 2 of D* = g rp / (gd rp + gp rd) with the
    most prefill workers, neither role beyond what the other keeps busy. R = min(P rp, D rd) rises to the meeting
    point and falls after it; whole workers move the best integer point by a worker or two of the larger kind,
    which the two windows cover (tests/test_disagg_plan.py checks it against every (P, D))."""
    pairs = set()
    meet_p, meet_d = g * rd / (gp * rd + gd * rp), g * rp / (gd * rp + gp * rd)
    for np_ in range(max(1, math.floor(meet_p) - 2), math.ceil(meet_p) + 3):
        pairs.add((np_, min((g - np_ * gp) // gd, max(1, math.ceil(np_ * rp / rd)))))
    for nd in range(max(1, math.floor(meet_d) - 2), math.ceil(meet_d) + 3):
        pairs.add((min((g - nd * gd) // gp, max(1, math.ceil(nd * rd / rp))), nd))
    fits = [(np_, nd) for np_, nd in pairs if np_ >= 1 and nd >= 1 and np_ * gp + nd * gd <= g]
    best = max(fits, key=lambda r: (min(r[0] * rp, r[1] * rd), -(r[0] * gp + r[1] * gd), -r[0]), default=None)
    return best, len(pairs)


def _ratios(search: _Search, p: RoleOption, d: RoleOption, pd: tuple[int, int] | None, cp: int,
            cd: int) -> tuple[list[tuple[int, int]], int]:
    """The P:D worth pricing for a pair of layouts, and how many were weighed: `pd` if it fits the GPUs, else
    best_split of the two workers' rates."""
    g = search.gpus
    if pd is not None:
        return ([pd], 1) if pd[0] * p.gpus + pd[1] * d.gpus <= g else ([], 1)
    best, weighed = best_split(g, p.gpus, d.gpus, search.prefill_served(p, cp)[1], search.decode_served(d, cd)[1])
    return ([best] if best else []), weighed


def _price(search: _Search, p: RoleOption, d: RoleOption, ratio: tuple[int, int], transfer: KvTransfer,
           steady: bool = False) -> Candidate:
    cp, cd, miss = _concurrencies(search, p, d, transfer.exposed_ms)
    return Candidate(p, d, ratio, transfer, _served(search, p, d, ratio, cp, cd, transfer.exposed_ms, steady), miss)


def _slowest(search: _Search, option: RoleOption, workers: Sequence[Worker]) -> RoleOption:
    """The role priced on its slowest worker's GPUs (the others wait for nothing, but the deployment's figures
    are those of the workers that lag): by a prompt's prefill for prefill workers, a step of one for decode."""
    priced = [search.priced(option.layout, w.gpus, w.nodes) or option for w in {w.gpus: w for w in workers}.values()]
    if workers[0].role == "prefill":
        return max(priced, key=lambda o: o.steps.prefill_ms(1))
    return max(priced, key=lambda o: o.steps.step_ms(1))


def _placed(search: _Search, candidate: Candidate) -> tuple[Candidate, tuple[Worker, ...]]:
    """The candidate on its real GPUs: each role priced on its slowest worker's GPUs, the transfer re-priced
    between the slowest prefill-decode pair."""
    p, d = candidate.prefill, candidate.decode
    workers = search.placer.place(RolePlan("prefill", p.layout, candidate.ratio[0]),
                                  RolePlan("decode", d.layout, candidate.ratio[1]))
    prefill = [w for w in workers if w.role == "prefill"]
    decode = [w for w in workers if w.role == "decode"]
    pairs = {(s.node == t.node, s.gpus, t.gpus): (s, t) for s in prefill for t in decode}
    transfer = max((search.transfer(s, t) for s, t in pairs.values()), key=lambda t: t.ms)
    return _price(search, _slowest(search, p, prefill), _slowest(search, d, decode), candidate.ratio, transfer,
                  steady=True), workers


def _aggregated(plan: Plan) -> Aggregated | None:
    best = next((r for r in plan.layouts if r.cost.fits and r.cost.served), None)
    if best is None:
        return None
    served = best.cost.served
    return Aggregated(best.cost.layout, best.nodes, served.replica.ttft_ms, served.replica.tpot_ms,  # type: ignore
                      served.replica.concurrency, served.output_tokens_per_s_per_gpu, best.cost.slo_miss)  # type: ignore


def _verdict(chosen: Candidate, agg: Aggregated | None) -> tuple[str, bool]:
    ours = chosen.served.output_tokens_per_s_per_gpu
    p, d = chosen.ratio
    if agg is None:
        return f"no aggregated layout fits: {p}P:{d}D is the only way found to serve this model here", True
    theirs = agg.output_tokens_per_s_per_gpu
    if (bool(chosen.slo_miss), -ours) >= (bool(agg.slo_miss), -theirs):
        return (f"disaggregation does not pay here: aggregated {agg.layout} delivers {theirs:.1f} output tokens/s "
                f"per GPU (TTFT {agg.ttft_ms:.0f} ms, TPOT {agg.tpot_ms:.1f} ms) against {ours:.1f} for "
                f"{p}P:{d}D" + ("; the disaggregated one misses the latency limits" if chosen.slo_miss else "")), False
    gain = f"{(ours / theirs - 1) * 100:+.0f}%" if theirs > 0 else "where aggregated serves nothing"
    return (f"disaggregation pays: {ours:.1f} output tokens/s per GPU against {theirs:.1f} for aggregated "
            f"{agg.layout} ({gain})" + ("; the aggregated one misses the latency limits" if agg.slo_miss else "")), True


def _notes(search: _Search, c: Candidate, workers: Sequence[Worker]) -> tuple[str, ...]:
    p, d = c.ratio
    rp = search.prefill_served(c.prefill, c.served.prefill_concurrency)[1]
    rd = search.decode_served(c.decode, c.served.decode_concurrency)[1]
    per = {role: f" per replica x {o.layout.dp} (attention DP)" if o.layout.dp > 1 else ""
           for role, o in (("prefill", c.prefill), ("decode", c.decode))}
    notes = [f"{p}P:{d}D: a prefill worker ({c.prefill.layout}) serves {rp:.2f} requests/s at "
             f"{c.served.prefill_concurrency} in flight{per['prefill']}, a decode worker ({c.decode.layout}) "
             f"{rd:.2f} at {c.served.decode_concurrency}{per['decode']}; the deployment "
             f"{c.served.output_tokens_per_s / search.gen:.2f} requests/s on {search.gpus} GPUs"]
    for w in workers:
        nics = list(dict.fromkeys(r.nic_name or r.nic for r in w.routes if r.nic))  # in GPU order, once each
        notes.append(f"{w.name} on node {w.node}{f'-{w.node + w.nodes - 1}' if w.nodes > 1 else ''}: "
                     f"{','.join(w.gpus)}, NUMA {','.join(map(str, w.numa_nodes)) or '?'}, KV via "
                     f"{','.join(nics) or 'no NIC'}")
    if any(s.node == t.node for s in workers if s.role == "prefill" for t in workers if t.role == "decode"):
        engine = search.plan.engine
        notes.append(f"{engine.name}'s KV transfer between workers of one node goes " + (
            "out through the sending GPUs' NICs and back in (its backend speaks RDMA only)"
            if engine.kv_transfer.same_node == VIA_NIC else "over the GPU-GPU link (CUDA IPC)") +
            ", as priced (docs/planner.md, section 10)")
    notes.append(f"KV connector {c.transfer.connector}: " + (
        "the whole cache leaves after the prefill (SGLang's and vLLM NixlConnector's default), all in the TTFT"
        if c.transfer.connector == "whole" else "each layer leaves as the prefill finishes it; only what outlasts "
        "the prefill, plus the last layer's share, is in the TTFT"))
    return tuple(notes)


def disagg_for(request: PlanRequest, pd: tuple[int, int] | None = None, connector: str = DEFAULT_CONNECTOR,
               roles: tuple[Layout, Layout] | None = None, roles_from: str = "the request") -> DisaggResult:
    """Plan a disaggregated deployment for `request` (its model, topology, nodes, workload, engine and limits):
    `pd` fixes the P:D (else searched), `connector` how the KV cache is sent ("whole" or "per-layer"), `roles`
    the prefill and decode worker layouts (else searched; `roles_from` names where they came from in errors)."""
    DisaggRequest(pd, connector)  # checks them
    plan = plan_for(replace(request, objective="throughput", search_batch=True))
    if not request.engine.serves:  # priced with the runner's costs; the split itself is an engine's
        plan = replace(plan, warnings=(*plan.warnings, f"--disagg priced with {request.engine}'s costs, but the "
                                       "bundled runner has no prefill/decode split: pass --engine sglang, vllm or "
                                       "trtllm for the engine you will serve with (launch --disagg needs one)"))
    if plan.serving is None:
        raise TopoplanError("plan --disagg needs the served model (a GPU plan), not the CPU planner")
    engine, cal = plan.engine, plan.calibration
    pricer = LinkPricer(plan.topology, cal, plan.device.nic_gbps, plan.device.nvlink_domain_gpus, engine.allreduce)
    costs = _costs(request, plan, pricer)
    gpus = len(plan.topology.gpus) * plan.nodes
    search = _Search(plan, plan.serving, pricer, costs, connector, gpus)
    if roles is None:
        prefills = decodes = _options(search, request)
    else:
        prefills = [_fixed(search, "prefill", roles[0], roles_from)]
        decodes = [_fixed(search, "decode", roles[1], roles_from)]
    options = [*prefills, *decodes]
    search.steps.update((o.layout, o.steps) for o in options)
    first: list[Candidate] = []
    searched = 0
    k = len(plan.topology.gpus)
    for p in prefills:
        for d in decodes:
            if p.gpus + d.gpus > gpus:
                continue
            transfer = _representative(search, p, d, plan.nodes > 1)
            cp, cd, _ = _concurrencies(search, p, d, transfer.exposed_ms)
            ratios, weighed = _ratios(search, p, d, pd, cp, cd)
            searched += weighed
            first.extend(_price(search, p, d, ratio, transfer) for ratio in ratios)
    if not first and roles is not None:
        np_, nd = pd or (1, 1)
        raise TopoplanError(f"too few GPUs for {np_} prefill ({roles[0]}) and {nd} decode ({roles[1]}) workers from "
                            f"{roles_from}: they need {np_ * prefills[0].gpus + nd * decodes[0].gpus} GPUs; "
                            f"{plan.nodes} node(s) x {k} GPUs have {gpus} (pass --nodes)")
    if not first:
        smallest = min(o.gpus for o in options)
        want = f"--pd {pd[0]}:{pd[1]} needs at least {pd[0] * smallest + pd[1] * smallest}" if pd else \
            f"one prefill and one decode worker need at least {2 * smallest}"
        raise TopoplanError(f"too few GPUs for a disaggregated deployment of {plan.model.name}: {want} GPUs "
                            f"({smallest} per worker at the least); {plan.nodes} node(s) x {k} GPUs have {gpus}")
    first.sort(key=Candidate.key)
    placed: list[tuple[Candidate, tuple[Worker, ...]]] = []
    errors = []
    for candidate in first:
        if len(placed) == PLACED:
            break
        try:
            placed.append(_placed(search, candidate))
        except TopoplanError as error:
            errors.append(str(error))
    if not placed:
        raise TopoplanError(errors[0])
    placed.sort(key=lambda cw: cw[0].key())
    best = placed[0][0]
    agg = _aggregated(plan)
    verdict, pays = _verdict(best, agg)
    given = roles_from if roles is not None else None
    return DisaggResult(tuple(_deployment(search, c, workers, given) for c, workers in placed),
                        tuple(c for c, _ in placed),
                        searched, agg, verdict, pays, plan, connector, best.slo_miss)


def _deployment(search: _Search, c: Candidate, workers: tuple[Worker, ...], roles_from: str | None) -> DisaggPlan:
    """A placed candidate as a deployment: its workers, transfer and served figures, with its notes and warnings
    (`roles_from`: where its P:D and layouts came from, when they were given rather than searched)."""
    plan = search.plan
    limits_note = () if plan.limits.bounded else (
        "no --max-ttft-ms or --max-tpot-ms: decode workers hold as many requests as memory and the engine allow; "
        "set a limit to bound TPOT",)
    far = route_warnings(workers)  # matters where the KV cache reaches a NIC; where it never does, a note
    crossing = len({w.node for w in workers}) > 1 or plan.engine.kv_transfer.same_node == VIA_NIC
    return DisaggPlan(c.prefill.layout, c.decode.layout, workers, c.transfer, c.served,
                      (*_notes(search, c, workers), *(() if crossing else far),
                       *((f"P:D and worker layouts from {roles_from}",) if roles_from else ())),
                      (*plan.warnings, *limits_note, *(far if crossing else ())))


@dataclass(frozen=True)
class DisaggRequest:
    """What `plan --disagg` asks beyond a PlanRequest: the P:D (None: searched), how the KV cache is sent, and the
    prefill and decode worker layouts (None: searched; an aiconfigurator result gives both, and the P:D); checked
    when built."""

    pd: tuple[int, int] | None = None
    connector: str = DEFAULT_CONNECTOR
    roles: tuple[Layout, Layout] | None = None  # (prefill, decode) worker layouts
    roles_from: str | None = None  # where `roles` came from, in words (the aiconfigurator file and its row)
    sized_for: tuple[int, int] | None = None  # (prompt, generated) tokens the file's deployment was sized for

    def __post_init__(self) -> None:
        if self.connector not in CONNECTORS:
            raise TopoplanError(f"--kv-connector {self.connector!r}: expected one of {', '.join(CONNECTORS)}")
        if self.pd is not None and min(self.pd) < 1:
            raise TopoplanError(f"--pd {self.pd[0]}:{self.pd[1]}: needs at least one prefill and one decode worker")

    @classmethod
    def parse(cls, pd: str | None, connector: str = DEFAULT_CONNECTOR, pd_from: str | None = None) -> DisaggRequest:
        """From `--pd P:D` (None: searched) or `--pd-from FILE` (aiconfigurator's result: P:D and both layouts)."""
        if pd_from is not None:
            if pd is not None:
                raise TopoplanError("--pd and --pd-from both give the P:D; pass one")
            from topoplan.plan.aic_result import read_aic_disagg

            aic = read_aic_disagg(pd_from)
            return cls(aic.pd, connector, (aic.prefill, aic.decode), f"{aic.source} (aiconfigurator: {aic.about})",
                       aic.sized_for)
        if pd is None:
            return cls(None, connector)
        match = re.fullmatch(r"\s*(\d{1,6})\s*:\s*(\d{1,6})\s*", pd, re.ASCII)  # 6 digits: counts, not numbers
        if match is None:
            raise TopoplanError(f"--pd {pd[:20]!r}: expected P:D, prefill and decode worker counts like 1:3")
        return cls((int(match.group(1)), int(match.group(2))), connector)

    def plan(self, request: PlanRequest) -> DisaggResult:
        """disagg_for with what this asks; a warning where the deployment was sized for other lengths than the
        request prices (its P:D is then aiconfigurator's answer to another question)."""
        result = disagg_for(request, self.pd, self.connector, self.roles, self.roles_from or "the request")
        w = result.plan.workload
        if self.sized_for is None or self.sized_for == (w.prompt_len, w.gen_len):
            return result
        isl, osl = self.sized_for
        warning = (f"aiconfigurator sized this P:D for {isl} prompt and {osl} generated tokens; this plan prices "
                   f"{w.prompt_len} and {w.gen_len} (pass --prompt-len {isl} --gen-len {osl} to price what it chose)")
        return replace(result, deployments=tuple(replace(d, warnings=(*d.warnings, warning))
                                                 for d in result.deployments))

    def record(self) -> dict[str, Any]:
        """As a saved plan's request records it."""
        return {"pd": list(self.pd) if self.pd else None, "connector": self.connector,
                "roles": [str(layout) for layout in self.roles] if self.roles else None,
                "roles_from": self.roles_from}
