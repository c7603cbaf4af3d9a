"""TensorRT-LLM (github.com/NVIDIA/TensorRT-LLM), 1.0 to 1.3 (PyTorch backend, `trtllm-serve`): CUDA-graph
decode, its own one-shot/two-shot all-reduce (AllReduceStrategy AUTO), and a KV pool sized as a fraction of
the memory left free once the weights are loaded."""

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
from topoplan.engines.vllm import AIC

V1 = Engine(
    name="trtllm", version="1.0", covers=("1.0.0", "1.3"), cuda_graphs_decode=True,
    parallelism=Parallelism(tp=True, pp=True, dp=False, ep=True, pads_vocab=True, tp_across_nodes=True,
                            attention_dp_tp=1),
    memory=MemoryPolicy(basis="free", fraction=0.90, option="--kv_cache_free_gpu_memory_fraction",
                        kv_block_tokens=32, reserved_gb=3.76),
    allreduce=AllReducePath(custom=True, world_sizes=(2, 4, 8), max_bytes=8 * 1024 * 1024,
                            one_shot_max_bytes=((8, 256 * 1024),), one_shot_us=3.5, two_shot_us=10.0),
    overheads=Overheads(memory_bandwidth_efficiency=0.85, flop_efficiency=0.70, layer_overhead_us=30.0,
                        graph_layer_overhead_us=52.0, step_overhead_us=0.0, step_overhead_per_rank_us=0.0,
                        collective_base_us=20.0),
    sources={
        "scheduler.budgets": "TensorRT-LLM in-flight batching: context and generation requests in one iteration "
                             "(docs/source/advanced/gpt-attention.md); tensorrt_llm/builder.py BuildConfig "
                             "max_num_tokens 8192, max_batch_size 2048; whole prompts by default "
                             "(tensorrt_llm/llmapi/llm_args.py enable_chunked_prefill = False: the model chunks "
                             "only a prompt that does not fit the room the decodes leave)",
        "scheduler.ttft_factor.divisor": "empirical, not a mechanism: TensorRT-LLM 1.0.0rc3's measured TTFT on H100 "
                                         "Qwen3-32B fp8 (aiconfigurator 0.12 silicon_sample.csv) is 4-9x one "
                                         "prompt's prefill at 8-64 in flight, growing as log2 of them; neither a "
                                         "wave of C prompts arriving together (2.5-3.5x over at 32-64) nor the "
                                         "scheduler replayed step by step explains it (docs/planner.md section 6). "
                                         "aiconfigurator's form (sdk/backends/vllm_backend.py _ttft_queuing_factor) "
                                         "with the divisor fitted by benchmarks/engine_fit.py on the 4 fitting rows "
                                         "whose TTFT does not grow with the output length (Qwen3-32B fp8 1024/512 "
                                         "C8, TP1/2/4/8): 0.95; its per-layer dispatch term fails leave-one-out. "
                                         "The Llama-3.1-8B runs of the same collection have one request always "
                                         "waiting for admission (benchmarks/ttft_output_slope.py): no fit uses them",
        "scheduler.ttft_factor.saturates_at": "as vllm@0.32's: aiconfigurator's factor saturates at 256 in flight",
        "memory.fraction": "tensorrt_llm/llmapi/llm_args.py KvCacheConfig.free_gpu_memory_fraction = 0.9 "
                           "(\"fraction of GPU memory ... allocated for the KV cache\", of what is free after "
                           "the model loads)",
        "memory.kv_block_tokens": "tensorrt_llm/llmapi/llm_args.py KvCacheConfig.tokens_per_block = 32 (PyTorch "
                                  "backend; the TensorRT backend's plugin default is 64)",
        "memory.reserved_gb": f"activations and runtime buffers before the KV pool is sized: {AIC}/../"
                              "h100_sxm.yaml misc.other_mem = 3.5 GiB",
        "allreduce.world_sizes": "TensorRT-LLM custom all-reduce on NVLink within a node (2, 4, 8 GPUs measured by "
                                 f"{AIC} h100_sxm/comm/trtllm/1.3.0rc20)",
        "allreduce.max_bytes": "estimate as vLLM's 8 MiB: the measured kernel beats NCCL up to 4 MiB at 8 GPUs "
                               f"({AIC} h100_sxm comm trtllm 1.3.0rc20 vs nccl 2.27.3)",
        "allreduce.one_shot_max_bytes": "estimate: one-shot below 256 KiB (measured latency doubles above it, "
                                        f"{AIC} h100_sxm/comm/trtllm/1.3.0rc20)",
        "allreduce.one_shot_us": f"{AIC} h100_sxm/comm/trtllm/1.3.0rc20 custom_allreduce_perf: 2.8-3.8 us at "
                                 "8-16 KiB, 2-8 GPUs (a100_sxm/1.0.0: 4.9-8.4 us)",
        "allreduce.two_shot_us": f"{AIC} h100_sxm/comm/trtllm/1.3.0rc20: 7.9-17.6 us at 256 KiB, 4-8 GPUs",
        **{f"overheads.{k}": v for k, v in {
            "memory_bandwidth_efficiency": "fitted by benchmarks/engine_fit.py (0.85) on TensorRT-LLM "
                                           "1.0.0rc3 H100 TP1/2/4/8 at concurrency 8, prompt 1024 / gen 512, "
                                           "Llama-3.1-8B bf16 and Qwen3-32B fp8 (tests/data/"
                                           "engine_measurements.json, aiconfigurator 0.12 silicon_sample.csv)",
            "flop_efficiency": "0.7: TensorRT-LLM v0.5 docs/source/performance.md 'Low Latency', batch-1 first-token "
                               "latency at 2048 tokens on A100 fp16 (Llama 7B TP1 133 ms, 70B TP4 377 ms) "
                               "priced within 5% at 0.7 (docs/engines.md); kipply's A100 GEMM figure is 0.72",
            "layer_overhead_us": "prefill: as vllm@0.32",
            "graph_layer_overhead_us": "fitted with memory_bandwidth_efficiency: 52 us per layer per decode step "
                                       "(two models, 32 and 64 layers, tell it from the per-step figure)",
            "step_overhead_us": "fitted: 0 (least squares over the two models puts the fixed time per layer)",
            "step_overhead_per_rank_us": "one executor loop per rank under MPI: no per-rank term",
            "sequence_overhead_us": "0: its fitting rows run at one concurrency (8), which cannot tell a "
                                    "per-sequence cost from the per-step figures (benchmarks/engine_fit.py)",
            "collective_base_us": "as vllm@0.32",
        }.items()},
    },
    notes="PyTorch-backend TensorRT-LLM under trtllm-serve; engines built with trtllm-build (TensorRT backend) "
          "have the same memory policy with 64-token blocks.",
    scheduler=Scheduler("mixed", (Budget(0, 8192, 2048),), ttft_factor=TtftFactor(0.95)),
    kv_transfer=KvTransferPath(GPU_LINK, "NVIDIA Dynamo's backends/trtllm/kv-cache-transfer.md: TensorRT-LLM's cache "
                               "transceiver moves the KV cache with NIXL over UCX by default, as vLLM's NixlConnector "
                               "(UCX's CUDA IPC within a host); not checked against its own source"),
    launcher="trtllm", launch_release="1.0",  # tests/data/engines/trtllm-serve-options.json (1.x main)
)

ENGINES = (V1,)
