"""HF `config.json` -> `ModelConfig`, the runner's one description of a Llama-family model.

Covers what Llama 2/3/3.1, Mistral and Qwen2 checkpoints write, in both spellings transformers has used:
`rope_theta` + `rope_scaling` (v4 and most published checkpoints) and `rope_parameters` (v5).
Anything the runner cannot compute exactly is refused with a TopoplanError naming the file and key,
rather than run with silently different numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.hf_fields import check_config, positive_number
from topoplan.jsonfile import read_json
from topoplan.models import spec_from_config
from topoplan.plan.layouts import tp_problems

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
    max_context: int = 0  # max_position_embeddings (0: not given, not checked)

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def parse_hf_config(raw: dict[str, Any], source: str | Path = "config.json") -> ModelConfig:
    """Read the keys the runner needs from an HF config dict; refuse what it cannot run exactly.

    The sizes come from the planner's reader (topoplan.models.spec_from_config), so both read a config alike.
    """
    if "model_type" not in raw:
        raise TopoplanError("missing key 'model_type' (expected a Llama-family HF config)", source=source)
    model_type = raw["model_type"]
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

    spec = spec_from_config(raw, name=str(source), source=source)  # the sizes: one reader, shared with the planner
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = positive_number(rope.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0, "rope_theta", source)
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if key in rope:
            positive_number(rope[key], f"rope_scaling.{key}", source)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise TopoplanError(f"rope type {rope_type!r} is not supported; expected default, linear or llama3",
                            source=source)
    rope = {} if rope_type == "default" else {**rope, "rope_type": rope_type}
    window = raw.get("sliding_window") if model_type == "mistral" else None
    return ModelConfig(
        vocab_size=spec.vocab,
        dim=spec.hidden,
        n_layers=spec.layers,
        n_heads=spec.heads,
        n_kv_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate,
        rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-5),
        rope_theta=theta,
        rope_scaling=tuple(sorted(rope.items())),
        qkv_bias=spec.attention_bias,  # Qwen2 always, Llama/Mistral when attention_bias
        o_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
        tie_word_embeddings=spec.tied_embeddings,
        sliding_window=int(window) if window else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
        byte_tokenizer=bool(raw.get("topoplan_byte_tokenizer", False)),
        max_context=spec.max_context,
    )


def load_hf_config(folder: str | Path) -> ModelConfig:
    """Parse `folder/config.json`; EOS ids from generation_config.json win when it has them, as in HF generate."""
    path = Path(folder) / "config.json"
    raw = check_config(read_json(path, "an HF checkpoint folder with config.json"), path)
    generation = Path(folder) / "generation_config.json"
    eos = None
    if generation.exists():
        eos = check_config(read_json(generation, "an HF generation_config.json"), generation).get("eos_token_id")
    if eos is not None:
        raw = {**raw, "eos_token_id": eos}
    return parse_hf_config(raw, source=path)


def check_tp(config: ModelConfig, tp: int, source: str = "layout") -> None:
    """Refuse a TP degree the weights cannot be split by: the planner's rule (topoplan.plan.layouts.tp_problems),
    plus the vocabulary, which this runner shards evenly without padding (vLLM pads it instead)."""
    problems = tp_problems(tp, config.n_heads, config.n_kv_heads,
                           {"intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size})
    if problems:
        raise TopoplanError("; ".join(problems), source=source)
