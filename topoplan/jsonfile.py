"""Reading JSON input: one wording for a missing file and for bad JSON (with its line), whoever reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError


def parse_json(text: str, source: str | Path, what: str) -> Any:
    """`text` as JSON; bad JSON is a TopoplanError at its line, saying `what` the file should have been."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise TopoplanError(f"not valid JSON ({error.msg}); expected {what}", source=source,
                            line=error.lineno) from None


def read_json(path: str | Path, what: str) -> Any:
    """The JSON in file `path`; a missing file or bad JSON is a TopoplanError naming the file and `what`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TopoplanError(f"no such file; expected {what}", source=path) from None
    return parse_json(text, path, what)
