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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from topoplan.cpuset import format_cpu_list
from topoplan.dtypes import dtype_of
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.device_env import device_env
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.netif import check_ifname
from topoplan.launch.runtime_addr import HOST_IP, IFNAME
from topoplan.launch.spec import LaunchSpec, NodeSpec
from topoplan.limits import check_count
from topoplan.vendors import vendor_of

DEFAULT_HOST = "127.0.0.1"  # serve on loopback unless asked: an open port on every interface is a choice to make
DEFAULT_SERVE_PORT = 8000  # vLLM's, SGLang's (30000 upstream, set explicitly) and trtllm-serve's default HTTP port
DEVICES = ("gpu", "cpu")


@dataclass(frozen=True)
class EngineSettings:
    """What the plan assumed of the engine, for its command line: the requests in flight it priced per replica,
    the longest sequence, the KV-cache and weight dtypes and the engine's memory share (topoplan.plan.saved)."""

    max_seqs: int  # requests in flight per replica (the served concurrency, else the priced batch)
    max_model_len: int  # prompt + generated tokens
    dtype: str  # activation dtype the plan priced (bf16, fp16)
    kv_dtype: str  # KV cache dtype (bf16, fp16, fp8)
    weights: str  # weight dtype (bf16, fp16, fp8, int4, mxfp4)
    memory_fraction: float  # the engine's memory share at this TP degree (its MemoryPolicy)
    why: str  # one line: which plan row these come from

    @property
    def fp8_kv(self) -> bool:
        return self.kv_dtype == "fp8"


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
    settings: EngineSettings | None = None  # from `launch --plan FILE --rank N`: what the plan priced
    ifname: str | None = None  # the interface that reaches the other nodes (--ifname, or found by --this-machine)

    def __post_init__(self) -> None:
        if not self.checkpoint.strip():
            raise TopoplanError("--checkpoint: expected the model folder (or hub name) the engine serves")
        if self.device not in DEVICES:
            raise TopoplanError(f"--device {self.device!r}: expected one of {', '.join(DEVICES)}")
        if not 1 <= self.port <= 65535:
            raise TopoplanError(f"--port {self.port} is not a TCP port (1..65535)")
        if not self.host or any(ch.isspace() or ord(ch) < 32 for ch in self.host):
            raise TopoplanError(f"--host {self.host!r}: expected an address or host name without spaces")
        if self.ifname is not None:
            check_ifname(self.ifname)  # written into a double-quoted shell word: a name, never shell syntax
        check_count("--kv-cache-gib", self.kv_cache_gib)
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

    cpus: tuple[str, ...] | None  # numactl CPU lists, one per worker; None when the source lists none
    numa_nodes: tuple[int, ...]  # the memory node of each worker

    def where(self) -> str:
        return ", ".join(f"cuda:{i} -> {n}" for i, n in enumerate(self.numa_nodes))


def worker_binding(spec: LaunchSpec, node: NodeSpec) -> tuple[WorkerBinding | None, str | None]:
    """The node's per-worker binding, or None with the reason there is none (--mem-policy none, or a topology that
    names no NUMA node for some GPU)."""
    ranks = spec.node_ranks(node.index)
    if ranks and ranks[0].mem_policy == "none":
        return None, "--mem-policy none: no CPU or memory binding, the engine's own default"
    if any(r.mem_node is None for r in ranks):
        return None, (f"node {node.index}: the topology names no NUMA node for "
                      f"{', '.join(r.gpu for r in ranks if r.mem_node is None)}, so the workers are not bound")
    unknown = [r.gpu for r in ranks if not r.cpus]
    if unknown and len(unknown) < len(ranks):  # the source lists CPUs for some GPUs only: a narrower cpuset
        return None, (f"node {node.index}: the topology lists no CPU of {', '.join(unknown)} while it lists other "
                      "GPUs' (a container cpuset without their node?): binding them to their NUMA node could name "
                      "CPUs the process may not use, so no worker is bound; run `topoplan doctor` on the host")
    cpus = None if unknown else tuple(format_cpu_list(r.cpus) for r in ranks)  # type: ignore[arg-type]
    return WorkerBinding(cpus, tuple(r.mem_node for r in ranks)), None  # type: ignore[arg-type]


def node_gpu_env(spec: LaunchSpec, node: NodeSpec) -> tuple[list[EnvVar], list[str]]:
    """GPU selection (the vendor's variables) and NCCL variables for a node's server process, and notes on what
    could not be expressed."""
    ranks = spec.node_ranks(node.index)
    order = [int(i) for i in node.cuda_visible_devices.split(",")]
    why = ("permuted from nvidia-smi order: it puts each TP group and stage boundary on the links the placement chose"
           if order != sorted(order) else "nvidia-smi order: no permutation of these GPUs links any group better")
    env = device_env(spec.vendor, node.cuda_visible_devices,
                     f"node {node.index}'s planned GPUs in local-rank order ({why}): worker local rank i uses cuda:i = "
                     + ", ".join(f"{r.gpu} (rank {r.rank})" for r in ranks))
    notes = []
    for name in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_P2P_LEVEL"):
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


def network_env(spec: LaunchSpec, options: ServeOptions, host_ip_var: str | None = None) -> list[EnvVar]:
    """Several nodes: the socket interface NCCL and gloo bootstrap over, and (`host_ip_var`) the node's own address
    on it, which the engine announces to the others. A wrong interface (docker0, a management port) is the most
    common multi-node start-up hang in the engines' trackers. The values are placeholders the scripts fill when
    they run (topoplan.launch.runtime_addr): TOPOPLAN_IFNAME, which --ifname (or --this-machine) sets by default
    and the scripts otherwise ask for, and the address read from it on each node."""
    if len(spec.nodes) < 2:
        return []
    source = f"--ifname {options.ifname}" if options.ifname else "TOPOPLAN_IFNAME, which the script asks for"
    env = [EnvVar("NCCL_SOCKET_IFNAME", IFNAME, f"the interface that reaches the other nodes ({source}): NCCL's "
                  "bootstrap and socket traffic; left to itself NCCL takes the first interface that is up, often a "
                  "container bridge"),
           EnvVar("GLOO_SOCKET_IFNAME", IFNAME, "the same interface for torch.distributed's gloo groups (the engine's "
                  "CPU-side groups), which otherwise resolve the host name, often to loopback")]
    if host_ip_var:
        env.append(EnvVar(host_ip_var, HOST_IP, "this node's IPv4 address on that interface, read when the line runs: "
                          "the address the engine announces to the other nodes"))
    return env


def gpu_node(spec: LaunchSpec, node: NodeSpec, options: ServeOptions,
             bind: Callable[[WorkerBinding], list[Option]], host_ip_var: str | None = None,
             ) -> tuple[list[EnvVar], list[Option], list[str]]:
    """A GPU node's environment (GPU selection, NCCL, the network of several nodes), the engine's binding options
    (`bind` writes the node's WorkerBinding in the engine's terms) and the notes on what could not be set."""
    env, notes = node_gpu_env(spec, node)
    env += network_env(spec, options, host_ip_var)
    binding, why_not = worker_binding(spec, node)
    return env, bind(binding) if binding is not None else [], notes + ([why_not] if why_not else [])


def http_options(options: ServeOptions, node: int) -> list[Option]:
    """Where node 0 serves HTTP; the other nodes serve nothing."""
    if node:
        return []
    return [Option(("--host", options.host), "where node 0 serves HTTP (--host)"),
            Option(("--port", str(options.port)), "node 0's HTTP port (--port)")]


@dataclass(frozen=True)
class SettingsFlags:
    """How one engine's server spells what the plan priced (EngineSettings), with the reasons that are its own.
    `--dtype`, the memory share's option (the engine profile's MemoryPolicy.option), `--kv-cache-dtype` and
    `--quantization fp8` are the same words in every server that takes this form (vLLM, SGLang)."""

    max_seqs: str  # the option for requests in flight per replica
    max_model_len: str  # the option for prompt + generated tokens
    max_model_len_why: str
    memory_why: str
    fp8_kv: str  # --kv-cache-dtype's value for an fp8 cache
    fp8_weights_why: str


def settings_options(s: EngineSettings, memory_option: str, flags: SettingsFlags) -> list[Option]:
    """What the plan priced, as the server's options in the engine's `flags`."""
    out = [Option((flags.max_seqs, str(s.max_seqs)), f"the requests in flight per replica the plan priced ({s.why})"),
           Option((flags.max_model_len, str(s.max_model_len)), flags.max_model_len_why),
           Option(("--dtype", dtype_of(s.dtype).name), f"the activation dtype the plan priced ({s.dtype})"),
           Option((memory_option, f"{s.memory_fraction:g}"), flags.memory_why)]
    if s.fp8_kv:
        out.append(Option(("--kv-cache-dtype", flags.fp8_kv), "the plan priced an fp8 KV cache"))
    if s.weights == "fp8":
        out.append(Option(("--quantization", "fp8"), flags.fp8_weights_why))
    return out


def server_command(node: int, entry: Sequence[str], env: list[EnvVar], chosen: list[Option], *,
                   options: ServeOptions, memory_option: str, flags: SettingsFlags, nodes: list[Option]) -> NodeCommand:
    """One node's server: `entry`, then the engine's layout and binding options (`chosen`), what the plan priced
    (options.settings, in the engine's `flags`), where node 0 serves HTTP and the node's place among several
    (`nodes`), and the user's own arguments last."""
    settings = settings_options(options.settings, memory_option, flags) if options.settings is not None else []
    chosen = [*chosen, *settings, *http_options(options, node), *nodes]
    argv = (*entry, *option_words(chosen), *options.extra_args)
    return NodeCommand(node, argv, tuple(env), serves=node == 0, options=tuple(chosen))


def device_mapping(spec: LaunchSpec, template: str) -> str:
    """An engine's one-line device mapping with the vendor's visible-devices variable in `{visible}`."""
    return template.format(visible=vendor_of(spec.vendor).visible_devices)
