"""What a serving engine's launch is made of: one server process per node, its environment and its binding.

A serving engine (vLLM, SGLang, TensorRT-LLM) starts its own workers, one per rank, from one command per node
(TRT-LLM: one per rank, under its MPI launcher). So where the bundled runner gets a line per rank, an engine gets
a `NodeCommand` per node; the per-rank facts of the LaunchSpec (GPU, CPUs, NUMA node, NCCL variables) are turned
into what that engine lets us set for the whole node:
- CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD, topoplan.vendors): the node's planned GPUs in local-rank
  order (the spec's own value). Every engine here
  gives worker `local_rank` the device `cuda:local_rank` and orders ranks TP-fastest, then PP, then DP, so each TP
  group lands on the GPUs the planner chose (each engine module says where its source does this);
- CPU/NUMA: an engine process cannot bind its workers one by one from outside, and one wrapper around the
  server binds nothing (its workers span the node's sockets) or, worse, overrides the engine's own binder. So each
  worker's CPUs and NUMA node from topoplan's split (`worker_binding`) reach the engine through its own options
  (vLLM --numa-bind-nodes/--numa-bind-cpus, SGLang --numa-node; TRT-LLM binds its workers itself, or per MPI
  rank); each engine module says what its version offers;
- NCCL variables the spec gives every rank of the node alike (NCCL_P2P_LEVEL, and NCCL_IB_HCA when all ranks of the
  node use the same NICs; a per-rank choice cannot be expressed through one environment and is reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topoplan.cpuset import format_cpu_list
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.device_env import device_env
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.spec import LaunchSpec, NodeSpec
from topoplan.vendors import vendor_of

DEFAULT_HOST = "127.0.0.1"  # serve on loopback unless asked: an open port on every interface is a choice to make
DEFAULT_SERVE_PORT = 8000  # vLLM's, SGLang's (30000 upstream, set explicitly) and trtllm-serve's default HTTP port
DEVICES = ("gpu", "cpu")


@dataclass(frozen=True)
class ServeOptions:
    """How the user wants the engine served: where, from which checkpoint and interpreter, on which device."""

    checkpoint: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_SERVE_PORT
    python: str = "python3"  # the engine's Python (vllm, sglang) or the folder of trtllm-serve via its Python
    device: str = "gpu"
    kv_cache_gib: int = 1  # vLLM CPU: VLLM_CPU_KVCACHE_SPACE
    extra_args: tuple[str, ...] = ()  # appended to the engine's own options, unchecked

    def __post_init__(self) -> None:
        if not self.checkpoint.strip():
            raise TopoplanError("--checkpoint: expected the model folder (or hub name) the engine serves")
        if self.device not in DEVICES:
            raise TopoplanError(f"--device {self.device!r}: expected one of {', '.join(DEVICES)}")
        if not 1 <= self.port <= 65535:
            raise TopoplanError(f"--port {self.port} is not a TCP port (1..65535)")
        if not self.host or any(ch.isspace() or ord(ch) < 32 for ch in self.host):
            raise TopoplanError(f"--host {self.host!r}: expected an address or host name without spaces")
        if self.kv_cache_gib < 1:
            raise TopoplanError(f"--kv-cache-gib must be at least 1, got {self.kv_cache_gib}")
        if not self.python.strip():
            raise TopoplanError("--engine-python: expected a path to the engine's Python interpreter")


@dataclass(frozen=True)
class Option:
    """One engine option topoplan writes, as its words on the command line, with the reason --explain shows."""

    words: tuple[str, ...]
    reason: str


def option_words(options: list[Option]) -> list[str]:
    return [word for option in options for word in option.words]


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: the argv, its environment (each variable with its reason) and whether it serves HTTP."""

    node: int
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]
    serves: bool  # this node's process answers HTTP on host:port (the others only run workers)
    options: tuple[Option, ...] = ()  # the engine options topoplan chose, with their reasons (in argv already)

    def env_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.env}


@dataclass(frozen=True)
class EngineLaunch:
    """A serving engine's launch: the spec it was derived from, the engine, and one command per node."""

    engine: Engine
    spec: LaunchSpec
    options: ServeOptions
    nodes: tuple[NodeCommand, ...]
    device_mapping: str  # one line: how this engine maps its workers to visible devices
    notes: tuple[str, ...] = field(default=())
    # (name, text) of option files the engine reads (TensorRT-LLM's --config YAML): the scripts write them when
    # they run, into the folder argv words name as topoplan.launch.runtime_addr.FILES
    files: tuple[tuple[str, str], ...] = field(default=())

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.options.port}"


@dataclass(frozen=True)
class WorkerBinding:
    """Each of a node's workers' CPUs and NUMA node, in local-rank order (= the engine's visible-GPU order), from
    topoplan's CPU split (topoplan.launch.binding): what the engines' own binders take."""

    cpus: tuple[str, ...] | None  # numactl CPU lists, one per worker; None when a worker has no list
    numa_nodes: tuple[int, ...]  # the memory node of each worker
    policy: str  # the --mem-policy asked for (preferred or bind)

    def where(self) -> str:
        return ", ".join(f"cuda:{i} -> node {n}" + (f" CPUs {self.cpus[i]}" if self.cpus else "")
                         for i, n in enumerate(self.numa_nodes))


def worker_binding(spec: LaunchSpec, node: NodeSpec) -> tuple[WorkerBinding | None, str | None]:
    """The node's per-worker binding, or None with the reason there is none (--mem-policy none, or a topology that
    names no NUMA node for some GPU)."""
    ranks = spec.node_ranks(node.index)
    if ranks and ranks[0].mem_policy == "none":
        return None, "--mem-policy none: no CPU or memory binding, the engine's own default"
    if any(r.mem_node is None for r in ranks):
        return None, (f"node {node.index}: the topology names no NUMA node for "
                      f"{', '.join(r.gpu for r in ranks if r.mem_node is None)}, so the workers are not bound")
    cpus = tuple(format_cpu_list(r.cpus) for r in ranks if r.cpus) if all(r.cpus for r in ranks) else None
    return WorkerBinding(cpus, tuple(r.mem_node for r in ranks), ranks[0].mem_policy), None  # type: ignore[misc]


def node_gpu_env(spec: LaunchSpec, node: NodeSpec) -> tuple[list[EnvVar], list[str]]:
    """GPU selection (the vendor's variables) and NCCL variables for a node's server process, and notes on what
    could not be expressed."""
    ranks = spec.node_ranks(node.index)
    env = device_env(spec.vendor, node.cuda_visible_devices,
                     f"node {node.index}'s planned GPUs in local-rank order: worker local rank i uses cuda:i = "
                     + ", ".join(f"{r.gpu} (rank {r.rank})" for r in ranks))
    notes = []
    for name in ("NCCL_IB_HCA", "NCCL_P2P_LEVEL"):
        found_vars = [next((v for v in r.env if v.name == name), None) for r in ranks]
        values = {v.value if v else None for v in found_vars}
        if len(values) == 1:
            if found_vars[0] is not None:
                env.append(EnvVar(name, found_vars[0].value, f"every rank of node {node.index}: "
                                  + found_vars[0].reason))
        else:
            found = ", ".join(sorted(v or "unset" for v in values))
            notes.append(f"node {node.index}: ranks differ in {name} ({found}); one server environment cannot set "
                         "it per worker, so it is left to NCCL")
    return env, notes


def device_mapping(spec: LaunchSpec, template: str) -> str:
    """An engine's one-line device mapping with the vendor's visible-devices variable in `{visible}`."""
    return template.format(visible=vendor_of(spec.vendor).visible_devices)
