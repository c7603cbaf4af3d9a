"""One engine at one version range, as every part of topoplan sees it: the Engine object.

The same object reaches the planner (its costs: memory policy, all-reduce path, CUDA graphs, overheads), the
layout rules (its traits: which parallelisms it runs and how), the launcher (which module writes its command
line, and the options that version accepts) and calibrate/validate (its on-box driver, where one exists). It is
resolved once, at the edge (topoplan.engines.resolve), from `NAME` or `NAME@VERSION`.

Each numeric constant carries its source in `sources`
(key = the field's dotted path, e.g. "memory.fraction"), and `tests/test_engines.py` checks none is missing.
Pure arithmetic on numbers lives here (which all-reduce kernel a message gets, how much memory the engine
lets weights and KV cache use); pricing it is the planner's job (topoplan.plan.cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from topoplan.engines.scheduling import STATIC, Scheduler
from topoplan.layout import Layout

Version = tuple[int, ...]


def version_tuple(text: str) -> Version | None:
    """"0.2" -> (0, 2), "1.3.0rc20" -> (1, 3, 0); None when it does not start with a number."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):  # "0rc20": the release candidate counts as its release
            break
    return tuple(parts) or None


@dataclass(frozen=True)
class Parallelism:
    """Which parallelisms the engine runs and the rules it puts on them."""

    tp: bool = True
    pp: bool = True
    dp: bool = True  # data-parallel replicas behind one front end (an engine option, not separate servers)
    ep: bool = False  # expert parallelism for MoE layers
    pads_vocab: bool = True  # vocab-parallel embedding / LM head padded to a multiple of tp (else tp must divide it)
    tp_across_nodes: bool = True
    # the batch walks the pipeline stages as micro-batches (topoplan.layout.micro_batches), not as one: the
    # bundled runner cuts it; a serving engine schedules whole batches (vLLM: a request in flight is not
    # scheduled again before its token returns, so the batch walks the stages as one)
    micro_batched_pp: bool = False
    # without `dp` (replicas behind one front end), dp > 1 only as attention DP of an MoE model (ep = tp x dp,
    # every rank its own attention with this TP degree, the experts over all of them); 0: not at all
    attention_dp_tp: int = 0
    # an MoE model's replicas share one expert group (vLLM: with DP the expert layers span all tp x dp ranks, as
    # EP or else TP), so dp > 1 only with ep = tp x dp, which the planner prices; not independent replicas
    moe_dp_shares_experts: bool = False

    def runs(self, layout: Layout, moe: bool) -> bool:
        """Whether one launch of the engine runs the layout's replicas (dp > 1) as the planner prices them."""
        if moe and self.moe_dp_shares_experts and layout.dp > 1 and layout.ep == 1:
            return False
        if layout.dp == 1 or self.dp:
            return True
        return moe and self.ep and layout.tp == self.attention_dp_tp and layout.ep == layout.tp * layout.dp


@dataclass(frozen=True)
class MemoryPolicy:
    """How much GPU memory the engine lets weights and KV cache use.

    basis "total": fraction x total memory holds weights, activations and the KV pool (vLLM
    gpu_memory_utilization, SGLang mem_fraction_static); basis "free": the KV pool is fraction x what is free
    once weights and activations are loaded (TensorRT-LLM free_gpu_memory_fraction). `reserved_gb` is what
    the engine keeps outside weights and KV (activations, CUDA graphs, NCCL buffers)."""

    basis: str  # "total" | "free"
    fraction: float
    option: str  # the engine's own option for the fraction
    kv_block_tokens: int  # KV cache allocation unit: a sequence holds whole blocks
    reserved_gb: float = 0.0
    fraction_by_tp: tuple[tuple[int, float], ...] = ()  # (tp at least, fraction), largest first: replaces `fraction`

    def fraction_for(self, tp: int) -> float:
        return next((f for least, f in self.fraction_by_tp if tp >= least), self.fraction)

    def usable_bytes(self, total: float, weights: float, tp: int) -> float:
        """Bytes weights + KV cache may use on one GPU holding `weights` bytes of weights."""
        f, reserved = self.fraction_for(tp), self.reserved_gb * 1e9
        if self.basis == "free":
            return weights + f * max(total - weights - reserved, 0.0)
        return f * total - reserved

    def kv_tokens(self, tokens: int) -> int:
        """Tokens of KV cache a sequence of `tokens` tokens occupies (whole blocks)."""
        return math.ceil(tokens / self.kv_block_tokens) * self.kv_block_tokens


@dataclass(frozen=True)
class AllReducePath:
    """Which kernel an all-reduce of a TP group gets.

    The engine's own one-shot/two-shot kernels run when the group is one of `world_sizes` GPUs on one node
    joined by a full NVLink mesh (or NVSwitch) and the message is at most `max_bytes`; one-shot below the
    size for the group's world (`one_shot_max_bytes`, (world at most, bytes) smallest first), two-shot above.
    Everything else goes to NCCL (ring/tree, NVLS on NVSwitch), priced as a ring by the planner."""

    custom: bool
    world_sizes: tuple[int, ...] = ()
    max_bytes: int = 0
    one_shot_max_bytes: tuple[tuple[int, int], ...] = ()
    one_shot_us: float = 0.0  # fixed cost of one one-shot all-reduce (launch, barrier, peer reads of a few KiB)
    two_shot_us: float = 0.0  # the same for two-shot (two barriers)
    nccl: tuple[str, ...] = ("ring", "tree", "nvls")

    def kernel(self, world: int, nbytes: float, full_nvlink: bool) -> str:
        """"one-shot", "two-shot" or "nccl" for an all-reduce of nbytes over `world` ranks."""
        if not (self.custom and full_nvlink and world in self.world_sizes and nbytes <= self.max_bytes):
            return "nccl"
        limit = next((b for most, b in self.one_shot_max_bytes if world <= most), 0)
        return "one-shot" if nbytes < limit else "two-shot"


@dataclass(frozen=True)
class Overheads:
    """The cost model's engine-dependent constants (topoplan.plan.calibration names them the same)."""

    memory_bandwidth_efficiency: float  # achieved/peak HBM bandwidth in decode GEMMs and attention
    flop_efficiency: float  # achieved/peak tensor FLOP/s in prefill GEMMs
    layer_overhead_us: float  # per layer per step: small kernels and launch gaps (eager execution)
    graph_layer_overhead_us: float  # the same when decode replays a CUDA graph (no CPU launch per kernel)
    step_overhead_us: float  # per step outside the layers: scheduler, input preparation, sampling, output
    step_overhead_per_rank_us: float  # per step per extra TP/PP rank: the driver sending each worker its inputs
    collective_base_us: float  # fixed cost of one NCCL call in the engine's step
    # per sequence in a step: the per-request bookkeeping the GPU waits for (scheduling, input preparation,
    # sampling, output handling) and attention's fixed work per sequence; 0 where no fit can tell it apart
    sequence_overhead_us: float = 0.0


GPU_LINK, VIA_NIC = "gpu-link", "nic"  # KvTransferPath.same_node


@dataclass(frozen=True)
class KvTransferPath:
    """How the engine's default KV transfer backend (its P/D disaggregation) moves a request's cache between a
    prefill and a decode worker on the same node: over the GPU-GPU link (CUDA IPC: NVLink where there is one, else
    PCIe peer-to-peer) or out through the sending GPU's RDMA NIC and back in through the receiver's (the backend
    speaks RDMA only, whatever the distance). Across nodes every backend goes through the NICs."""

    same_node: str = GPU_LINK  # GPU_LINK | VIA_NIC
    source: str = "the engine has no P/D disaggregation of its own; priced as a CUDA-IPC copy"


@dataclass(frozen=True)
class Engine:
    """One engine between two versions: what the planner prices, the rules it puts on layouts, and how it is
    launched and driven here."""

    name: str
    version: str  # the profile's label, what `NAME@VERSION` names
    covers: tuple[str, str]  # first and last engine version these constants describe
    cuda_graphs_decode: bool
    parallelism: Parallelism
    memory: MemoryPolicy
    allreduce: AllReducePath
    overheads: Overheads
    sources: dict[str, str] = field(default_factory=dict)  # dotted constant path -> where it comes from
    notes: str = ""
    # a serving engine: one server command per node, requests over HTTP (else the bundled runner: a line per rank)
    serves: bool = True
    # the module of topoplan.launch.engines that writes this version's command line; None: launch cannot write
    # it (refused in one line), `plan` still prices the version
    launcher: str | None = None
    # the module of topoplan.bench that runs this engine on this machine for calibrate/validate; None: none
    driver: str | None = None
    # the release whose options `launch` writes (tests parse the lines with that release's own parser or its
    # pinned option list); a user who pins another release with NAME@VERSION is refused in one line
    launch_release: str | None = None
    # the version the user pinned with NAME@VERSION (None: the newest), which `launch` checks against the above
    pinned: str | None = field(default=None, compare=False)
    # how its scheduler batches requests (topoplan.engines.scheduling): what the served model prices
    scheduler: Scheduler = STATIC
    # the path of a same-node KV transfer under its default P/D backend (plan --disagg)
    kv_transfer: KvTransferPath = KvTransferPath()

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    def matches(self, version: str) -> bool:
        """Whether the requested version (a prefix like "0.2" or a release like "0.2.4") lies in `covers`."""
        want = version_tuple(version)
        if want is None:
            return False
        lo, hi = (version_tuple(v) or () for v in self.covers)
        return lo[:len(want)] <= want and want[:len(hi)] <= hi


def constants(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every number in a profile by dotted path (what needs a source); booleans and names excluded."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in ("sources", "name", "version", "covers", "notes", "attention_dp_tp"):  # labels and rules
            continue
        value, path = getattr(obj, f.name), f"{prefix}{f.name}"
        if isinstance(value, AllReducePath) and not value.custom:
            continue  # no custom kernels: its sizes and latencies are unused
        if is_dataclass(value):
            out |= constants(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = value
        elif isinstance(value, tuple) and value and not all(isinstance(v, str) for v in value):
            out[path] = value
    return out
