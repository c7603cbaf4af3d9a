"""HF `config.json` -> `ModelConfig`, the runner's one description of a Llama-family model.

Covers what Llama 2/3/3.1, Mistral and Qwen2 checkpoints write, in both spellings transformers has used:
`rope_theta` + `rope_scaling` (v4 and most published checkpoints) and `rope_parameters` (v5).
Anything the runner cannot compute exactly is refused with a TopoplanError naming the file and key,
rather than run with silently different numerics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Global (unsharded) sizes of a Llama-family decoder."""

    vocab_size: int
    dim: int  # hidden_size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # sorted items of the HF dict; () means plain RoPE
    qkv_bias: bool = False  # Qwen2: always; Llama: attention_bias
    o_bias: bool = False  # Llama attention_bias also biases o_proj; Qwen2 does not
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # Mistral: keys older than this many positions are not attended
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    byte_tokenizer: bool = False  # the built-in models: token id == byte value, no tokenizer.json

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def parse_hf_config(raw: dict[str, Any], source: str | Path = "config.json") -> ModelConfig:
    """Read the keys the runner needs from an HF config dict; refuse what it cannot run exactly."""

    def need(key: str) -> Any:
        if key not in raw:
            raise TopoplanError(f"missing key {key!r} (expected a Llama-family HF config)", source=source)
        return raw[key]

    model_type = need("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TopoplanError(f"model_type {model_type!r} is not supported; expected one of "
                            f"{', '.join(SUPPORTED_MODEL_TYPES)}", source=source)
    if raw.get("hidden_act", "silu") != "silu":
        raise TopoplanError(f"hidden_act {raw['hidden_act']!r}: the runner implements SwiGLU (silu) only",
                            source=source)
    if raw.get("mlp_bias"):
        raise TopoplanError("mlp_bias=true is not supported", source=source)
    if model_type == "qwen2" and raw.get("use_sliding_window"):
        raise TopoplanError("qwen2 use_sliding_window=true is not supported", source=source)

    dim, n_heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = raw.get("head_dim") or dim // n_heads
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise TopoplanError(f"rope type {rope_type!r} is not supported; expected default, linear or llama3",
                            source=source)
    rope = {} if rope_type == "default" else {**rope, "rope_type": rope_type}
    attention_bias = bool(raw.get("attention_bias", False))
    window = raw.get("sliding_window") if model_type == "mistral" else None
    return ModelConfig(
        vocab_size=int(need("vocab_size")),
        dim=dim,
        n_layers=int(need("num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
        head_dim=int(head_dim),
        intermediate_size=int(need("intermediate_size")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=tuple(sorted(rope.items())),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
        byte_tokenizer=bool(raw.get("topoplan_byte_tokenizer", False)),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TopoplanError("not found (expected an HF checkpoint folder with config.json)", source=path) from None
    except json.JSONDecodeError as error:
        raise TopoplanError(f"invalid JSON: {error.msg}", source=path, line=error.lineno) from None


def load_hf_config(folder: str | Path) -> ModelConfig:
    """Parse `folder/config.json`; EOS ids from generation_config.json win when it has them, as in HF generate."""
    path = Path(folder) / "config.json"
    raw = _read_json(path)
    generation = Path(folder) / "generation_config.json"
    if generation.exists() and _read_json(generation).get("eos_token_id") is not None:
        raw = {**raw, "eos_token_id": _read_json(generation)["eos_token_id"]}
    return parse_hf_config(raw, source=path)


def check_tp(config: ModelConfig, tp: int, source: str = "layout") -> None:
    """Refuse a TP degree the weights cannot be split by (vLLM's rule for KV heads)."""
    problems = []
    for name, value in (("num_attention_heads", config.n_heads), ("intermediate_size", config.intermediate_size),
                        ("vocab_size", config.vocab_size)):
        if value % tp:
            problems.append(f"{name}={value} is not divisible by tp={tp}")
    if config.n_kv_heads % tp and tp % config.n_kv_heads:
        problems.append(f"num_key_value_heads={config.n_kv_heads} neither divides nor is divisible by tp={tp}")
    if problems:
        raise TopoplanError("; ".join(problems), source=source)


def split_layers(n_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage: as even as possible, earlier stages take the remainder.

    Stage 0 also embeds and the last stage also runs the head, so the extra layers go first.
    """
    if pp > n_layers:
        raise TopoplanError(f"pp={pp} is more stages than the model's {n_layers} layers")
    base, extra = divmod(n_layers, pp)
    bounds = [0]
    for stage in range(pp):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return [range(bounds[s], bounds[s + 1]) for s in range(pp)]

