"""Random weights from a fixed seed for the built-in models (topoplan.runner.builtin), written as HF folders.

The weights are scaled so that activations keep unit variance and logits are well separated: greedy
tokens then do not flip on rounding noise, which the sharded-versus-unsharded tests rely on.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from topoplan.atomic import exclusive_lock
from topoplan.errors import TopoplanError
from topoplan.runner.builtin import BUILD_RECORD, BUILTIN, SEED, build_record, builtin_cache_folder, cache_mismatch
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


def _write_model(folder: Path, hf_config: dict[str, Any], seed: int) -> None:
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file(random_weights(hf_config, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})


def save_checkpoint(folder: str | Path, hf_config: dict[str, Any], seed: int = 0) -> Path:
    """Write config.json + model.safetensors with random weights; atomically (a temp folder renamed)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise TopoplanError("already exists and is not empty; choose a new folder", source=folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _write_model(tmp, hf_config, seed)
        os.replace(tmp, folder)  # fails if another process got there first with a non-empty folder
    except OSError:
        if not (folder / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _build_cached(name: str, folder: Path) -> None:
    """Build built-in `name` in a temporary folder beside `folder`, its build record written last, then swap
    it in: a reader sees the old folder, no folder, or the complete new one; never a half-written one."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.build.", dir=folder.parent))
    stale = folder.parent / f"{tmp.name}.stale"
    try:
        _write_model(tmp, BUILTIN[name], SEED)
        (tmp / BUILD_RECORD).write_text(json.dumps(build_record(name, tmp), indent=1) + "\n")
        if folder.exists():
            os.replace(folder, stale)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)


def _interrupted_builds(folder: Path) -> list[Path]:
    """The temporary folders of `_build_cached` beside `folder` (`.NAME.build.*`, and `.stale` ones). Only the
    holder of the cache's lock writes them, so any found by the next holder are those of a build that was killed
    (SIGKILL, power loss) before its `finally` ran."""
    return sorted(folder.parent.glob(f".{folder.name}.build.*")) if folder.parent.is_dir() else []


def builtin_folder(name: str) -> Path:
    """The HF folder of built-in model `name` in the user cache: checked against its definition on every use,
    built on first use, rebuilt (with a one-line notice on stderr) when it does not match. Concurrent callers
    (the ranks of one run, two runs) take turns on a lock file, so one builds and the others find it built; the
    next holder of the lock removes what a killed build left."""
    folder = builtin_cache_folder(name)
    if cache_mismatch(name, folder) is None and not _interrupted_builds(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(folder.parent / f".{folder.name}.lock"):
        for leftover in _interrupted_builds(folder):
            shutil.rmtree(leftover, ignore_errors=True)
        problem = cache_mismatch(name, folder)  # another process may have built it while we waited
        if problem is None:
            return folder
        if folder.exists():
            print(f"topoplan: notice: rebuilding the cached built-in model {name} ({folder}): {problem}",
                  file=sys.stderr, flush=True)
        _build_cached(name, folder)
    return folder
