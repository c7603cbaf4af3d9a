"""`topoplan list gpus|models`: the catalogs the planner prices with, as rows with their sources.

The rows are read from the catalogs themselves (topoplan.hardware.GPUS, topoplan.models.CATALOG), so the
listing cannot drift from what `plan --gpu` and `plan --model` accept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from topoplan.hardware import GPUS
from topoplan.model_aliases import ALIASES
from topoplan.models import CATALOG, MODEL_SOURCES, spec_from_config


def gpu_rows() -> list[dict[str, Any]]:
    """Every GPU of the catalog, all its fields, catalog order."""
    return [asdict(spec) for spec in GPUS]


def model_rows() -> list[dict[str, Any]]:
    """Every catalog model: its sizes as the planner reads them, aliases, the config keys, and the source."""
    rows = []
    for name, config in CATALOG.items():
        spec = spec_from_config(config, name, source=f"catalog:{name}")
        rows.append({"name": name, "aliases": [a for a, target in ALIASES.items() if target == name],
                     "params": spec.params, "layers": spec.layers, "hidden": spec.hidden, "heads": spec.heads,
                     "kv_heads": spec.kv_heads, "experts": spec.experts, "max_context": spec.max_context,
                     "source": MODEL_SOURCES[name], "config": config})
    return rows


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in columns:  # aliases fold onto more lines at a narrow width; names, figures and sources never do
        table.add_column(name, justify="left" if name in ("name", "aliases") else "right",
                         no_wrap=name != "aliases", overflow="fold")
    table.add_column("src", justify="right", no_wrap=True, min_width=4)
    return table


def _with_sources(table: Table, rows: list[dict[str, Any]], cells: Callable[[dict[str, Any]], list[str]]) -> Group:
    """The table with a short `[n]` per row, and each distinct source once below it: a source is a sentence,
    which in a column would squeeze the figures at 80 columns."""
    numbers = {source: i for i, source in enumerate(dict.fromkeys(r["source"] for r in rows), 1)}
    for r in rows:
        table.add_row(*cells(r), f"[{numbers[r['source']]}]")
    return Group(table, *(Text(f"[{n}] {source}") for source, n in numbers.items()))


def gpu_table(rows: list[dict[str, Any]]) -> Group:
    table = _table(f"{len(rows)} GPUs (plan --gpu takes the name, an alias or the NVML name)",
                   ["name", "aliases", "arch", "GiB", "GB/s", "BF16 TF"])
    return _with_sources(table, rows, lambda r: [
        r["key"], "\n".join(r["aliases"]) or "-", r["arch"], f"{r['memory_mib'] / 1024:.0f}",
        f"{r['memory_bandwidth_gbps']:g}", f"{r['bf16_tflops']:g}"])


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"


def model_table(rows: list[dict[str, Any]]) -> Group:
    table = _table(f"{len(rows)} models (plan --model takes the name, an alias or a HF config.json)",
                   ["name", "aliases", "params", "layers", "heads/kv", "context"])
    return _with_sources(table, rows, lambda r: [
        r["name"], "\n".join(r["aliases"]) or "-", _params(r["params"]), str(r["layers"]),
        f"{r['heads']}/{r['kv_heads']}", f"{r['max_context']:,}" if r["max_context"] else "-"])
