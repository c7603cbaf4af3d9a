"""Prefill + decode over a static KV cache, for a batch of prompts of different lengths.

Prompts are left-padded to a common length, so the last position is every sequence's newest token and
one cache slot index serves the whole batch. Each sequence gets its own RoPE positions (slot minus its
padding) and a mask that hides the padding, exactly as HF `generate` treats a left-padded batch.

How TP ranks agree on a token: the LM head is vocab-parallel and its shards are all-gathered, so every
TP rank of the last stage holds bit-identical full logits. Greedy argmax is then identical everywhere;
sampling uses a generator seeded with the same `seed` on every rank and drawn in the same order, so it
picks the same token without a broadcast. The last stage then broadcasts the tokens along its pipeline,
which gives stage 0 its next input and every stage the same view of which sequences have finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from topoplan.runner.model import Transformer
from topoplan.runner.pipeline import Pipeline, SingleStage


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax(logits / temperature), cut to the top-p nucleus."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per prompt, up to and including EOS
    logits: list[torch.Tensor] = field(default_factory=list)  # per step [B, V], last stage, when asked
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0


def attention_mask(pad: torch.Tensor, slot: int, n_new: int, window: int | None) -> torch.Tensor:
    """[B, 1, n_new, slot + n_new], True where query slot i may attend key slot j."""
    q = torch.arange(slot, slot + n_new, device=pad.device)[:, None]  # [L, 1]
    k = torch.arange(slot + n_new, device=pad.device)[None, :]  # [1, S]
    allowed = (k <= q) & (k >= pad[:, None, None])  # causal, and not padding: [B, L, S]
    if window is not None:
        allowed &= (q - k) < window  # Mistral's sliding window
    allowed |= k == q  # a padding query sees itself, so no row is all-masked (NaN-free softmax)
    return allowed.unsqueeze(1)


def pick_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row of logits [B, V]."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > sampling.top_p  # keep the smallest nucleus
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(model: Transformer, prompts: list[list[int]], max_new_tokens: int, *, eos_ids: tuple[int, ...] = (),
             pad_id: int = 0, sampling: Sampling = Sampling(), pipeline: Pipeline | SingleStage | None = None,
             keep_logits: bool = False, on_step: Callable[[int], None] | None = None) -> Generation:
    """Generate up to `max_new_tokens` per prompt; stop early once every sequence has produced an EOS.

    `pad_id` fills the left padding; it is masked out, so any valid id will do."""
    pipeline = pipeline or SingleStage()
    weight = next(model.parameters())
    device, dtype = weight.device, weight.dtype
    batch, width = len(prompts), max(len(p) for p in prompts)
    pad = torch.tensor([width - len(p) for p in prompts], device=device)
    tokens = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    model.setup_cache(batch, width + max_new_tokens)
    generator = torch.Generator(device=device).manual_seed(sampling.seed) if sampling.temperature > 0 else None
    eos = torch.tensor(eos_ids, device=device, dtype=torch.long)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    out = Generation(tokens=[[] for _ in prompts])
    # one new token, no padding, no window: it may attend to the whole cache, so no mask is needed
    plain_decode = int(pad.max()) == 0 and model.config.sliding_window is None
    slot = 0
    for step in range(max_new_tokens):
        _sync(device)
        start = time.perf_counter()
        n_new = tokens.shape[1]
        positions = (torch.arange(slot, slot + n_new, device=device)[None, :] - pad[:, None]).clamp(min=0)
        mask = None if plain_decode and step > 0 else attention_mask(pad, slot, n_new, model.config.sliding_window)
        logits = pipeline.step(model, tokens, positions, mask, slot, dtype)
        if logits is not None:
            next_tokens = pick_tokens(logits, sampling, generator)
            if keep_logits:
                out.logits.append(logits.float().cpu())
        else:
            next_tokens = torch.empty(batch, dtype=torch.long, device=device)
        next_tokens = pipeline.share_tokens(next_tokens)
        for i, token in enumerate(next_tokens.tolist()):
            if not finished[i]:
                out.tokens[i].append(token)
        finished |= torch.isin(next_tokens, eos)
        _sync(device)
        elapsed = time.perf_counter() - start
        if step == 0:
            out.prefill_s = elapsed
        else:
            out.decode_s += elapsed
            out.decode_steps += 1
        if on_step:
            on_step(step)
        if bool(finished.all()):
            break
        slot += n_new
        tokens = next_tokens[:, None]
    return out
