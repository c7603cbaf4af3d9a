"""The runner's CPU matrix product (topoplan.runner.cpu_linear): which weights it packs for oneDNN, that the
packed product equals F.linear, and that a packed model, one rank or TP2/PP2 ranks, generates what the plain
one does. The layer grid of test_runner_dist.py uses models too small to pack; these use one that packs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from runner_models import run_jobs, save_byte_model

from topoplan.plan.cost import STREAMED_WEIGHT_BYTES
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


def test_the_rule_packs_streamed_weights_unless_one_row_on_one_thread():
    big = torch.empty(STREAMED_WEIGHT_BYTES // 4 // 256, 256)
    cached = torch.empty(128, 256)  # 128 KiB: stays in a core's cache
    assert cpu_linear.packs(big, rows=2, threads=1) and cpu_linear.packs(big, rows=1, threads=2)
    assert not cpu_linear.packs(big, rows=1, threads=1)
    assert not cpu_linear.packs(cached, rows=8, threads=2)
    assert not cpu_linear.packs(big.to(torch.bfloat16), rows=8, threads=2)


@pytest.mark.parametrize("shape", [(3, 512), (2, 5, 512)])
def test_packed_product_equals_f_linear(shape):
    torch.manual_seed(0)
    w, b, x = torch.randn(1024, 512), torch.randn(1024), torch.randn(*shape)
    packed = cpu_linear.pack(w)
    assert packed.is_mkldnn
    torch.testing.assert_close(cpu_linear.linear(x, packed, b), F.linear(x, w, b), rtol=0, atol=1e-4)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), rtol=0, atol=0)


def _load(folder):
    cfg = load_hf_config(folder)
    model = build_stage(cfg, Shard(), torch.device("cpu"), torch.float32)
    load_stage_weights(model, folder, cfg.tie_word_embeddings)
    return model


def test_a_packed_model_generates_what_the_plain_one_does(tmp_path):
    folder = save_byte_model(tmp_path / "m", **BIG, tie_word_embeddings=True)
    plain, packed = _load(folder), _load(folder)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert packed.pack_for_decode(rows=1) == 0  # one row on one thread: MKL's F.linear
        assert packed.pack_for_decode(rows=len(PROMPTS)) == 2 * 4  # qkv, o, gate+up, down of each layer
    finally:
        torch.set_num_threads(threads)
    assert packed.lm_head.weight is packed.embed_tokens.weight and not packed.lm_head.weight.is_mkldnn  # tied
    expected, ours = generate(plain, PROMPTS, 6, keep_logits=True), generate(packed, PROMPTS, 6, keep_logits=True)
    assert ours.tokens == expected.tokens
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(expected.logits), rtol=0, atol=FP32_LOGIT_TOL)


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
        torch.testing.assert_close(torch.stack(logits), torch.stack(reference.logits), rtol=0, atol=FP32_LOGIT_TOL)
