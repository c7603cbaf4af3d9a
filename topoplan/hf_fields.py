"""The type and range of every HF `config.json` key topoplan reads, checked once before any is used.

A config is user input: `"num_key_value_heads": "4"`, `"hidden_size": true`, `"head_dim": -16` or
`"vocab_size": 1e400` must be refused by name, not crash a formula later (in the parent or inside a rank)
or plan a model of zero bytes. Keys absent here are not read by topoplan and are not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_LAYERS

# One sanity bound for sizes: the largest published models have hidden 16-25k, vocab ~260k, 128 layers.
_MAX_SIZE = 2**31


def _positive_int(value: Any) -> bool:
    return type(value) is int and 1 <= value <= _MAX_SIZE


def _count(value: Any) -> bool:  # zero allowed: e.g. first_k_dense_replace, n_shared_experts
    return type(value) is int and 0 <= value <= _MAX_SIZE


def _positive_float(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def _flag(value: Any) -> bool:
    return type(value) is bool


def _token_ids(value: Any) -> bool:
    ids = value if isinstance(value, list) else [value]
    return all(type(v) is int and 0 <= v <= _MAX_SIZE for v in ids)


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _mapping(value: Any) -> bool:
    return isinstance(value, dict)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and 0 <= v <= _MAX_SIZE for v in value)


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive integer": (_positive_int, (
        "hidden_size num_attention_heads num_key_value_heads num_hidden_layers intermediate_size vocab_size "
        "head_dim max_position_embeddings num_local_experts num_experts n_routed_experts num_experts_per_tok "
        "moe_intermediate_size shared_expert_intermediate_size decoder_sparse_step kv_lora_rank q_lora_rank "
        "qk_nope_head_dim qk_rope_head_dim v_head_dim moe_layer_freq")),
    # sliding_window 0: off (transformers v5 writes it so for Qwen2-MoE with use_sliding_window false)
    "non-negative integer": (_count, "n_shared_experts first_k_dense_replace sliding_window"),
    "positive finite number": (_positive_float, "rms_norm_eps rope_theta"),
    "true or false": (_flag, "tie_word_embeddings attention_bias mlp_bias use_sliding_window topoplan_byte_tokenizer "
                             "norm_topk_prob"),
    "token id or list of token ids": (_token_ids, "bos_token_id eos_token_id"),
    "string": (_text, "model_type hidden_act _name_or_path"),
    "JSON object": (_mapping, "rope_scaling rope_parameters quantization_config"),
    "list of layer indexes": (_int_list, "mlp_only_layers"),
}
_EXPECTED = {key: (check, kind) for kind, (check, keys) in _RULES.items() for key in keys.split()}
_NULLABLE = {"rope_scaling", "rope_parameters", "sliding_window", "bos_token_id", "eos_token_id", "head_dim",
             "q_lora_rank", "max_position_embeddings", "rope_theta"}  # transformers v5 writes rope_theta: null


def positive_number(value: Any, key: str, source: str | Path) -> float:
    """A value nested below the top level (e.g. rope_parameters.rope_theta) checked like a top-level one."""
    if not _positive_float(value):
        raise TopoplanError(f"key {key!r} must be a positive finite number, got {value!r:.40}", source=source)
    return float(value)


def check_config(raw: Any, source: str | Path) -> dict[str, Any]:
    """`raw` itself if it is a JSON object whose known keys have the right type and range; else a one-line error
    naming the key, what it holds and what was expected."""
    if not isinstance(raw, dict):
        raise TopoplanError(f"expected a JSON object (a HF config.json), found {type(raw).__name__}", source=source)
    for key, value in raw.items():
        rule = _EXPECTED.get(key)
        if rule is None or (value is None and key in _NULLABLE):
            continue
        check, kind = rule
        if not check(value):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise TopoplanError(f"key {key!r} must be a {kind}, got {shown}", source=source)
    _check_together(raw, source)
    return raw


_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")  # the spellings of the expert count
_ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _check_together(raw: dict[str, Any], source: str | Path) -> None:
    """What each key's own range cannot catch: values that contradict another key, or a depth the planner would
    iterate over for ever. One line each, naming both keys."""
    layers = raw.get("num_hidden_layers")
    if type(layers) is int and layers > MAX_LAYERS:
        raise TopoplanError(f"num_hidden_layers {layers}: more than {MAX_LAYERS:,}, beyond any real model "
                            "(docs/limits.md)", source=source)
    experts = next((raw[k] for k in _EXPERTS if type(raw.get(k)) is int), None)
    top_k = raw.get("num_experts_per_tok")
    if experts is not None and type(top_k) is int and top_k > experts:
        raise TopoplanError(f"num_experts_per_tok {top_k} is more than the {experts} experts; expected each token "
                            "routed to at most every expert", source=source)
    for key in ("rope_scaling", "rope_parameters"):
        rope = raw.get(key) or {}
        for name in _ROPE_NUMBERS:
            if name in rope and rope[name] is not None:
                positive_number(rope[name], f"{key}.{name}", source)
    vocab = raw.get("vocab_size")
    for key in ("bos_token_id", "eos_token_id"):
        ids = raw.get(key)
        ids = ids if isinstance(ids, list) else [ids]
        beyond = [i for i in ids if type(i) is int and type(vocab) is int and i >= vocab]
        if beyond:
            raise TopoplanError(f"{key} {beyond[0]} is beyond the vocabulary (vocab_size {vocab}: ids 0 to "
                                f"{vocab - 1})", source=source)
