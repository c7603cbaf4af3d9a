"""The KV cache one request moves from its prefill worker to its decode worker, and its price over the real path.

Bytes: every layer's cache for the prompt, as the model stores it (ModelSpec.kv_bytes_per_token: K and V of each
KV head for GQA, the compressed latent plus the shared RoPE key for MLA models such as DeepSeek-V3).

Path, per decode GPU (each receives its own slice, from the prefill GPU of the same rank, all slices at once):
  same node   -> the GPU-GPU link (NVLink, or the PCIe path code), priced as LinkPricer prices that hop, where the
  engine's backend copies by CUDA IPC (vLLM's NIXL/UCX); through the NICs as across nodes where it speaks RDMA only
  (SGLang's Mooncake): Engine.kv_transfer;
  across nodes -> prefill GPU -> its nearest NIC (the PCIe path code: PIX/PXB/NODE, or SYS, which crosses the
  socket link) -> the network at the NIC's speed -> the decode GPU's nearest NIC -> the decode GPU.
A slice's bandwidth is the slowest of its hops, each shared by the slices that cross it at once; its time is
bytes / bandwidth + the hops' latencies; the transfer ends with its slowest slice.

Connector (how the engine sends it): "whole" sends the whole cache after the prefill ends (all of it is in the
TTFT); "per-layer" sends each layer as the prefill finishes it, so only what outlasts the prefill and the last
layer's share is exposed: max(0, transfer - prefill) + transfer / layers. docs/planner.md, "Disaggregated
prefill/decode", gives the formulas and their sources.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from topoplan.engines.engine import GPU_LINK
from topoplan.errors import TopoplanError
from topoplan.models import ModelSpec
from topoplan.plan.calibration import NET
from topoplan.plan.collectives import Hop, LinkPricer
from topoplan.plan.disagg_types import KvRoute, KvTransfer, Worker
from topoplan.topology.model import Topology

CONNECTORS = ("whole", "per-layer")
# What a KV connector adds to each request's transfer beyond moving its bytes (the handshake, the block-descriptor
# exchange, the completion notice): 0.40 ms, fitted on one point, Mooncake's vLLM v1 connector at 128 tokens (0.54 ms
# measured, 0.14 ms of it the bytes as priced here), and checked on that table's other eight points
# (fixtures/validation/pd_transfer.json; docs/planner.md, "Disaggregated prefill/decode").
CONNECTOR_SETUP_US = 400.0


def kv_bytes_per_request(model: ModelSpec, prompt_tokens: int, kv_dtype: str) -> int:
    """The whole model's KV cache for one prompt: layers x KV heads x head dim x 2 (K and V) x tokens x dtype
    bytes (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x tokens x dtype bytes), as one unsharded copy."""
    return model.kv_bytes_per_token(kv_dtype) * prompt_tokens


def kv_routes(topology: Topology) -> dict[str, KvRoute]:
    """Where each GPU's KV traffic leaves it: its nearest NIC, with the PCIe path code between them; a route
    without a NIC when the machine lists none. GPUs that tie for the same nearest NICs (a DGX A100 pair behind
    one PCIe switch with two NICs) take them in turn, in GPU order, so that every such NIC carries traffic
    instead of the first one carrying both; a GPU with a nearest NIC of its own gets that one."""
    shared: dict[tuple[str, ...], int] = {}
    routes = {}
    for gpu in topology.gpus:
        nics = topology.nearest_nics(gpu.id)
        if not nics:
            routes[gpu.id] = KvRoute(gpu.id, None, None, None)
            continue
        ties = tuple(n.id for n in nics)
        turn = shared.get(ties, 0)
        shared[ties] = turn + 1
        nic = nics[turn % len(nics)]
        routes[gpu.id] = KvRoute(gpu.id, nic.id, nic.name, topology.link(gpu.id, nic.id).code)
    return routes


@dataclass(frozen=True)
class _Slice:
    """One decode GPU's share of the cache and the hops it crosses, each with the slices sharing it."""

    src: KvRoute  # the prefill GPU it comes from
    dst: KvRoute  # the decode GPU it goes to
    nbytes: float
    hops: tuple[tuple[Hop, int], ...]  # (hop, slices crossing it at once), prefill side first

    @property
    def gbps(self) -> float:
        return min(hop.bandwidth_gbps / sharing for hop, sharing in self.hops)

    def describe(self) -> str:
        """The slowest hop in words."""
        slowest = min(range(len(self.hops)), key=lambda i: self.hops[i][0].bandwidth_gbps / self.hops[i][1])
        hop = self.hops[slowest][0]
        if len(self.hops) == 1:
            return f"{hop.code} {self.src.gpu} -> {self.dst.gpu}"
        if hop.link_class == NET:
            return f"network {self.src.nic_name or self.src.nic} -> {self.dst.nic_name or self.dst.nic}"
        route = self.src if slowest == 0 else self.dst
        return f"{hop.code} hop {route.gpu} <-> {route.nic_name or route.nic}"

    @property
    def us(self) -> float:
        return self.nbytes / (self.gbps * 1e3) + sum(hop.alpha_us for hop, _ in self.hops)


def _replica(worker: Worker) -> tuple[KvRoute, ...]:
    """The routes of the GPUs one request's KV cache lives on: one replica's tp x pp ranks (the first, in rank
    order); a worker with attention DP (dp > 1) holds each request on one of its replicas only."""
    return worker.routes[:worker.layout.tp * worker.layout.pp]


def _pairs(src: Worker, dst: Worker) -> list[tuple[KvRoute, KvRoute]]:
    """(prefill GPU, decode GPU) per decode rank of the replica the request lands on: rank i pulls from the
    prefill replica's rank i mod its GPUs."""
    sender = _replica(src)
    return [(sender[i % len(sender)], route) for i, route in enumerate(_replica(dst))]


def _need_nic(route: KvRoute, worker: Worker) -> str:
    if route.nic is None:
        raise TopoplanError(f"no NIC for a cross-node KV transfer: {worker.name}'s {route.gpu} on node {worker.node} "
                            "has none listed (the topology names no NIC); place prefill and decode on one node or "
                            "give a topology with its NICs")
    return route.nic


def _slices(pricer: LinkPricer, src: Worker, dst: Worker, per_gpu: float, same_node: str) -> list[_Slice]:
    pairs = _pairs(src, dst)
    senders = Counter(s.gpu for s, _ in pairs)
    if src.node == dst.node and (same_node == GPU_LINK or not all(s.nic and d.nic for s, d in pairs)):
        return [_Slice(s, d, per_gpu, ((pricer.hop((0, s.gpu), (0, d.gpu)), senders[s.gpu]),)) for s, d in pairs]
    out_nic = Counter(_need_nic(s, src) for s, _ in pairs)
    in_nic = Counter(_need_nic(d, dst) for _, d in pairs)
    net = pricer.net(1)
    slices = []
    for s, d in pairs:
        hops = ((pricer.hop((0, s.gpu), (0, s.nic)), senders[s.gpu]),
                (net, max(out_nic[s.nic], in_nic[d.nic])),
                (pricer.hop((0, d.nic), (0, d.gpu)), 1))
        slices.append(_Slice(s, d, per_gpu, hops))
    return slices


def price_transfer(pricer: LinkPricer, model: ModelSpec, prompt_tokens: int, kv_dtype: str, src: Worker,
                   dst: Worker, connector: str = "whole", prefill_ms: float = 0.0,
                   setup_us: float = CONNECTOR_SETUP_US, same_node: str = GPU_LINK) -> KvTransfer:
    """The KV cache of one request moved from prefill worker `src` to decode worker `dst` (each GPU's traffic
    through `routes`, the GPUs' nearest NICs), under `connector`; `prefill_ms` is how long the prefill that the
    per-layer connector overlaps takes. Each decode GPU receives the cache its TP rank keeps for its stage's
    layers (ModelSpec.kv_bytes_per_token at the decode TP: heads split, or the MLA latent whole on every rank).
    A worker with attention DP (dp > 1) sends and receives each request on one of its replicas (tp x pp GPUs).
    `same_node`: the engine's path between workers of one node (Engine.kv_transfer.same_node): the GPU-GPU link, or
    out and back in through the GPUs' NICs as across nodes (where every GPU lists one; else the GPU link).
    `setup_us`: the connector's fixed cost per request, paid once after the last byte (0 for a bare transfer, as
    `bench --kv-transfer` measures)."""
    if connector not in CONNECTORS:
        raise TopoplanError(f"KV connector {connector!r}: expected one of {', '.join(CONNECTORS)}")
    total = kv_bytes_per_request(model, prompt_tokens, kv_dtype)
    per_gpu = model.kv_bytes_per_token(kv_dtype, dst.layout.tp) * prompt_tokens / dst.layout.pp
    slices = _slices(pricer, src, dst, per_gpu, same_node)
    slowest = max(slices, key=lambda s: s.us)
    ms = (slowest.us + setup_us) / 1e3
    moving_s = max(slowest.us - sum(hop.alpha_us for hop, _ in slowest.hops), 1e-3) / 1e6
    path = f"{slowest.describe()} at {slowest.gbps:.1f} GB/s, {len(slices)} slice(s) at once"
    moved = slowest.us / 1e3
    exposed = ms if connector == "whole" else max(0.0, moved - prefill_ms) + moved / model.layers + setup_us / 1e3
    # every decode GPU of the replica receives its slice at once (a worker spanning nodes: each node's slices on
    # its own NICs)
    return KvTransfer(total, path, per_gpu * len(slices) / moving_s / 1e9, ms, exposed, connector)
