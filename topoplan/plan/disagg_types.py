"""The disaggregated plan's shape: prefill and decode workers, each on its own GPUs, and the NIC each GPU's KV cache
leaves through. `plan --disagg` builds it (topoplan.plan.disagg), `launch --disagg` writes each engine's worker
groups and router from it (topoplan.launch.engines), and `--json` prints it: one shape for all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topoplan.layout import Layout

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class KvRoute:
    """Where one GPU's KV traffic leaves the GPU: its nearest NIC (Topology.nearest_nics; GPUs tying for the same
    NICs take them in turn, topoplan.plan.kv_transfer.kv_routes) and the PCIe path code between them; nic None when
    the machine lists no NIC (the transfer stays on the node)."""

    gpu: str  # "GPU3", nvidia-smi numbering
    nic: str | None  # "NIC2"
    nic_name: str | None  # the device name the engines take ("mlx5_2"); None when the source names none
    link: str | None  # GPU -> NIC path code: "PIX", "PXB", "PHB", "NODE" or "SYS"


@dataclass(frozen=True)
class Worker:
    """One engine server of the deployment: a prefill or a decode worker, with its own TP/PP/EP layout on its own
    GPUs of one node (dp 1: DP is more workers, or the engine's attention DP inside one worker via layout.dp)."""

    role: str  # "prefill" | "decode"
    index: int  # 0.. within its role
    node: int  # 0.. the node it runs on
    layout: Layout
    gpus: tuple[str, ...]  # its GPUs in rank order: the worker's CUDA_VISIBLE_DEVICES, as nvidia-smi ids
    cpus: tuple[int, ...]  # the CPUs it is bound to (its GPUs' NUMA nodes); () when the source gives no affinity
    numa_nodes: tuple[int, ...]  # its GPUs' NUMA nodes
    routes: tuple[KvRoute, ...]  # one per GPU, in `gpus` order
    nodes: int = 1  # nodes it spans from `node` (a layout larger than a node: the same `gpus` on each)

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"


@dataclass(frozen=True)
class KvTransfer:
    """The KV cache one request moves from its prefill worker to its decode worker, priced over the path between
    them."""

    bytes_per_request: int  # layers x KV heads x head dim x 2 (K and V) x prompt tokens x KV dtype bytes
    path: str  # the slowest hop, in words ("NVLink NV18", "NIC mlx5_0 (PIX) at 50 GB/s", "SYS hop then NIC ...")
    gbps: float  # the path's bandwidth, GB/s, one direction, per request's transfer
    ms: float  # bytes / bandwidth + latency: the whole cache at once
    exposed_ms: float  # what TTFT pays: all of `ms` for a whole-cache connector, the last layer's for a
    # layer-by-layer one that overlaps the prefill
    connector: str  # how it is sent: "whole" or "per-layer" (the engine's KV connector)


@dataclass(frozen=True)
class DisaggServed:
    """The deployment's served figures: TTFT = prefill + exposed transfer; TPOT of the decode workers; delivered
    output tokens/s over all its GPUs."""

    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    prefill_concurrency: int  # requests in flight per prefill worker (per replica of one with attention DP) at
    # the deployment's steady rate
    decode_concurrency: int  # per decode worker (per replica, likewise)
    prefill_max_concurrency: int  # the most a prefill worker may hold within the limits: its engine's cap
    decode_max_concurrency: int  # the most a decode worker may hold within the limits and its memory


@dataclass(frozen=True)
class DisaggPlan:
    """One disaggregated deployment: P prefill workers and D decode workers on disjoint GPUs, and what it serves."""

    prefill: Layout  # each prefill worker's layout
    decode: Layout  # each decode worker's layout
    workers: tuple[Worker, ...]  # prefill workers first, then decode, each by index
    transfer: KvTransfer
    served: DisaggServed
    notes: tuple[str, ...] = ()  # reasons: why this ratio, why these GPUs and NICs
    warnings: tuple[str, ...] = field(default=())  # a GPU with no NIC on its own PCIe switch or socket, ...

    @property
    def ratio(self) -> tuple[int, int]:
        """(P, D): prefill and decode workers."""
        return (sum(w.role == "prefill" for w in self.workers), sum(w.role == "decode" for w in self.workers))
