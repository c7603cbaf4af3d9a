"""SGLang (github.com/sgl-project/sglang), 0.4 to 0.5: CUDA-graph decode, the custom all-reduce kernel it
took from vLLM (sgl-kernel), a static memory fraction that shrinks with the TP size, token-sized KV pages."""

from __future__ import annotations

from topoplan.engines.engine import (
    VIA_NIC,
    AllReducePath,
    Engine,
    KvTransferPath,
    MemoryPolicy,
    Overheads,
    Parallelism,
)
from topoplan.engines.scheduling import Budget, Scheduler
from topoplan.engines.vllm import AIC

V0_5 = Engine(
    name="sglang", version="0.5", covers=("0.4.0", "0.5"), cuda_graphs_decode=True,
    parallelism=Parallelism(tp=True, pp=True, dp=True, ep=True, pads_vocab=True, tp_across_nodes=True),
    memory=MemoryPolicy(basis="total", fraction=0.88, option="--mem-fraction-static", kv_block_tokens=1,
                        reserved_gb=0.0, fraction_by_tp=((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87))),
    allreduce=AllReducePath(custom=True, world_sizes=(2, 4, 6, 8), max_bytes=8 * 1024 * 1024,
                            one_shot_max_bytes=((2, 8 * 1024 * 1024), (4, 512 * 1024), (8, 256 * 1024)),
                            one_shot_us=5.0, two_shot_us=11.0),
    overheads=Overheads(memory_bandwidth_efficiency=0.90, flop_efficiency=0.53, layer_overhead_us=30.0,
                        graph_layer_overhead_us=53.0, step_overhead_us=0.0, step_overhead_per_rank_us=0.0,
                        collective_base_us=20.0),
    sources={
        "scheduler.budgets": "python/sglang/srt/managers/scheduler.py: a prefill batch runs before the running decode "
                             "batch resumes (enable_mixed_chunk off by default); python/sglang/srt/server_args.py "
                             "chunked_prefill_size 2048 under 35 GiB, 8192 under 160 GiB, 16384 above; "
                             "max_running_requests from the KV pool",
        "memory.fraction": "python/sglang/srt/server_args.py: mem_fraction_static 0.88 on one GPU (v0.4.x)",
        "memory.fraction_by_tp": "python/sglang/srt/server_args.py (v0.4.x): 0.87 at tp >= 2, 0.85 at >= 4, "
                                 "0.81 at >= 8, 0.79 at >= 16; the fraction holds weights and the KV pool, the "
                                 "rest is activations and CUDA graphs",
        "memory.kv_block_tokens": "python/sglang/srt/server_args.py page_size = 1 (token-granular radix cache)",
        "memory.reserved_gb": "none: activations live in the 1 - mem_fraction_static share",
        "allreduce.world_sizes": "sglang/srt/distributed/device_communicators/custom_all_reduce.py "
                                 "_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8] (from vLLM's)",
        "allreduce.max_bytes": "custom_all_reduce.py max_size = 8192 * 1024 (as vLLM)",
        "allreduce.one_shot_max_bytes": "sgl-kernel custom all-reduce: vLLM's 1-stage/2-stage rule "
                                        "(csrc/custom_all_reduce.cuh)",
        "allreduce.one_shot_us": f"{AIC} h100_sxm/comm/sglang/0.5.10 custom_allreduce_perf sglang_graph: "
                                 "4.6-5.5 us at 8-16 KiB, 2-8 GPUs",
        "allreduce.two_shot_us": f"{AIC} h100_sxm/comm/sglang/0.5.10 sglang_graph: 11.4-15.8 us at 256 KiB",
        **{f"overheads.{k}": v for k, v in {
            "memory_bandwidth_efficiency": "fitted by benchmarks/engine_fit.py (grid top, 0.9) on SGLang 0.5.1.post1 "
                                           "H100 Qwen3-32B bf16 TP2/4/8 at concurrency 16, prompt/gen 1024/512 and "
                                           "2048/256 (tests/data/engine_measurements.json, aiconfigurator 0.12 "
                                           "silicon_sample.csv)",
            "flop_efficiency": "fitted: least mean |TTFT error| (grid step 0.01) on the same 6 fitting rows, whose "
                               "TTFT under SGLang's prefill-first waves is batched prefills alone (docs/planner.md "
                               "sections 4 and 6): 0.53 (0.70 put them 16% under)",
            "layer_overhead_us": "prefill (eager): as vllm@0.32",
            "graph_layer_overhead_us": "fitted with memory_bandwidth_efficiency (TPOT of the waves, "
                                       "tests/engine_cases.py): 53 us per layer per decode step",
            "step_overhead_us": "0: one model's rows cannot separate it from the per-layer figure, which absorbs "
                                "it (benchmarks/engine_fit.py)",
            "step_overhead_per_rank_us": "scheduler output broadcast once to the TP workers: no per-rank term",
            "sequence_overhead_us": "0: its fitting rows run at one concurrency (16), which cannot tell a "
                                    "per-sequence cost from the per-layer figure (benchmarks/engine_fit.py)",
            "collective_base_us": "as vllm@0.32",
        }.items()},
    },
    notes="Fewer published TP sweeps than vLLM or TensorRT-LLM: one (NVIDIA's aiconfigurator silicon samples).",
    scheduler=Scheduler("separate", (Budget(160, 16384, None), Budget(35, 8192, None), Budget(0, 2048, None))),
    kv_transfer=KvTransferPath(VIA_NIC, "python/sglang/srt/disaggregation/mooncake/transfer_engine.py: the default "
                               "backend (mooncake) initializes Mooncake's transfer engine with protocol \"rdma\" "
                               "(MOONCAKE_PROTOCOL's default), which installs only its RdmaTransport "
                               "(mooncake-transfer-engine transfer_engine.cpp: the transport follows the protocol "
                               "string), so a same-node transfer leaves by the sending GPU's RDMA device and comes "
                               "back in by the receiver's; NVLink only with SGLANG_MOONCAKE_CUSTOM_MEM_POOL="
                               "INTRA_NODE_NVLINK and MC_INTRANODE_NVLINK (docs/advanced_features/"
                               "pd_disaggregation.md), which topoplan does not set"),
    launcher="sglang", launch_release="0.5",  # tests/data/engines/sglang-0.5.23-options.json
)

ENGINES = (V0_5,)
