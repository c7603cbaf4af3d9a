"""vLLM (github.com/vllm-project/vllm): the profiles of its 2023 engine (0.2) and of its V1 engine (0.8 on).

Per-step CPU overhead is what changed most between them: 0.2 ran every layer eagerly and its driver sent
each step's inputs to Ray workers; V1 replays CUDA graphs for decode and runs the scheduler in its own
process (vLLM blog, "vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction", 2024-09-05, and
"vLLM V1: A Major Upgrade to vLLM's Core Architecture", 2025-01-27).
"""

from __future__ import annotations

from topoplan.engines.engine import (
    GPU_LINK,
    AllReducePath,
    Engine,
    KvTransferPath,
    MemoryPolicy,
    Overheads,
    Parallelism,
)
from topoplan.engines.scheduling import Budget, Scheduler, TtftFactor

NAME = "vllm"  # the engine's name on the command line (--engine vllm, vllm@VERSION)
AIC = "aiconfigurator 0.12 (pip), aiconfigurator_core/systems/data"
MEMORY = MemoryPolicy(basis="total", fraction=0.90, option="--gpu-memory-utilization", kv_block_tokens=16,
                      reserved_gb=3.76)
MEMORY_SOURCES = {
    "memory.fraction": "vllm/engine/arg_utils.py EngineArgs.gpu_memory_utilization = 0.90 (v0.2.0 to v0.32)",
    "memory.kv_block_tokens": "vllm/engine/arg_utils.py EngineArgs.block_size = 16 (CUDA default, v0.2.0 on)",
    "memory.reserved_gb": "activations, CUDA graphs and NCCL buffers come out of the same budget (vLLM profiles "
                          f"them at start-up); {AIC}/../a100_sxm.yaml misc.other_mem = 3.5 GiB reserve",
}

V0_2 = Engine(
    name=NAME, version="0.2", covers=("0.2.0", "0.2.4"), cuda_graphs_decode=False,
    parallelism=Parallelism(tp=True, pp=False, dp=False, ep=False, pads_vocab=True, tp_across_nodes=True),
    memory=MEMORY,
    allreduce=AllReducePath(custom=False),
    overheads=Overheads(memory_bandwidth_efficiency=0.80, flop_efficiency=0.60, layer_overhead_us=124.0,
                        graph_layer_overhead_us=124.0, step_overhead_us=3000.0, step_overhead_per_rank_us=300.0,
                        collective_base_us=45.0),
    sources={
        **MEMORY_SOURCES,
        "scheduler.budgets": "vllm/core/scheduler.py (v0.2.x): waiting prompts are scheduled in a prefill-only step "
                             "before any decode step; vllm/config.py SchedulerConfig max_num_batched_tokens = "
                             "max(max_model_len, 2560) (2560 for prompts that fit it), max_num_seqs = 256",
        # No published TP sweep of vLLM 0.2 was found: these are estimates, not fits (docs/engines.md).
        "overheads.memory_bandwidth_efficiency": "estimate: the FasterTransformer fit's 0.8 (docs/planner.md "
                                                 "section 5), below V1's fitted 0.9 (older attention kernels)",
        "overheads.flop_efficiency": "estimate: cuBLAS GEMMs at prefill sizes under xformers attention",
        "overheads.layer_overhead_us": "estimate: vllm@0.32's fitted 64 us per layer (its figure before it got a "
                                       "per-sequence term) plus eager launches, ~12 "
                                       "kernels per layer at ~5 us each (CUDA graphs came with PR #1926, "
                                       "December 2023, after 0.2.4)",
        "overheads.graph_layer_overhead_us": "no CUDA graphs in 0.2.0-0.2.4: the eager figure",
        "overheads.step_overhead_us": "estimate: the Python scheduler, sampler and output processing per step; "
                                      "vLLM blog 2024-09-05 measured the GPU busy only 38% of each step in v0.5.3 "
                                      "(Llama-3-8B, one H100; API server 33%, scheduler 29%), 0.2 had the same "
                                      "loop without its later fixes",
        "overheads.step_overhead_per_rank_us": "estimate: the 0.2 driver broadcasts each step's inputs to every "
                                               "Ray worker (vllm/worker/worker.py), a cost per extra rank",
        "overheads.sequence_overhead_us": "0: the per-step estimate (3 ms) stands for all its Python work; no "
                                          "vLLM 0.2 measurement separates a per-sequence part",
        "overheads.collective_base_us": f"eager all-reduce launch: {AIC} a100_sxm/comm/vllm/0.14.0 "
                                        "custom_allreduce_perf vllm_eager 44 us at 8-16 KiB (eager launch cost)",
    },
    notes="The 2023 engine: tensor parallelism only (PP from 0.5, DP later), NCCL all-reduce via torch.distributed "
          "(custom all-reduce from v0.3.0, PR #2192), no CUDA graphs.",
    scheduler=Scheduler("separate", (Budget(0, 2560, 256),)),
    launcher=None,  # its options differ from today's and nobody launches it any more: priced, not launched
)

V1 = Engine(
    name=NAME, version="0.32", covers=("0.8.0", "0.32"), cuda_graphs_decode=True,
    parallelism=Parallelism(tp=True, pp=True, dp=True, ep=True, pads_vocab=True, tp_across_nodes=True,
                            moe_dp_shares_experts=True),  # docs.vllm.ai data_parallel_deployment (MoE)
    memory=MEMORY,
    allreduce=AllReducePath(custom=True, world_sizes=(2, 4, 6, 8), max_bytes=8 * 1024 * 1024,
                            one_shot_max_bytes=((2, 8 * 1024 * 1024), (4, 512 * 1024), (8, 256 * 1024)),
                            one_shot_us=5.0, two_shot_us=10.0),
    overheads=Overheads(memory_bandwidth_efficiency=0.90, flop_efficiency=0.70, layer_overhead_us=30.0,
                        graph_layer_overhead_us=57.0, step_overhead_us=0.0, step_overhead_per_rank_us=0.0,
                        collective_base_us=20.0, sequence_overhead_us=43.0),
    sources={
        **MEMORY_SOURCES,
        "scheduler.budgets": "vllm/v1/core/sched/scheduler.py: running requests' decodes first, then waiting prompts "
                             "chunked into the rest of the token budget (chunked prefill always on in V1); "
                             "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, `vllm serve`: "
                             "max_num_batched_tokens 8192 and max_num_seqs 1024 on GPUs of >= 70 GiB other than A100 "
                             "(PR #17885), else 2048 and 256; not in waves: its measured closed-loop TTFT "
                             "(tests/data/engine_measurements.json, fit rows too) is below the least mean a "
                             "wave of C prompts arriving together allows, (C + 1) / 2 prefills",
        "scheduler.ttft_factor.divisor": "empirical, not a mechanism: vLLM 0.12.0's measured TTFT on H100 Qwen3-32B "
                                 "bf16 "
                                 "(aiconfigurator 0.12 silicon_sample.csv) is 2.2-3.6x the modelled wait at every "
                                 "TP, C and length, and no scheduler mechanism found explains it (docs/planner.md "
                                 "section 4); aiconfigurator's own form (sdk/backends/vllm_backend.py "
                                 "_ttft_queuing_factor, 1 + log2(C) / 8) with the divisor refitted by "
                                 "benchmarks/engine_fit.py on the 6 fitting rows (prompt 1024 / gen 1024, C8/C16, "
                                 "TP2/4/8): 2.0; its per-layer dispatch term (0.8 ms) fails leave-one-out there",
        "scheduler.ttft_factor.saturates_at": "C is capped at 256, where aiconfigurator's factor "
                                              "(1 + log2(b) / 8, at most 2) saturates (sdk/backends/vllm_backend.py "
                                              "_ttft_queuing_factor)",
        "allreduce.world_sizes": "vllm/distributed/device_communicators/custom_all_reduce.py "
                                 "_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]; needs full NVLink beyond 2 GPUs",
        "allreduce.max_bytes": "custom_all_reduce.py CustomAllreduce max_size = 8192 * 1024",
        "allreduce.one_shot_max_bytes": "csrc/custom_all_reduce.cuh allreduce(): world 2 always one-shot (1-stage); "
                                        "< 512 KiB at world <= 4, < 256 KiB at world <= 8; two-shot above",
        "allreduce.one_shot_us": f"{AIC} h200_sxm/comm/vllm/0.24.0 custom_allreduce_perf vllm_graph: 4.6-5.2 us "
                                 "at 8-16 KiB for 2-8 GPUs (a100_sxm/0.14.0: 5.2-6.9 us)",
        "allreduce.two_shot_us": f"{AIC} h200_sxm/comm/vllm/0.24.0 vllm_graph: 10.5-11.1 us at 256 KiB, 4-8 GPUs",
        **{f"overheads.{k}": v for k, v in {
            "memory_bandwidth_efficiency": "fitted by benchmarks/engine_fit.py (grid top, 0.9) on vLLM 0.12.0 H100 "
                                           "Qwen3-32B bf16 TP2/4/8 TPOT, prompt 1024 / gen 1024 "
                                           "(tests/data/engine_measurements.json, aiconfigurator 0.12 "
                                           "silicon_sample.csv); checked on the other 30 rows (docs/engines.md)",
            "flop_efficiency": "kipply's profiled A100 GEMM efficiency (0.72), as the bundled runner's; checked on "
                               "TensorRT-LLM v0.5's published batch-1 first-token latency at 2048 tokens on A100 "
                               "fp16 (Llama 7B TP1 133 ms, 70B TP4 377 ms: docs/engines.md), no vLLM prefill "
                               "measurement isolates it",
            "layer_overhead_us": "prefill runs eagerly or piecewise-compiled: the FasterTransformer-fitted 30 us",
            "graph_layer_overhead_us": "fitted with memory_bandwidth_efficiency: 57 us per layer per decode step "
                                       "(small kernels below peak bandwidth, QK-norm, attention's fixed cost)",
            "sequence_overhead_us": "fitted with memory_bandwidth_efficiency: 43 us per sequence per step, from "
                                    "the fitting rows' TPOT at 8 and 16 in flight (benchmarks/engine_fit.py): the "
                                    "engine core's per-request work between GPU steps without async scheduling "
                                    "(vllm/v1/core/sched/scheduler.py schedule and update_from_output, "
                                    "gpu_model_runner.py input preparation) and attention's per-sequence work; "
                                    "checked at 32-128 in flight (docs/planner.md section 6)",
            "step_overhead_us": "0: one model's rows cannot separate it from the per-layer figure (same layer "
                                "count in every row), which absorbs it (benchmarks/engine_fit.py)",
            "step_overhead_per_rank_us": "V1 broadcasts the scheduler output once through shared memory "
                                         "(vllm/v1/executor/multiproc_executor.py): no per-rank term",
            "collective_base_us": "NCCL call under CUDA graphs (prefill-sized messages): fitted FasterTransformer "
                                  "base 25 us less the eager launch",
        }.items()},
    },
    notes="V1 engine (default from 0.8.0): CUDA graphs for decode, custom one-shot/two-shot all-reduce on an "
          "NVLink mesh, PP and DP over its own multiprocessing executor or Ray.",
    scheduler=Scheduler("mixed", (Budget(70, 8192, 1024, excludes=("a100",)), Budget(0, 2048, 256)),
                        ttft_factor=TtftFactor(2.0)),
    kv_transfer=KvTransferPath(GPU_LINK, "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py: the "
                               "NixlConnector's NIXL agent uses its UCX backend, and vLLM's NixlConnector usage guide "
                               "runs prefill and decode on two GPUs of one host with UCX_TLS=all (cuda_ipc among them; "
                               "its example of narrowing them is \"rc,ud,sm,^cuda_ipc\"): UCX moves GPU memory "
                               "between processes of one host by CUDA IPC, over NVLink where the GPUs have it. Not "
                               "between containers that cannot share CUDA IPC handles (Kubernetes pods: NVIDIA "
                               "Dynamo's disagg-communication-guide.md), where it takes the RDMA NICs"),
    launcher="vllm", driver="vllm_cpu", launch_release="0.32",  # tests/test_engine_lines.py: vLLM 0.32's parser
)

ENGINES = (V0_2, V1)
