"""A small YAML writer for the manifests launch emits: mappings, lists, strings, integers and booleans, with
comments above keys and list items.

Deterministic (keys in the order given) and safe by construction: every string value is a double-quoted scalar
in which everything outside printable ASCII, and `"` and `\\`, is escaped, so no value can turn into another
type (`yes`, `010`, `null`, `1e3`), break the structure (`: `, `- `, `#`, a newline) or carry YAML syntax; keys
are written plain only when they are simple names that no YAML reader takes for a boolean or null. The output is
what PyYAML and Kubernetes' YAML reader (YAML 1.1 and 1.2 alike) read back as the same data (tests/test_lws.py).
A runtime dependency on PyYAML for one output format would cost every `topoplan` start-up its import checks;
this subset is all a manifest needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_NOT_PLAIN = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}  # YAML 1.1 booleans and null


@dataclass(frozen=True)
class Commented:
    """A value written with `# comment` lines above its key or list item."""

    value: object
    comment: str


def _escape(text: str, specials: str) -> str:
    """`text` in printable ASCII: YAML escapes for every other character and for `specials`."""
    out = []
    for ch in text:
        if ch in specials:
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def quote(text: str) -> str:
    """`text` as a double-quoted YAML scalar with only printable ASCII inside."""
    return '"' + _escape(text, '"\\') + '"'


def _key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"YAML keys here are strings, got {key!r}")
    return key if _PLAIN_KEY.fullmatch(key) and key.lower() not in _NOT_PLAIN else quote(key)


def _scalar(value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (dict, list)) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML here")


def _comment_lines(comment: str | None, pad: str) -> list[str]:
    if comment is None:
        return []
    return [f"{pad}# {_escape(line, '')}".rstrip() for line in comment.splitlines() or [""]]


def _unwrap(value: object) -> tuple[object, str | None]:
    return (value.value, value.comment) if isinstance(value, Commented) else (value, None)


def _block(value: object) -> bool:
    return isinstance(value, (dict, list)) and bool(value)


def _lines(value: dict | list, indent: int) -> list[str]:
    pad, out = " " * indent, []
    if isinstance(value, dict):
        for key, item in value.items():
            item, comment = _unwrap(item)
            out += _comment_lines(comment, pad)
            if _block(item):
                out += [f"{pad}{_key(key)}:", *_lines(item, indent + 2)]  # type: ignore[arg-type]
            else:
                out.append(f"{pad}{_key(key)}: {_scalar(item)}")
        return out
    for item in value:
        item, comment = _unwrap(item)
        out += _comment_lines(comment, pad)
        if not _block(item):
            out.append(f"{pad}- {_scalar(item)}")
            continue
        inner = _lines(item, indent + 2)  # type: ignore[arg-type]
        if isinstance(item, dict) and not inner[0].lstrip().startswith("#"):
            out += [f"{pad}- {inner[0].lstrip()}", *inner[1:]]  # `- key: value`, the rest aligned under it
        else:
            out += [f"{pad}-", *inner]
    return out


def dump(document: dict, header: Sequence[str] = ()) -> str:
    """The document (a mapping) as YAML text, after `header` comment lines."""
    comments = _comment_lines("\n".join(header), "") if header else []
    return "\n".join([*comments, *_lines(document, 0)]) + "\n"
