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

BOS, EOS, PAD = 256, 257, 258
BYTE_VOCAB = 264  # 256 bytes + specials, rounded up so that TP degrees 1-4, 6, 8, 12 divide it

_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "vocab_size": BYTE_VOCAB,
    "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "topoplan_byte_tokenizer": True,
}
BUILTIN: dict[str, dict[str, Any]] = {
    "tiny": {**_COMMON, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
             "num_key_value_heads": 4, "intermediate_size": 384, "max_position_embeddings": 4096},
    "small": {**_COMMON, "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8, "intermediate_size": 2816, "max_position_embeddings": 4096},
}



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
