"""The static-shape decode step that CUDA graphs record (topoplan.runner.graphs): the same tokens and logits as
transformers and as the eager step, and, through a stand-in for the GPU's capture that forbids host reads,
recorded once per micro-batch (in the runner's warm-up) and replayed on every later step with its inputs
copied into the tensors it owns; an MoE step cannot be recorded."""

from __future__ import annotations

import contextlib

import pytest
import torch
from runner_models import hf_generate, hf_model

from topoplan.runner.config import load_hf_config
from topoplan.runner.generate import attention_mask, generate
from topoplan.runner.graphs import StaticDecodeStep, static_decode_mask
from topoplan.runner.model import Shard, build_stage
from topoplan.runner.weights import load_stage_weights

FP32_LOGIT_TOL = 1e-4
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 20, 21], [1, 30, 31, 32, 33, 34]]  # left padding of 0, 6, 3


def load(tmp_path, kind):
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    cfg = load_hf_config(tmp_path)
    model = build_stage(cfg, Shard(), torch.device("cpu"), torch.float32)
    load_stage_weights(model, tmp_path, cfg.tie_word_embeddings)
    return hf, model


@pytest.mark.parametrize("kind", ["llama", "mistral", "mixtral"])
def test_static_decode_matches_transformers_and_the_eager_step(tmp_path, kind):
    """Padding, GQA, Mistral's sliding window of 5 (crossed after 5 steps) and MoE routing, over the whole cache
    under the mask instead of the filled slice."""
    hf, model = load(tmp_path, kind)
    expected, hf_logits = hf_generate(hf, PROMPTS, 10)
    eager = generate(model, PROMPTS, 10, keep_logits=True)
    static = generate(model, PROMPTS, 10, keep_logits=True, static_decode=True)
    assert static.tokens == expected == eager.tokens
    torch.testing.assert_close(torch.stack(static.logits), hf_logits, rtol=0, atol=FP32_LOGIT_TOL)
    torch.testing.assert_close(torch.stack(static.logits), torch.stack(eager.logits), rtol=0, atol=FP32_LOGIT_TOL)


class HostRead(RuntimeError):
    """A step read a tensor's value on the host while being recorded or replayed."""


@contextlib.contextmanager
def no_host_reads():
    """Make every host read of a tensor's value (.item(), .tolist(), bool(), int()) raise, as a CUDA stream
    capture does; a replay would also freeze the value read at recording."""
    def refuse(*_args, **_kwargs):
        raise HostRead("a host read of a tensor's value inside a recorded step")

    names = ("item", "tolist", "__bool__", "__int__")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class ReplayingCapture:
    """A stand-in for cuda_graph_capture: records which steps were captured and, on replay, runs the captured
    step again with host reads forbidden (as during a CUDA capture) and writes its result into the tensor the
    capture returned (a CUDA graph's replay rewrites its recorded output); the result's shape must not change."""

    def __init__(self):
        self.captured, self.replays = [], 0

    def __call__(self, step):
        with no_host_reads():
            out = step()
        self.captured.append(out)

        def replay():
            self.replays += 1
            with no_host_reads():
                result = step()
            assert result.shape == out.shape  # a fixed-shape step
            out.copy_(result)
            return out

        return replay


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_each_micro_batch_is_captured_once_and_replayed_every_later_step(tmp_path, kind):
    _hf, model = load(tmp_path, kind)
    eager = generate(model, PROMPTS, 8, keep_logits=True, micro_batches=2)
    capture = ReplayingCapture()
    graphed = generate(model, PROMPTS, 8, keep_logits=True, micro_batches=2, static_decode=True, capture=capture)
    assert graphed.tokens == eager.tokens
    torch.testing.assert_close(torch.stack(graphed.logits), torch.stack(eager.logits), rtol=0, atol=FP32_LOGIT_TOL)
    # 2 micro-batches: each captured at its first decode step, then replayed at every decode step 1..7 (a CUDA
    # graph's recording computes nothing, so the first step replays too)
    assert len(capture.captured) == 2 and capture.replays == 2 * 7


def test_a_warm_up_records_and_the_next_generation_only_replays(tmp_path):
    """As the runner does: an untimed generation records the steps; the timed one, given the same `statics` and
    reusing the KV cache's buffers, replays them (other prompts of the same shapes: the padding is an input)."""
    _hf, model = load(tmp_path, "llama")
    capture, statics = ReplayingCapture(), {}
    generate(model, PROMPTS, 2, static_decode=True, capture=capture, statics=statics, cache_len=20)
    cache = model.layers["0"].self_attn.cache.k
    others = [[1, 40, 41, 42], [1, 50, 51, 52, 53, 54, 55, 56, 57], [1, 60]]  # other lengths: other padding
    eager = generate(model, others, 8, keep_logits=True, cache_len=20)
    timed = generate(model, others, 8, keep_logits=True, static_decode=True, capture=capture, statics=statics,
                     cache_len=20)
    assert model.layers["0"].self_attn.cache.k is cache  # the buffers the recording points at
    assert len(capture.captured) == 1  # recorded in the warm-up only
    assert timed.tokens == eager.tokens
    torch.testing.assert_close(torch.stack(timed.logits), torch.stack(eager.logits), rtol=0, atol=FP32_LOGIT_TOL)


def test_an_moe_step_cannot_be_recorded(tmp_path):
    """Routing reads each expert's row count on the host (topoplan.runner.moe): a capture forbids that, which is
    why `run --cuda-graphs` refuses MoE checkpoints."""
    _hf, model = load(tmp_path, "mixtral")
    with pytest.raises(HostRead):
        generate(model, PROMPTS, 3, static_decode=True, capture=ReplayingCapture())


def test_static_step_writes_the_slot_it_is_given_and_nothing_else(tmp_path):
    _hf, model = load(tmp_path, "llama")
    model.setup_cache(1, 16)
    attn = model.layers["0"].self_attn
    step = StaticDecodeStep(model, torch.tensor([[7]]), torch.tensor([0]), slice(0, 1), 16)
    step(torch.tensor([[7]]), 5, torch.tensor([0]))
    written = attn.cache.k[0].abs().sum(dim=(0, 2))  # per cache position
    assert written[5] > 0 and written[:5].sum() == 0 and written[6:].sum() == 0


def test_static_mask_is_the_decode_mask_over_the_whole_cache():
    """Where the eager step's mask covers slots 0..slot, the static one covers the cache and hides the rest."""
    pad, slot, cache_len = torch.tensor([0, 3, 6]), 9, 16
    for window in (None, 4):
        eager = attention_mask(pad, slot, 1, window)  # [B, 1, 1, slot + 1]
        static = static_decode_mask(pad, torch.tensor([slot]), cache_len, window)  # [B, 1, 1, 16]
        assert static.shape == (3, 1, 1, cache_len)
        assert torch.equal(static[..., :slot + 1], eager) and not static[..., slot + 1:].any()
