"""Findings as a table (grouped by what they protect, worst first inside a group) or as JSON.

Every string from a recording (file contents, interface names) is made printable before it reaches rich or
the terminal: a recording is input, and a control character in it must not move the cursor or recolour."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from topoplan.doctor.finding import EXIT_CODES, GROUPS, SEVERITIES, Finding, exit_code, worst
from topoplan.errors import printable
from topoplan.terminal import emit

STYLES = {"ok": "green", "unknown": "dim", "note": "cyan", "slows": "yellow", "blocks": "bold red"}
FINDINGS_FORMAT = "topoplan-doctor-findings"


def ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (GROUPS.index(f.group), -SEVERITIES.index(f.severity)))


def findings_json(findings: list[Finding], source: str) -> dict[str, Any]:
    return {"format": FINDINGS_FORMAT, "source": source, "worst": worst(findings),
            "exit_code": exit_code(findings), "exit_codes": EXIT_CODES,
            "findings": [f.as_dict() for f in ordered(findings)]}


def findings_table(findings: list[Finding], source: str) -> Table:
    table = Table(title=Text(f"topoplan doctor: {printable(source)}"), title_justify="left", show_lines=False,
                  caption=Text(f"worst: {worst(findings)}; exit status {exit_code(findings)} "
                               "(0 ok/notes/unknown, 3 slows, 4 blocks)"), caption_justify="left")
    for name, ratio in (("group", None), ("severity", None), ("subject", 1), ("finding, evidence and fix", 3)):
        table.add_column(name, overflow="fold", ratio=ratio)
    for f in ordered(findings):
        cell = Text(printable(f.message))
        cell.append("\n" + printable(f.evidence), style="dim")
        if f.fix:
            cell.append("\nfix: " + printable(f.fix))
        table.add_row(Text(f.group), Text(f.severity, style=STYLES[f.severity]), Text(printable(f.subject)), cell)
    return table


def print_findings(findings: list[Finding], source: str, console: Console | None = None) -> None:
    emit(console or Console(), findings_table(findings, source))
