"""Reading JSON input: one wording for an unreadable file and for bad JSON (with its line), whoever reads it."""

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
    """The JSON in file `path`; a file that cannot be read (missing, a folder, no permission, not UTF-8) or bad
    JSON is a TopoplanError naming the file and `what`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TopoplanError(f"cannot read it: {error.strerror or error}; expected {what}", source=path) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TopoplanError(f"not UTF-8 text (byte 0x{data[error.start]:02x}); expected {what}", source=path,
                            line=data.count(b"\n", 0, error.start) + 1) from None
    return parse_json(text, path, what)
