"""The typer commands made from dataclasses whose fields declare their options (topoplan.option_fields: vLLM's
EngineArgs idea, the request type owns its options), so cli.py only says which dataclasses a command builds and
what it renders.

`Commands` builds each command only when it is called or listed, importing its dataclasses then: `topoplan inspect`
never loads the planner, the model catalog or the engine registry that `plan`'s request needs (start-up time,
benchmarks/cli_latency.py). Each call builds the dataclasses from the parsed values (their `__post_init__` checks
run there) and turns a TopoplanError into one line on stderr and its exit code.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import Field, dataclass
from enum import Enum
from typing import Any

import typer
from typer.core import TyperGroup

from topoplan.errors import TopoplanError
from topoplan.option_fields import Opt, build, default_of, options_of

# what typer parses, for the annotations the request dataclasses use (their annotations are strings: PEP 563)
_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "list[str]": list[str],
                          "tuple[str, ...]": list[str]}


def _cli_type(f: Field, opt: Opt) -> Any:
    if opt.choices:  # an Enum only for typer's sake: it shows [a|b] and refuses the rest; build() reads .value
        return Enum(f"{f.name}_choices", [(c.replace("-", "_"), c) for c in opt.choices], type=str)
    if opt.type is not None:
        return opt.type
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    text = text.removesuffix(" | None")
    if text not in _TYPES:
        raise TypeError(f"{f.name}: annotation {f.type!r} needs option(type=...)")
    return _TYPES[text]


def parameters(cls: type) -> list[inspect.Parameter]:
    """The typer parameters of `cls`'s options (keyword-only, named after the fields)."""
    params = []
    for f, opt in options_of(cls):
        kind = typer.Argument if opt.argument else typer.Option
        plain = opt.help.replace("[", "\\[")  # typer renders help as rich markup: "[extra]" would vanish as a tag
        info = kind(default_of(f, opt), *opt.names, help=plain, metavar=opt.metavar, **opt.extra)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                        annotation=_cli_type(f, opt)))
    return params


def fail(error: TopoplanError) -> typer.Exit:
    """Print a user error as one line on stderr; return the Exit to raise."""
    print(f"topoplan: error: {error}", file=sys.stderr)
    return typer.Exit(error.exit_code)


Source = type | str  # a dataclass, or "module:Class" to import when the command is built


def _resolve(source: Source) -> type:
    if isinstance(source, str):
        module, _, name = source.partition(":")
        return getattr(importlib.import_module(module), name)
    return source


@dataclass(frozen=True)
class Unbuilt:
    """A dataclass whose options a command takes but builds itself, being handed their parsed values (a dict by
    field name): for a request some of whose values depend on other options (LaunchRequest.from_options)."""

    source: Source


def _handed(source: type | Unbuilt, values: dict[str, Any]) -> Any:
    if isinstance(source, Unbuilt):
        return {f.name: values[f.name] for f, _ in options_of(source.source)}  # type: ignore[arg-type]
    return build(source, values)


@dataclass(frozen=True)
class _Lazy:
    """A command not built yet: the function that renders, the dataclasses it takes, typer's command settings."""

    name: str
    body: Callable[..., None]
    sources: tuple[Source | Unbuilt, ...]
    settings: dict[str, Any]

    def command(self) -> Any:
        """The click command: one typer option per field option of the dataclasses; each call builds them (their
        checks run; a TopoplanError is one line and exit 2) and hands them to `body`."""
        classes = [Unbuilt(_resolve(s.source)) if isinstance(s, Unbuilt) else _resolve(s) for s in self.sources]
        params = [p for cls in classes for p in parameters(cls.source if isinstance(cls, Unbuilt) else cls)]
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise TypeError(f"{self.name}: two options share a field name: {sorted(names)}")
        body = self.body

        def callback(**values: Any) -> None:
            try:
                body(*(_handed(cls, values) for cls in classes))
            except TopoplanError as error:
                raise fail(error) from None

        callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        callback.__doc__, callback.__name__ = body.__doc__, body.__name__
        single = typer.Typer(add_completion=False)  # the root app offers completion
        single.command(self.name, **self.settings)(callback)
        return typer.main.get_command(single)


class _Commands(dict):
    """The group's commands by name, a _Lazy one built on first access (click reads them through get, [] and
    items: `topoplan plan` builds plan's command only; `topoplan --help` builds them all to list them)."""

    def __getitem__(self, name: str) -> Any:
        value = super().__getitem__(name)
        if isinstance(value, _Lazy):
            value = value.command()
            super().__setitem__(name, value)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> Any:
        return [self[name] for name in self]

    def items(self) -> Any:
        return [(name, self[name]) for name in self]


class Commands:
    """The commands of one typer app, built when used: `app = typer.Typer(cls=commands.group)`, then
    `@commands.command("plan", "topoplan.plan.frontend:PlanRequest", PlanView)` on a function taking one instance
    of each dataclass, in that order (their options are listed in that order too)."""

    def __init__(self) -> None:
        self.lazy: dict[str, _Lazy] = {}
        lazy = self.lazy

        class Group(TyperGroup):
            def __init__(self, *args: Any, commands: dict[str, Any] | None = None, **kwargs: Any) -> None:
                super().__init__(*args, commands=commands, **kwargs)
                self.commands = _Commands({**lazy, **self.commands})  # declared order, typer's own (list) after

        self.group = Group

    def command(self, name: str, *sources: Source | Unbuilt, **settings: Any) -> Callable[[Callable[..., None]],
                                                                               Callable[..., None]]:
        def register(body: Callable[..., None]) -> Callable[..., None]:
            self.lazy[name] = _Lazy(name, body, sources, settings)
            return body

        return register
