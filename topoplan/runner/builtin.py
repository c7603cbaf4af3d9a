"""The built-in models' configs and byte-level tokenisation (no torch here: the CLI checks runs with it).

`tiny` is for demos and tests (per-token overhead dominates); `small` (about 370 MB of fp32 weights) is
large enough that decode is bound by memory bandwidth on a CPU. Token ids 0-255 are bytes, so no
tokenizer is needed; 256 is BOS, 257 EOS, 258 padding. topoplan.runner.tiny writes their random weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.models import CATALOG

BOS, EOS, PAD = 256, 257, 258

# The sizes (vocabulary included) are the planner's catalog entries, so `plan -m tiny` prices what runs;
# these are the keys only the runner reads.
_RUNTIME: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "bos_token_id": BOS, "eos_token_id": EOS,
    "pad_token_id": PAD, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
    "topoplan_byte_tokenizer": True, "max_position_embeddings": 4096,
}
BUILTIN: dict[str, dict[str, Any]] = {name: {**_RUNTIME, **CATALOG[name]} for name in ("tiny", "small")}


def checkpoint_folder(model: str) -> Path | None:
    """The one reading of the runner's `--model`: None for a built-in name (its folder is written on first
    use, topoplan.runner.tiny.builtin_folder), else the HF checkpoint folder it must name."""
    if model in BUILTIN:
        return None
    folder = Path(model)
    if not folder.is_dir():
        raise TopoplanError(f"--model {model!r}: not a folder; expected an HF checkpoint folder or one of "
                            f"{', '.join(BUILTIN)}")
    return folder


def builtin_cache_folder(name: str) -> Path:
    """Where built-in model `name` is written on first use: the user cache (XDG_CACHE_HOME)."""
    if name not in BUILTIN:
        raise TopoplanError(f"unknown built-in model {name!r}; expected one of {', '.join(BUILTIN)} or a folder")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topoplan" / "models"
    return cache / f"{name}-seed0"


def encode_bytes(text: str) -> list[int]:
    """Byte-level tokenisation of the built-in models: BOS then the UTF-8 bytes."""
    return [BOS, *text.encode("utf-8")]


def decode_bytes(ids: list[int]) -> str:
    """Bytes back to text; special ids are dropped."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
