"""Reading JSON input: one wording for an unreadable file and for bad JSON (with its line), whoever reads it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_DIGITS, MAX_JSON_DEPTH, read_capped


def parse_json(text: str, source: str | Path, what: str) -> Any:
    """`text` as JSON; bad JSON is a TopoplanError at its line, saying `what` the file should have been.

    Stricter than json.loads where Python's reader would crash or accept what JSON does not: nesting deeper
    than MAX_JSON_DEPTH (RecursionError), integers longer than MAX_DIGITS (Python's int-string limit),
    NaN/Infinity and numbers that overflow to infinity (not JSON; they would print as invalid JSON later)."""
    _check_depth(text, source, what)
    try:
        return json.loads(text, parse_int=lambda s: _int(s, source, what),
                          parse_float=lambda s: _float(s, source, what),
                          parse_constant=lambda s: _constant(s, source, what))
    except json.JSONDecodeError as error:
        raise TopoplanError(f"not valid JSON ({error.msg}); expected {what}", source=source,
                            line=error.lineno) from None


def _check_depth(text: str, source: str | Path, what: str) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH in one linear pass (brackets inside strings do not count)."""
    depth, in_string, escaped = 0, False, False
    for index, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise TopoplanError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels; expected {what}",
                                    source=source, line=text.count("\n", 0, index) + 1)
        elif ch in "]}":
            depth -= 1


def _int(text: str, source: str | Path, what: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise TopoplanError(f"a JSON integer with {len(text)} digits; expected at most {MAX_DIGITS} in {what}",
                            source=source)
    return int(text)


def _float(text: str, source: str | Path, what: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise TopoplanError(f"the JSON number {text[:20]}{'...' if len(text) > 20 else ''} overflows a float; "
                            f"expected a finite number in {what}", source=source)
    return value


def _constant(text: str, source: str | Path, what: str) -> Any:
    raise TopoplanError(f"{text} is not JSON (expected a finite number in {what})", source=source)


def read_json(path: str | Path, what: str) -> Any:
    """The JSON in file `path`; a file that cannot be read (missing, a folder, no permission, not UTF-8) or bad
    JSON is a TopoplanError naming the file and `what`."""
    path = Path(path)
    try:
        data = read_capped(path)
    except OSError as error:
        raise TopoplanError(f"cannot read it: {error.strerror or error}; expected {what}", source=path) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TopoplanError(f"not UTF-8 text (byte 0x{data[error.start]:02x}); expected {what}", source=path,
                            line=data.count(b"\n", 0, error.start) + 1) from None
    return parse_json(text, path, what)
