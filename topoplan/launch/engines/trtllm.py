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
`--gpus_per_node` set to the ranks per node. trtllm-serve runs data parallelism only as attention DP of an MoE
model (tp 1, ep = dp, `enable_attention_dp: true` in the `--config` YAML the script writes); other dp > 1 layouts
are refused (start one server per replica), and the planner ranks none for it (Parallelism.attention_dp_tp).

Binding (TensorRT-LLM's "CPU Affinity configuration" guide): one node, `TLLM_NUMA_AWARE_WORKER_AFFINITY=1` makes
TRT-LLM bind each worker it starts to its GPU's NUMA-local CPUs; over several nodes every MPI rank gets topoplan's
numactl binding and `TLLM_NUMA_AWARE_WORKER_AFFINITY=0`, without which TRT-LLM clears an affinity set outside it.
"""

from __future__ import annotations

from dataclasses import replace

from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.engines.common import (
    EngineLaunch,
    EngineSettings,
    NodeCommand,
    Option,
    ServeOptions,
    device_mapping,
    node_gpu_env,
    option_words,
    worker_binding,
)
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.runtime_addr import FILES
from topoplan.launch.spec import LaunchSpec, require_master_addr, require_node_blocks
from topoplan.layout import Layout
from topoplan.vendors import vendor_of

SERVER_MODULE = "tensorrt_llm.commands.serve"
MPI_WRAPPER = "trtllm-llmapi-launch"  # TRT-LLM's wrapper that turns MPI ranks > 0 into workers of rank 0's server
DEVICE_MAPPING = ("TensorRT-LLM: rank r uses cuda:(r % gpus_per_node) of {visible}; ranks are TP-fastest, "
                  "then PP; node n runs the n-th contiguous block of ranks")


EXTRA_OPTIONS = "trtllm-extra-llm-api-options.yaml"  # --config: LLM API options the command line has no flag for
AFFINITY = "TLLM_NUMA_AWARE_WORKER_AFFINITY"  # tensorrt_llm/executor/base_worker.py _configure_affinity


def _attention_dp(layout: Layout) -> bool:
    """An MoE layout whose replicas TRT-LLM runs as attention DP: every rank its own attention (tp 1), the experts
    over all of them (ep = dp); Parallelism.attention_dp_tp lets the planner rank only these dp > 1 layouts."""
    return layout.dp > 1 and layout.tp == 1 and layout.ep == layout.dp


def _options(spec: LaunchSpec, options: ServeOptions) -> list[Option]:
    layout, per_node = spec.layout, len(spec.nodes[0].ranks)
    if _attention_dp(layout):
        chosen = [Option(("--tp_size", str(layout.dp)), f"attention DP: TRT-LLM's TP size is every rank of the stage "
                         f"({layout.dp}), each running its own attention"),
                  Option(("--ep_size", str(layout.ep)), f"the experts sharded over all {layout.ep} ranks (the plan's "
                         "ep)"),
                  Option(("--config", f"{FILES}/{EXTRA_OPTIONS}"), "enable_attention_dp: true, which has no flag: "
                         "the script writes the YAML (with any other LLM API option the plan needs) when it runs")]
    else:
        chosen = [Option(("--tp_size", str(layout.tp)), "the plan's TP degree")]
        if layout.ep > 1:
            chosen.append(Option(("--ep_size", str(layout.ep)), f"the plan shards the experts over {layout.ep} of "
                                 "the TP ranks"))
    return [*chosen, Option(("--pp_size", str(layout.pp)), "the plan's pipeline stages"),
            Option(("--gpus_per_node", str(per_node)), f"{per_node} ranks per node: rank r uses cuda:(r % "
                   f"{per_node}) of the node's visible GPUs, the placement's order"),
            Option(("--host", options.host), "where MPI rank 0 serves HTTP (--host)"),
            Option(("--port", str(options.port)), "its HTTP port (--port)")]


def _settings(s: EngineSettings, memory_option: str) -> tuple[list[Option], list[str], list[str]]:
    """What the plan priced, as trtllm-serve's options, lines of its --config YAML, and notes."""
    chosen = [Option(("--max_batch_size", str(s.max_seqs)), f"the requests in flight the plan priced ({s.why})"),
              Option(("--max_seq_len", str(s.max_model_len)), "prompt + generated tokens the plan priced"),
              Option((memory_option, f"{s.memory_fraction:g}"), "the share of free memory for the KV cache the "
                     "plan's memory check used (TensorRT-LLM's default)")]
    yaml = ["kv_cache_config:", "  dtype: fp8"] if s.fp8_kv else []
    notes = [f"TensorRT-LLM reads the weight quantisation ({s.weights}) from the checkpoint (ModelOpt): serve an "
             f"{s.weights} checkpoint"] if s.weights not in ("bf16", "fp16") else []
    return chosen, yaml, notes


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One trtllm-serve for one node; for several nodes, one MPI process per rank (EngineLaunch.mpi_spec)."""
    if options.device != "gpu" or vendor_of(spec.vendor).name != "nvidia":
        raise TopoplanError(f"TensorRT-LLM runs on NVIDIA GPUs only; this launch is for "
                            f"{'CPUs' if options.device != 'gpu' else vendor_of(spec.vendor).name + ' GPUs'}: "
                            "choose vllm or sglang")
    layout = spec.layout
    if layout.dp > 1 and not _attention_dp(layout):
        raise TopoplanError(f"TensorRT-LLM: trtllm-serve runs data parallelism only as attention DP of an MoE model "
                            f"(tp=1, ep=dp), not {layout}: start one server per replica with a dp=1 layout")
    require_node_blocks(spec, "TensorRT-LLM")
    chosen = _options(spec, options)
    yaml, plan_notes = ["enable_attention_dp: true"] if _attention_dp(layout) else [], []
    if options.settings is not None:
        more, lines, plan_notes = _settings(options.settings, engine.memory.option)
        chosen, yaml = [*chosen, *more], [*yaml, *lines]
    if yaml and not _attention_dp(layout):
        chosen.append(Option(("--config", f"{FILES}/{EXTRA_OPTIONS}"), "LLM API options without a flag (the KV "
                             "cache dtype): the script writes the YAML when it runs"))
    argv = [options.python, "-m", SERVER_MODULE, "serve", options.checkpoint, *option_words(chosen),
            *options.extra_args]
    files = ((EXTRA_OPTIONS, "\n".join(yaml) + "\n"),) if yaml else ()
    mapping = device_mapping(spec, DEVICE_MAPPING)
    if len(spec.nodes) == 1:
        node = spec.nodes[0]
        env, notes = node_gpu_env(spec, node)
        notes += plan_notes
        binding, why_not = worker_binding(spec, node)
        if binding is not None:
            env.append(EnvVar(AFFINITY, "1", "trtllm-serve starts its MPI workers itself, so TRT-LLM binds each to "
                              "its GPU's NUMA-local CPUs (NVML's affinity: the whole node's, not topoplan's finer "
                              f"split; nodes {binding.where()}); it sets no memory policy"))
        notes += [why_not] if why_not else []
        command = NodeCommand(0, tuple(argv), tuple(env), serves=True, options=tuple(chosen))
        return EngineLaunch(engine, spec, options, (command,), mapping, tuple(notes), files)
    require_master_addr(spec, "TensorRT-LLM over several nodes")
    if files:
        raise TopoplanError("TensorRT-LLM attention DP over several nodes reads its --config YAML on every node: write "
                            "`enable_attention_dp: true` to a shared path and pass `--config PATH` after --")
    if options.ifname is None:
        raise TopoplanError("TensorRT-LLM over several nodes: every MPI rank's NCCL and gloo must bootstrap over the "
                            "interface that reaches the other nodes: pass --ifname IF (or launch on node 0 with "
                            "--this-machine to find it)")
    notes = ["several nodes: every rank is an MPI process (mpirun or srun); MPI rank 0 serves HTTP"]
    return EngineLaunch(engine, mpi_spec(spec, argv, options.ifname), options, (), mapping, tuple(notes))


def mpi_spec(spec: LaunchSpec, argv: list[str], ifname: str) -> LaunchSpec:
    """The per-rank spec whose command is the engine under TRT-LLM's MPI wrapper: the mpirun and srun renderers
    give every rank its GPU order, numactl binding and NCCL variables, as for the bundled runner, and each rank
    keeps that binding (TRT-LLM would otherwise clear an affinity set from outside)."""
    keep = EnvVar(AFFINITY, "0", "keep the per-rank numactl binding topoplan computed: with the variable unset, "
                  "TRT-LLM clears an affinity constrained from outside")
    sockets = [EnvVar(name, ifname, f"--ifname: the interface that reaches the other nodes, for {what}")
               for name, what in (("NCCL_SOCKET_IFNAME", "NCCL's bootstrap"), ("GLOO_SOCKET_IFNAME", "gloo groups"))]
    ranks = tuple(replace(r, env=(*r.env, *([keep] if r.cpus is not None or r.cpu_node is not None else []),
                                  *sockets)) for r in spec.ranks)
    return replace(spec, command=(MPI_WRAPPER, *argv), ranks=ranks)
