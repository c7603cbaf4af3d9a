"""Random weights from a fixed seed for the built-in models (topoplan.runner.builtin), written as HF folders.

The weights are scaled so that activations keep unit variance and logits are well separated: greedy
tokens then do not flip on rounding noise, which the sharded-versus-unsharded tests rely on.
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
from topoplan.runner.builtin import BUILTIN, builtin_cache_folder
from topoplan.runner.config import parse_hf_config


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
    folder = builtin_cache_folder(name)
    if not (folder / "model.safetensors").exists():
        save_checkpoint(folder, BUILTIN[name])
    return folder
