"""The bundled runner (topoplan/runner) as the planner prices it: the FasterTransformer-fitted constants of
docs/planner.md section 5, the runner's own rules (no vocabulary padding, a contiguous KV cache) and
NCCL ring all-reduces. `topoplan calibrate` measures the runner's real constants on a given machine."""

from __future__ import annotations

from topoplan.engines.engine import AllReducePath, Engine, MemoryPolicy, Overheads, Parallelism

FT = "fitted to FasterTransformer GPT-20B/13B decode on A100 (docs/planner.md section 5)"

RUNNER = Engine(
    name="topoplan", version="0.1", covers=("0.1", "0.1"), cuda_graphs_decode=False,
    parallelism=Parallelism(tp=True, pp=True, dp=True, ep=False, pads_vocab=False, tp_across_nodes=True,
                            micro_batched_pp=True),
    memory=MemoryPolicy(basis="total", fraction=0.90, option="(none: the runner allocates what it needs)",
                        kv_block_tokens=1, reserved_gb=0.0),
    allreduce=AllReducePath(custom=False),
    overheads=Overheads(memory_bandwidth_efficiency=0.80, flop_efficiency=0.70, layer_overhead_us=30.0,
                        graph_layer_overhead_us=30.0, step_overhead_us=0.0, step_overhead_per_rank_us=0.0,
                        collective_base_us=25.0),
    sources={
        "memory.fraction": "runtime_reserve 0.10 (docs/planner.md section 5): CUDA context, NCCL buffers",
        "memory.kv_block_tokens": "topoplan/runner/generate.py: one contiguous cache per sequence",
        "memory.reserved_gb": "none beyond the 10% reserve",
        "overheads.memory_bandwidth_efficiency": FT,
        "overheads.flop_efficiency": "kipply's profiled FasterTransformer MLP GEMM efficiency on A100 (0.72)",
        "overheads.layer_overhead_us": FT,
        "overheads.graph_layer_overhead_us": "no CUDA graphs: the eager figure",
        "overheads.step_overhead_us": "no sourced GPU figure; absorbed by the fitted layer overhead",
        "overheads.step_overhead_per_rank_us": "none: every rank runs the same loop (torchrun), no driver",
        "overheads.sequence_overhead_us": "none: the runner's step prepares its batch as tensors, no per-request "
                                          "Python work",
        "overheads.collective_base_us": FT,
    },
    notes="The planner's historical default: an idealised fused-kernel runtime, not a measurement of the runner "
          "on a GPU (no published one exists); `topoplan calibrate` replaces its constants with measured ones.",
    serves=False,  # per-rank lines (torchrun, mpirun, Slurm, shell) from topoplan.launch.formats
    # scheduler: the default, static: topoplan.runner prefills all prompts together, then decodes them together
)

ENGINES = (RUNNER,)
