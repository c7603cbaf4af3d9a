"""A disaggregated deployment chosen by aiconfigurator, read from its result file: how many prefill and decode
workers and each role's parallel layout. aiconfigurator says how many; `plan --disagg --pd-from FILE` then places
and prices exactly that deployment on this topology (its GPUs, NICs, NUMA nodes).

The file: `aiconfigurator cli default|exp --save-dir DIR` writes, per experiment, `DIR/<run>/disagg/
best_config_topn.csv` (and `pareto.csv`, the same columns) with pandas' `DataFrame.to_csv(index=False)`
(ai-dynamo/aiconfigurator src/aiconfigurator/cli/report_and_save.py, `save_results`); its columns are
`ColumnsDisagg` (aiconfigurator_core/sdk/common.py in aiconfigurator-core 0.12.0), one row per deployment, best
first (`best_config_topn`: the top N by tokens/s/gpu). A row's `(p)workers` prefill workers each run `(p)tp` x
`(p)pp` x `(p)dp` GPUs (`(p)cp` > 1: context parallel, which topoplan does not price), their MoE layers
`(p)moe_tp` x `(p)moe_ep` (= tp x dp); `(d)...` the same for decode (src/aiconfigurator/sdk/picking.py,
`build_disagg_summary_dict`). topoplan takes the first row; the run's folder (or its `disagg` folder) stands for
that file.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from topoplan.errors import TopoplanError
from topoplan.layout import Layout
from topoplan.limits import read_capped

RESULT_FILE = ("disagg", "best_config_topn.csv")  # where a run's folder keeps the disaggregated rows
ROLES = {"prefill": "(p)", "decode": "(d)"}
NEEDED = tuple(f"{prefix}{name}" for prefix in ROLES.values()
               for name in ("workers", "tp", "pp", "dp", "moe_tp", "moe_ep"))
EXPECTED = ("an aiconfigurator disagg result (best_config_topn.csv or pareto.csv of `aiconfigurator cli`, with "
            "columns (p)workers, (p)tp, (p)pp, (p)dp, (p)moe_tp, (p)moe_ep and the same for (d))")


@dataclass(frozen=True)
class AicDisagg:
    """aiconfigurator's deployment: P:D and each role's worker layout, with what its row says it was priced for."""

    pd: tuple[int, int]
    prefill: Layout
    decode: Layout
    source: str  # the CSV file read
    about: str  # the row's model, backend, system, ISL/OSL, in words (a note beside the plan)
    sized_for: tuple[int, int] | None = None  # the row's (isl, osl): the workload aiconfigurator sized it for


def _file(path: str) -> Path:
    """The CSV `path` names: the file itself, or a run's folder (its disagg/best_config_topn.csv), or that
    disagg folder."""
    given = Path(path)
    for candidate in (given, given / RESULT_FILE[1], given.joinpath(*RESULT_FILE)):
        if candidate.is_file():
            return candidate
    if given.is_dir():
        raise TopoplanError(f"no {RESULT_FILE[1]} in it or in its {RESULT_FILE[0]}/ folder; expected {EXPECTED}",
                            source=path)
    return given


def _whole(row: dict[str, str], column: str, source: Path, line: int) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)  # pandas writes an int column as "8", one with a missing value as "8.0"
    except ValueError:
        value = float("nan")
    if not (value == value and value.is_integer() and 1 <= value <= 1_000_000):
        raise TopoplanError(f"column {column} is {text[:20]!r}; expected a whole number of at least 1 in {EXPECTED}",
                            source=source, line=line)
    return int(value)


def _layout(row: dict[str, str], role: str, source: Path, line: int) -> Layout:
    """One role's worker as a topoplan layout: tp x pp x dp GPUs, the experts over moe_ep of them (ep; aiconfigurator's
    attention DP, dp > 1 with moe_ep = tp x dp, is topoplan's dp with ep = tp x dp). A dense model's rows say
    moe_tp 1, moe_ep 1 (src/aiconfigurator/sdk/task_v2.py), as do an MoE model's TP-sharded experts: both ep 1."""
    p = ROLES[role]
    tp, pp, dp = (_whole(row, f"{p}{name}", source, line) for name in ("tp", "pp", "dp"))
    moe_tp, moe_ep = (_whole(row, f"{p}{name}", source, line) for name in ("moe_tp", "moe_ep"))
    if (row.get(f"{p}cp") or "1").strip() not in ("", "1", "1.0"):
        raise TopoplanError(f"{role} workers use context parallelism ({p}cp {row[f'{p}cp'][:10]}), which topoplan "
                            "does not price; pick a row with cp 1", source=source, line=line)
    if (moe_tp, moe_ep) != (1, 1) and moe_tp * moe_ep != tp * dp:
        raise TopoplanError(f"{role}: {p}moe_tp x {p}moe_ep = {moe_tp * moe_ep} is not {p}tp x {p}dp = {tp * dp}, "
                            f"as aiconfigurator's MoE layouts are; expected {EXPECTED}", source=source, line=line)
    if dp > 1 and moe_ep != tp * dp:
        raise TopoplanError(f"{role}: {p}dp {dp} without the experts over every GPU of the worker ({p}moe_ep "
                            f"{moe_ep}, not tp x dp = {tp * dp}): topoplan prices DP inside a worker only as an MoE "
                            "model's attention DP with expert parallel over all its GPUs", source=source, line=line)
    try:
        return Layout(tp, pp, dp, moe_ep)
    except TopoplanError as error:
        raise TopoplanError(f"{role}: {error}", source=source, line=line) from None


def read_aic_disagg(path: str) -> AicDisagg:
    """The first (best) row of aiconfigurator's disagg result at `path` (a CSV, or the run's folder)."""
    source = _file(path)
    try:
        text = read_capped(source).decode("utf-8-sig")
    except OSError as error:
        raise TopoplanError(f"cannot read it: {error.strerror or error}; expected {EXPECTED}", source=path) from None
    except UnicodeDecodeError:
        raise TopoplanError(f"not UTF-8 text; expected {EXPECTED}", source=source) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header, row = reader.fieldnames or [], next(reader, None)
    except csv.Error as error:
        raise TopoplanError(f"not CSV ({error}); expected {EXPECTED}", source=source) from None
    missing = [c for c in NEEDED if c not in header]
    if missing:
        raise TopoplanError(f"no column {missing[0]}" + (" (an aggregated result?)" if "tp" in header else "") +
                            f"; expected {EXPECTED}", source=source, line=1)
    if row is None:
        raise TopoplanError(f"no rows; expected {EXPECTED}", source=source)
    line = reader.line_num
    pd = (_whole(row, "(p)workers", source, line), _whole(row, "(d)workers", source, line))
    prefill, decode = (_layout(row, role, source, line) for role in ROLES)
    about = ", ".join(f"{k} {row[k]}" for k in ("model", "(p)backend", "(p)system", "isl", "osl", "num_total_gpus")
                      if (row.get(k) or "").strip())
    lengths = [(row.get(k) or "").strip() for k in ("isl", "osl")]
    sized = (int(lengths[0]), int(lengths[1])) if all(t.isdigit() and len(t) < 9 for t in lengths) else None
    return AicDisagg(pd, prefill, decode, str(source), about, sized)
