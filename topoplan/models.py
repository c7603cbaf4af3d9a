"""The model catalog and HF `config.json` -> `ModelSpec`: the sizes the planner prices.

Catalog entries are the exact keys of each model's published `config.json` (Hugging Face hub), so a
catalog model and `--model path/config.json` go through the same reader. docs/planner.md lists sources.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from topoplan.dtypes import dtype_of
from topoplan.errors import TopoplanError
from topoplan.hf_fields import check_config
from topoplan.jsonfile import read_json
from topoplan.model_aliases import ALIASES


@dataclass(frozen=True)
class ModelSpec:
    """Global (unsharded) sizes of a decoder-only transformer: dense/GQA, MLA attention, dense or MoE MLP."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (the dense layers of an MoE model)
    vocab: int
    tied_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU: 3 matrices; GPT-style GeLU MLP: 2
    attention_bias: bool = False  # Qwen2: bias on q, k, v
    # MoE: `experts` routed experts of width `expert_intermediate`, `experts_per_token` chosen per token;
    # `shared_experts` always-on experts, together one MLP of width `shared_intermediate` (DeepSeek: n x
    # moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size, scaled by a sigmoid gate)
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    shared_intermediate: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: a hidden -> 1 gate on the shared expert
    moe_layer_ids: frozenset[int] = frozenset()  # which decoder layers have routed experts (the rest: dense MLP)
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head (2 x head_dim weights per layer)
    layer_norms: int = 2  # RMSNorms of hidden width per decoder layer (Gemma-2/3: 4, before and after each block)
    # MLA (DeepSeek-V2/V3): low-rank compressed KV; the cache holds kv_lora_rank + qk_rope_head_dim per token
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    max_context: int = 0  # max_position_embeddings: prompt + generated tokens it was trained for (0: unknown)
    checkpoint_dtype: str | None = None  # the weights dtype its quantization_config names (None: not quantised)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def moe_layers_in(self, layers: range) -> int:
        """How many of `layers` (global ids, e.g. one pipeline stage) have routed experts."""
        return sum(1 for i in layers if i in self.moe_layer_ids)

    # --- parameter counts (exact for the weights, norms included) ---------------------------------
    @cached_property
    def attention_params(self) -> int:
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk
                 if self.q_lora_rank else h * self.heads * qk)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.heads * self.v_head_dim * h
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.attention_bias else 0
        norms = 2 * self.head_dim if self.qk_norm else 0
        return h * q + 2 * h * kv + q * h + bias + norms

    def mlp_params(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @cached_property
    def expert_params(self) -> int:
        return self.mlp_params(self.expert_intermediate)

    @cached_property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.mlp_params(self.intermediate) + self.layer_norms * self.hidden

    @cached_property
    def shared_params(self) -> int:
        """The shared expert(s) of one MoE layer, and their gate (Qwen2-MoE): every token passes through them."""
        return self.mlp_params(self.shared_intermediate) + (self.hidden if self.shared_expert_gate else 0)

    @cached_property
    def router_params(self) -> int:
        return self.hidden * self.experts

    @cached_property
    def moe_layer_params(self) -> int:
        """All experts, shared experts and the router of one MoE layer, plus its attention and norms."""
        return self.moe_layer_active_params(self.experts)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The LM head; counted once more even when tied, because it is read in every decode step."""
        return self.vocab * self.hidden

    @cached_property
    def params(self) -> int:
        dense = self.layers - self.moe_layers
        body = dense * self.dense_layer_params + self.moe_layers * self.moe_layer_params
        head = 0 if self.tied_embeddings else self.head_params
        return self.embedding_params + body + head + self.hidden

    def moe_layer_active_params(self, experts_touched: float) -> float:
        """Weights one MoE layer reads when `experts_touched` distinct routed experts are in use."""
        return (self.attention_params + experts_touched * self.expert_params + self.shared_params
                + self.router_params + self.layer_norms * self.hidden)

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct routed experts used by `tokens` tokens (uniform routing): E(1-(1-k/E)^tokens)."""
        if not self.is_moe:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens)

    # --- attention sizes ----------------------------------------------------------------------------
    @property
    def qk_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    def kv_elements_per_token_layer(self, tp: int) -> int:
        """KV-cache elements one TP rank stores per token per layer.

        GQA: K and V for ceil(kv_heads/tp) heads (heads are replicated once tp exceeds kv_heads).
        MLA: the compressed latent plus the shared RoPE key, replicated on every TP rank.
        """
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * -(-self.kv_heads // tp) * self.head_dim

    def kv_bytes_per_token(self, dtype: str, tp: int = 1) -> int:
        """KV-cache bytes per token for the whole model on one TP rank (all layers)."""
        return self.kv_elements_per_token_layer(tp) * self.layers * dtype_of(dtype).bytes

    def layer_params_per_rank(self, tp: int = 1, ep: int = 1) -> float:
        """The weights of one layer's products a rank holds, on average over the layers, with tp-way tensor
        parallelism and the routed experts split ep ways (as whole experts; with ep 1, each sliced tp ways): the
        size of a layer a rank's caches see go by."""
        routed = self.experts * self.expert_params
        per_layer = self.matmul_params(self.dense_layers, self.moe_layers, self.experts) / self.layers
        routed_share = routed * self.moe_layers / self.layers
        return (per_layer - routed_share) / tp + routed_share / (ep if ep > 1 else tp)

    def matmul_params(self, dense_layers: int, moe_layers: int, experts: float) -> float:
        """Weights a token's GEMMs multiply by in that many dense and MoE layers, `experts` routed experts in use
        per MoE layer (dense layers: without their norms). The planner's cost model prices stages with this."""
        moe = self.moe_layer_active_params(experts) if moe_layers else 0.0
        return dense_layers * (self.dense_layer_params - self.layer_norms * self.hidden) + moe_layers * moe

    def attention_flops(self, layers: int, queries: float, context: float) -> float:
        """QK^T and AV FLOPs in `layers` layers for `queries` tokens each attending to `context` keys."""
        return 2.0 * layers * self.heads * (self.qk_dim + self.v_dim) * queries * context

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs for one token attending to `context` earlier tokens: 2 x active weights + attention."""
        matmul = self.matmul_params(self.layers - self.moe_layers, self.moe_layers, self.experts_per_token)
        return 2.0 * (matmul + self.head_params) + self.attention_flops(self.layers, 1, context)

    def weight_bytes(self, dtype: str) -> float:
        """Bytes of all weights stored in `dtype`: a quantised format (fp8, int4) covers the decoder's linear
        layers; the embedding, LM head and norms stay in its activation dtype (topoplan.dtypes)."""
        d = dtype_of(dtype)
        head = 0 if self.tied_embeddings else self.head_params
        plain = self.embedding_params + head + self.hidden
        return (self.params - plain) * d.weight_bytes + plain * d.activations.bytes


# Exact figures from each model's config.json on the Hugging Face hub (only the keys the planner reads).
_LLAMA2 = {"model_type": "llama", "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 4096}
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 8192}
_LLAMA31 = {**_LLAMA3, "max_position_embeddings": 131072}
BUILTIN_MODELS = ("tiny", "small")  # the bundled runner's random models, built on first use (topoplan.runner.builtin)
CATALOG: dict[str, dict[str, Any]] = {
    "Llama-2-7B": {**_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32},
    "Llama-2-13B": {**_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                    "num_attention_heads": 40, "num_key_value_heads": 40},
    "Llama-2-70B": {**_LLAMA2, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "Llama-3-8B": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8},
    "Llama-3-70B": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "Llama-3.1-8B": {**_LLAMA31, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8},
    "Llama-3.1-70B": {**_LLAMA31, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8},
    "Llama-3.1-405B": {**_LLAMA31, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                       "num_attention_heads": 128, "num_key_value_heads": 8},
    "Mixtral-8x7B": {"model_type": "mixtral", "vocab_size": 32000, "tie_word_embeddings": False,
                     "max_position_embeddings": 32768, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                     "num_experts_per_tok": 2},
    "Qwen2.5-72B": {"model_type": "qwen2", "vocab_size": 152064, "tie_word_embeddings": False,
                    "max_position_embeddings": 32768,
                    "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "DeepSeek-V3": {"model_type": "deepseek_v3", "vocab_size": 129280, "tie_word_embeddings": False,
                    "max_position_embeddings": 163840,
                    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                    "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
    # mistralai/Mixtral-8x22B-Instruct-v0.1 config.json (the base v0.1 differs only in vocab_size 32000)
    "Mixtral-8x22B": {"model_type": "mixtral", "vocab_size": 32768, "tie_word_embeddings": False,
                      "max_position_embeddings": 65536, "hidden_size": 6144, "intermediate_size": 16384,
                      "num_hidden_layers": 56, "num_attention_heads": 48, "num_key_value_heads": 8,
                      "num_local_experts": 8, "num_experts_per_tok": 2},
    # Qwen/Qwen3-235B-A22B config.json: every layer MoE (decoder_sparse_step 1, no mlp_only_layers), no shared expert
    "Qwen3-235B-A22B": {"model_type": "qwen3_moe", "vocab_size": 151936, "tie_word_embeddings": False,
                        "max_position_embeddings": 40960, "hidden_size": 4096, "intermediate_size": 12288,
                        "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
                        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                        "decoder_sparse_step": 1, "mlp_only_layers": []},
    # The runner's built-in random models (topoplan/runner/builtin.py BUILTIN reads these): a byte vocabulary,
    # 256 bytes + specials rounded up to 264 so that TP degrees 1-4, 6, 8, 12 divide it.
    "tiny": {"model_type": "llama", "vocab_size": 264, "tie_word_embeddings": False, "hidden_size": 128,
             "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4},
    "small": {"model_type": "llama", "vocab_size": 264, "tie_word_embeddings": False, "hidden_size": 1024,
              "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8},
}

_HF = "config.json of {} on the Hugging Face hub"
# Where each catalog entry's figures come from (`topoplan list models` prints it).
MODEL_SOURCES: dict[str, str] = {
    "Llama-2-7B": _HF.format("meta-llama/Llama-2-7b-hf"), "Llama-2-13B": _HF.format("meta-llama/Llama-2-13b-hf"),
    "Llama-2-70B": _HF.format("meta-llama/Llama-2-70b-hf"), "Llama-3-8B": _HF.format("meta-llama/Meta-Llama-3-8B"),
    "Llama-3-70B": _HF.format("meta-llama/Meta-Llama-3-70B"), "Llama-3.1-8B": _HF.format("meta-llama/Llama-3.1-8B"),
    "Llama-3.1-70B": _HF.format("meta-llama/Llama-3.1-70B"),
    "Llama-3.1-405B": _HF.format("meta-llama/Llama-3.1-405B"),
    "Mixtral-8x7B": _HF.format("mistralai/Mixtral-8x7B-v0.1"), "Qwen2.5-72B": _HF.format("Qwen/Qwen2.5-72B"),
    "DeepSeek-V3": _HF.format("deepseek-ai/DeepSeek-V3"),
    "Mixtral-8x22B": _HF.format("mistralai/Mixtral-8x22B-Instruct-v0.1"),
    "Qwen3-235B-A22B": _HF.format("Qwen/Qwen3-235B-A22B"),
    "tiny": "topoplan's built-in random model (topoplan/runner/builtin.py; `topoplan run --model tiny`)",
    "small": "topoplan's built-in random model (topoplan/runner/builtin.py; `topoplan run --model small`)",
}


def check_context(max_context: int, tokens: int, asked: str, model: str) -> None:
    """Refuse more tokens per sequence than the model was trained for (max_position_embeddings; 0: unknown,
    not checked): the KV cache and RoPE are sized to prompt + generated tokens. `asked` names the options."""
    if max_context and tokens > max_context:
        raise TopoplanError(f"{asked} exceed the model's context of {max_context} tokens "
                            f"(max_position_embeddings of {model})")


@dataclass(frozen=True)
class Architecture:
    """What a family's config.json leaves implicit, by its `model_type` (the defaults of its transformers config
    class and the layers its modeling file builds)."""

    gated_mlp: bool = True  # SwiGLU / GeGLU: gate, up and down matrices, whatever `hidden_act` names
    tied_default: bool = False  # tie_word_embeddings when the config omits it
    layer_norms: int = 2
    qkv_bias: bool = False  # q/k/v biases always on
    qk_norm: bool = False  # RMSNorm over each query and key head
    # what the bundled runner reads of the family (topoplan.runner): whether it runs it at all, whether the
    # config's `sliding_window` masks keys older than it (Mistral, Mixtral; Qwen2's needs use_sliding_window, which
    # the runner refuses), the HF names of an MoE block and its experts' gate/up/down matrices, and Mixtral's
    # router quirks (transformers' MixtralTopKRouter: weights in fp32, top-k probabilities always renormalised)
    runner: bool = False
    sliding_window: bool = False
    moe_names: tuple[str, tuple[str, str, str]] | None = None
    router_fp32: bool = False
    always_norm_topk: bool = False


_GEMMA2 = Architecture(tied_default=True, layer_norms=4)  # pre/post norms around attention and the MLP
# transformers' models/<type>/configuration_*.py (tie_word_embeddings default) and modeling_*.py (the layers)
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(runner=True),
    "mistral": Architecture(runner=True, sliding_window=True),
    "mixtral": Architecture(runner=True, sliding_window=True, moe_names=("block_sparse_moe", ("w1", "w3", "w2")),
                            router_fp32=True, always_norm_topk=True),
    **dict.fromkeys(("deepseek_v2", "deepseek_v3"), Architecture()),
    "qwen2": Architecture(qkv_bias=True, runner=True),
    "qwen2_moe": Architecture(qkv_bias=True, runner=True, moe_names=("mlp", ("gate_proj", "up_proj", "down_proj"))),
    **dict.fromkeys(("qwen3", "qwen3_moe"), Architecture(qk_norm=True)),
    "gemma": Architecture(tied_default=True),  # GeGLU (hidden_act gelu): gated
    "gemma2": _GEMMA2,
    "gemma3_text": Architecture(tied_default=True, layer_norms=4, qk_norm=True),
}


def architecture(raw: dict[str, Any]) -> Architecture:
    """The family's defaults; for a model_type not listed, a Llama-style layer whose MLP is gated when its
    activation is SiLU (a GeLU MLP without a gate: GPT-style, two matrices) and untied embeddings unless said."""
    known = ARCHITECTURES.get(raw.get("model_type", ""))
    if known is not None:
        return known
    return Architecture(gated_mlp=raw.get("hidden_act", "silu") in ("silu", "swiglu"))


def _moe_layer_ids(raw: dict[str, Any], layers: int) -> frozenset[int]:
    """The decoder layers with routed experts, in each family's spelling:
    DeepSeek-V2/V3: layer i >= first_k_dense_replace with i % moe_layer_freq == 0;
    Qwen2-MoE/Qwen3-MoE: (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers; Mixtral: every layer."""
    if "first_k_dense_replace" in raw or "n_routed_experts" in raw:
        first, freq = raw.get("first_k_dense_replace") or 0, raw.get("moe_layer_freq") or 1
        return frozenset(i for i in range(first, layers) if i % freq == 0)
    step, only = raw.get("decoder_sparse_step") or 1, raw.get("mlp_only_layers") or []  # types: hf_fields
    return frozenset(i for i in range(layers) if (i + 1) % step == 0 and i not in only)


def _moe_fields(raw: dict[str, Any], layers: int, need: Callable[[str], Any]) -> dict[str, Any]:
    """The MoE keys of Mixtral (num_local_experts), Qwen2/3-MoE (num_experts, shared_expert_intermediate_size)
    and DeepSeek-V2/V3 (n_routed_experts, n_shared_experts) as ModelSpec fields."""
    width = raw.get("moe_intermediate_size") or need("intermediate_size")
    shared = raw.get("n_shared_experts") or 0  # DeepSeek: n experts of the routed width, run as one MLP
    qwen_shared = raw.get("shared_expert_intermediate_size") or 0  # Qwen2-MoE: one gated shared expert
    return {"experts": raw.get("num_local_experts") or raw.get("n_routed_experts") or raw["num_experts"],
            "experts_per_token": need("num_experts_per_tok"),
            "expert_intermediate": width,
            "shared_experts": shared or (1 if qwen_shared else 0),
            "shared_intermediate": shared * width or qwen_shared,
            "shared_expert_gate": bool(qwen_shared),
            "moe_layer_ids": _moe_layer_ids(raw, layers)}


# quantization_config.quant_method -> the planner's weights dtype (topoplan.dtypes): fp8 checkpoints (transformers'
# FineGrainedFP8 and FBGEMM configs, vLLM's `--quantization fp8`), AWQ/GPTQ at 4 bits, OCP MXFP4 (gpt-oss)
QUANT_METHODS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "awq": "int4", "gptq": "int4", "mxfp4": "mxfp4"}


def checkpoint_dtype(raw: dict[str, Any], source: str | Path) -> str | None:
    """The weights dtype a config's `quantization_config` names; None without one; a one-line error for a
    method (or an AWQ/GPTQ bit width) the planner does not price."""
    quant = raw.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method")
    dtype = QUANT_METHODS.get(method) if isinstance(method, str) else None
    bits = quant.get("bits", quant.get("w_bit", 4))
    if dtype == "int4" and bits != 4:
        raise TopoplanError(f"quantization_config: {method} at {bits!r} bits is not modelled (4-bit AWQ/GPTQ is)",
                            source=source)
    if dtype is None:
        raise TopoplanError(f"quantization_config: quant_method {method!r:.40} is not modelled (expected one of "
                            f"{', '.join(QUANT_METHODS)}); plan its unquantised config with --dtype", source=source)
    return dtype


def spec_from_config(raw: dict[str, Any], name: str, source: str | Path = "config.json") -> ModelSpec:
    """Read a HF config dict (Llama/Mistral/Qwen2/Qwen3, Gemma/Gemma-2/Gemma-3, Mixtral, Qwen2-MoE/Qwen3-MoE,
    DeepSeek-V2/V3 spellings; per family, ARCHITECTURES) into a ModelSpec."""
    check_config(raw, source)

    def need(key: str) -> Any:
        if key not in raw:
            raise TopoplanError(f"missing key {key!r} (expected a Llama-family or MoE HF config)", source=source)
        value = raw[key]
        if not isinstance(value, int) or value < 1:
            raise TopoplanError(f"key {key!r} must be a positive integer, got {value!r}", source=source)
        return value

    hidden, heads, layers = need("hidden_size"), need("num_attention_heads"), need("num_hidden_layers")
    arch = architecture(raw)
    kv_lora = raw.get("kv_lora_rank") or 0
    experts = raw.get("num_local_experts") or raw.get("n_routed_experts") or raw.get("num_experts") or 0
    if hidden % heads and not raw.get("head_dim") and not kv_lora:
        raise TopoplanError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}", source=source)
    spec = ModelSpec(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        intermediate=need("intermediate_size"),
        vocab=need("vocab_size"),
        tied_embeddings=bool(raw.get("tie_word_embeddings", arch.tied_default)),
        gated_mlp=arch.gated_mlp,
        attention_bias=arch.qkv_bias or bool(raw.get("attention_bias")),
        qk_norm=arch.qk_norm,
        layer_norms=arch.layer_norms,
        **(_moe_fields(raw, layers, need) if experts else {}),
        kv_lora_rank=kv_lora,
        q_lora_rank=raw.get("q_lora_rank") or 0,
        qk_nope_head_dim=need("qk_nope_head_dim") if kv_lora else 0,
        qk_rope_head_dim=need("qk_rope_head_dim") if kv_lora else 0,
        v_head_dim=need("v_head_dim") if kv_lora else 0,
        max_context=need("max_position_embeddings") if "max_position_embeddings" in raw else 0,
        checkpoint_dtype=checkpoint_dtype(raw, source),
    )
    if spec.heads % spec.kv_heads:
        raise TopoplanError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                            f"{spec.kv_heads}", source=source)
    return spec


def find_model(name: str) -> ModelSpec:
    """A catalog model by name or alias (case-insensitive), a path to a HF config.json, or a HF checkpoint folder
    (its config.json), as `run --model` takes."""
    path = Path(name)
    try:
        folder, file = path.is_dir(), path.is_file()
    except OSError as error:  # a name too long for the file system: not a path, and no catalog name either
        raise TopoplanError(f"cannot read it: {error.strerror}; expected a model name or a HF checkpoint folder",
                            source=name) from None
    if folder:
        return load_config(path / "config.json")
    if name.endswith(".json") or file:
        return load_config(path)
    by_lower = {k.lower(): k for k in CATALOG} | {k.lower(): v for k, v in ALIASES.items()}
    key = by_lower.get(name.lower())
    if key is None:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=4, cutoff=0.4)
        names = dict.fromkeys(by_lower[c] for c in close)
        hint = f"; close: {', '.join(names)}" if names else f"; known: {', '.join(CATALOG)}"
        raise TopoplanError(f"unknown model {name!r}{hint} (or pass a HF checkpoint folder or its config.json)")
    return spec_from_config(CATALOG[key], key, source=f"catalog:{key}")


def load_config(path: Path) -> ModelSpec:
    """A HF config.json file; the error names the file when it is missing or not a config."""
    raw = check_config(read_json(path, "a HF config.json"), path)
    name = raw.get("_name_or_path") or path.resolve().parent.name or path.stem
    return spec_from_config(raw, str(name), source=path)
