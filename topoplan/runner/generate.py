"""Prefill + decode over a static KV cache, for a batch of prompts of different lengths, with pipeline
micro-batches in flight.

Prompts are left-padded to a common length, so the last position is every sequence's newest token and
one cache slot index serves the whole batch. Each sequence gets its own RoPE positions (slot minus its
padding) and a mask that hides the padding, exactly as HF `generate` treats a left-padded batch.

Schedule: the batch is cut into m micro-batches (contiguous rows; m = min(stages, batch) by default, the
schedule the planner prices, topoplan.plan.cost). Every stage works through the items (step 0, mb 0), (step
0, mb 1), ..., (step 1, mb 0), ... in that order; stage 0 starts (t, j) as soon as the last stage has sent
back the tokens of (t - 1, j), so while the last stage finishes one micro-batch the first already runs the
next: with m = stages no stage idles in the steady state. With one stage (or m = 1) this is the plain loop.

How ranks agree on a token: the LM head is vocab-parallel and its shards are all-gathered, so every TP rank
of the last stage holds bit-identical full logits. Greedy argmax is then identical everywhere; sampling
draws each sequence's uniform from its own generator, seeded from `seed` and the sequence's index, so every
rank, every layout and every micro-batch split picks the same token without a broadcast. Stage 0 records the
tokens and decides when a micro-batch (and the whole batch) has finished; it tells the later stages with
control messages (topoplan.runner.pipeline).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from topoplan.layout import micro_batches
from topoplan.runner.graphs import Capture, StaticDecodeStep
from topoplan.runner.model import Transformer
from topoplan.runner.pipeline import SKIP, STOP, Pipeline, SingleStage


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax(logits / temperature), cut to the top-p nucleus."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per prompt, up to and including EOS
    logits: list[torch.Tensor] = field(default_factory=list)  # per prompt [its steps, V], last stage, when asked
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


def pick_tokens(logits: torch.Tensor, sampling: Sampling, generators: list[torch.Generator] | None) -> torch.Tensor:
    """Next token per row of logits [B, V]; sampling draws row i's uniform from generators[i]."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    assert generators is not None and len(generators) == logits.shape[0]
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > sampling.top_p  # keep the smallest nucleus
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    cumulative = probs.cumsum(dim=-1)  # inverse-CDF draw: row i takes the first token whose mass passes u_i
    uniform = torch.stack([torch.rand((), generator=g, device=probs.device) for g in generators])
    picked = torch.searchsorted(cumulative, (uniform * cumulative[:, -1])[:, None], right=True).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def micro_batch_rows(batch: int, stages: int, requested: int) -> list[slice]:
    """The rows of each micro-batch: `requested` of them (0: one per stage), at most one per sequence."""
    m = micro_batches(stages, batch, requested)
    bounds = [j * batch // m for j in range(m + 1)]  # sizes differ by at most one
    return [slice(bounds[j], bounds[j + 1]) for j in range(m)]


@dataclass
class MicroBatch:
    """One micro-batch as stage 0 and the last stage track it: its rows of the batch, the tokens it runs next,
    and which of its sequences have produced an EOS."""

    rows: slice
    tokens: torch.Tensor  # [b, L]: the (padded) prompts, then each step's new token
    finished: torch.Tensor  # [b] bool
    done: bool = False  # every one finished (kept with `finished`: asked several times a step)

    @property
    def size(self) -> int:
        return self.rows.stop - self.rows.start

    def open_rows(self) -> list[tuple[int, int]]:
        """(row of the batch, position in this micro-batch) of each sequence still generating."""
        return [(self.rows.start + k, k) for k, ended in enumerate(self.finished.tolist()) if not ended]


@torch.inference_mode()
def generate(model: Transformer, prompts: list[list[int]], max_new_tokens: int, *, eos_ids: tuple[int, ...] = (),
             pad_id: int = 0, sampling: Sampling = Sampling(), pipeline: Pipeline | SingleStage | None = None,
             micro_batches: int = 0, keep_logits: bool = False,
             on_step: Callable[[int], None] | None = None, cache_len: int | None = None,
             static_decode: bool = False, capture: Capture | None = None,
             statics: dict[tuple, StaticDecodeStep] | None = None) -> Generation:
    """Generate up to `max_new_tokens` per prompt; stop early once every sequence has produced an EOS.

    `pad_id` fills the left padding; it is masked out, so any valid id will do. `cache_len`: KV-cache positions
    to allocate (default: the longest prompt plus `max_new_tokens`); a compiled stage's warm-up gives the real
    run's, so the graphs it builds have the cache's shape. `static_decode`: decode steps with fixed shapes
    (topoplan.runner.graphs), recorded by `capture` on their first call when given (CUDA graphs), kept in
    `statics` when given so a later generation of the same shapes replays them. Stage 0 and the last stage
    return the tokens (the others return none); every stage returns its timings: prefill until it has handled
    step 0 of every micro-batch, decode the rest, per step of the whole batch."""
    pipeline = pipeline or SingleStage()
    weight = next(model.parameters())
    device, dtype = weight.device, weight.dtype
    batch, width = len(prompts), max(len(p) for p in prompts)
    pad = torch.tensor([width - len(p) for p in prompts], device=device)
    padded = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    cache_len = cache_len or width + max_new_tokens
    model.setup_cache(batch, cache_len)
    generators = ([torch.Generator(device=device).manual_seed(sampling.seed + i) for i in range(batch)]
                  if sampling.temperature > 0 else None)
    eos = torch.tensor(eos_ids, device=device, dtype=torch.long)
    mbs = [MicroBatch(rows, padded[rows], torch.zeros(rows.stop - rows.start, dtype=torch.bool, device=device))
           for rows in micro_batch_rows(batch, pipeline.stages, micro_batches)]
    knows_tokens = pipeline.is_first or pipeline.is_last
    out = Generation(tokens=[[] for _ in prompts] if knows_tokens else [])
    logits_rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    # one new token, no padding, no window: it may attend to the whole cache, so no mask is needed
    plain_decode = int(pad.max()) == 0 and model.config.sliding_window is None

    def record(mb: MicroBatch, new: torch.Tensor) -> None:
        tokens = new.tolist()
        for i, k in mb.open_rows():
            out.tokens[i].append(tokens[k])
        if eos_ids:
            mb.finished |= torch.isin(new, eos)
            mb.done = bool(mb.finished.all())
        mb.tokens = new[:, None]

    steps = statics if statics is not None else {}  # with static_decode: per micro-batch and shape

    def forward(step: int, mb: MicroBatch, x: torch.Tensor) -> torch.Tensor:
        slot = 0 if step == 0 else width + step - 1
        if step > 0 and static_decode:
            key = (mb.rows.start, mb.rows.stop, cache_len, tuple(x.shape), x.dtype)
            if key not in steps:
                steps[key] = StaticDecodeStep(model, x, pad[mb.rows], mb.rows, cache_len, capture)
            return steps[key](x, slot, pad[mb.rows])
        n_new = x.shape[1]
        positions = (torch.arange(slot, slot + n_new, device=device)[None, :] - pad[mb.rows, None]).clamp(min=0)
        mask = (None if plain_decode and step > 0
                else attention_mask(pad[mb.rows], slot, n_new, model.config.sliding_window))
        return model(x, positions, mask, slot, mb.rows)

    def run_item(step: int, mb: MicroBatch, x: torch.Tensor) -> None:
        y = forward(step, mb, x)
        if not pipeline.is_last:
            pipeline.send_on(y)
            return
        new = pick_tokens(y, sampling, generators[mb.rows] if generators else None)
        if keep_logits:  # the steps that produced each sequence's tokens, up to its EOS
            rows = y.to("cpu", torch.float32, copy=True)  # a recorded step rewrites y next step
            for i, k in mb.open_rows():
                logits_rows[i].append(rows[k])
        if not pipeline.is_first:
            pipeline.send_tokens(new)
        record(mb, new)  # the last stage tracks EOS too, for the logits; stage 0 decides what runs

    start = time.perf_counter()
    stopped = False
    for step in range(max_new_tokens + 1):  # the extra round only collects the last step's tokens at stage 0
        for mb in mbs:
            if pipeline.is_first:
                if step > 0 and not mb.done and not pipeline.is_last:
                    record(mb, pipeline.receive_tokens(mb.size))
                if all(m.done for m in mbs):
                    stopped = True
                    break
                if step == max_new_tokens or mb.done:
                    if not pipeline.is_last and step < max_new_tokens:
                        pipeline.send_on(None, SKIP)
                    continue
                run_item(step, mb, mb.tokens)
            elif step < max_new_tokens:
                message = pipeline.receive(dtype)
                if isinstance(message, torch.Tensor):
                    run_item(step, mb, message)
                elif message == STOP:
                    stopped = True
                    break
                elif not pipeline.is_last:  # SKIP: stage 0 has nothing more for this micro-batch
                    pipeline.send_on(None, SKIP)
        if stopped:
            if not pipeline.is_last and step < max_new_tokens:  # after the last step the others have ended
                pipeline.send_on(None, STOP)
            break
        if step == 0:
            _sync(device)
            out.prefill_s = time.perf_counter() - start
        elif step < max_new_tokens:
            out.decode_steps += 1
        if on_step and step < max_new_tokens:
            on_step(step)
    pipeline.close()
    _sync(device)
    out.decode_s = time.perf_counter() - start - out.prefill_s
    if keep_logits and pipeline.is_last:
        out.logits = [torch.stack(rows) for rows in logits_rows]
    return out
