"""Small random checkpoints for the runner tests: HF transformers models saved with save_pretrained, and
configs for the built-in random-weight writer. Weights are rescaled so logits are well separated (random
HF init at std 0.02 gives near-ties that rounding could flip), which keeps greedy comparisons exact."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from topoplan.runner.builtin import BUILTIN
from topoplan.runner.spawn import spawn_ranks
from topoplan.runner.tiny import save_checkpoint

HF_COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
                 num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}


def hf_model(kind: str):
    """A random transformers model: llama (Llama 3.1 RoPE, GQA), mistral (sliding window 5), qwen2 (q/k/v
    bias, tied embeddings), llama-mha (MHA, linear RoPE scaling, attention bias on q/k/v/o), mixtral (4 experts,
    top-2), qwen2_moe (8 experts, top-2 unnormalised, a gated shared expert, layer 1 dense)."""
    import transformers as tf

    torch.manual_seed({"llama": 1, "mistral": 2, "qwen2": 3, "llama-mha": 4, "mixtral": 5, "qwen2_moe": 6}[kind])
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**HF_COMMON, rope_scaling=LLAMA31_ROPE, rope_theta=500000.0))
    elif kind == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**HF_COMMON, sliding_window=5))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**HF_COMMON, tie_word_embeddings=True))
    elif kind == "llama-mha":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**{**HF_COMMON, "num_key_value_heads": 8}, attention_bias=True,
                                                   rope_scaling={"rope_type": "linear", "factor": 2.0}))
    elif kind == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(**{**HF_COMMON, "intermediate_size": 48}, num_local_experts=4,
                                                       num_experts_per_tok=2))
    elif kind == "qwen2_moe":
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**HF_COMMON, moe_intermediate_size=32,
                                                         shared_expert_intermediate_size=48, num_experts=8,
                                                         num_experts_per_tok=2, mlp_only_layers=[1]))
    else:
        raise ValueError(kind)
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif param.dim() == 2:
                std = (0.5 if tied else 1.0) if "embed" in name else param.shape[1] ** -0.5
                param.copy_(torch.randn_like(param) * std)
            else:
                param.copy_(0.1 * torch.randn_like(param))
    return model.eval()


def save_hf(kind: str, folder: Path, max_shard_size: str | None = None) -> Path:
    model = hf_model(kind)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, eos: int | None = None):
    """Greedy HF generate on a left-padded batch: (new tokens per prompt, per-prompt logits [steps, V])."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, eos_token_id=eos, pad_token_id=0)
    logits = torch.stack(out.logits, dim=1)  # [B, steps, V]
    tokens = out.sequences[:, width:].tolist()
    if eos is not None:  # HF pads finished rows; keep up to and including the EOS like the runner
        tokens = [seq[:seq.index(eos) + 1] if eos in seq else seq for seq in tokens]
    return tokens, logits


def byte_config(**overrides) -> dict:
    """A built-in-style (byte vocabulary) Llama config for the layout grid."""
    return {**BUILTIN["tiny"], "hidden_size": 96, "num_hidden_layers": 5, "num_attention_heads": 12,
            "num_key_value_heads": 2, "intermediate_size": 192, "head_dim": 8, **overrides}


def save_byte_model(folder: Path, seed: int = 0, **overrides) -> Path:
    return save_checkpoint(folder, byte_config(**overrides), seed=seed)


def run_jobs(world: int, jobs: list[dict], out: Path) -> dict[str, tuple[dict, list]]:
    """Run `jobs` (tests/runner_harness.py's job list) as `world` gloo ranks in one launch, each dumping its
    logits into `out`: {job name: (result dict, per-prompt logits)}."""
    root = Path(__file__).resolve().parents[1]
    for job in jobs:
        job["options"]["dump_logits"] = str(out / f"{job['name']}.logits.pt")
    (out / "jobs.json").write_text(json.dumps(jobs))
    result = spawn_ranks(world, [sys.executable, str(root / "tests" / "runner_harness.py"), str(out / "jobs.json"),
                                 str(out)],
                         env_per_rank=lambda r: {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(root),
                                                 "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor")},
                         timeout_s=600, capture_stdout=True, echo=False)
    assert result.returncode == 0, "\n".join(result.stderr[-40:])
    return {job["name"]: (json.loads((out / f"{job['name']}.json").read_text()),
                          torch.load(out / f"{job['name']}.logits.pt")) for job in jobs}
