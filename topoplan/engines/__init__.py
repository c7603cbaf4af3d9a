"""The serving engines topoplan plans and launches for, named once: `vllm`, `sglang`, `trtllm`, `topoplan`.

A user names an engine as `NAME` (its current profile) or `NAME@VERSION` (an older one, e.g. `vllm@0.2`).
This module only parses and checks that name; what each engine is (parallelism rules, memory policy,
all-reduce path, overheads) lives in one module per engine beside this one, and how its command line is
written lives under `topoplan.launch`, which may import the planner (this package may not).
"""

from __future__ import annotations

from dataclasses import dataclass

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
