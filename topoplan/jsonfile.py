"""Reading JSON input: one wording for an unreadable file and for bad JSON (with its line), whoever reads it."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_DEPTH, MAX_DIGITS, MAX_ELEMENTS, read_capped


def parse_json(text: str, source: str | Path, what: str) -> Any:
    """`text` as JSON; bad JSON is a TopoplanError at its line, saying `what` the file should have been.

    Stricter than json.loads where Python's reader would crash or accept what JSON does not: nesting deeper
    than MAX_DEPTH (RecursionError), more than MAX_ELEMENTS values (seconds and hundreds of MiB), integers
    longer than MAX_DIGITS (Python's int-string limit), NaN/Infinity and numbers that overflow to infinity (not
    JSON; they would print as invalid JSON later)."""
    _check_shape(text, source, what)
    try:
        return json.loads(text, parse_int=lambda s: _int(s, source, what),
                          parse_float=lambda s: _float(s, source, what),
                          parse_constant=lambda s: _constant(s, source, what))
    except json.JSONDecodeError as error:
        raise TopoplanError(f"not valid JSON ({error.msg}); expected {what}", source=source,
                            line=error.lineno) from None


# A string once its escaped backslashes and quotes are gone; an unclosed one runs to the end (one pass, and a
# single character-class repeat, which the regex engine runs without per-character state).
_STRING = re.compile(r'"[^"]*"?')
_BRACKET = re.compile(r"[\[\]{}]")


def _check_shape(text: str, source: str | Path, what: str) -> None:
    """Refuse more than MAX_ELEMENTS values or nesting deeper than MAX_DEPTH, before json.loads allocates
    anything: strings are blanked and separators counted at C speed, and only then are the brackets (at most
    MAX_ELEMENTS of them) walked for depth."""
    bare = _STRING.sub('""', text.replace("\\\\", "").replace('\\"', ""))
    elements = bare.count(",") + bare.count("[") + bare.count("{")
    if elements > MAX_ELEMENTS:
        raise TopoplanError(f"{elements} JSON values; expected at most {MAX_ELEMENTS:,} in {what}", source=source)
    depth = 0
    for bracket in _BRACKET.finditer(bare):
        depth += 1 if bracket.group(0) in "[{" else -1
        if depth > MAX_DEPTH:
            raise TopoplanError(f"JSON nested deeper than {MAX_DEPTH} levels; expected {what}",
                                source=source, line=bare.count("\n", 0, bracket.start()) + 1)


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
