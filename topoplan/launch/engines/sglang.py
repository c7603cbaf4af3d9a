"""SGLang's own command line for a planned layout (checked against SGLang 0.5.23's parser, tests/data/engines).

The server: `PYTHON -m sglang.launch_server --model-path CKPT --tp-size T --pp-size P --dp-size D --host H
--port N`; several nodes add `--nnodes N --node-rank n --dist-init-addr A:M` on every node (node 0 serves HTTP,
the others run their schedulers only).

Workers and devices (sglang/srt/entrypoints/engine.py `_calculate_rank_ranges`, weight_cache/protocol.py
`compute_local_gpu_id`, managers/data_parallel_controller.py): the worker of (pp_rank, tp_rank) uses local GPU
`base_gpu_id + (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node` (gpu_id_step 1), DP replica d
starts at `base_gpu_id = d * tp * pp`, and node n holds the n-th contiguous block of (pp, tp) ranks: TP fastest,
then PP, then DP, as in topoplan.layout. So the node's CUDA_VISIBLE_DEVICES in our local-rank order puts every TP
group on its planned GPUs. SGLang spreads DP replicas over nodes only with DP attention (`--enable-dp-attention`,
the DeepSeek recipe: an MoE model with ep = tp x dp), so other dp > 1 layouts are emitted for one node only.
Binding: `--numa-node` takes each GPU's NUMA node (one per GPU, in local order). SGLang is launched here for GPUs
only (its CPU backend needs its own build).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

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

SERVER_MODULE = "sglang.launch_server"
DEVICE_MAPPING = ("SGLang: worker (pp_rank, tp_rank) of DP replica d uses local GPU d*tp*pp + pp_rank*tp_per_node + "
                  "tp_rank of {visible}; node n runs the n-th contiguous block of ranks")


def _parallel(layout: Layout) -> list[Option]:
    """SGLang's sizes. With expert parallel over replicas (ep = tp x dp) SGLang runs them as DP attention inside
    one server: its --tp-size is then every GPU of a stage (tp x dp), --dp-size the attention replicas, and
    --ep-size the ranks the experts are sharded over (SGLang server_args: enable_dp_attention, ep_size)."""
    pp = Option(("--pp-size", str(layout.pp)), "the plan's pipeline stages")
    if layout.ep == 1:
        return [Option(("--tp-size", str(layout.tp)), "the plan's TP degree"), pp,
                Option(("--dp-size", str(layout.dp)), "the plan's replicas, behind SGLang's DP controller")]
    if layout.dp == 1:
        return [Option(("--tp-size", str(layout.tp)), "the plan's TP degree"), pp,
                Option(("--ep-size", str(layout.ep)), f"the plan shards the experts over {layout.ep} of the TP ranks")]
    if layout.ep != layout.tp * layout.dp:
        raise TopoplanError(f"SGLang: {layout}: with data parallelism, expert parallel spans the DP-attention "
                            f"group of tp x dp = {layout.tp * layout.dp} GPUs; use ep={layout.tp * layout.dp}")
    return [Option(("--tp-size", str(layout.ep)), f"SGLang's TP group under DP attention is every GPU of a stage "
                   f"(tp x dp = {layout.ep})"), pp,
            Option(("--dp-size", str(layout.dp)), f"{layout.dp} attention replicas of tp={layout.tp} each"),
            Option(("--enable-dp-attention",), "attention runs data-parallel (each replica its own KV cache, no KV "
                   "duplication across the TP group), the MoE layers expert-parallel: the plan's ep = tp x dp"),
            Option(("--ep-size", str(layout.ep)), f"the experts sharded over all {layout.ep} GPUs of the stage")]


# What the plan priced, as SGLang's options (sglang/srt/server_args.py).
SETTINGS = SettingsFlags(
    "--max-running-requests", "--context-length", "prompt + generated tokens the plan priced",
    "the static memory share (weights and KV pool) the plan's memory check used at this TP degree (SGLang's default)",
    "fp8_e4m3", "the plan priced fp8 weights")


def _binding(binding: WorkerBinding) -> list[Option]:
    return [Option(("--numa-node", *map(str, binding.numa_nodes)),
                   f"each GPU's NUMA node in local-rank order ({binding.where()}): SGLang binds each GPU's scheduler "
                   "and worker process to its node's CPUs and memory before it allocates; it takes no CPU list, so "
                   "workers of one node share its CPUs")]


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One SGLang server per node; node 0 serves on options.host:options.port."""
    if options.device != "gpu":
        raise TopoplanError("SGLang is launched for GPUs only (--device gpu); its CPU backend is a separate build")
    require_node_blocks(spec, "SGLang")
    layout, nnodes = spec.layout, len(spec.nodes)
    if nnodes > 1 and layout.dp > 1 and layout.ep == 1:
        raise TopoplanError(f"SGLang: {layout} over {nnodes} nodes: SGLang spreads data-parallel replicas over nodes "
                            "only with DP attention (an MoE model with ep = tp x dp); launch one server per replica, "
                            "or dp=1 over several nodes")
    master = require_master_addr(spec, "SGLang") if nnodes > 1 else None
    commands, notes = [], []
    entry = (options.python, "-m", SERVER_MODULE, "--model-path", options.checkpoint)
    for node in spec.nodes:
        env, bound, node_notes = gpu_node(spec, node, options, _binding)
        notes += node_notes
        spans = [Option(("--nnodes", str(nnodes)), "the nodes the server spans"),
                 Option(("--node-rank", str(node.index)), f"this is node {node.index}"),
                 Option(("--dist-init-addr", f"{master}:{spec.master_port}"), "node 0's rendezvous address")
                 ] if nnodes > 1 else []
        commands.append(server_command(node.index, entry, env, _parallel(layout) + bound, options=options,
                                       memory_option=engine.memory.option, flags=SETTINGS, nodes=spans))
    if layout.ep > 1:
        notes.append("expert parallelism: SGLang's default MoE exchange works with any install; --moe-a2a-backend "
                     "deepep (with --enable-eplb for skewed routing) is faster across nodes where DeepEP is installed: "
                     "add them after --")
    return EngineLaunch(engine, spec, options, tuple(commands), device_mapping(spec, DEVICE_MAPPING), tuple(notes))


# --- disaggregated prefill/decode (launch --disagg; topoplan.launch.engines.disagg) ---------------------------------
# SGLang's PD disaggregation (sglang/srt/disaggregation, server_args.py; the router in sgl-project/sglang
# sgl-model-gateway/bindings/python/src/sglang_router/router_args.py): each worker is its own launch_server with
# --disaggregation-mode prefill|decode; the KV cache moves over Mooncake's RDMA transfer engine, which takes each GPU's
# IB device from --disaggregation-ib-device; the router sends each request to a prefill and a decode worker and tells
# the decode worker the prefill's bootstrap address (the prefill URL's host and its bootstrap port).
ROUTER_MODULE = "sglang_router.launch_router"
BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port; prefill worker i takes 8998 + i
TRANSFER_BACKEND = "mooncake"  # SGLang's default backend, the one that takes a per-GPU IB device map
DISAGG_HOST_VAR = "SGLANG_HOST_IP"  # the address SGLang announces (sglang/srt/utils: get_local_ip_auto reads it)


def _ib_devices(names: tuple[str | None, ...]) -> Option | None:
    """--disaggregation-ib-device: SGLang reads a JSON object from local GPU id (the CUDA index after
    CUDA_VISIBLE_DEVICES, its gpu_id) to that GPU's devices, or one comma list that every GPU of the worker then
    shares (get_ib_devices_for_gpu in sglang/srt/disaggregation/mooncake). The map pins each GPU to its nearest
    NIC; a shared list would let Mooncake send a GPU's KV through another GPU's NIC."""
    if not names or any(n is None for n in names):
        return None
    if len(names) == 1:
        value = names[0]
    else:
        value = json.dumps({str(i): name for i, name in enumerate(names)}, separators=(",", ":"))
    where = ", ".join(f"cuda:{i} -> {name}" for i, name in enumerate(names))
    return Option(("--disaggregation-ib-device", value), f"each GPU's KV transfer leaves by its nearest NIC ({where}), "
                  "keyed by the worker's local GPU index: the plan's routes, so no two GPUs' KV share a NIC where the "
                  "machine has one per GPU and none crosses the socket to a far NIC")  # type: ignore[arg-type]


def disagg_worker(engine: Engine, slot: WorkerSlot, options: ServeOptions,
                  ) -> tuple[list[str], list[EnvVar], list[Option], list[int]]:
    """One prefill or decode worker: SGLang's sizes, binding and plan settings as for a normal launch, its own HTTP
    port, and the disaggregation options; and the ports it takes besides its HTTP port (a prefill's bootstrap)."""
    w = slot.worker
    chosen = slot.server_options(engine, options, SETTINGS, _parallel(w.layout), _binding)
    chosen += [Option(("--disaggregation-mode", w.role), f"this server runs the {w.role} phase only; the router pairs "
                      "it with a worker of the other phase"),
               Option(("--disaggregation-transfer-backend", TRANSFER_BACKEND), "Mooncake's RDMA transfer engine "
                      "moves the KV cache (SGLang's default), and takes the per-GPU device map below")]
    ib = _ib_devices(slot.nic_names)
    if ib is not None:
        chosen.append(ib)
    ports = [BOOTSTRAP_PORT + w.index] if w.role == "prefill" else []
    if ports:
        chosen.append(Option(("--disaggregation-bootstrap-port", str(ports[0])),
                             f"where decode workers fetch {w.name}'s KV layout and addresses ({BOOTSTRAP_PORT} + its "
                             "index: every prefill server on a node needs its own); the router passes it on"))
    argv = [options.python, "-m", SERVER_MODULE, "--model-path", options.checkpoint, *option_words(chosen),
            *options.extra_args]
    return argv, list(slot.env), chosen, ports


def disagg_router(workers: Sequence[Process], options: ServeOptions,
                  ) -> tuple[list[str], list[EnvVar], list[Option], str]:
    """SGLang's router in PD mode, in front of every worker: `--prefill URL BOOTSTRAP_PORT` per prefill worker,
    `--decode URL` per decode worker."""
    chosen = [Option(("--pd-disaggregation",), "route each request to a prefill and a decode worker")]
    for w in workers:
        if w.role == "prefill":
            chosen.append(Option(("--prefill", f"http://{w.address}:{w.port}", str(BOOTSTRAP_PORT + w.index)),
                                 f"{w.name} on GPUs {','.join(w.gpus)}, with its bootstrap port"))
        else:
            chosen.append(Option(("--decode", f"http://{w.address}:{w.port}"), f"{w.name} on GPUs {','.join(w.gpus)}"))
    chosen += [Option(("--host", options.host), "where the deployment answers HTTP (--host)"),
               Option(("--port", str(options.port)), "the deployment's HTTP port (--port)")]
    argv = [options.python, "-m", ROUTER_MODULE, *option_words(chosen)]
    return argv, [], chosen, ("SGLang's router (sglang_router, installed with sglang) in PD mode, from the engine's "
                              "Python")
