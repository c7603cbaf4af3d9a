"""The calibration file, typed: its one reader (`read_calibration_file`) and its one writer
(`write_calibration_file`).

`topoplan calibrate` writes it from measurements, `calibrate --engine vllm` adds an engine's fitted overheads to a
copy, and `plan --calibration`, `plan --device cpu` and `validate` read it. Every section is checked when the
file is read, so a malformed one is a one-line error naming the file and the key, whichever command reads it:

    {"version": 1,                                     # SCHEMA_VERSION; another is refused
     "links": {"nvlink": {"alpha_us": 2.0, "bandwidth_gbps": 190.0}, ...},   # per link class (LINK_CLASSES)
     "collective_base_us": 25.0, ..., "runtime_reserve": 0.1,                # the constants (ConstantValues)
     "gpu": {"name": .., "catalog": .., <probes>},      # the GPU it was measured on (GpuRecord)
     "cpu": {"cores": .., "threads": {"1": <probes>, ..}, ...},  # this machine's CPU entry (CpuEntry)
     "measured": {"host": .., "when": .., "torch": .., ...},     # what was measured, where and when (Measured)
     "engines": {"vllm": {"layer_overhead_us": .., ..., "engine_version": .., ...}}}  # EngineFit per engine

Every key is optional: a file overrides only the constants and link classes it names, laid over the engine's
defaults (`CalibrationFile.calibration(base, engine)`). docs/planner.md explains the constants, docs/bench.md
the sections `calibrate` writes, topoplan.plan.cpu_entry how the CPU entry prices a layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from topoplan.atomic import check_folder, write_atomic
from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json
from topoplan.plan.calibration import LINK_CLASSES, Calibration, LinkCalibration

SCHEMA_VERSION = 1
WHAT = "a topoplan calibration file"
RECALIBRATE = "run `topoplan calibrate` again to write a current one"
FRACTION = {"fraction": True}  # a ConstantValues field's metadata: a share in (0, 1], not a time

Points = tuple[tuple[int, float], ...]  # a curve by rows or bytes, ascending: ((1, 0.5), (64, 1.0))


@dataclass(frozen=True)
class ConstantValues:
    """The cost-model constants a file (or an engine's entry) names, each a Calibration field of the same name;
    None: not named, the base's value holds. In the file's order: times, then fractions."""

    collective_base_us: float | None = None
    layer_overhead_us: float | None = None
    decode_layer_overhead_us: float | None = None
    step_overhead_us: float | None = None
    step_overhead_per_rank_us: float | None = None
    sequence_overhead_us: float | None = None
    matmul_call_us: float | None = None
    moe_layer_overhead_us: float | None = None
    expert_overhead_us: float | None = None
    bus_efficiency: float | None = field(default=None, metadata=FRACTION)
    memory_bandwidth_efficiency: float | None = field(default=None, metadata=FRACTION)
    flop_efficiency: float | None = field(default=None, metadata=FRACTION)
    runtime_reserve: float | None = field(default=None, metadata=FRACTION)

    def named(self) -> dict[str, float]:
        """The named constants, as Calibration field -> value."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def of(cls, calibration: Calibration) -> ConstantValues:
        """Every constant of a calibration (what `topoplan calibrate` writes)."""
        return cls(**{f.name: getattr(calibration, f.name) for f in fields(cls)})


CONSTANT_KEYS = tuple(f.name for f in fields(ConstantValues))


@dataclass(frozen=True)
class LinkValues:
    """One link class's entry: its per-step latency (None: the base's) and measured bus bandwidth (None: the
    topology's estimate x bus_efficiency)."""

    alpha_us: float | None = None
    bandwidth_gbps: float | None = None


@dataclass(frozen=True, kw_only=True)
class Probes:
    """What the probes measured at one thread count (topoplan.bench.calibrate.probe_all; topoplan.plan.cpu_entry
    says how each prices a layout). The optional ones are absent from files written before they were probed."""

    stream_gbps: float
    gemv_gbps: float
    gemm_tflops: float
    layer_overhead_us: float
    step_overhead_us: float | None = None
    moe_layer_overhead_us: float | None = None
    expert_overhead_us: float | None = None
    matmul_tflops_by_kernel: dict[str, Points] | None = None  # kernel -> rows -> TFLOP/s
    matmul_tflops: Points  # rows -> TFLOP/s (the faster kernel at each row count)
    matmul_call_us: Points | None = None  # rows -> us per weight product
    layer_overhead_by_bytes: Points | None = None  # a layer's bytes -> us
    spread: dict[str, float] | None = None  # each probe's worst interquartile spread / median, for the record


@dataclass(frozen=True)
class CpuEntry:
    """This machine's CPU, as `topoplan calibrate` measured it: probes at one thread and at every core."""

    cores: int
    memory_bytes: float
    threads: dict[int, Probes]  # thread count -> probes; always one at `cores`
    numa_nodes: int | None = None
    dtype: str | None = None

    def probes(self, threads: int) -> Probes:
        found = self.threads.get(threads)
        if found is None:
            raise TopoplanError(f"the calibration's cpu entry has no probes at {threads} thread(s); it has "
                                f"{', '.join(str(t) for t in sorted(self.threads))}")
        return found


@dataclass(frozen=True)
class GpuRecord:
    """The GPU `topoplan calibrate` measured on: its name (the planner warns when planning another), its catalog
    key, and the probes' figures, kept for the record."""

    name: str | None = None
    catalog: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineFit:
    """A serving engine's fixed costs `calibrate --engine E` fitted on this machine, with what it served to fit
    them (topoplan.bench.vllm_cpu)."""

    constants: ConstantValues = field(default_factory=ConstantValues)
    device: str | None = None
    engine_version: str | None = None
    model: str | None = None
    batch: int | None = None
    prompt_len: int | None = None
    gen_len: int | None = None
    load: dict[str, Any] | None = None  # topoplan.bench.load.LoadMonitor.report()
    fit_rows: list[dict[str, Any]] | None = None  # measured and roofline times per layout


@dataclass(frozen=True)
class Measured:
    """What `topoplan calibrate` measured, where, when and with what (for the record; `validate` reprobes with
    the same buffer size)."""

    host: str | None = None
    when: str | None = None  # UTC, ISO 8601
    seconds: float | None = None
    load_average: list[float] | None = None
    load: dict[str, Any] | None = None  # topoplan.bench.load.LoadMonitor.report()
    topoplan: str | None = None  # the version that measured (absent from files before it was recorded)
    torch: str | None = None
    dtype: str | None = None
    sizes: str | None = None
    iters: int | None = None
    probe_mib: int | None = None
    base_from_fit: bool | None = None
    sync_wait_us: dict[str, float] | None = None  # stretch MiB -> us (CPU)
    fits: list[dict[str, Any]] | None = None  # topoplan.bench.fit.CollectiveFit.to_json() per fit

    @property
    def load_warnings(self) -> list[str]:
        return list((self.load or {}).get("warnings") or [])


@dataclass(frozen=True)
class CalibrationFile:
    """One calibration file, every section typed."""

    source: str = "<calibration>"  # the path it was read from, for messages and Calibration.source
    links: dict[str, LinkValues] = field(default_factory=dict)
    constants: ConstantValues = field(default_factory=ConstantValues)
    gpu: GpuRecord | None = None
    cpu: CpuEntry | None = None
    measured: Measured | None = None
    engines: dict[str, EngineFit] = field(default_factory=dict)

    def calibration(self, base: Calibration | None = None, engine: str | None = None) -> Calibration:
        """The file's constants and links laid over `base` (the engine's constants; default: the bundled
        runner's); with `engine`, its `engines.<engine>` entry goes on top of the file's own constants."""
        base = base or Calibration()
        links = dict(base.links)
        for name, entry in self.links.items():
            alpha = links[name].alpha_us if entry.alpha_us is None else entry.alpha_us
            links[name] = LinkCalibration(alpha, entry.bandwidth_gbps)
        fit = self.engines.get(engine) if engine is not None else None
        values = self.constants.named() | (fit.constants.named() if fit else {})
        measured_on = "cpu" if self.cpu else (self.gpu.name if self.gpu else None)
        return replace(base, links=links, source=self.source, measured_on=measured_on,
                       sets_nothing=not values and links == base.links, **values)

    def cpu_entry(self) -> CpuEntry:
        if self.cpu is None:
            raise TopoplanError("no `cpu` entry: run `topoplan calibrate` on this machine to measure one",
                                source=self.source)
        return self.cpu

    def engine_fit(self, engine: str, needed: tuple[str, ...]) -> EngineFit:
        """The `engines.<engine>` entry, with every constant in `needed` named."""
        fit = self.engines.get(engine)
        if fit is None or any(getattr(fit.constants, k) is None for k in needed):
            raise TopoplanError(f"no `engines.{engine}` entry with {', '.join(needed)}: run `topoplan calibrate "
                                f"--engine {engine}` first", source=self.source)
        return fit


# --- the reader -------------------------------------------------------------------------------------------

def _fail(where: str, expected: str, path: str) -> TopoplanError:
    return TopoplanError(f"{where}: expected {expected}", source=path)


def _number(value: Any, where: str, path: str, *, fraction: bool = False, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TopoplanError(f"{where}: expected a non-negative number, got {value!r}", source=path)
    if fraction and not (0 < value <= 1):
        raise TopoplanError(f"{where}: expected a fraction in (0, 1], got {value!r}", source=path)
    if positive and value == 0:
        raise TopoplanError(f"{where}: must be above 0", source=path)
    return float(value)


def _object(value: Any, where: str, path: str, expected: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, expected, path)
    return value


NUMBER = (int, float)
JSON_NAMES: dict[type | tuple[type, ...], str] = {str: "a string", int: "an integer", NUMBER: "a number",
                                                   bool: "true or false", dict: "an object", list: "a list"}


def _typed(raw: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str, path: str) -> Any:
    """An optional record key of a JSON type (None when absent); bools are not numbers."""
    value = raw.get(key)
    numeric = kinds in (int, NUMBER)
    if value is not None and (not isinstance(value, kinds) or (numeric and isinstance(value, bool))):
        raise _fail(f"{where}.{key}", f"{JSON_NAMES[kinds]}, got {value!r:.40}", path)
    return value


def _constants(raw: dict[str, Any], where: str, path: str) -> ConstantValues:
    values: dict[str, float] = {}
    for f in fields(ConstantValues):
        if f.name in raw:
            values[f.name] = _number(raw[f.name], f"{where}{f.name}", path, fraction=bool(f.metadata.get("fraction")))
    if values.get("runtime_reserve") == 1.0:
        raise TopoplanError(f"{where}runtime_reserve: 1.0 leaves no memory for the model", source=path)
    return ConstantValues(**values)


def _links(raw: Any, path: str) -> dict[str, LinkValues]:
    links = {}
    for name, entry in _object(raw, "links", path, "an object of link classes").items():
        if name not in LINK_CLASSES:
            raise TopoplanError(f"links.{name}: unknown link class; expected one of {', '.join(LINK_CLASSES)}",
                                source=path)
        if not isinstance(entry, dict) or set(entry) - {"alpha_us", "bandwidth_gbps"}:
            raise TopoplanError(f"links.{name}: expected {{\"alpha_us\": .., \"bandwidth_gbps\": ..}}", source=path)
        alpha = entry.get("alpha_us")
        bandwidth = entry.get("bandwidth_gbps")
        links[name] = LinkValues(
            None if alpha is None else _number(alpha, f"links.{name}.alpha_us", path),
            None if bandwidth is None else _number(bandwidth, f"links.{name}.bandwidth_gbps", path, positive=True))
    return links


def _non_negative(value: Any) -> bool:
    """A number of at least 0 (JSON's true is not one; read_json refuses NaN and infinities)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _points(curve: Any, positive: bool) -> Points | None:
    """A non-empty {positive integer (rows, bytes): number} map as ascending points, its numbers positive or
    at least 0; None when it is not one."""
    if not isinstance(curve, dict) or not curve or not all(
            k.isdecimal() and int(k) > 0 and _non_negative(v) and (v > 0 or not positive) for k, v in curve.items()):
        return None
    return tuple(sorted((int(k), v) for k, v in curve.items()))


PROBES = ("stream_gbps", "gemv_gbps", "gemm_tflops")  # required, above 0
# required, at least 0: the probe clamps a slope that the machine's noise made negative to 0
# (topoplan.bench.probes.runner_overheads_us)
LAYER_OVERHEAD = "layer_overhead_us"
OPTIONAL_OVERHEADS = ("step_overhead_us", "moe_layer_overhead_us", "expert_overhead_us")


def _probes(raw: Any, where: str, path: str) -> Probes:
    """One thread count's probes; every problem in one message (`expected positive a, b`)."""
    raw = raw if isinstance(raw, dict) else {}
    missing = [k for k in PROBES if not isinstance(raw.get(k), (int, float)) or isinstance(raw[k], bool)
               or raw[k] <= 0]
    if not _non_negative(raw.get(LAYER_OVERHEAD)):
        missing.append(f"{LAYER_OVERHEAD} (may be 0)")
    curve = _points(raw.get("matmul_tflops"), positive=True)
    if curve is None:
        missing.append("matmul_tflops (rows -> TFLOP/s)")
    by_kernel = raw.get("matmul_tflops_by_kernel")
    kernels = {name: _points(c, positive=True) for name, c in by_kernel.items()} if isinstance(by_kernel, dict) \
        else {}
    if by_kernel is not None and (not kernels or None in kernels.values()):
        missing.append("matmul_tflops_by_kernel (kernel -> rows -> TFLOP/s)")
    curves = {}
    for name, unit in (("matmul_call_us", "rows"), ("layer_overhead_by_bytes", "bytes")):
        curves[name] = None if name not in raw else _points(raw[name], positive=False)
        if name in raw and curves[name] is None:
            missing.append(f"{name} ({unit} -> us, may be 0)")
    missing += [f"{k} (may be 0)" for k in OPTIONAL_OVERHEADS if k in raw and not _non_negative(raw[k])]
    spread = raw.get("spread")
    if spread is not None and not (isinstance(spread, dict) and all(_non_negative(v) for v in spread.values())):
        missing.append("spread (probe -> spread, may be 0)")
    if missing:
        raise TopoplanError(f"{where}: expected positive {', '.join(missing)}", source=path)
    return Probes(**{k: raw[k] for k in (*PROBES, LAYER_OVERHEAD)},
                  **{k: raw[k] for k in OPTIONAL_OVERHEADS if k in raw},
                  matmul_tflops=curve, matmul_tflops_by_kernel=kernels or None, spread=spread,  # type: ignore[arg-type]
                  **curves)


def parse_cpu_entry(raw: Any, path: str) -> CpuEntry:
    """The `cpu` section, checked (also how `topoplan calibrate` types the entry it measured)."""
    entry = _object(raw, "cpu", path, "an object (the CPU entry `topoplan calibrate` writes)")
    threads = entry.get("threads")
    cores = entry.get("cores")
    if not isinstance(cores, int) or isinstance(cores, bool) or not isinstance(threads, dict) \
            or str(cores) not in threads or not all(k.isdecimal() and int(k) > 0 for k in threads):
        raise TopoplanError("cpu: expected `cores` (an integer) and `threads` with an entry for all cores",
                            source=path)
    memory = entry.get("memory_bytes")
    if not _non_negative(memory) or not memory:
        raise _fail("cpu.memory_bytes", f"a positive number of bytes, got {memory!r:.40}", path)
    return CpuEntry(cores, memory, {int(k): _probes(v, f"cpu.threads.{k}", path) for k, v in threads.items()},
                    _typed(entry, "numa_nodes", int, "cpu", path), _typed(entry, "dtype", str, "cpu", path))


def _gpu(raw: Any, path: str) -> GpuRecord:
    entry = _object(raw, "gpu", path, "an object (the GPU `topoplan calibrate` measured on)")
    return GpuRecord(_typed(entry, "name", str, "gpu", path), _typed(entry, "catalog", str, "gpu", path),
                     {k: v for k, v in entry.items() if k not in ("name", "catalog")})


RECORD_TYPES: dict[str, type | tuple[type, ...]] = {  # the JSON type of each record key of the sections below
    "device": str, "engine_version": str, "model": str, "batch": int, "prompt_len": int, "gen_len": int,
    "load": dict, "fit_rows": list, "host": str, "when": str, "seconds": NUMBER, "load_average": list,
    "topoplan": str, "torch": str, "dtype": str, "sizes": str, "iters": int, "probe_mib": int,
    "base_from_fit": bool, "sync_wait_us": dict, "fits": list}


def _record(cls: type, raw: dict[str, Any], where: str, path: str) -> dict[str, Any]:
    return {f.name: _typed(raw, f.name, RECORD_TYPES[f.name], where, path) for f in fields(cls)
            if f.name in RECORD_TYPES}


def _engines(raw: Any, path: str) -> dict[str, EngineFit]:
    out = {}
    for name, entry in _object(raw, "engines", path, "an object of engines").items():
        where = f"engines.{name}"
        entry = _object(entry, where, path, "an object of constants (e.g. layer_overhead_us)")
        out[name] = EngineFit(_constants(entry, f"{where}.", path), **_record(EngineFit, entry, where, path))
    return out


def _measured(raw: Any, path: str) -> Measured:
    entry = _object(raw, "measured", path, "an object (what `topoplan calibrate` measured)")
    return Measured(**_record(Measured, entry, "measured", path))


SECTIONS = {"links": _links, "gpu": _gpu, "cpu": parse_cpu_entry, "measured": _measured, "engines": _engines}


def parse_calibration_file(raw: Any, path: str | Path) -> CalibrationFile:
    """Check a calibration document and type it; every problem is one line naming the file and the key."""
    path = str(path)
    if not isinstance(raw, dict):
        raise TopoplanError(f"expected a JSON object ({WHAT})", source=path)
    if raw.get("version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise TopoplanError(f"version {raw.get('version')!r}: this topoplan reads version {SCHEMA_VERSION}; "
                            f"{RECALIBRATE}", source=path)
    known = {"version", *CONSTANT_KEYS, *SECTIONS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TopoplanError(f"unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}", source=path)
    sections = {name: read(raw[name], path) for name, read in SECTIONS.items() if raw.get(name) is not None}
    return CalibrationFile(path, constants=_constants(raw, "", path), **sections)


def read_calibration_file(path: str | Path) -> CalibrationFile:
    return parse_calibration_file(read_json(path, WHAT), path)


def load_calibration(path: str | Path | None, base: Calibration | None = None, engine: str | None = None
                     ) -> Calibration:
    """The calibration in `path` laid over `base` (default: the bundled runner's), or `base` when None;
    `engine` also applies the file's `engines.<engine>` entry."""
    base = base or Calibration()
    return base if path is None else read_calibration_file(path).calibration(base, engine)


# --- the writer -------------------------------------------------------------------------------------------

def _curve_json(points: Points) -> dict[str, float]:
    return {str(k): v for k, v in points}


def _probes_json(p: Probes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(p):
        value = getattr(p, f.name)
        if value is None:
            continue
        if f.name == "matmul_tflops_by_kernel":
            value = {name: _curve_json(c) for name, c in value.items()}
        elif isinstance(value, tuple):
            value = _curve_json(value)
        out[f.name] = value
    return out


def _record_json(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in fields(record)
            if f.name in RECORD_TYPES and getattr(record, f.name) is not None}


def calibration_json(file: CalibrationFile) -> dict[str, Any]:
    """The file's JSON document (what `write_calibration_file` writes and `calibrate --json` prints)."""
    out: dict[str, Any] = {"version": SCHEMA_VERSION}
    if file.links:
        out["links"] = {name: {**({"alpha_us": v.alpha_us} if v.alpha_us is not None else {}),
                               **({"bandwidth_gbps": v.bandwidth_gbps} if v.bandwidth_gbps else {})}
                        for name, v in file.links.items()}
    out |= file.constants.named()
    if file.gpu is not None:
        out["gpu"] = {"name": file.gpu.name, "catalog": file.gpu.catalog, **file.gpu.figures}
    if file.cpu is not None:
        cpu = file.cpu
        out["cpu"] = {"cores": cpu.cores, **({"numa_nodes": cpu.numa_nodes} if cpu.numa_nodes is not None else {}),
                      "memory_bytes": cpu.memory_bytes, **({"dtype": cpu.dtype} if cpu.dtype is not None else {}),
                      "threads": {str(k): _probes_json(p) for k, p in cpu.threads.items()}}
    if file.measured is not None:
        out["measured"] = _record_json(file.measured)
    if file.engines:
        out["engines"] = {name: {**fit.constants.named(), **_record_json(fit)} for name, fit in file.engines.items()}
    return out


def write_calibration_file(path: str | Path, file: CalibrationFile) -> Path:
    """Write the file all-or-nothing, after reading its own document back (whatever is written, the reader
    accepts)."""
    path = check_folder(path)
    document = calibration_json(file)
    parse_calibration_file(json.loads(json.dumps(document)), path)
    write_atomic(path, json.dumps(document, indent=2) + "\n")
    return path
