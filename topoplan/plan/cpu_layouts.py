"""CPU-process layouts of this machine, priced by the planner from a calibration's `cpu` entry: what
`topoplan plan --device cpu` ranks and what `topoplan validate` measures.

The candidates: one rank with every core as its threads (TP1), and every tp x pp x dp with one
single-threaded rank per core; for an MoE model also the expert-parallel layouts the bundled runner runs
(ep dividing tp: with dp 1, the planner's ep = tp x dp and the runner's EP inside a TP group coincide).
Each is priced by the planner itself (topoplan.plan.rank.plan) on the CPU topology and device of
topoplan.plan.cpu_entry, twice: a decode step multiplies `batch` rows by each weight (`batch / m` with the runner's
m = min(pp, batch) micro-batches, all m stages streaming at once), prefill `batch x prompt_len`, and a CPU's
FLOP rate depends on the rows (cpu.py). The decode time per token is the micro-batched schedule's step (every
sequence one token, the planner's throughput formula), which is what the runner measures. CPU layouts are
priced in fp32, the dtype the runner uses on CPUs and the one the `cpu` entry was measured in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from topoplan.cpuset import cpu_cores
from topoplan.dtypes import dtype_of
from topoplan.errors import TopoplanError
from topoplan.layout import Layout, micro_batches
from topoplan.models import ModelSpec, find_model
from topoplan.plan.calibration import Calibration
from topoplan.plan.calibration_file import ConstantValues, CpuEntry, read_calibration_file
from topoplan.plan.cost import LayoutCost, Workload
from topoplan.plan.cpu_entry import concurrent_ranks, cpu_calibration, cpu_device, cpu_topology
from topoplan.plan.frontend import PlanRequest
from topoplan.plan.layouts import enumerate_layouts
from topoplan.plan.rank import Plan, RankedLayout, check_search, mark_dominated, plan, rank_key

CPU_DTYPE = "fp32"


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    threads: int  # intra-op threads per rank


def runnable(layout: Layout) -> bool:
    """The layouts the runner runs as priced: an EP group inside one TP group (ep divides tp); its DP replicas
    run independently, so vLLM's ep = tp x dp with dp > 1 has no runner counterpart."""
    return layout.tp % layout.ep == 0


def cpu_candidates(spec: ModelSpec, cores: int, wanted: list[Layout] | None, batch: int | None) -> list[Candidate]:
    """TP1 on every core, and every layout with one single-threaded rank per core (or the ones asked).
    `batch`: prompts split over the DP replicas (validate), so dp must divide it; None when each replica has
    its own batch (plan)."""
    if wanted is None:
        found = [Candidate(Layout(), cores)]
        if cores > 1:
            found += [Candidate(l, 1) for l in enumerate_layouts(spec, cores)
                      if l.world == cores and (batch is None or batch % l.dp == 0) and runnable(l)]
        return found
    out = []
    for layout in wanted:
        if layout.world > cores:
            raise TopoplanError(f"{layout} needs {layout.world} ranks; this machine has {cores} cores")
        if batch is not None and batch % layout.dp:
            raise TopoplanError(f"{layout}: --batch {batch} does not split over dp={layout.dp} replicas")
        if not runnable(layout):
            raise TopoplanError(f"{layout}: the bundled runner runs ep dividing tp (its replicas are independent)")
        enumerate_layouts(spec, layout.world, tp=layout.tp, pp=layout.pp, dp=layout.dp,  # the planner's checks
                          ep=layout.ep if layout.ep > 1 else None)
        out.append(Candidate(layout, max(1, cores // layout.world)))
    return out


def price_cpu(spec: ModelSpec, cand: Candidate, entry: CpuEntry, calibration: Calibration,
              workload: Workload, overheads: ConstantValues | None = None, micro_batched: bool = True) -> LayoutCost:
    """The planner's cost of one CPU layout (`workload.batch` per replica): decode priced at the decode step's
    rows, prefill at prefill's (both on the kernel the runner keeps for the decode step's rows), the request
    time from both. `overheads` (the constants they name) replace
    the runner's fixed costs the `cpu` entry measured, for another engine (topoplan.bench.vllm_cpu), and
    `micro_batched` False prices an engine that runs the batch through its stages as one."""
    layout = cand.layout
    layer_bytes = spec.layer_params_per_rank(layout.tp, layout.ep) * dtype_of(CPU_DTYPE).bytes

    micro = micro_batches(layout.pp, workload.batch) if micro_batched else 1
    decode_rows = math.ceil(workload.batch / micro)

    def at(rows: int, busy_stages: int) -> LayoutCost:
        measured = cpu_calibration(calibration, entry, cand.threads, rows, layer_bytes)
        cal = replace(measured, **overheads.named()) if overheads else measured
        device = cpu_device(entry, cand.threads, concurrent_ranks(layout, busy_stages), rows, decode_rows)
        return plan(cpu_topology(layout.world), spec, device, workload, calibration=cal, tp=layout.tp, pp=layout.pp,
                    dp=layout.dp, ep=layout.ep).layouts[0].cost

    decode, prefill = at(decode_rows, micro), at(workload.batch * workload.prompt_len, 1)
    step_ms = layout.dp * workload.batch / decode.tokens_per_s * 1e3  # every sequence one token: the schedule's step
    return replace(decode, prefill_ms=prefill.prefill_ms, decode_ms_per_token=step_ms,
                   request_ms=prefill.prefill_ms + workload.gen_len * step_ms,
                   served=None, offline=None)  # the served model's figures are the GPU plan's (static figures here)


def _refuse_gpu_options(r: PlanRequest) -> None:
    options = (("--topo", r.topo), ("--gpu", r.gpu), ("--cpu", r.cpu), ("--nic-gbps", r.nic_gbps))
    given = [name for name, value in options if value is not None] + (["--nodes"] if r.nodes != 1 else []) + (
        [f"--engine {r.engine}"] if r.engine.serves else [])
    if given:
        raise TopoplanError(f"--device cpu plans this machine's CPU cores; {', '.join(given)} describe GPU "
                            "machines: drop them, or plan GPUs with --device gpu")


def plan_cpu(request: PlanRequest) -> Plan:
    """`plan --device cpu`: rank this machine's CPU-process layouts with the calibration's `cpu` entry."""
    r = request
    _refuse_gpu_options(r)
    if r.calibration is None:
        raise TopoplanError("--device cpu needs --calibration FILE with a `cpu` entry: run `topoplan calibrate` on "
                            "this machine first (the planner has no built-in CPU figures)")
    file = read_calibration_file(r.calibration)
    entry, calibration = file.cpu_entry(), file.calibration()
    spec = find_model(r.model)
    cores = len(cpu_cores())
    check_search(nodes=1, objective=r.objective, max_tp=r.max_tp, tp=r.tp, pp=r.pp, dp=r.dp, ep=r.ep)
    wanted = [Layout(r.tp, r.pp, r.dp, r.ep or 1)] if None not in (r.tp, r.pp, r.dp) else None
    candidates = [c for c in cpu_candidates(spec, cores, wanted, None)
                  if all(want is None or want == got for want, got in ((r.tp, c.layout.tp), (r.pp, c.layout.pp),
                                                                     (r.dp, c.layout.dp), (r.ep, c.layout.ep)))
                  and (r.max_tp is None or c.layout.tp <= r.max_tp)]
    if not candidates:
        raise TopoplanError(f"no CPU-process layout of {cores} cores matches --tp/--pp/--dp/--max-tp")
    workload = replace(r.workload, dtype=CPU_DTYPE)
    ranked = [RankedLayout(price_cpu(spec, c, entry, calibration, workload),
                           tuple(f"CPU{i}" for i in range(c.layout.world))) for c in candidates]
    ranked.sort(key=lambda e: rank_key(r.objective, e))
    mark_dominated(ranked)
    warnings = () if entry.cores == cores else (
        f"{r.calibration} was measured on {entry.cores} cores; this machine has {cores}",)
    threads = ", ".join(f"{c.layout}: {c.layout.world} rank(s) x {c.threads} thread(s)" for c in candidates)
    topology = cpu_topology(cores).with_notes(f"CPU-process layouts of this machine ({threads})")
    device = replace(cpu_device(entry, 1, 1, workload.batch), name="CPU cores")
    return Plan(spec, device, topology, 1, workload, r.objective, calibration,
                [e for e in ranked if e.dominated_by is None], [e for e in ranked if e.dominated_by is not None],
                warnings)
