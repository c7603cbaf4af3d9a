"""Every constant of the cost model, with its default (docs/planner.md explains each).

The defaults are the engine's (topoplan.engines: `plan --engine`, the bundled runner's when none is named);
a calibration file (topoplan.plan.calibration_file: `topoplan calibrate` writes it, `plan --calibration FILE`
reads it) overrides only the keys it names.

A link class's `bandwidth_gbps` (a measured bus bandwidth) replaces the topology's estimate for every
link of that class; without it the estimate times `bus_efficiency` is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topoplan.topology.links import LinkKind

NET = "net"  # the inter-node link class (a NIC hop); the others are LinkKind values
LINK_CLASSES = tuple(k.value for k in LinkKind) + (NET,)


@dataclass(frozen=True)
class LinkCalibration:
    alpha_us: float  # latency of one ring step over a link of this class
    bandwidth_gbps: float | None = None  # measured bus bandwidth; None: topology estimate x bus_efficiency


# Per-step latencies. NVLink's 3 us is fitted to the FasterTransformer TP1-8 decode residuals
# (docs/planner.md); the PCIe figure keeps NCCL's NVLink:PCI hop-latency ratio 0.6:1.0
# (src/graph/tuning.cc hwLat), so 5 us; a socket crossing and a network hop are estimates, ordered as
# NCCL orders them (NVLINK < PCI < NET).
DEFAULT_LINKS: dict[str, LinkCalibration] = {
    LinkKind.NVLINK.value: LinkCalibration(3.0),
    LinkKind.XGMI.value: LinkCalibration(3.0),  # no fit of its own yet: a direct GPU link, as NVLink
    LinkKind.PIX.value: LinkCalibration(5.0),
    LinkKind.PXB.value: LinkCalibration(5.0),
    LinkKind.PHB.value: LinkCalibration(5.0),
    LinkKind.NODE.value: LinkCalibration(5.0),
    LinkKind.SYS.value: LinkCalibration(6.0),
    NET: LinkCalibration(8.0),
}


@dataclass(frozen=True)
class Calibration:
    """The cost model's constants (defaults documented in docs/planner.md)."""

    links: dict[str, LinkCalibration] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    collective_base_us: float = 25.0  # fixed cost of one collective call: launch, enqueue, rank skew
    bus_efficiency: float = 0.8  # achieved/nominal link bandwidth in ring collectives
    memory_bandwidth_efficiency: float = 0.8  # achieved/peak HBM bandwidth streaming weights and KV
    flop_efficiency: float = 0.7  # achieved/peak tensor FLOP/s in large GEMMs
    layer_overhead_us: float = 30.0  # per-layer fixed time: small kernels, launches, tails
    # the same in decode steps when they differ (an engine replaying CUDA graphs); None: layer_overhead_us
    decode_layer_overhead_us: float | None = None
    # per-step fixed time outside the layers (embedding, head, sampling, the runtime's step loop); 0 by
    # default: no published GPU figure separates it, and the layer overhead fitted to FasterTransformer
    # absorbs it. `topoplan calibrate` measures it for the runner.
    step_overhead_us: float = 0.0
    step_overhead_per_rank_us: float = 0.0  # per step per rank beyond the first: a driver feeding its workers
    sequence_overhead_us: float = 0.0  # per step per sequence in it: an engine's per-request bookkeeping
    # per weight product of a step beyond streaming its bytes (each layer's fused QKV, output, gate/up and down
    # products, two per routed expert a rank runs, the LM head); 0 by default: on a GPU it is a kernel launch,
    # in layer_overhead_us already. On CPU `topoplan calibrate` measures it (topoplan.bench.probes.matmul_call_us).
    matmul_call_us: float = 0.0
    # an MoE layer's fixed cost beyond a dense layer's, and per routed expert it runs (routing, sorting the
    # tokens by expert, each expert's slicing and activation, adding the outputs back); 0 by default: GPU
    # engines' fitted layer overheads include their MoE layers. `topoplan calibrate` measures the runner's
    # (topoplan.bench.probes.moe_overheads_us).
    moe_layer_overhead_us: float = 0.0
    expert_overhead_us: float = 0.0
    runtime_reserve: float = 0.10  # share of GPU memory kept for the runtime (CUDA context, workspaces)
    source: str = "defaults"
    measured_on: str | None = None  # "cpu" when the file has a `cpu` entry, else its `gpu` name, else None
    sets_nothing: bool = False  # the file overrides no constant (e.g. `{}`): the defaults apply

    def link(self, link_class: str) -> LinkCalibration:
        return self.links[link_class]

    @property
    def decode_layer_us(self) -> float:
        return self.layer_overhead_us if self.decode_layer_overhead_us is None else self.decode_layer_overhead_us
