"""HF `config.json` -> `ModelConfig`, the runner's one description of a Llama-family model.

Covers what Llama 2/3/3.1, Mistral, Qwen2, Mixtral and Qwen2-MoE checkpoints write, in both spellings
transformers has used:
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
from topoplan.layout import tp_problems
from topoplan.models import architecture, spec_from_config

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe")
SLIDING_WINDOW_TYPES = ("mistral", "mixtral")  # their `sliding_window` key masks keys older than it


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
    # MoE (Mixtral, Qwen2-MoE): routed experts of width moe_intermediate_size in the layers moe_layers
    model_type: str = "llama"
    n_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one sigmoid-gated shared expert (0: none)
    norm_topk_prob: bool = True  # renormalise the top-k routing weights (Mixtral always; Qwen2-MoE by key)
    moe_layers: frozenset[int] = frozenset()

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
    if model_type in ("qwen2", "qwen2_moe") and raw.get("use_sliding_window"):
        raise TopoplanError(f"{model_type} use_sliding_window=true is not supported", source=source)

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
    window = raw.get("sliding_window") if model_type in SLIDING_WINDOW_TYPES else None
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
        o_bias=not architecture(raw).qkv_bias and bool(raw.get("attention_bias", False)),
        tie_word_embeddings=spec.tied_embeddings,
        sliding_window=int(window) if window else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
        byte_tokenizer=bool(raw.get("topoplan_byte_tokenizer", False)),
        max_context=spec.max_context,
        model_type=model_type,
        n_experts=spec.experts,
        experts_per_tok=spec.experts_per_token,
        moe_intermediate_size=spec.expert_intermediate,
        shared_expert_intermediate_size=spec.shared_intermediate,
        norm_topk_prob=model_type == "mixtral" or bool(raw.get("norm_topk_prob", False)),
        moe_layers=spec.moe_layer_ids,
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


def check_tp(config: ModelConfig, tp: int, source: str = "layout", ep: int = 1) -> None:
    """Refuse a TP degree the weights cannot be split by: the planner's rule (topoplan.layout.tp_problems),
    plus the vocabulary, which this runner shards evenly without padding (vLLM pads it instead). MoE: experts
    TP-sharded (ep 1) need their widths divisible by tp; expert parallelism needs ep to divide the experts,
    and ep to divide tp (this runner's DP replicas run independently, so an EP group stays in one TP group)."""
    widths = {"intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size}
    if config.n_experts and ep == 1:
        widths["moe_intermediate_size"] = config.moe_intermediate_size
    if config.shared_expert_intermediate_size:
        widths["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
    problems = tp_problems(tp, config.n_heads, config.n_kv_heads, widths)
    if ep > 1 and not config.n_experts:
        problems.append(f"ep={ep}: the model has no experts (expert parallelism needs an MoE checkpoint)")
    elif ep > 1 and config.n_experts % ep:
        problems.append(f"ep={ep} does not divide the {config.n_experts} experts")
    if ep > 1 and tp % ep:
        problems.append(f"ep={ep} must divide tp={tp} in the bundled runner (its DP replicas run independently, "
                        "so an EP group stays inside one TP group; vLLM's ep = tp x dp needs replicas in lockstep)")
    if problems:
        raise TopoplanError("; ".join(problems), source=source)
