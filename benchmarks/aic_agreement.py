"""`plan --estimator aiconfigurator` beside aiconfigurator's own in-flight ("agg") estimate of the same points.

The served figures topoplan builds on aiconfigurator's kernel times (its links, its served model) against what
aiconfigurator itself estimates for continuous batching at that concurrency (`run_agg` with a context budget of
one prompt, as `aiconfigurator cli estimate --estimate-mode agg` defaults to), on an 8 x H200 NVLink board
(fixtures/topo/41_...): TTFT, TPOT and delivered output tokens/s per GPU of the replica, with topoplan's built-in
estimate at the same concurrency for reference. Needs the optional extra (pip install 'topoplan[aiconfigurator]').

    python benchmarks/aic_agreement.py
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.plan.cost import Workload  # noqa: E402
from topoplan.plan.frontend import PlanRequest, plan_for  # noqa: E402

H200 = str(ROOT / "fixtures" / "topo" / "41_h200-8gpu-nv18-10nic-container-cpuset-empty-affinity.txt")
MODELS = (("Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", 4), ("Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B", 1))
POINTS = ((1, 1024, 128), (8, 1024, 128), (32, 2048, 256))  # (concurrency, prompt, gen)


def main() -> None:
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database_view

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    print("| engine (data) | model | TP | C | prompt/gen | TTFT ms agg / ours / built-in | TPOT ms agg / ours / "
          "built-in | tok/s/GPU agg / ours / built-in | TPOT err | tok/s err |")
    print("|---" * 10 + "|")
    for engine in ("vllm", "trtllm", "sglang"):
        for model, hf_id, tp in MODELS:
            for c, prompt, gen in POINTS:
                result = plan_for(PlanRequest(model=model, topo=H200, gpu="h200", engine=engine, tp=tp, pp=1, dp=1,
                                              workload=Workload(c, prompt, gen), estimator="aiconfigurator"))
                version = result.estimator["version"]
                agg = get_backend(engine).run_agg(  # a fresh backend: its agg cache is keyed without the model
                    get_model(hf_id, ModelConfig(tp_size=tp), engine), get_database_view("h200_sxm", engine, version),
                    RuntimeConfig(batch_size=c, isl=prompt, osl=gen), ctx_tokens=prompt).get_result_dict()
                est = result.layouts[0].cost.estimates
                ours, builtin = est["aiconfigurator"].replica, est["builtin"].replica
                rate = (agg["tokens/s/gpu"], ours.output_tokens_per_s / tp, builtin.output_tokens_per_s / tp)
                print(f"| {engine} ({version}) | {model} | {tp} | {c} | {prompt}/{gen} | "
                      f"{agg['ttft']:.1f} / {ours.ttft_ms:.1f} / {builtin.ttft_ms:.1f} | "
                      f"{agg['tpot']:.2f} / {ours.tpot_ms:.2f} / {builtin.tpot_ms:.2f} | "
                      f"{rate[0]:.1f} / {rate[1]:.1f} / {rate[2]:.1f} | "
                      f"{100 * (ours.tpot_ms / agg['tpot'] - 1):+.1f}% | {100 * (rate[1] / rate[0] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
