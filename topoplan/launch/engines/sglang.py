"""SGLang's own command line for a planned layout (checked against SGLang 0.5.23's parser, tests/data/engines).

The server: `PYTHON -m sglang.launch_server --model-path CKPT --tp-size T --pp-size P --dp-size D --host H
--port N`; several nodes add `--nnodes N --node-rank n --dist-init-addr A:M` on every node (node 0 serves HTTP,
the others run their schedulers only).

Workers and devices (sglang/srt/entrypoints/engine.py `_calculate_rank_ranges`, weight_cache/protocol.py
`compute_local_gpu_id`, managers/data_parallel_controller.py): the worker of (pp_rank, tp_rank) uses local GPU
`base_gpu_id + (pp_rank % pp_per_node) * tp_per_node + tp_rank % tp_per_node` (gpu_id_step 1), DP replica d
starts at `base_gpu_id = d * tp * pp`, and node n holds the n-th contiguous block of (pp, tp) ranks: TP fastest,
then PP, then DP, as in topoplan.layout. So the node's CUDA_VISIBLE_DEVICES in our local-rank order puts every TP
group on its planned GPUs. SGLang spreads DP replicas over nodes only with DP attention, so dp > 1 is emitted for
one node only. SGLang is launched here for GPUs only (its CPU backend needs its own build).
"""

from __future__ import annotations

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
from topoplan.layout import Layout

SERVER_MODULE = "sglang.launch_server"
DEVICE_MAPPING = ("SGLang: worker (pp_rank, tp_rank) of DP replica d uses local GPU d*tp*pp + pp_rank*tp_per_node + "
                  "tp_rank of {visible}; node n runs the n-th contiguous block of ranks")


def _parallel_args(layout: Layout) -> list[str]:
    """SGLang's sizes. With expert parallel over replicas (ep = tp x dp) SGLang runs them as DP attention inside
    one server: its --tp-size is then every GPU of a stage (tp x dp), --dp-size the attention replicas, and
    --ep-size the ranks the experts are sharded over (SGLang server_args: enable_dp_attention, ep_size)."""
    sizes = ["--pp-size", str(layout.pp)]
    if layout.ep == 1:
        return ["--tp-size", str(layout.tp), *sizes, "--dp-size", str(layout.dp)]
    if layout.dp == 1:
        return ["--tp-size", str(layout.tp), *sizes, "--ep-size", str(layout.ep)]
    if layout.ep != layout.tp * layout.dp:
        raise TopoplanError(f"SGLang: {layout}: with data parallelism, expert parallel spans the DP-attention "
                            f"group of tp x dp = {layout.tp * layout.dp} GPUs; use ep={layout.tp * layout.dp}")
    return ["--tp-size", str(layout.ep), *sizes, "--dp-size", str(layout.dp), "--enable-dp-attention",
            "--ep-size", str(layout.ep)]


def engine_launch(engine: Engine, spec: LaunchSpec, options: ServeOptions) -> EngineLaunch:
    """One SGLang server per node; node 0 serves on options.host:options.port."""
    if options.device != "gpu":
        raise TopoplanError("SGLang is launched for GPUs only (--device gpu); its CPU backend is a separate build")
    require_node_blocks(spec, "SGLang")
    layout, nnodes = spec.layout, len(spec.nodes)
    if nnodes > 1 and layout.dp > 1:
        raise TopoplanError(f"SGLang: {layout} over {nnodes} nodes: SGLang spreads data-parallel replicas over nodes "
                            "only with DP attention; launch one server per replica, or dp=1 over several nodes")
    common = [*_parallel_args(layout), "--host", options.host, "--port", str(options.port)]
    if nnodes > 1:
        master = require_master_addr(spec, "SGLang")
        common += ["--nnodes", str(nnodes), "--dist-init-addr", f"{master}:{spec.master_port}"]
    commands, notes = [], []
    for node in spec.nodes:
        env, node_notes = node_gpu_env(spec, node)
        notes += node_notes
        rank_args = ["--node-rank", str(node.index)] if nnodes > 1 else []
        argv = (*node_binding(spec, node), options.python, "-m", SERVER_MODULE, "--model-path", options.checkpoint,
                *common, *rank_args, *options.extra_args)
        commands.append(NodeCommand(node.index, argv, tuple(env), serves=node.index == 0))
    return EngineLaunch(engine, spec, options, tuple(commands), device_mapping(spec, DEVICE_MAPPING), tuple(notes))
