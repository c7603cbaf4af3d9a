"""The registry of the engines topoplan plans, launches and drives: one Engine per engine and version range.

A user names an engine as `NAME` (its newest version) or `NAME@VERSION` (an older one, e.g. `vllm@0.2`); `resolve`
turns that into the Engine object once, at the edge (the CLI, or a request built from Python), and that object
travels to the planner, the launcher and calibrate/validate. What each engine is lives in one module per engine
beside this one (topoplan/engines/vllm.py, sglang.py, trtllm.py, topoplan.py, each listing its ENGINES oldest
first); adding a version is one Engine there (docs/library.md). This is the only list of the modules.
"""

from __future__ import annotations

from topoplan.engines import sglang, trtllm, vllm
from topoplan.engines import topoplan as bundled
from topoplan.engines.engine import Engine
from topoplan.errors import TopoplanError

ENGINES: tuple[Engine, ...] = (*bundled.ENGINES, *vllm.ENGINES, *sglang.ENGINES, *trtllm.ENGINES)
ENGINE_NAMES = tuple(dict.fromkeys(e.name for e in ENGINES))
DEFAULT_ENGINE = bundled.RUNNER.name


def versions(name: str) -> tuple[Engine, ...]:
    """Every version of the engine `name`, oldest first (the last is what a bare NAME means)."""
    return tuple(e for e in ENGINES if e.name == name)


def resolve(engine: Engine | str) -> Engine:
    """`vllm` -> the newest vLLM; `vllm@0.2` -> the version covering 0.2; an Engine stays itself. A one-line error
    naming the known engines, or the versions there are, otherwise."""
    if isinstance(engine, Engine):
        return engine
    name, sep, version = engine.strip().lower().partition("@")
    if name not in ENGINE_NAMES:
        raise TopoplanError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINE_NAMES)} "
                            f"(optionally NAME@VERSION, e.g. vllm@0.2)")
    if sep and not version:
        raise TopoplanError(f"engine {engine!r} has '@' but no version after it (e.g. vllm@0.2)")
    known = versions(name)
    if not version:
        return known[-1]
    found = next((e for e in reversed(known) if e.matches(version)), None)
    if found is None:
        covered = "; ".join(f"{e} covers {e.covers[0]}-{e.covers[1]}" for e in known)
        raise TopoplanError(f"no {name} profile for version {version!r}: known {covered}")
    return found


def default_engine() -> Engine:
    """The bundled runner: what `plan` and `launch` price and start when no --engine is named."""
    return bundled.RUNNER
