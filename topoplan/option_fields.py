"""Options declared on dataclass fields: flag names, help text and the option's default beside the field, and the
way back from parsed values to the dataclass (whose own `__post_init__` checks them).

Standard library only, so the request modules that declare their options here (topoplan.run_options, the bench
worker's request) cost a rank process nothing; topoplan.cli_options makes typer commands of them. Adding an
option is one edit: docs/library.md, "Adding an option".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

MISSING: Any = dataclasses.MISSING
NESTED = "nested"
FIELD_DEFAULT: Any = type("FieldDefault", (), {})()  # an option whose default is its field's


@dataclasses.dataclass(frozen=True)
class Opt:
    """One option (or, with `argument`, the positional arguments) of a field."""

    names: tuple[str, ...]  # flags; empty: typer's --field-name
    help: str
    metavar: str | None = None
    type: Any = None  # what typer parses; None: from the field's annotation
    choices: tuple[str, ...] = ()  # the accepted words, shown as [a|b] (the field keeps the str)
    parse: Callable[[Any], Any] | None = None  # the parsed value -> the field's value, when given (not None)
    default: Any = FIELD_DEFAULT  # the option's default where it differs from the field's (None: "not given")
    argument: bool = False
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # more typer.Option settings (min, ...)


def option(*names: str, help: str, metavar: str | None = None, type: Any = None, choices: tuple[str, ...] = (),
           parse: Callable[[Any], Any] | None = None, default: Any = FIELD_DEFAULT, **extra: Any) -> dict[str, Opt]:
    """A field's metadata that makes it an option: `field(default=1, metadata=option("--nodes", help="..."))`."""
    return {"cli": Opt(names, help, metavar, type, choices, parse, default, extra=extra)}


def argument(*, help: str, parse: Callable[[Any], Any] | None = None) -> dict[str, Opt]:
    """A field's metadata that makes it the command's positional arguments (`launch ... -- COMMAND...`)."""
    return {"cli": Opt((), help, parse=parse, default=None, argument=True)}


def nested() -> dict[str, str]:
    """A field's metadata that lends the options of its dataclass (its default or default_factory) to the command."""
    return {"cli": NESTED}


def nested_class(f: dataclasses.Field) -> type:
    return f.default_factory if f.default_factory is not MISSING else type(f.default)  # type: ignore[return-value]


def options_of(cls: type) -> Iterator[tuple[dataclasses.Field, Opt]]:
    """Every (field, option) of `cls`, nested dataclasses' included, in field order."""
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("cli")
        if declared == NESTED:
            yield from options_of(nested_class(f))
        elif declared is not None:
            yield f, declared


def default_of(f: dataclasses.Field, opt: Opt) -> Any:
    if opt.default is not FIELD_DEFAULT:
        return opt.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    if f.default is MISSING:
        return ...  # required
    return f.default


def given_options(cls: type, values: dict[str, Any]) -> list[str]:
    """The flag of each of `cls`'s options (nested ones' included) whose parsed value in `values` (by field name)
    is not the option's default: what a command line gave, where giving the default is the same as leaving it out."""
    return [opt.names[0] for f, opt in options_of(cls) if f.name in values and values[f.name] != default_of(f, opt)]


def build(cls: type, values: dict[str, Any], **extra: Any) -> Any:
    """`cls` from parsed option values (by field name; a missing one takes the option's default), through each
    option's `parse`, nested dataclasses first, and `extra` arguments for fields that are no options; the
    dataclasses' `__post_init__` checks them. A class with `from_cli(kwargs)` builds itself from the keyword
    arguments (a nested dataclass's as a dict)."""
    from_cli = getattr(cls, "from_cli", None)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("cli")
        if declared == NESTED:  # from_cli gets a nested dataclass's arguments, to complete and build it
            inner = nested_class(f)
            kwargs[f.name] = build(inner, values) if from_cli is None else _arguments(inner, values)
        elif declared is not None:
            kwargs[f.name] = _value(f, declared, values)
    kwargs.update(extra)
    return from_cli(kwargs) if from_cli is not None else cls(**kwargs)


def _value(f: dataclasses.Field, opt: Opt, values: dict[str, Any]) -> Any:
    """The field's value from its option's parsed one (its default when missing)."""
    value = values.get(f.name, default_of(f, opt))
    if value is None and opt.argument:  # typer's value for no positional arguments: the field's own default
        return f.default_factory() if f.default_factory is not MISSING else f.default
    if isinstance(value, Enum) and opt.choices:
        value = value.value
    return opt.parse(value) if opt.parse is not None and value is not None else value


def _arguments(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    return {f.name: _value(f, opt, values) for f, opt in options_of(cls)}


