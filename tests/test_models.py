"""Model catalog: parameter counts against the published totals, KV bytes per token by hand, config reading."""

import json

import pytest

from topoplan.errors import TopoplanError
from topoplan.models import CATALOG, find_model, load_config, spec_from_config

# Totals as the model cards / papers state them (billions).
PUBLISHED_PARAMS_B = {
    "Llama-2-7B": 6.74, "Llama-2-13B": 13.02, "Llama-2-70B": 68.98,  # HF safetensors totals
    "Llama-3-8B": 8.03, "Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.55, "Llama-3.1-405B": 405.85,
    "Mixtral-8x7B": 46.7,  # Mistral AI: "46.7B total parameters"
    "Qwen2.5-72B": 72.7,  # Qwen2.5 model card: "Number of Parameters: 72.7B"
    "DeepSeek-V3": 671.0,  # DeepSeek-V3 report: 671B total (the 14B MTP module excluded)
    "Mixtral-8x22B": 141.0,  # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): 141B total
    "Qwen3-235B-A22B": 235.0,  # Qwen3 model card: "Number of Parameters: 235B in total and 22B activated"
}


@pytest.mark.parametrize("name, billions", PUBLISHED_PARAMS_B.items())
def test_parameter_counts_match_published_totals(name, billions):
    assert find_model(name).params / 1e9 == pytest.approx(billions, rel=0.003)


def test_active_parameters_of_moe_models():
    # Mixtral: "12.9B active parameters per token"; DeepSeek-V3: "37B activated for each token".
    mixtral, dsv3 = find_model("Mixtral-8x7B"), find_model("DeepSeek-V3")
    assert mixtral.flops_per_token(0) / 2 / 1e9 == pytest.approx(12.9, rel=0.02)
    assert (dsv3.flops_per_token(0) / 2 + dsv3.embedding_params) / 1e9 == pytest.approx(37.5, rel=0.03)


def test_a_layers_weights_per_rank_by_hand():
    """`small`: per layer QKV 1024 x 2048, output 1024 x 1024, gate/up and down 3 x 1024 x 2816 (norms left
    out), halved by TP2. Mixtral-8x7B (every layer MoE): eight experts of 3 x 4096 x 14336 split over EP
    ranks as whole experts, the rest (attention 2 x 4096 x 4096 + 2 x 4096 x 1024, router 4096 x 8, and the
    layer's two norms of 4096, which the planner's MoE layer count keeps) over TP."""
    small = find_model("small")
    assert small.layer_params_per_rank() == 1024 * 2048 + 1024 * 1024 + 3 * 1024 * 2816
    assert small.layer_params_per_rank(2) == small.layer_params_per_rank() / 2
    mixtral = find_model("mixtral")
    routed, rest = 8 * 3 * 4096 * 14336, 2 * 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096
    assert mixtral.layer_params_per_rank() == routed + rest
    assert mixtral.layer_params_per_rank(4, 2) == routed / 2 + rest / 4
    assert mixtral.layer_params_per_rank(4) == (routed + rest) / 4  # without EP each expert is sliced


# Active parameters per token as published (billions), embedding included as the model cards count it.
PUBLISHED_ACTIVE_B = {
    "Mixtral-8x22B": 39.0,  # Mistral AI: "39B active parameters out of 141B"
    "Qwen3-235B-A22B": 22.0,  # Qwen3 model card: "22B activated"
    "DeepSeek-V3": 37.0,  # DeepSeek-V3 report: "37B activated for each token"
}


@pytest.mark.parametrize("name, billions", PUBLISHED_ACTIVE_B.items())
def test_active_parameters_match_published(name, billions):
    model = find_model(name)
    active = model.flops_per_token(0) / 2 + model.embedding_params  # the k experts, shared ones, head, embedding
    assert active / 1e9 == pytest.approx(billions, rel=0.025)


def test_moe_layer_patterns_of_each_family():
    assert find_model("DeepSeek-V3").moe_layer_ids == frozenset(range(3, 61))  # first_k_dense_replace 3
    assert find_model("Qwen3-235B-A22B").moe_layers == 94 and find_model("8x22b").moe_layers == 56
    qwen = {**CATALOG["Qwen3-235B-A22B"], "num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    assert spec_from_config(qwen, "q").moe_layer_ids == frozenset({1, 5, 7})  # (i+1) % 2 == 0, not layer 3
    dsv2 = {**CATALOG["DeepSeek-V3"], "num_hidden_layers": 7, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    assert spec_from_config(dsv2, "d").moe_layer_ids == frozenset({2, 4, 6})
    bad = {**qwen, "mlp_only_layers": "3"}
    with pytest.raises(TopoplanError, match="'mlp_only_layers' must be a list of layer indexes"):
        spec_from_config(bad, "q", source="c.json")


def _tiny_hf(kind: str):
    """A small random transformers MoE model of each family, and its config as a dict."""
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64)
    if kind == "mixtral":
        config = tf.MixtralConfig(**common, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    elif kind == "qwen2_moe":
        config = tf.Qwen2MoeConfig(**common, intermediate_size=48, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=40, num_experts=6, num_experts_per_tok=2,
                                   decoder_sparse_step=1, mlp_only_layers=[1])
    elif kind == "qwen3_moe":
        config = tf.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=48, moe_intermediate_size=16,
                                   num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[])
    else:
        config = tf.DeepseekV3Config(**{**common, "num_key_value_heads": 4}, intermediate_size=48,
                                     moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2,
                                     num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                                     q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                     v_head_dim=8)
    cls = {"mixtral": tf.MixtralForCausalLM, "qwen2_moe": tf.Qwen2MoeForCausalLM,
           "qwen3_moe": tf.Qwen3MoeForCausalLM, "deepseek_v3": tf.DeepseekV3ForCausalLM}[kind]
    return cls(config), config.to_dict()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_moe_config_reader_counts_every_transformers_weight(kind):
    """spec_from_config on each family's config.json counts the weights transformers builds from it, one by one."""
    model, raw = _tiny_hf(kind)
    spec = spec_from_config(raw, kind)
    assert spec.params == sum(p.numel() for p in model.parameters())
    routed = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    assert spec.moe_layer_ids == frozenset(routed)


def test_kv_bytes_per_token_gqa_replication_and_mla():
    llama70 = find_model("70b")
    # 2 (K and V) x 8 KV heads x 128 dims x 80 layers x 2 bytes
    assert llama70.kv_bytes_per_token("bf16") == 2 * 8 * 128 * 80 * 2 == 327_680
    assert llama70.kv_bytes_per_token("bf16", tp=8) == 327_680 // 8
    # tp=16 > 8 KV heads: each rank still holds one whole (replicated) KV head
    assert llama70.kv_bytes_per_token("bf16", tp=16) == 327_680 // 8
    assert llama70.kv_bytes_per_token("fp8", tp=2) == 2 * 4 * 128 * 80
    assert find_model("Llama-2-7B").kv_bytes_per_token("fp16") == 2 * 32 * 128 * 32 * 2
    # MLA: kv_lora_rank 512 + rope key 64 per layer, the same on every TP rank
    dsv3 = find_model("DeepSeek-V3")
    assert dsv3.kv_bytes_per_token("bf16", tp=1) == dsv3.kv_bytes_per_token("bf16", tp=8) == (512 + 64) * 61 * 2


def test_aliases_and_case():
    assert find_model("70b").name == "Llama-3.1-70B"
    assert find_model("405B").name == "Llama-3.1-405B"
    assert find_model("llama-2-13b").name == "Llama-2-13B"
    assert find_model("tiny").layers == CATALOG["tiny"]["num_hidden_layers"]


def test_unknown_model_lists_close_names():
    with pytest.raises(TopoplanError, match=r"unknown model 'Llama-3.1-7B'.*close: .*Llama-3.1-8B"):
        find_model("Llama-3.1-7B")


def test_config_json_path(tmp_path):
    raw = dict(CATALOG["Qwen2.5-72B"], architectures=["Qwen2ForCausalLM"], rope_theta=1e6)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = find_model(str(path))
    assert spec.params == find_model("Qwen2.5-72B").params and spec.attention_bias


def test_config_missing_field_names_file_and_key(tmp_path):
    raw = dict(CATALOG["Llama-3.1-8B"])
    del raw["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(TopoplanError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: missing key 'num_hidden_layers' (expected a Llama-family or MoE HF config)"


def test_config_not_json_gives_the_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n "hidden_size": 4096,\n oops\n}')
    with pytest.raises(TopoplanError, match=r"config.json:3: not valid JSON"):
        load_config(path)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_builtin_models_match_the_runner(name):
    """The planner prices the runner's built-in models with the runner's own figures (BUILTIN reads CATALOG)."""
    from topoplan.runner.builtin import BUILTIN

    runner = BUILTIN[name]
    assert {k: runner[k] for k in CATALOG[name] if k != "model_type"} == {
        k: v for k, v in CATALOG[name].items() if k != "model_type"}


def test_planner_counts_the_weights_the_runner_writes():
    """ModelSpec.params against the tensors of the built-in tiny model, counted one by one."""
    from topoplan.runner.builtin import BUILTIN
    from topoplan.runner.tiny import random_weights

    tensors = random_weights(BUILTIN["tiny"])
    layer = 3 * 128 * 128 + 3 * 128 * 384 + 2 * 128  # q, k+v (4 of 8 heads), o; SwiGLU; two norms
    by_hand = 2 * 264 * 128 + 4 * layer + 128  # embedding and untied head; 4 layers; final norm
    assert find_model("tiny").params == sum(t.numel() for t in tensors.values()) == by_hand == 855_168


def test_max_context_comes_from_max_position_embeddings():
    assert find_model("70b").max_context == 131072 and find_model("Llama-2-7B").max_context == 4096
    assert find_model("dsv3").max_context == 163840
    assert find_model("tiny").max_context == 0  # no max_position_embeddings: unknown, not checked


def test_a_checkpoint_folder_is_read_through_its_config(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    raw = {**CATALOG["Llama-3.1-8B"]}
    (folder / "config.json").write_text(json.dumps(raw))
    spec = find_model(str(folder))
    assert spec.name == "my-llama" and spec.params == find_model("8b").params
    (folder / "config.json").write_text(json.dumps({**raw, "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    assert find_model(str(folder)).name == "meta-llama/Llama-3.1-8B"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TopoplanError, match="config.json: cannot read it: No such file or directory; expected a HF"):
        find_model(str(empty))


def _tiny_dense_hf(kind: str):
    """A small random transformers model of each dense family the planner reads, and its config as a dict."""
    import transformers as tf

    common = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    extra = {"qwen3": {"head_dim": 32}, "gemma": {"head_dim": 16, "hidden_act": "gelu_pytorch_tanh"},
             "gemma2": {"head_dim": 16}, "gemma3_text": {"head_dim": 16}}.get(kind, {})
    config = tf.AutoConfig.for_model(kind, **common, **extra)
    return tf.AutoModelForCausalLM.from_config(config), config.to_dict()


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"])
def test_dense_config_reader_counts_every_transformers_weight(kind):
    """Each family's layers as its modeling file builds them: Gemma's GeGLU MLP has a gate (three matrices though
    hidden_act is a GeLU), Gemma-2/3 four norms a layer, Gemma-3 q/k norms, Qwen2 q/k/v biases; transformers counts
    tied embeddings once, as spec.params does."""
    model, raw = _tiny_dense_hf(kind)
    assert spec_from_config(raw, kind).params == sum(p.numel() for p in model.parameters())
    raw.pop("tie_word_embeddings")  # a hand-written config.json that leaves it out: the family's default
    assert spec_from_config(raw, kind).tied_embeddings == kind.startswith("gemma")


def test_hand_written_gemma2_9b_counts_9_24_billion():
    """google/gemma-2-9b's config.json keys as a user might write them: no tie_word_embeddings (Gemma2Config
    ties by default) and a GeLU activation name for its gated MLP. 42 layers x (attention 44,040,192 + MLP
    3 x 3584 x 14336 + 4 norms x 3584) + 256000 x 3584 embedding (tied) + the final norm."""
    raw = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
           "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"}
    layer = 3584 * 4096 * 2 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 4 * 3584
    assert spec_from_config(raw, "gemma-2-9b").params == 42 * layer + 256000 * 3584 + 3584 == 9_241_705_984


@pytest.mark.parametrize(("quant", "dtype"), [({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
                                              ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
                                              ({"quant_method": "mxfp4"}, "mxfp4")])
def test_quantization_config_names_the_weights_dtype(quant, dtype):
    raw = {**CATALOG["Llama-3.1-8B"], "hidden_size": 4096, "quantization_config": quant}
    assert spec_from_config(raw, "q").checkpoint_dtype == dtype
    assert find_model("8b").checkpoint_dtype is None


@pytest.mark.parametrize(("quant", "message"), [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes' is not modelled"),
    ({"quant_method": "gptq", "bits": 8}, "gptq at 8 bits is not modelled"),
    ("fp8", "key 'quantization_config' must be a JSON object")])
def test_quantization_config_the_planner_does_not_price_is_refused_in_one_line(quant, message):
    with pytest.raises(TopoplanError, match=message):
        spec_from_config({**CATALOG["Llama-3.1-8B"], "quantization_config": quant}, "q", source="c.json")
