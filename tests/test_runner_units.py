"""Runner pieces in one process: rank-order groups, config parsing, RoPE, masks, sampling, loading, and the
unsharded model against HF transformers (token for token, logits close) in fp32."""

from __future__ import annotations

import json

import pytest
import torch
from runner_models import hf_generate, hf_model, save_byte_model

from topoplan.errors import TopoplanError
from topoplan.models import spec_from_config
from topoplan.run_options import RunOptions, parse_argv, parse_ids
from topoplan.runner.config import check_tp, load_hf_config, parse_hf_config
from topoplan.runner.generate import Sampling, attention_mask, generate, pick_tokens
from topoplan.runner.model import RMSNorm, Shard, build_stage, kv_heads_of, rope_inv_freq
from topoplan.runner.tiny import save_checkpoint
from topoplan.runner.weights import load_stage_weights

FP32_LOGIT_TOL = 1e-4  # absolute, on logits of order 1-10: fp32 summation-order noise is ~1e-6


LLAMA31 = {  # the shape of meta-llama/Llama-3.1-8B's config.json (transformers v4 spelling)
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}


def test_parse_llama31_config():
    cfg = parse_hf_config(LLAMA31)
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        128256, 4096, 32, 32, 8, 128)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling_dict["rope_type"] == "llama3"
    assert cfg.eos_token_ids == (128001, 128008, 128009) and not cfg.qkv_bias and not cfg.tie_word_embeddings


def test_parse_v5_rope_parameters_and_qwen2_bias():
    cfg = parse_hf_config({**LLAMA31, "model_type": "qwen2", "rope_scaling": None, "rope_theta": None,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling == () and cfg.qkv_bias and not cfg.o_bias


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"hidden_act": "gelu"}, "SwiGLU"),
])
def test_unsupported_configs_are_refused_with_the_file(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA31, **change}))
    with pytest.raises(TopoplanError, match=message) as info:
        load_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


def test_sizes_are_read_like_the_planner_reads_them():
    """One reader for the sizes: the runner's ModelConfig and the planner's ModelSpec agree, and refuse alike."""
    cfg, spec = parse_hf_config(LLAMA31), spec_from_config(LLAMA31, "Llama-3.1-8B")
    sizes = (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.intermediate_size)
    assert sizes == (
        spec.vocab, spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate)
    with pytest.raises(TopoplanError, match="key 'hidden_size' must be a positive integer, got '4096'"):
        parse_hf_config({**LLAMA31, "hidden_size": "4096"})


def test_broken_config_json_names_the_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n"model_type": "llama",\n oops\n}')
    with pytest.raises(TopoplanError, match=r"config.json:3: not valid JSON"):
        load_hf_config(tmp_path)


def test_check_tp():
    cfg = parse_hf_config(LLAMA31)
    check_tp(cfg, 8)
    check_tp(cfg, 16)  # 16 > 8 KV heads: each KV head replicated on 2 ranks
    with pytest.raises(TopoplanError, match="num_attention_heads=32 is not divisible by tp=3"):
        check_tp(cfg, 3)
    with pytest.raises(TopoplanError, match="num_key_value_heads=8 neither divides"):
        check_tp(parse_hf_config({**LLAMA31, "num_attention_heads": 24, "head_dim": 128,
                                  "vocab_size": 128256 - 128256 % 12}), 12)


def test_kv_heads_replicated_beyond_their_count():
    cfg = parse_hf_config({**LLAMA31, "num_key_value_heads": 2})
    assert [kv_heads_of(cfg, r, 4) for r in range(4)] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [kv_heads_of(cfg, r, 2) for r in range(2)] == [range(0, 1), range(1, 2)]


@pytest.mark.parametrize("rope", [{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}, {"rope_type": "linear", "factor": 4.0}])
def test_rope_frequencies_match_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_scaling=rope, rope_theta=500000.0)
    expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
    ours = rope_inv_freq(parse_hf_config({**LLAMA31, "rope_scaling": rope}))
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype):
    """The CPU norm (a vector_norm and four kernels) against HF's LlamaRMSNorm, on rows whose mean squares span
    1e-12 (eps dominates) to 1e6, and on a batch of decode rows [B, 1, D]."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    dim, eps = 256, 1e-5
    scale = torch.tensor([1e-6, 1e-2, 1.0, 1e3]).view(4, 1, 1)
    x = (torch.randn(4, 3, dim) * scale).to(dtype)
    hf = LlamaRMSNorm(dim, eps=eps).to(dtype)
    ours = RMSNorm(dim, eps).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(dim).to(dtype))
        ours.weight.copy_(hf.weight)
        for rows in (x, x[:, -1:]):
            got, expected = ours(rows), hf(rows)
            assert got.dtype == expected.dtype == dtype
            # fp32: rounding of the sum order (~1e-7 relative); bf16: one bf16 rounding step of the result
            tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
            torch.testing.assert_close(got, expected, **tol)


def test_attention_mask_hides_padding_and_future():
    # batch of two: the second is left-padded by 2; prefill of 4 slots, then one decode slot
    mask = attention_mask(torch.tensor([0, 2]), slot=0, n_new=4, window=None)[:, 0].int().tolist()
    assert mask[0] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert mask[1] == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]  # padding sees only itself
    decode = attention_mask(torch.tensor([0, 2]), slot=4, n_new=1, window=3)[:, 0].int().tolist()
    assert decode == [[[0, 0, 1, 1, 1]], [[0, 0, 1, 1, 1]]]  # sliding window of 3


def test_pick_tokens_greedy_and_nucleus():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    assert pick_tokens(logits, Sampling(), None).tolist() == [1, 0]
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    nucleus = Sampling(temperature=1.0, top_p=0.5)  # the top token alone holds more than half the mass
    assert all(pick_tokens(logits, nucleus, gens).tolist() == [1, 0] for _ in range(50))
    wide = [pick_tokens(logits, Sampling(temperature=5.0), gens)[0].item() for _ in range(200)]
    assert set(wide) == {0, 1, 2}
    # each row draws from its own generator: row 1's token does not depend on which rows are drawn with it
    for seed in range(20):
        alone = pick_tokens(logits[1:], Sampling(temperature=5.0), [torch.Generator().manual_seed(seed)])
        together = pick_tokens(logits, Sampling(temperature=5.0), [torch.Generator().manual_seed(seed + 1),
                                                                    torch.Generator().manual_seed(seed)])
        assert alone.item() == together[1].item()


def test_sampling_follows_the_distribution():
    """Inverse-CDF draws land on each token in proportion to its probability, never on a zero-mass one."""
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]])
    gen = [torch.Generator().manual_seed(4)]
    picks = [pick_tokens(probs.log(), Sampling(temperature=1.0), gen).item() for _ in range(4000)]
    counts = [picks.count(t) / len(picks) for t in range(4)]
    assert counts[1] == 0.0
    assert all(abs(got - want) < 0.03 for got, want in zip(counts, [0.5, 0.0, 0.3, 0.2]))


def test_options_round_trip_through_argv():
    opts = RunOptions(model="/x y", tp=2, pp=3, dp=1, prompt=["a b", "c"], prompt_ids=["1,2"], max_new_tokens=5,
                      backend="gloo", temperature=0.7, top_p=0.9, seed=3, ignore_eos=True, json=True)
    assert parse_argv(opts.to_argv()) == opts
    assert parse_argv([]) == RunOptions()
    assert parse_ids("256, 1,2") == [256, 1, 2]
    with pytest.raises(TopoplanError, match="expected comma-separated token ids"):
        parse_ids("1,x")


def _load_unsharded(folder):
    cfg = load_hf_config(folder)
    model = build_stage(cfg, Shard(), torch.device("cpu"), torch.float32)
    report = load_stage_weights(model, folder, cfg.tie_word_embeddings)
    return cfg, model, report


PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 20, 21], [1, 30, 31, 32, 33, 34]]


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "llama-mha", "mixtral", "qwen2_moe"])
def test_unsharded_matches_transformers(tmp_path, kind):
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    cfg, model, report = _load_unsharded(tmp_path)
    tied_copy = cfg.vocab_size * cfg.dim * 4 if cfg.tie_word_embeddings else 0  # state_dict lists it twice
    assert report.bytes_read == sum(p.numel() * 4 for p in hf.state_dict().values()) - tied_copy
    expected, hf_logits = hf_generate(hf, PROMPTS, 10)
    ours = generate(model, PROMPTS, 10, keep_logits=True)
    assert ours.tokens == expected
    got = torch.stack(ours.logits)  # [B, steps, V]: no EOS here, every prompt ran 10 steps
    torch.testing.assert_close(got, hf_logits, rtol=0, atol=FP32_LOGIT_TOL)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_single_prompt_decode_without_mask_matches_transformers(tmp_path, kind):
    """No padding (and no sliding window for llama): decode steps attend to the whole cache unmasked."""
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    _, model, _ = _load_unsharded(tmp_path)
    expected, hf_logits = hf_generate(hf, PROMPTS[:1], 12)
    ours = generate(model, PROMPTS[:1], 12, keep_logits=True)
    assert ours.tokens == expected
    torch.testing.assert_close(torch.stack(ours.logits), hf_logits, rtol=0, atol=FP32_LOGIT_TOL)


def test_unsharded_stops_at_eos_per_sequence(tmp_path):
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path)
    _, model, _ = _load_unsharded(tmp_path)
    free, _ = hf_generate(hf, PROMPTS, 10)
    eos = free[1][3]  # make the second prompt's 4th token the EOS
    expected, _ = hf_generate(hf, PROMPTS, 10, eos=eos)
    ours = generate(model, PROMPTS, 10, eos_ids=(eos,))
    assert ours.tokens == expected and len(ours.tokens[1]) <= 4 and ours.tokens[1][-1] == eos


def test_builtin_folder_is_a_transformers_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save_byte_model(tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    _, model, _ = _load_unsharded(folder)
    prompts = [[256, *b"hello"], [256, *b"hi"]]
    expected, hf_logits = hf_generate(hf, prompts, 8)
    ours = generate(model, prompts, 8, keep_logits=True)
    assert ours.tokens == expected
    torch.testing.assert_close(torch.stack(ours.logits), hf_logits, rtol=0, atol=FP32_LOGIT_TOL)


def test_save_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(TopoplanError, match="already exists and is not empty"):
        save_checkpoint(tmp_path, {})
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_loader_refuses_a_mismatched_checkpoint(tmp_path):
    folder = save_byte_model(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(TopoplanError, match=r"mlp.gate_proj.weight' has shape \[192, 96\], expected \[96, 96\]"):
        _load_unsharded(folder)


def test_generation_config_eos_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31))
    assert load_hf_config(tmp_path).eos_token_ids == (128001, 128008, 128009)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 128009}))
    assert load_hf_config(tmp_path).eos_token_ids == (128009,)
