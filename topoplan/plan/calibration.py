"""Every constant of the cost model, with its default, and the JSON file that overrides them.

`topoplan calibrate` writes this file from measurements; `topoplan plan --calibration FILE` reads it.
Schema (all keys optional; docs/planner.md explains each):

    {"version": 1,
     "links": {"nvlink": {"alpha_us": 2.0, "bandwidth_gbps": 190.0}, "pix": {...}, "pxb": {...},
               "phb": {...}, "node": {...}, "sys": {...}, "net": {...}},
     "collective_base_us": 25.0, "bus_efficiency": 0.8,
     "memory_bandwidth_efficiency": 0.8, "flop_efficiency": 0.7,
     "layer_overhead_us": 30.0, "decode_layer_overhead_us": 8.0, "step_overhead_us": 0.0,
     "step_overhead_per_rank_us": 0.0, "matmul_call_us": 0.0, "runtime_reserve": 0.1}

The defaults are the engine's (topoplan.engines: `plan --engine`, the bundled runner's when none is named);
a file overrides only the keys it names (`load_calibration(path, base)`).

A link class's `bandwidth_gbps` (a measured bus bandwidth) replaces the topology's estimate for every
link of that class; without it the estimate times `bus_efficiency` is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json
from topoplan.topology.links import LinkKind

# Sections other tools own, accepted and left to them: `cpu` / `gpu` (the hardware it was measured on,
# topoplan.plan.cpu_entry and bench/calibrate.py) and `measured` (what `topoplan calibrate` fitted these constants
# from, kept for the record), `engines` (a serving engine's fixed costs fitted on this machine by `calibrate
# --engine vllm`, topoplan.bench.vllm_cpu).
PASSTHROUGH_KEYS = ("cpu", "gpu", "measured", "engines")
NET = "net"  # the inter-node link class (a NIC hop); the others are LinkKind values
LINK_CLASSES = tuple(k.value for k in LinkKind) + (NET,)
SCHEMA_VERSION = 1


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


_FRACTIONS = ("bus_efficiency", "memory_bandwidth_efficiency", "flop_efficiency", "runtime_reserve")
_TIMES = ("collective_base_us", "layer_overhead_us", "decode_layer_overhead_us", "step_overhead_us",
          "step_overhead_per_rank_us", "matmul_call_us", "moe_layer_overhead_us", "expert_overhead_us")


def _number(value: Any, where: str, path: Path, *, fraction: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TopoplanError(f"{where}: expected a non-negative number, got {value!r}", source=path)
    if fraction and not (0 < value <= 1):
        raise TopoplanError(f"{where}: expected a fraction in (0, 1], got {value!r}", source=path)
    return float(value)


def parse_calibration(raw: Any, path: Path, base: Calibration | None = None,
                      engine: str | None = None) -> Calibration:
    """Validate a calibration dict and lay it over `base` (the engine's constants; default: the bundled
    runner's); with `engine`, its `engines.<engine>` entry (what `calibrate --engine` fitted) goes on top of
    the file's own keys. Every problem names the key."""
    base = base or Calibration()
    if not isinstance(raw, dict):
        raise TopoplanError("expected a JSON object (a topoplan calibration file)", source=path)
    if raw.get("version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise TopoplanError(f"version {raw.get('version')!r}: this topoplan reads version {SCHEMA_VERSION}",
                            source=path)
    known = {f.name for f in fields(Calibration)} - {"source", "measured_on", "sets_nothing"} | {"version",
                                                                                           *PASSTHROUGH_KEYS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TopoplanError(f"unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}", source=path)
    links = dict(base.links)
    if not isinstance(raw.get("links") or {}, dict):
        raise TopoplanError(f"links: expected an object of link classes, found {raw['links']!r:.40}", source=path)
    for name, entry in (raw.get("links") or {}).items():
        if name not in LINK_CLASSES:
            raise TopoplanError(f"links.{name}: unknown link class; expected one of {', '.join(LINK_CLASSES)}",
                                source=path)
        if not isinstance(entry, dict) or set(entry) - {"alpha_us", "bandwidth_gbps"}:
            raise TopoplanError(f"links.{name}: expected {{\"alpha_us\": .., \"bandwidth_gbps\": ..}}", source=path)
        alpha = _number(entry.get("alpha_us", links[name].alpha_us), f"links.{name}.alpha_us", path)
        bw = entry.get("bandwidth_gbps")
        if bw is not None:
            bw = _number(bw, f"links.{name}.bandwidth_gbps", path)
            if bw == 0:
                raise TopoplanError(f"links.{name}.bandwidth_gbps: must be above 0", source=path)
        links[name] = LinkCalibration(alpha, bw)
    values: dict[str, Any] = {k: _number(raw[k], k, path, fraction=True) for k in _FRACTIONS if k in raw}
    values |= {k: _number(raw[k], k, path) for k in _TIMES if k in raw}
    values |= _engine_values(raw, engine, path)
    if values.get("runtime_reserve") == 1.0:
        raise TopoplanError("runtime_reserve: 1.0 leaves no memory for the model", source=path)
    gpu = raw.get("gpu")
    measured_on = "cpu" if "cpu" in raw else (gpu.get("name") if isinstance(gpu, dict) else None)
    sets_nothing = not values and links == base.links
    return replace(base, links=links, source=str(path), measured_on=measured_on, sets_nothing=sets_nothing,
                   **values)


def _engine_values(raw: dict[str, Any], engine: str | None, path: Path) -> dict[str, Any]:
    """The cost-model constants of the file's `engines.<engine>` entry (its other keys are its record)."""
    engines = raw.get("engines")
    if engine is None or engines is None:
        return {}
    if not isinstance(engines, dict) or not isinstance(engines.get(engine, {}), dict):
        raise TopoplanError(f"engines.{engine}: expected an object of constants (e.g. layer_overhead_us)",
                            source=path)
    entry = engines.get(engine, {})
    values = {k: _number(entry[k], f"engines.{engine}.{k}", path, fraction=True) for k in _FRACTIONS if k in entry}
    return values | {k: _number(entry[k], f"engines.{engine}.{k}", path) for k in _TIMES if k in entry}


def load_calibration(path: str | Path | None, base: Calibration | None = None, engine: str | None = None
                     ) -> Calibration:
    """The calibration in `path` laid over `base`, or `base` (default: the bundled runner's) when None;
    `engine` also applies the file's `engines.<engine>` entry."""
    base = base or Calibration()
    if path is None:
        return base
    path = Path(path)
    return parse_calibration(read_json(path, "a topoplan calibration file"), path, base, engine)


def to_json(calibration: Calibration) -> dict[str, Any]:
    """The file form of a calibration (what `topoplan calibrate` writes)."""
    links = {name: {"alpha_us": c.alpha_us, **({"bandwidth_gbps": c.bandwidth_gbps} if c.bandwidth_gbps else {})}
             for name, c in calibration.links.items()}
    return {"version": SCHEMA_VERSION, "links": links,
            **{k: getattr(calibration, k) for k in (*_TIMES, *_FRACTIONS) if getattr(calibration, k) is not None}}
