"""TensorRT-LLM's own command line for a planned layout (`trtllm-serve`, checked against the option list of
NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py in tests/data/engines).

The server is `trtllm-serve CKPT --tp_size T --pp_size P --host H --port N`, written as `PYTHON -m
tensorrt_llm.commands.serve serve ...` (the same click command the console script runs) so the interpreter can
be chosen. One node: trtllm-serve starts its own MPI workers. Several nodes: every rank is an MPI process,
started by Open MPI (`mpirun ... trtllm-llmapi-launch trtllm-serve ...`, run on node 0) or Slurm (`srun
--mpi=pmix ...`); MPI rank 0 serves HTTP and the others wait for work from it.

Workers and devices (tensorrt_llm/mapping.py, `Mapping.local_rank = rank % gpus_per_node`, and the worker's
`torch.cuda.set_device(local_rank)`): ranks are TP-fastest, then PP, and the rank's device is `cuda:local_rank`,
so the node's CUDA_VISIBLE_DEVICES in our local-rank order puts every TP group on its planned GPUs, with
`--gpus_per_node` set to the ranks per node. trtllm-serve has no data parallelism for dense models: a dp > 1
layout is refused (start one server per replica). Under mpirun each rank also gets its own numactl binding.
"""

from __future__ import annotations

from dataclasses import replace

from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.engines.common import (
    EngineLaunch,
    NodeCommand,
    ServeOptions,
    device_mapping,
    node_binding,
    node_gpu_env,
)
from topoplan.launch.spec import LaunchSpec, require_master_addr, require_node_blocks

SERVER_MODULE = "tensorrt_llm.commands.serve"
MPI_WRAPPER = "trtllm-llmapi-launch"  # TRT-LLM's wrapper that turns MPI ranks > 0 into workers of rank 0's server
DEVICE_MAPPING = ("TensorRT-LLM: rank r uses cuda:(r % gpus_per_node) of {visible}; ranks are TP-fastest, "
                  "then PP; node n runs the n-th contiguous block of ranks")


def server_argv(spec: LaunchSpec, options: ServeOptions) -> list[str]:
    layout = spec.layout
    return [options.python, "-m", SERVER_MODULE, "serve", options.checkpoint,
            "--tp_size", str(layout.tp), "--pp_size", str(layout.pp),
            *(["--ep_size", str(layout.ep)] if layout.ep > 1 else []),  # MoE experts over ep of the tp ranks
            "--gpus_per_node", str(len(spec.nodes[0].ranks)),
            "--host", options.host, "--port", str(options.port), *options.extra_args]


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One trtllm-serve for one node; for several nodes, one MPI process per rank (EngineLaunch.mpi_spec)."""
    if options.device != "gpu":
        raise TopoplanError("TensorRT-LLM runs on NVIDIA GPUs only (--device gpu)")
    if spec.layout.dp > 1:
        raise TopoplanError(f"TensorRT-LLM: trtllm-serve has no data parallelism for dense models ({spec.layout}): "
                            "start one server per replica with a dp=1 layout")
    require_node_blocks(spec, "TensorRT-LLM")
    argv = server_argv(spec, options)
    if len(spec.nodes) == 1:
        node = spec.nodes[0]
        env, notes = node_gpu_env(spec, node)
        command = NodeCommand(0, (*node_binding(spec, node), *argv), tuple(env), serves=True)
        return EngineLaunch(engine, spec, options, (command,), device_mapping(spec, DEVICE_MAPPING), tuple(notes))
    require_master_addr(spec, "TensorRT-LLM over several nodes")
    return EngineLaunch(engine, mpi_spec(spec, argv), options, (), device_mapping(spec, DEVICE_MAPPING),
                        ("several nodes: every rank is an MPI process (mpirun or srun); MPI rank 0 serves HTTP",))


def mpi_spec(spec: LaunchSpec, argv: list[str]) -> LaunchSpec:
    """The per-rank spec whose command is the engine under TRT-LLM's MPI wrapper: the mpirun and srun renderers
    give every rank its GPU order, binding and NCCL variables, as for the bundled runner."""
    return replace(spec, command=(MPI_WRAPPER, *argv))
