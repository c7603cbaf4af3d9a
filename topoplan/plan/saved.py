"""A plan saved for launch: `plan -o plan.json` records the request that priced it, so `launch --plan plan.json
--rank N` launches exactly that row, with every option that priced it, or refuses a stale file in one line.

The record holds every PlanRequest field (model, topology file, GPU, engine and version, workload, limits,
calibration, GPUs, EP), topoplan's version, and the SHA-256 of the files it read (topology, calibration, a
config.json model). `load_plan` checks the version and the hashes, plans again from the record and compares row N
with the saved one: a plan priced by another topoplan, or from files that changed since, is not launched.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from topoplan import __version__
from topoplan.errors import TopoplanError
from topoplan.jsonfile import read_json
from topoplan.layout import Layout
from topoplan.limits import read_capped
from topoplan.plan.cost import Workload
from topoplan.plan.disagg import DisaggRequest, DisaggResult
from topoplan.plan.disagg_types import DisaggPlan
from topoplan.plan.frontend import PlanRequest, plan_for
from topoplan.plan.rank import Limits, Plan, RankedLayout

RECORD_KEY = "request"
FILE_FIELDS = ("topo", "calibration", "model")  # request fields that may name a file whose contents priced the plan


def _digest(path: str) -> str | None:
    """SHA-256 of the file a request field names (a checkpoint folder: its config.json, what the planner reads);
    None when it names no readable file (a catalog model name)."""
    file = Path(path) / "config.json" if path != "-" and Path(path).is_dir() else Path(path)
    if path == "-" or not file.is_file():
        return None
    return hashlib.sha256(read_capped(file)).hexdigest()


def _located(value: Any) -> Any:
    """A file field's value as an absolute path where it names a file or folder, so that `launch --plan` finds it
    from another working directory; else (a catalog model name, "-") as given."""
    return str(Path(value).resolve()) if isinstance(value, str) and value != "-" and Path(value).exists() else value


def request_record(request: PlanRequest, disagg: DisaggRequest | None = None) -> dict[str, Any]:
    """The request as JSON (file fields as absolute paths), with topoplan's version and the digest of each file
    it read; with `disagg` (a `plan --disagg`), its P:D and connector under `disagg`."""
    record: dict[str, Any] = {} if disagg is None else {"disagg": disagg.record()}
    for f in fields(request):
        value = _located(getattr(request, f.name)) if f.name in FILE_FIELDS else getattr(request, f.name)
        record[f.name] = str(value) if f.name == "engine" else asdict(value) if f.name in ("workload", "limits") \
            else value
    files = {name: _digest(record[name]) for name in FILE_FIELDS if isinstance(record.get(name), str)}
    return {**record, "topoplan_version": __version__, "sha256": {k: v for k, v in files.items() if v}}


@dataclass(frozen=True)
class SavedRow:
    """Row N of a saved plan, planned again from its record: the request and the ranked layout."""

    request: PlanRequest
    plan: Plan
    row: RankedLayout


def _request(record: Any, path: str) -> PlanRequest:
    if not isinstance(record, dict):
        raise TopoplanError(f"no `{RECORD_KEY}` object: not a plan written by `topoplan plan -o FILE` (or --json)",
                            source=path)
    known = {f.name for f in fields(PlanRequest)}
    values = {k: v for k, v in record.items() if k in known}
    try:
        values["workload"] = Workload(**values.get("workload", {}))
        values["limits"] = Limits(**values.get("limits", {}))
        return PlanRequest(**values)
    except TypeError as error:
        raise TopoplanError(f"`{RECORD_KEY}` does not describe a plan request ({error})", source=path) from None


def _check_fresh(record: dict[str, Any], path: str) -> None:
    if record.get("topoplan_version") != __version__:
        raise TopoplanError(f"stale plan: priced by topoplan {record.get('topoplan_version')!r}, this is "
                            f"{__version__}; run `topoplan plan ... -o FILE` again", source=path)
    for name, digest in (record.get("sha256") or {}).items():
        named = record.get(name)
        if not isinstance(named, str) or _digest(named) != digest:
            raise TopoplanError(f"stale plan: {name} file {named!r} changed (or is gone) since the plan was made; run "
                                "`topoplan plan ... -o FILE` again", source=path)


def load_plan(path: str, rank: int) -> SavedRow:
    """Row `rank` (1 = best) of the plan saved at `path`, planned again from its record and checked against it."""
    document = read_json(path, "a plan from `topoplan plan -o FILE`")
    record = document.get(RECORD_KEY) if isinstance(document, dict) else None
    request = _request(record, path)
    _check_fresh(record, path)  # type: ignore[arg-type]
    saved = document.get("layouts") if isinstance(document, dict) else None
    if not isinstance(saved, list) or not 1 <= rank <= len(saved):
        count = len(saved) if isinstance(saved, list) else 0
        raise TopoplanError(f"--rank {rank}: the saved plan lists {count} layout(s), numbered from 1 (plan with "
                            "--top 0 to save them all)", source=path)
    plan = plan_for(request)
    if rank > len(plan.layouts):
        raise TopoplanError(f"stale plan: it now has {len(plan.layouts)} layout(s), not {rank}", source=path)
    row, want = plan.layouts[rank - 1], saved[rank - 1]
    layout = row.cost.layout
    got = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep}
    if not isinstance(want, dict) or any(want.get(k) != v for k, v in got.items()):
        raise TopoplanError(f"stale plan: row {rank} is now {layout}, the file says "
                            f"{ {k: want.get(k) for k in got} if isinstance(want, dict) else want}; run `topoplan plan "
                            "... -o FILE` again", source=path)
    return SavedRow(request, plan, row)


def load_disagg(path: str, rank: int = 1) -> tuple[PlanRequest, DisaggResult, DisaggPlan]:
    """The disaggregated plan saved by `plan --disagg -o FILE`, planned again from its record and checked against
    it (the same chosen P:D and worker layouts, and the same `rank`-th of its `candidates`), with the request that
    priced it and its `rank`-th deployment (1: the chosen one)."""
    document = read_json(path, "a plan from `topoplan plan --disagg -o FILE`")
    record = document.get(RECORD_KEY) if isinstance(document, dict) else None
    request = _request(record, path)
    _check_fresh(record, path)  # type: ignore[arg-type]
    asked, saved = record.get("disagg"), document.get("disagg")  # type: ignore[union-attr]
    if not isinstance(asked, dict) or not isinstance(saved, dict):
        raise TopoplanError("no `disagg` record: not a plan written by `topoplan plan --disagg -o FILE`", source=path)
    pd, roles = asked.get("pd"), asked.get("roles")
    try:
        disagg = DisaggRequest(tuple(pd) if isinstance(pd, list) else None,  # type: ignore[arg-type]
                               asked.get("connector", DisaggRequest().connector),
                               tuple(Layout.parse(r) for r in roles) if isinstance(roles, list) else None,  # type: ignore
                               asked.get("roles_from"))
    except (TypeError, AttributeError) as error:
        raise TopoplanError(f"`disagg` does not describe a disaggregated request ({error})", source=path) from None
    result = disagg.plan(request)
    chosen = result.chosen
    now = {"prefill": chosen.ratio[0], "decode": chosen.ratio[1], "prefill_layout": str(chosen.prefill),
           "decode_layout": str(chosen.decode)}
    then = {**(saved.get("ratio") or {}), "prefill_layout": saved.get("prefill_layout"),
            "decode_layout": saved.get("decode_layout")}
    if now != then:
        raise TopoplanError(f"stale plan: the deployment is now {now}, the file says {then}; run `topoplan plan "
                            "--disagg ... -o FILE` again", source=path)
    listed = saved.get("candidates")
    if not isinstance(listed, list) or not 1 <= rank <= len(listed):
        raise TopoplanError(f"--rank {rank}: the saved plan lists {len(listed) if isinstance(listed, list) else 0} "
                            "disaggregated candidate(s), numbered from 1", source=path)
    deployment = result.deployment(rank)
    now = {"prefill_layout": str(deployment.prefill), "decode_layout": str(deployment.decode),
           "ratio": list(deployment.ratio)}
    then = {key: listed[rank - 1].get(key) for key in now} if isinstance(listed[rank - 1], dict) else listed[rank - 1]
    if now != then:
        raise TopoplanError(f"stale plan: candidate {rank} is now {now}, the file says {then}; run `topoplan plan "
                            "--disagg ... -o FILE` again", source=path)
    return request, result, deployment
