"""A Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2; Mixtral and Qwen2-MoE with runner/moe.py) that reads
as a single-device model.

Parallelism enters only through `Shard`: which layers this pipeline stage holds and which heads, MLP
columns and vocabulary rows this TP rank holds. With `Shard()` (TP 1, all layers) this is the plain
model. Names follow HF (`layers.<global id>.self_attn.o_proj.weight`) except where two or three HF
weights are stacked into one matmul (`qkv_proj`, `gate_up_proj`); layers.sources maps every piece back.
Shapes in comments: B batch, L new tokens, S cached length, D hidden,
H/Hkv local query/KV heads, Dh head size, F local MLP width, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from topoplan.runner.config import ModelConfig
from topoplan.runner.cpu_linear import KernelChoice, prepack
from topoplan.runner.layers import (
    LINEAR_LAYERS,
    ColumnParallelLinear,
    NoComm,
    Part,
    RowParallelLinear,
    TpComm,
    VocabParallelEmbedding,
    block,
    scaled,
)
from topoplan.runner.moe import MoE, moe_names


@dataclass(frozen=True)
class Shard:
    """What this rank holds: TP position, its pipeline stage's global layer ids, and the TP collectives."""

    tp_rank: int = 0
    tp_size: int = 1
    layers: range | None = None  # None: all layers (a single stage)
    first: bool = True  # embeds tokens
    last: bool = True  # runs the final norm and LM head
    comm: TpComm = field(default_factory=NoComm)  # with ep_size > 1 also the EP group's (runner.moe.EpComm)
    ep_rank: int = 0  # position in the EP group (MoE: which block of experts this rank holds)
    ep_size: int = 1


def kv_heads_of(config: ModelConfig, tp_rank: int, tp_size: int) -> range:
    """KV heads for a TP rank: split when there are enough, else each rank keeps one, replicated."""
    if config.n_kv_heads >= tp_size:
        return block(config.n_kv_heads, tp_rank, tp_size)
    head = tp_rank // (tp_size // config.n_kv_heads)
    return range(head, head + 1)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies (fp32, as HF computes them), with linear or llama3 scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = config.rope_scaling_dict
    kind = scaling.get("rope_type")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":  # Llama 3.1: slow down low frequencies, keep high ones, blend in between
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        original = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled_freq = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled_freq / factor + smooth * scaled_freq
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        return torch.where(medium, blended, scaled_freq)
    return inv_freq


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [..., 1, Dh] of the RoPE angles of `positions` [...] (fp32, as HF computes them), for
    `apply_rotary`: the sin of the first half negated, so HF's rotate_half (cat(-x2, x1)) becomes a roll."""
    freqs = positions.unsqueeze(-1).float() * inv_freq  # [..., Dh/2]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1).unsqueeze(-2).to(dtype), torch.cat((-sin, sin), dim=-1).unsqueeze(-2).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin for x [B, L, heads, Dh], in three ops: the per-token cost of a
    small model is its op count."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps_tensor = torch.tensor(eps, device="cpu")  # a plain CPU scalar (explicit device: not meta-built)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """HF's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, cast back, then scaled (in fp32 the scale needs no
        cast, so HF's order is kept by construction). On a GPU that is F.rms_norm, one fused kernel. On a CPU
        F.rms_norm is a composite of ~15 dispatched ops, and a small model's decode step costs its op count, so
        the mean square comes from one vector_norm and the rest takes four kernels (`tiny`'s decode step on 2
        threads, 4 interleaved runs: 0.84-0.89 ms -> 0.77-0.81 ms; `small`'s 17.2-18.2 -> 16.9-17.3 ms)."""
        if x.device.type != "cpu":
            if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
                return F.rms_norm(x, (x.shape[-1],), self.weight, eps=self.eps)
            return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        h = x.float()  # no copy in fp32
        norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
        inverse = torch.addcmul(self.eps_tensor, norm, norm, value=1.0 / x.shape[-1]).rsqrt_()  # 1/sqrt(ms + eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.mul(h, inverse).mul_(self.weight)
        return self.weight * torch.mul(h, inverse).to(x.dtype)


class KVCache(nn.Module):
    """Static cache of this rank's KV heads: [B, Hkv, max_len, Dh], written at slot positions."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, slot: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys and values of batch rows `rows` (a pipeline micro-batch, or all) at `slot`; return
        the keys and values up to them. A tensor `slot` ([1]: a static-shape step, topoplan.runner.graphs)
        writes by index and returns the whole cache, so no shape depends on it."""
        keys, values = self.k[rows], self.v[rows]  # views (narrow and copy_: a third of indexed assignment's cost)
        if isinstance(slot, torch.Tensor):
            keys.index_copy_(2, slot, k)
            values.index_copy_(2, slot, v)
            return keys, values
        n = k.shape[2]
        keys.narrow(2, slot, n).copy_(k)
        values.narrow(2, slot, n).copy_(v)
        return keys.narrow(2, 0, slot + n), values.narrow(2, 0, slot + n)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, shard: Shard):
        super().__init__()
        heads = block(config.n_heads, shard.tp_rank, shard.tp_size)
        kv_heads = kv_heads_of(config, shard.tp_rank, shard.tp_size)
        self.n_local_heads, self.n_local_kv_heads, self.head_dim = len(heads), len(kv_heads), config.head_dim
        dh = config.head_dim
        q_size, kv_size = config.n_heads * dh, config.n_kv_heads * dh
        self.qkv_proj = ColumnParallelLinear(config.dim, [Part("q_proj", q_size, scaled(heads, dh)),
                                                          Part("k_proj", kv_size, scaled(kv_heads, dh)),
                                                          Part("v_proj", kv_size, scaled(kv_heads, dh))],
                                             config.qkv_bias)
        self.o_proj = RowParallelLinear(q_size, scaled(heads, dh), config.dim, config.o_bias, shard.comm)
        self.cache: KVCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                slot: int | torch.Tensor, rows: slice) -> torch.Tensor:
        b, n, _ = x.shape
        q_size, k_size, v_size = self.qkv_proj.sizes
        qk, v = self.qkv_proj(x).split((q_size + k_size, v_size), dim=-1)  # q and k rotate together
        qk = apply_rotary(qk.view(b, n, self.n_local_heads + self.n_local_kv_heads, self.head_dim), cos, sin)
        q, k = qk.transpose(1, 2).split((self.n_local_heads, self.n_local_kv_heads), dim=1)  # [B, H(kv), L, Dh]
        v = v.view(b, n, self.n_local_kv_heads, self.head_dim).transpose(1, 2)
        assert self.cache is not None, "call Transformer.setup_cache first"
        k, v = self.cache.update(slot, k, v, rows)  # [B, Hkv, S, Dh]
        # GQA without copying K/V: the `group` query heads sharing a KV head become extra query rows.
        group = self.n_local_heads // self.n_local_kv_heads
        q = q.reshape(b, self.n_local_kv_heads, group * n, self.head_dim)  # [B, Hkv, group*L, Dh]
        if mask is not None and group > 1:
            mask = mask.repeat(1, 1, group, 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.view(b, self.n_local_heads, n, self.head_dim)  # [B, H, L, Dh]
        return self.o_proj(y.transpose(1, 2).reshape(b, n, self.n_local_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up stacked in one column-parallel layer, down row-parallel."""

    def __init__(self, config: ModelConfig, shard: Shard):
        super().__init__()
        width = config.intermediate_size
        cols = block(width, shard.tp_rank, shard.tp_size)
        self.gate_up_proj = ColumnParallelLinear(config.dim, [Part("gate_proj", width, cols),
                                                              Part("up_proj", width, cols)], bias=False)
        self.down_proj = RowParallelLinear(width, cols, config.dim, bias=False, comm=shard.comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.gate_up_proj.sizes, dim=-1)  # [B, L, F] each
        return self.down_proj(F.silu(gate) * up)  # [B, L, D]


class DecoderLayer(nn.Module):
    """Attention then the MLP: dense, or in an MoE layer the experts (named as HF names them: Mixtral's
    `block_sparse_moe`, Qwen2-MoE's `mlp`)."""

    def __init__(self, config: ModelConfig, shard: Shard, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.rms_norm_eps)
        self.self_attn = Attention(config, shard)
        self.post_attention_layernorm = RMSNorm(config.dim, config.rms_norm_eps)
        if layer_id in config.moe_layers:
            self.mlp_name = moe_names(config.model_type)[0]
            self.add_module(self.mlp_name, MoE(config, shard.tp_rank, shard.tp_size, shard.ep_rank, shard.ep_size,
                                               shard.comm))
        else:
            self.mlp_name = "mlp"
            self.mlp = MLP(config, shard)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                slot: int | torch.Tensor, rows: slice) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, slot, rows)
        return x + getattr(self, self.mlp_name)(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """One pipeline stage: [embed] -> its decoder layers -> [norm -> LM head -> full logits of the last token]."""

    def __init__(self, config: ModelConfig, shard: Shard = Shard()):
        super().__init__()
        self.config, self.shard = config, shard
        vocab_rows = block(config.vocab_size, shard.tp_rank, shard.tp_size)
        if shard.first:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, vocab_rows, config.dim, shard.comm)
        layer_ids = shard.layers if shard.layers is not None else range(config.n_layers)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(config, shard, i) for i in layer_ids})
        if shard.last:
            self.norm = RMSNorm(config.dim, config.rms_norm_eps)
            vocab_part = Part("", config.vocab_size, vocab_rows)  # vocab-parallel head
            self.lm_head = ColumnParallelLinear(config.dim, [vocab_part], bias=False)
        self.inv_freq = rope_inv_freq(config)  # a plain CPU tensor (explicit device: not meta-built)
        self.rope_cos = self.rope_sin = torch.empty(0, device="cpu")  # per position, built by setup_cache

    def tie_weights(self) -> None:
        """Tied embeddings on a stage that both embeds and predicts: one tensor, loaded once."""
        if self.config.tie_word_embeddings and self.shard.first and self.shard.last:
            self.lm_head.weight = self.embed_tokens.weight

    def pack_for_decode(self, rows: int, onednn: bool | None = None) -> KernelChoice:
        """Lay the linear layers' weights out for the CPU kernel that serves decode steps of `rows` rows fastest
        here, measured unless `onednn` says which (topoplan.runner.cpu_linear.prepack)."""
        return prepack(self, rows, LINEAR_LAYERS, onednn)

    def setup_cache(self, batch: int, max_len: int) -> None:
        """A KV cache of `batch` x `max_len` positions per layer, emptied; the buffers of the same shape are kept
        (a recorded CUDA graph of a decode step points at them: topoplan.runner.graphs)."""
        weight = next(self.parameters())
        if self.rope_cos.shape[0] != max_len or self.rope_cos.dtype != weight.dtype:  # kept like the cache
            self.rope_cos, self.rope_sin = rotary_tables(torch.arange(max_len, device=weight.device), self.inv_freq,
                                                         weight.dtype)  # [max_len, 1, Dh]: a step indexes them
        for layer in self.layers.values():
            attn = layer.self_attn
            shape = (batch, attn.n_local_kv_heads, max_len, attn.head_dim)
            if attn.cache is not None and attn.cache.k.shape == shape and attn.cache.k.dtype == weight.dtype:
                attn.cache.k.zero_()
                attn.cache.v.zero_()
            else:
                attn.cache = KVCache(batch, attn.n_local_kv_heads, max_len, attn.head_dim, weight.dtype,
                                     weight.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, slot: int | torch.Tensor,
                rows: slice = slice(None)) -> torch.Tensor:
        """x: token ids [B, L] on the first stage, else hidden states [B, L, D]. positions: [B, L] RoPE
        positions; mask: [B, 1, L, slot+L] True where a query may attend (None: everything cached); rows: which
        rows of the KV cache these B sequences are (a pipeline micro-batch). Returns hidden states [B, L, D],
        or on the last stage the full-vocabulary logits of the last position, [B, V]."""
        if self.shard.first:
            x = self.embed_tokens(x)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # [B, L, 1, Dh]
        for layer in self.layers.values():
            x = layer(x, cos, sin, mask, slot, rows)
        if not self.shard.last:
            return x
        local_logits = self.lm_head(self.norm(x[:, -1]))  # [B, V / tp]
        return self.shard.comm.all_gather_last_dim(local_logits)  # [B, V]


def build_stage(config: ModelConfig, shard: Shard, device: torch.device, dtype: torch.dtype) -> Transformer:
    """An uninitialised stage (weights are loaded next): built on the meta device, so no random init cost."""
    with torch.device("meta"):
        model = Transformer(config, shard)
    model = model.to_empty(device=device).to(dtype)
    model.inv_freq = model.inv_freq.to(device)
    model.tie_weights()
    return model.eval()
