"""docs/limits.md's table shows the limits the code enforces: every row of topoplan.limits.LIMITS appears in it
verbatim, so a changed value in the code fails here until the document says the same."""

from __future__ import annotations

from pathlib import Path

from topoplan.limits import LIMITS, MAX_DEPTH, MAX_DIGITS, MAX_GPUS_PER_NODE

DOC = Path(__file__).resolve().parents[1] / "docs" / "limits.md"


def test_every_limit_row_is_in_the_document():
    table = [line for line in DOC.read_text().splitlines() if line.startswith("| ")]
    missing = [limit.row() for limit in LIMITS if limit.row() not in table]
    assert not missing, missing


def test_rows_show_the_values_the_readers_use():
    rows = {limit.what: limit.value for limit in LIMITS}
    assert rows["Nesting (JSON and XML)"] == f"{MAX_DEPTH} levels" == "64 levels"
    assert rows["Digits in one integer (text, JSON or XML, hex too)"] == str(MAX_DIGITS) == "20"
    assert rows["GPUs per node (every format)"] == str(MAX_GPUS_PER_NODE) == "32"
