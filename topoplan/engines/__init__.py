"""The serving engines topoplan plans and launches for, named once: `vllm`, `sglang`, `trtllm`, `topoplan`.

A user names an engine as `NAME` (its current profile) or `NAME@VERSION` (an older one, e.g. `vllm@0.2`).
This module parses that name and resolves it to an EngineProfile (`resolve`); what each engine is
(parallelism rules, memory policy, all-reduce path, overheads) lives in one module per engine beside this
one (topoplan/engines/vllm.py, sglang.py, trtllm.py, topoplan.py), and how its command line is written
lives under `topoplan.launch`, which may import the planner (this package may not).
"""

from __future__ import annotations

from dataclasses import dataclass

from topoplan.engines import sglang, trtllm, vllm
from topoplan.engines import topoplan as bundled
from topoplan.engines.profile import EngineProfile
from topoplan.errors import TopoplanError

ENGINE_NAMES = ("topoplan", "vllm", "sglang", "trtllm")
DEFAULT_ENGINE = "topoplan"


@dataclass(frozen=True)
class EngineId:
    """An engine and, when the user pinned one, its version (None: the newest profile)."""

    name: str
    version: str | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


def parse_engine(text: str) -> EngineId:
    """`vllm` or `vllm@0.2` -> EngineId; a one-line error naming the known engines otherwise."""
    name, sep, version = text.strip().lower().partition("@")
    if name not in ENGINE_NAMES:
        raise TopoplanError(f"unknown engine {text!r}: expected one of {', '.join(ENGINE_NAMES)} "
                            f"(optionally NAME@VERSION, e.g. vllm@0.2)")
    if sep and not version:
        raise TopoplanError(f"engine {text!r} has '@' but no version after it (e.g. vllm@0.2)")
    return EngineId(name, version or None)


# Every profile by engine, oldest first: the last one is what a bare NAME means.
PROFILES: dict[str, tuple[EngineProfile, ...]] = {
    "topoplan": bundled.PROFILES, "vllm": vllm.PROFILES, "sglang": sglang.PROFILES, "trtllm": trtllm.PROFILES,
}


def resolve(engine: EngineId | str) -> EngineProfile:
    """The profile of `vllm` (the newest), `vllm@0.2` (the one covering that version) or an EngineId; a
    one-line error listing the versions there are profiles for otherwise."""
    engine = parse_engine(engine) if isinstance(engine, str) else engine
    profiles = PROFILES[engine.name]
    if engine.version is None:
        return profiles[-1]
    found = next((p for p in reversed(profiles) if p.matches(engine.version)), None)
    if found is None:
        known = "; ".join(f"{p} covers {p.covers[0]}-{p.covers[1]}" for p in profiles)
        raise TopoplanError(f"no {engine.name} profile for version {engine.version!r}: known {known}")
    return found
