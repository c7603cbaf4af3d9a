"""The `--json` contract of `plan --disagg`: the `disagg` object (docs/planner.md §10 lists its keys), and one
deployment's part of it, which a saved plan keeps and `launch --disagg` reads back."""

from __future__ import annotations

from typing import Any

from topoplan.plan.disagg import DisaggResult
from topoplan.plan.disagg_types import DisaggPlan, Worker


def worker_json(w: Worker) -> dict[str, Any]:
    return {"role": w.role, "index": w.index, "name": w.name, "node": w.node, "nodes": w.nodes,
            "layout": {"tp": w.layout.tp, "pp": w.layout.pp, "dp": w.layout.dp, "ep": w.layout.ep},
            "gpus": list(w.gpus), "cpus": list(w.cpus), "numa_nodes": list(w.numa_nodes),
            "routes": [{"gpu": r.gpu, "nic": r.nic, "nic_name": r.nic_name, "link": r.link} for r in w.routes]}


def disagg_plan_json(plan: DisaggPlan) -> dict[str, Any]:
    """One disaggregated deployment: ratio, workers, transfer, served figures, notes and warnings."""
    t, s = plan.transfer, plan.served
    return {
        "ratio": {"prefill": plan.ratio[0], "decode": plan.ratio[1]},
        "prefill_layout": str(plan.prefill), "decode_layout": str(plan.decode),
        "workers": [worker_json(w) for w in plan.workers],
        "transfer": {"bytes_per_request": t.bytes_per_request, "path": t.path, "gbps": round(t.gbps, 3),
                     "ms": round(t.ms, 4), "exposed_ms": round(t.exposed_ms, 4), "connector": t.connector},
        "served": {"ttft_ms": round(s.ttft_ms, 3), "tpot_ms": round(s.tpot_ms, 4),
                   "output_tokens_per_s": round(s.output_tokens_per_s, 2),
                   "output_tokens_per_s_per_gpu": round(s.output_tokens_per_s_per_gpu, 3),
                   "prefill_concurrency": s.prefill_concurrency, "decode_concurrency": s.decode_concurrency,
                   "prefill_max_concurrency": s.prefill_max_concurrency,
                   "decode_max_concurrency": s.decode_max_concurrency},
        "notes": list(plan.notes), "warnings": list(plan.warnings),
    }


def disagg_json(result: DisaggResult) -> dict[str, Any]:
    """The `--json` `disagg` object: the chosen deployment, the aggregated comparison and the verdict, the
    search's size and the other placed candidates."""
    agg = result.aggregated
    return {
        **disagg_plan_json(result.chosen),
        **({"slo_miss": result.slo_miss} if result.slo_miss else {}),
        "aggregated": None if agg is None else {
            "layout": str(agg.layout), "nodes": agg.nodes, "ttft_ms": round(agg.ttft_ms, 3),
            "tpot_ms": round(agg.tpot_ms, 4), "concurrency_per_replica": agg.concurrency,
            "output_tokens_per_s_per_gpu": round(agg.output_tokens_per_s_per_gpu, 3),
            **({"slo_miss": agg.slo_miss} if agg.slo_miss else {})},
        "verdict": result.verdict, "pays": result.pays, "searched": result.searched,
        "candidates": [{"prefill_layout": str(c.prefill.layout), "decode_layout": str(c.decode.layout),
                        "ratio": list(c.ratio), "ttft_ms": round(c.served.ttft_ms, 3),
                        "tpot_ms": round(c.served.tpot_ms, 4),
                        "output_tokens_per_s_per_gpu": round(c.served.output_tokens_per_s_per_gpu, 3),
                        **({"slo_miss": c.slo_miss} if c.slo_miss else {})} for c in result.candidates],
    }


