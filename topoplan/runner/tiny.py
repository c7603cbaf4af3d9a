"""Built-in models: random weights from a fixed seed, byte-level vocabulary, written as HF folders.

`tiny` is for demos and tests (per-token overhead dominates); `small` (about 370 MB of fp32 weights) is
large enough that decode is bound by memory bandwidth on a CPU. Token ids 0-255 are bytes, so no
tokenizer is needed; 256 is BOS, 257 EOS, 258 padding. The weights are scaled so that activations keep
unit variance and logits are well separated: greedy tokens then do not flip on rounding noise, which
the sharded-versus-unsharded tests rely on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from topoplan.errors import TopoplanError
from topoplan.runner.config import parse_hf_config

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


def random_weights(hf_config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named fp32 tensors for a Llama-family config: N(0, 1/fan_in) matrices, norms near 1."""
    cfg = parse_hf_config(hf_config, source="<built-in config>")
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std + mean

    d, dh = cfg.dim, cfg.head_dim
    out = {"model.embed_tokens.weight": normal(cfg.vocab_size, d, std=1.0),
           "model.norm.weight": normal(d, std=0.1, mean=1.0)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = normal(cfg.vocab_size, d, std=d ** -0.5)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (cfg.n_heads * dh, d), "self_attn.k_proj": (cfg.n_kv_heads * dh, d),
                  "self_attn.v_proj": (cfg.n_kv_heads * dh, d), "self_attn.o_proj": (d, cfg.n_heads * dh),
                  "mlp.gate_proj": (cfg.intermediate_size, d), "mlp.up_proj": (cfg.intermediate_size, d),
                  "mlp.down_proj": (d, cfg.intermediate_size)}
        for name, (rows, cols) in shapes.items():
            out[f"{p}{name}.weight"] = normal(rows, cols, std=cols ** -0.5)
        if cfg.qkv_bias:
            for name in ("q_proj", "k_proj", "v_proj"):
                out[f"{p}self_attn.{name}.bias"] = normal(shapes[f"self_attn.{name}"][0], std=0.1)
        if cfg.o_bias:
            out[f"{p}self_attn.o_proj.bias"] = normal(d, std=0.1)
        out[f"{p}input_layernorm.weight"] = normal(d, std=0.1, mean=1.0)
        out[f"{p}post_attention_layernorm.weight"] = normal(d, std=0.1, mean=1.0)
    return out


def save_checkpoint(folder: str | Path, hf_config: dict[str, Any], seed: int = 0) -> Path:
    """Write config.json + model.safetensors with random weights; atomically (a temp folder renamed)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise TopoplanError("already exists and is not empty; choose a new folder", source=folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(random_weights(hf_config, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.replace(tmp, folder)  # fails if another process got there first with a non-empty folder
    except OSError:
        if not (folder / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def builtin_folder(name: str) -> Path:
    """The HF folder of built-in model `name`, written to the user cache on first use."""
    if name not in BUILTIN:
        raise TopoplanError(f"unknown built-in model {name!r}; expected one of {', '.join(BUILTIN)} or a folder")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topoplan" / "models"
    folder = cache / f"{name}-seed0"
    if not (folder / "model.safetensors").exists():
        save_checkpoint(folder, BUILTIN[name])
    return folder


def encode_bytes(text: str) -> list[int]:
    """Byte-level tokenisation of the built-in models: BOS then the UTF-8 bytes."""
    return [BOS, *text.encode("utf-8")]


def decode_bytes(ids: list[int]) -> str:
    """Bytes back to text; special ids are dropped."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
