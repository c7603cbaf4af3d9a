"""Published prefill/decode KV-transfer measurements, and the planner's price for each: the table of
docs/disagg-validation.md, reproducible from the data file (fixtures/validation/pd_transfer.json) by
`python benchmarks/kv_transfer.py --published`.

Each case is what one source measured (its URL, the figure in words, the time and/or bandwidth it states) and,
where the source gives enough to price it (model, prompt, KV dtype, each side's TP, the NICs), the same transfer
priced by topoplan.plan.kv_transfer.price_transfer between two identical nodes of a bundled topology fixture
that matches the source's machine (each GPU's KV through its nearest NIC, the NIC speed the source states).
A case the source does not size (no model or prompt) says why in `not_priced` and is printed as cited.

Error = (priced - measured) / measured, on the time where the source states one, else on the bandwidth.
Imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json
from topoplan.layout import Layout
from topoplan.machine import load_topology
from topoplan.models import ModelSpec, find_model, spec_from_config
from topoplan.plan.calibration import Calibration
from topoplan.plan.collectives import LinkPricer
from topoplan.plan.disagg_types import KvTransfer, Worker
from topoplan.plan.kv_transfer import CONNECTORS, kv_routes, price_transfer

SCHEMA_VERSION = 1
REPOSITORY = Path(__file__).resolve().parents[2]  # a case's `topology` is a path in the repository, as docs cite it
DEFAULT_FILE = REPOSITORY / "fixtures" / "validation" / "pd_transfer.json"
PRICE_KEYS = {"model", "kv_dtype", "prompt_tokens", "topology", "nic_gbps", "tp", "connector"}
CASE_KEYS = {"id", "source", "what", "measured", "stated_kv", "price", "not_priced", "notes"}


@dataclass(frozen=True)
class Pricing:
    """How the planner prices a case: `tp` GPUs of node 0 send to `tp` GPUs of node 1 of `topology`."""

    model: str
    kv_dtype: str
    prompt_tokens: int
    topology: Path
    nic_gbps: float
    tp: int
    connector: str


@dataclass(frozen=True)
class Case:
    id: str
    source: str  # URL
    what: str  # what was measured, in the source's words
    measured_ms: float | None
    measured_gbps: float | None
    stated_kv: str | None  # the KV size as the source writes it ("4.50 GB")
    pricing: Pricing | None
    not_priced: str | None  # why a case without `price` cannot be priced
    notes: str | None


def _fail(path: Path, where: str, expected: str) -> TopoplanError:
    return TopoplanError(f"{where}: expected {expected}", source=path)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _text(raw: dict[str, Any], key: str, where: str, path: Path, optional: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{where}.{key}", "a non-empty string")
    return value


def _pricing(raw: Any, where: str, path: Path, models: dict[str, ModelSpec]) -> Pricing:
    if not isinstance(raw, dict) or set(raw) != PRICE_KEYS:
        raise _fail(path, where, f"an object with exactly {', '.join(sorted(PRICE_KEYS))}")
    for key in ("prompt_tokens", "tp"):
        if not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 1:
            raise _fail(path, f"{where}.{key}", "a whole number of at least 1")
    if not _positive(raw["nic_gbps"]):
        raise _fail(path, f"{where}.nic_gbps", "a positive number of GB/s")
    if raw["connector"] not in CONNECTORS:
        raise _fail(path, f"{where}.connector", " or ".join(CONNECTORS))
    for key in ("model", "kv_dtype", "topology"):
        _text(raw, key, where, path)
    topology = REPOSITORY / raw["topology"]
    if not topology.is_file():
        raise _fail(path, f"{where}.topology", f"a bundled fixture; {raw['topology']!r} is not a file")
    if raw["model"] not in models:
        models[raw["model"]] = find_model(raw["model"])  # a catalog name; unknown: its own one-line error
    return Pricing(raw["model"], raw["kv_dtype"], raw["prompt_tokens"], topology, float(raw["nic_gbps"]), raw["tp"],
                   raw["connector"])


def _case(raw: Any, where: str, path: Path, models: dict[str, ModelSpec]) -> Case:
    if not isinstance(raw, dict) or set(raw) - CASE_KEYS:
        raise _fail(path, where, f"an object with keys among {', '.join(sorted(CASE_KEYS))}")
    measured = raw.get("measured")
    if (not isinstance(measured, dict) or not measured or set(measured) - {"ms", "gbps"}
            or not all(_positive(v) for v in measured.values())):
        raise _fail(path, f"{where}.measured", "{\"ms\": .., \"gbps\": ..} (one or both, positive)")
    pricing = None if raw.get("price") is None else _pricing(raw["price"], f"{where}.price", path, models)
    not_priced = _text(raw, "not_priced", where, path, optional=pricing is not None)
    if pricing is not None and not_priced is not None:
        raise _fail(path, f"{where}.not_priced", "nothing when the case has `price`")
    return Case(_text(raw, "id", where, path), _text(raw, "source", where, path), _text(raw, "what", where, path),
                measured.get("ms"), measured.get("gbps"), _text(raw, "stated_kv", where, path, optional=True),
                pricing, not_priced, _text(raw, "notes", where, path, optional=True))


def load_cases(path: str | Path = DEFAULT_FILE) -> tuple[list[Case], dict[str, ModelSpec]]:
    """The file's cases, checked (every problem one line naming the file and the key), and the models they
    price with: the file's own `models` (HF config.json fields, each with its source) and catalog names."""
    path = Path(path)
    raw = read_json(path, "a published P/D transfer file")
    if not isinstance(raw, dict) or raw.get("version") != SCHEMA_VERSION:
        raise TopoplanError(f"expected a JSON object with \"version\": {SCHEMA_VERSION}", source=path)
    models: dict[str, ModelSpec] = {}
    for name, entry in (raw.get("models") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict) or not entry.get("source"):
            raise _fail(path, f"models.{name}", "{\"source\": .., \"config\": {HF config.json fields}}")
        models[name] = spec_from_config(entry["config"], name, source=path)
    cases = raw.get("cases")
    if not isinstance(cases, list) or not cases:
        raise _fail(path, "cases", "a non-empty list")
    return [_case(c, f"cases[{i}]", path, models) for i, c in enumerate(cases)], models


def _worker(role: str, node: int, layout: Layout, topology: Any) -> Worker:
    """The first `layout.tp` GPUs of `node`, each with its KV route (its nearest NIC; topoplan.plan.kv_transfer)."""
    gpus, routes = tuple(g.id for g in topology.gpus[:layout.tp]), kv_routes(topology)
    return Worker(role, 0, node, layout, gpus, (), (), tuple(routes[g] for g in gpus))


def price_case(pricing: Pricing, spec: ModelSpec) -> KvTransfer:
    """price_transfer from `tp` GPUs of node 0 to `tp` GPUs of node 1 (links and bus efficiency: the
    calibration's defaults, which every engine shares; the NIC speed the source states)."""
    topology = load_topology(str(pricing.topology))
    if pricing.tp > len(topology.gpus):
        raise TopoplanError(f"tp {pricing.tp}: {pricing.topology.name} has {len(topology.gpus)} GPUs")
    layout = Layout(tp=pricing.tp)
    pricer = LinkPricer(topology, Calibration(), pricing.nic_gbps)
    prefill, decode = (_worker(role, node, layout, topology) for role, node in (("prefill", 0), ("decode", 1)))
    return price_transfer(pricer, spec, pricing.prompt_tokens, pricing.kv_dtype, prefill, decode,
                          connector=pricing.connector)


def published_rows(path: str | Path = DEFAULT_FILE) -> list[dict[str, Any]]:
    """One row per case: what was measured and, where priced, the price and the error."""
    cases, models = load_cases(path)
    rows = []
    for case in cases:
        row: dict[str, Any] = {"id": case.id, "source": case.source, "what": case.what, "stated_kv": case.stated_kv,
                               "measured_ms": case.measured_ms, "measured_gbps": case.measured_gbps,
                               "not_priced": case.not_priced, "notes": case.notes}
        if case.pricing is not None:
            priced = price_case(case.pricing, models[case.pricing.model])
            compared = "ms" if case.measured_ms is not None else "gbps"
            measured, predicted = ((case.measured_ms, priced.ms) if compared == "ms"
                                   else (case.measured_gbps, priced.gbps))
            row |= {"priced_bytes": priced.bytes_per_request, "priced_ms": priced.ms, "priced_gbps": priced.gbps,
                    "priced_path": priced.path, "compared": compared, "error": (predicted - measured) / measured}
        rows.append(row)
    return rows
