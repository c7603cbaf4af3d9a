"""The runner's CPU matrix product (topoplan.runner.cpu_linear): which weights are candidates for oneDNN and which
are kept transposed, that each form's product equals F.linear, that the kernel is chosen by timing both and the
weights left as chosen (the plain ones bit for bit), and that a packed model, one rank or TP2/PP2 ranks,
generates what the plain one does. The layer grid of test_runner_dist.py uses models too small to pack; these
use one that packs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from runner_models import run_jobs, save_byte_model

from topoplan.layout import STREAMED_WEIGHT_BYTES
from topoplan.runner import cpu_linear
from topoplan.runner.config import load_hf_config
from topoplan.runner.generate import generate
from topoplan.runner.model import Shard, build_stage
from topoplan.runner.weights import load_stage_weights

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="this torch build has no oneDNN linear ops")

FP32_LOGIT_TOL = 1e-4  # absolute: the two kernels only sum in another order
BIG = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
       "head_dim": 64, "num_hidden_layers": 2}  # every linear weight but the 264-row head >= STREAMED_WEIGHT_BYTES
PROMPTS = [[256, 1, 2, 3, 4, 5, 6], [256, 9, 8], [256, 40, 41, 42]]


def test_streamed_float32_weights_are_candidates_and_cached_ones_are_transposed():
    big = torch.empty(STREAMED_WEIGHT_BYTES // 4 // 256, 256)
    cached = torch.empty(128, 256)  # 128 KiB: stays in a core's cache
    assert cpu_linear.streams(big) and not cpu_linear.transposes(big)
    assert cpu_linear.transposes(cached) and not cpu_linear.streams(cached)
    assert not cpu_linear.streams(big.to(torch.bfloat16)) and not cpu_linear.transposes(cached.to(torch.bfloat16))


@pytest.mark.parametrize("shape", [(3, 512), (2, 5, 512)])
def test_packed_and_transposed_products_equal_f_linear(shape):
    torch.manual_seed(0)
    w, b, x = torch.randn(1024, 512), torch.randn(1024), torch.randn(*shape)
    packed = cpu_linear.pack(w)
    assert packed.is_mkldnn and torch.equal(packed.to_dense(), w)  # MKL chosen: reordered back bit for bit
    torch.testing.assert_close(cpu_linear.linear(x, packed, b), F.linear(x, w, b), rtol=0, atol=1e-4)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), rtol=0, atol=0)
    column_major = w.t().contiguous().t()
    torch.testing.assert_close(cpu_linear.linear(x, column_major, b, weight_t=column_major.t()), F.linear(x, w, b),
                               rtol=0, atol=1e-4)


def _load(folder):
    cfg = load_hf_config(folder)
    model = build_stage(cfg, Shard(), torch.device("cpu"), torch.float32)
    load_stage_weights(model, folder, cfg.tie_word_embeddings)
    return model


def _streamed(model):
    return [m for m in model.modules() if getattr(m, "weight", None) is not None and hasattr(m, "packed")
            and m.weight.numel() * 4 >= STREAMED_WEIGHT_BYTES]


@pytest.mark.parametrize("onednn", [True, False])
def test_a_prepared_model_generates_what_the_plain_one_does(tmp_path, onednn):
    folder = save_byte_model(tmp_path / "m", **BIG, tie_word_embeddings=True)
    plain, prepared = _load(folder), _load(folder)
    choice = prepared.pack_for_decode(rows=len(PROMPTS), onednn=onednn)
    assert (choice.onednn, choice.weights) == (onednn, 2 * 4)  # qkv, o, gate+up, down of each layer
    assert all(m.packed == m.weight.is_mkldnn == onednn for m in _streamed(prepared))
    assert prepared.lm_head.weight is prepared.embed_tokens.weight and not prepared.lm_head.weight.is_mkldnn  # tied
    expected, ours = generate(plain, PROMPTS, 6, keep_logits=True), generate(prepared, PROMPTS, 6, keep_logits=True)
    assert ours.tokens == expected.tokens
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(expected.logits), rtol=0, atol=FP32_LOGIT_TOL)


@pytest.mark.parametrize("faster", ["onednn", "mkl"])
def test_the_kernel_timed_faster_is_kept(tmp_path, monkeypatch, faster):
    """prepack times a pass over the streamed weights plain, then packed, and keeps the faster; here the clock is a
    stand-in that makes `faster` win, so both outcomes are checked: packed weights, or the loaded ones bit for bit."""
    folder = save_byte_model(tmp_path / "m", **BIG)
    model, loaded = _load(folder), _load(folder)
    timed = []

    def fake_pass_ms(weights, rows):
        timed.append((rows, [w.is_mkldnn for w in weights]))
        return 1.0 if weights[0].is_mkldnn == (faster == "onednn") else 2.0

    monkeypatch.setattr(cpu_linear, "pass_ms", fake_pass_ms)
    choice = model.pack_for_decode(rows=3)
    assert timed == [(3, [False] * 8), (3, [True] * 8)]
    assert (choice.onednn, choice.mkl_ms, choice.onednn_ms) == ((True, 2.0, 1.0) if faster == "onednn" else
                                                                 (False, 1.0, 2.0))
    for mine, theirs in zip(_streamed(model), _streamed(loaded), strict=True):
        assert mine.packed == mine.weight.is_mkldnn == (faster == "onednn")
        if faster == "mkl":
            assert torch.equal(mine.weight, theirs.weight)


def test_the_timed_choice_is_the_faster_pass(tmp_path):
    """With the real clock: both passes are timed, and the kernel kept is the one whose pass was faster."""
    model = _load(save_byte_model(tmp_path / "m", **BIG))
    choice = model.pack_for_decode(rows=1)
    assert choice.mkl_ms > 0 and choice.onednn_ms > 0 and choice.onednn == (choice.onednn_ms < choice.mkl_ms)
    assert all(m.packed == choice.onednn for m in _streamed(model))


def test_packed_ranks_generate_what_one_rank_does(tmp_path):
    """The worker packs after loading (2 ranks x 1 thread, 3 prompts: 3 rows, or 2 per micro-batch with PP2)."""
    folder = save_byte_model(tmp_path / "m", **BIG)
    ids = [",".join(map(str, p)) for p in PROMPTS]
    opts = lambda tp, pp: {"model": str(folder), "tp": tp, "pp": pp, "dp": 1, "prompt_ids": ids,  # noqa: E731
                           "max_new_tokens": 6, "backend": "gloo", "timeout": 120}
    results = run_jobs(2, [{"name": "tp2", "options": opts(2, 1)}, {"name": "pp2", "options": opts(1, 2)}], tmp_path)
    reference = generate(_load(folder), PROMPTS, 6, keep_logits=True)
    for name in ("tp2", "pp2"):
        result, logits = results[name]
        assert result["tokens"] == reference.tokens, name
        for kernel in result["cpu_kernel_per_rank"]:  # each rank timed both kernels and kept the faster
            assert kernel["kernel"] == ("onednn" if kernel["onednn_ms"] < kernel["mkl_ms"] else "mkl"), (name, kernel)
        torch.testing.assert_close(torch.stack(logits), torch.stack(reference.logits), rtol=0, atol=FP32_LOGIT_TOL)
