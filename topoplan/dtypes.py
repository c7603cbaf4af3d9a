"""The one dtype table: each dtype's two spellings, its size, and its torch dtype (looked up only when asked,
so planning stays torch-free).

The planner and `calibrate` speak the short spelling (`bf16`, as vLLM's `--dtype` and model cards do); the
runner and the bench speak torch's (`bfloat16`, the name the ranks pass to torch). Each command accepts the
set below that it can use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from topoplan.errors import TopoplanError


@dataclass(frozen=True)
class DType:
    short: str  # the planner's spelling: bf16
    name: str  # torch's spelling, the attribute of the torch module: bfloat16
    bytes: int
    computes: bool  # the runner and the CPU probes compute in it (fp8 is only moved, by `bench`)

    def torch(self) -> Any:
        """The torch.dtype (imports torch: call it only in runner/bench processes)."""
        import torch

        return getattr(torch, self.name)


DTYPES: tuple[DType, ...] = (
    DType("fp32", "float32", 4, True),
    DType("bf16", "bfloat16", 2, True),
    DType("fp16", "float16", 2, True),
    DType("fp8", "float8_e4m3fn", 1, False),  # can the backend move fp8 activations? (gloo: no)
)
_BY_NAME = {spelling: d for d in DTYPES for spelling in (d.short, d.name)}

PLAN_DTYPES = tuple(d.short for d in DTYPES)  # `plan --dtype`: weights and KV cache
PROBE_DTYPES = tuple(d.short for d in DTYPES if d.computes)  # `calibrate --dtype`
RUN_DTYPES = tuple(d.name for d in DTYPES if d.computes)  # `run --dtype`
BENCH_DTYPES = tuple(d.name for d in DTYPES)  # `bench --dtype`


def dtype_of(name: str) -> DType:
    """The table's row for either spelling (`bf16` or `bfloat16`)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TopoplanError(f"unknown dtype {name!r}; expected one of {', '.join(_BY_NAME)}") from None


def checked_dtype(name: str, choices: Sequence[str], option: str = "--dtype") -> DType:
    """`name` if it is one of the command's `choices`, else a one-line error naming them."""
    if name not in choices:
        raise TopoplanError(f"unknown {option} {name!r}: expected one of {', '.join(choices)}")
    return _BY_NAME[name]
