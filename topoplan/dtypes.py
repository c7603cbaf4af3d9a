"""The one dtype table: each dtype's two spellings, its size, its torch dtype (looked up only when asked,
so planning stays torch-free), and how the planner stores and moves it.

The planner and `calibrate` speak the short spelling (`bf16`, as vLLM's `--dtype` and model cards do); the
runner and the bench speak torch's (`bfloat16`, the name the ranks pass to torch). Each command accepts the
set below that it can use.

Quantised weight formats (fp8, int4 AWQ/GPTQ, mxfp4) quantise the decoder's linear layers only: the embedding and
the LM head stay in the activation dtype, and activations (hence the all-reduces, the pipeline hand-offs
and, by default, the KV cache) travel in it too. That is what vLLM does with `--quantization fp8|awq|gptq`
and `--kv-cache-dtype auto` (the cache takes the model's activation dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from topoplan.errors import TopoplanError

# AWQ and GPTQ 4-bit checkpoints: 4-bit weights plus, per group of 128 input channels, one fp16 scale and one
# packed 4-bit zero point (AutoAWQ / AutoGPTQ default group_size=128): (128 x 0.5 + 2 + 0.5) / 128 bytes.
INT4_GROUP = 128
INT4_PARAM_BYTES = (INT4_GROUP * 0.5 + 2 + 0.5) / INT4_GROUP
# MXFP4 (OCP Microscaling Formats spec v1.0): 32 4-bit e2m1 elements share one 8-bit e8m0 scale: 17/32 bytes.
MXFP4_BLOCK = 32
MXFP4_PARAM_BYTES = (MXFP4_BLOCK * 0.5 + 1) / MXFP4_BLOCK


@dataclass(frozen=True)
class DType:
    short: str  # the planner's spelling: bf16
    name: str  # torch's spelling, the attribute of the torch module: bfloat16
    bytes: int  # one element of the torch dtype (int4: torch's one-byte container)
    computes: bool  # the runner and the CPU probes compute in it (fp8 is only moved, by `bench`)
    param_bytes: float = 0.0  # bytes per weight stored, scales included (0: `bytes`)
    activation: str = ""  # the dtype activations and the default KV cache travel in ("": itself)

    def torch(self) -> Any:
        """The torch.dtype (imports torch: call it only in runner/bench processes)."""
        import torch

        return getattr(torch, self.name)

    @property
    def weight_bytes(self) -> float:
        """Bytes per quantised weight (the decoder's linear layers), scales included."""
        return self.param_bytes or self.bytes

    @property
    def activations(self) -> DType:
        """The dtype activations, the embedding, the LM head and the default KV cache use."""
        return _BY_NAME[self.activation] if self.activation else self


DTYPES: tuple[DType, ...] = (
    DType("fp32", "float32", 4, True),
    DType("bf16", "bfloat16", 2, True),
    DType("fp16", "float16", 2, True),
    # fp8 e4m3 with per-tensor scales (one float per weight matrix: negligible); activations in bf16
    DType("fp8", "float8_e4m3fn", 1, False, activation="bf16"),
    # AWQ / GPTQ 4-bit weights, bf16 activations (fp16 on GPUs without bf16)
    DType("int4", "int4", 1, False, param_bytes=INT4_PARAM_BYTES, activation="bf16"),
    # OCP microscaling FP4 (gpt-oss checkpoints): e2m1 weights (torch packs two a byte), one e8m0 scale per block
    DType("mxfp4", "float4_e2m1fn_x2", 1, False, param_bytes=MXFP4_PARAM_BYTES, activation="bf16"),
)
_BY_NAME = {spelling: d for d in DTYPES for spelling in (d.short, d.name)}

PLAN_DTYPES = tuple(d.short for d in DTYPES)  # `plan --dtype`: the weights
KV_DTYPES = tuple(d.short for d in DTYPES if not d.param_bytes)  # `plan --kv-dtype`: elementwise dtypes
PROBE_DTYPES = tuple(d.short for d in DTYPES if d.computes)  # `calibrate --dtype`
RUN_DTYPES = tuple(d.name for d in DTYPES if d.computes)  # `run --dtype`
BENCH_DTYPES = tuple(d.name for d in DTYPES if not d.param_bytes)  # `bench --dtype`: what collectives move


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
