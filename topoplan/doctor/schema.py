"""A small shape checker for recordings: a damaged or hand-edited file is refused in one line that names the
field (`pci.0000:17:00.0.max_link_width: expected text or {"unreadable": why}, got 16`), before any check
reads it, so no check needs to guard against a wrong type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topoplan.doctor.readings import is_unreadable
from topoplan.errors import TopoplanError

MAX_ENTRIES = 65_536  # items in one map or list: a recording of the largest machine holds a few thousand


class ShapeError(Exception):
    def __init__(self, path: str, expected: str, value: Any):
        shown = repr(value)
        super().__init__(f"{path or 'the top level'}: expected {expected}, got "
                         f"{shown[:60] + '...' if len(shown) > 60 else shown}")


@dataclass(frozen=True)
class Leaf:
    """A value accepted by `test`, described as `what` in the error."""

    what: str
    test: Callable[[Any], bool]

    def check(self, value: Any, path: str) -> None:
        if not self.test(value):
            raise ShapeError(path, self.what, value)


@dataclass(frozen=True)
class Fields:
    """A JSON object with these required and optional keys; others refused unless `extra`."""

    required: dict[str, Any]
    optional: dict[str, Any] = field(default_factory=dict)
    extra: bool = False

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(path, "an object", value)
        for key, spec in self.required.items():
            if key not in value:
                raise ShapeError(_join(path, key), "a value (the field is missing)", None)
            spec.check(value[key], _join(path, key))
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], _join(path, key))
        unknown = sorted(set(value) - set(self.required) - set(self.optional))
        if unknown and not self.extra:
            raise ShapeError(_join(path, unknown[0]), "no such field", value[unknown[0]])


@dataclass(frozen=True)
class MapOf:
    """A JSON object whose values all have one shape."""

    values: Any
    keys: Leaf | None = None  # what every key must be; None: any text

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
            raise ShapeError(path, f"an object of at most {MAX_ENTRIES} entries", value)
        for key, item in value.items():
            if self.keys is not None and not self.keys.test(key):
                raise ShapeError(_join(path, key), f"a key that is {self.keys.what}", key)
            self.values.check(item, _join(path, key))


@dataclass(frozen=True)
class ListOf:
    items: Any

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) > MAX_ENTRIES:
            raise ShapeError(path, f"a list of at most {MAX_ENTRIES} items", value)
        for index, item in enumerate(value):
            self.items.check(item, f"{path}[{index}]")


@dataclass(frozen=True)
class OneOf:
    """The first shape that fits; the error names them all."""

    options: tuple[Any, ...]
    what: str

    def check(self, value: Any, path: str) -> None:
        for option in self.options:
            try:
                option.check(value, path)
                return
            except ShapeError:
                continue
        raise ShapeError(path, self.what, value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


TEXT = Leaf("text", lambda v: isinstance(v, str))
INT = Leaf("an integer", _is_int)
BOOL = Leaf("true or false", lambda v: isinstance(v, bool))
UNREADABLE = Leaf('{"unreadable": why}', is_unreadable)
CPU_NUMBER = Leaf("a CPU number", lambda v: isinstance(v, str) and v.isdigit() and len(v) <= 5)
READING = Leaf('text or {"unreadable": why}', lambda v: isinstance(v, str) or is_unreadable(v))
NVML_ANSWER = Leaf('a number, text or {"nvml_error": NAME} (NVML\'s raw answer)',
                   lambda v: _is_int(v) or isinstance(v, str)
                   or (isinstance(v, dict) and set(v) == {"nvml_error"} and isinstance(v["nvml_error"], str)))
NVML_INT = Leaf('a number or {"nvml_error": NAME} (NVML\'s raw answer)',
                lambda v: _is_int(v) or (isinstance(v, dict) and set(v) == {"nvml_error"}
                                         and isinstance(v["nvml_error"], str)))
ANYTHING = Leaf("anything", lambda v: True)


def check_shape(data: Any, spec: Any, source: str) -> None:
    """Refuse `data` that does not fit `spec`, naming the first field that does not."""
    try:
        spec.check(data, "")
    except ShapeError as error:
        raise TopoplanError(f"damaged doctor recording: {error}", source=source) from None
