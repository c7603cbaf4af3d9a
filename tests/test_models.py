"""Model catalog: parameter counts against the published totals, KV bytes per token by hand, config reading."""

import json

import pytest

from topoplan.errors import TopoplanError
from topoplan.models import CATALOG, find_model, load_config

# Totals as the model cards / papers state them (billions).
PUBLISHED_PARAMS_B = {
    "Llama-2-7B": 6.74, "Llama-2-13B": 13.02, "Llama-2-70B": 68.98,  # HF safetensors totals
    "Llama-3-8B": 8.03, "Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.55, "Llama-3.1-405B": 405.85,
    "Mixtral-8x7B": 46.7,  # Mistral AI: "46.7B total parameters"
    "Qwen2.5-72B": 72.7,  # Qwen2.5 model card: "Number of Parameters: 72.7B"
    "DeepSeek-V3": 671.0,  # DeepSeek-V3 report: 671B total (the 14B MTP module excluded)
}


@pytest.mark.parametrize("name, billions", PUBLISHED_PARAMS_B.items())
def test_parameter_counts_match_published_totals(name, billions):
    assert find_model(name).params / 1e9 == pytest.approx(billions, rel=0.003)


def test_active_parameters_of_moe_models():
    # Mixtral: "12.9B active parameters per token"; DeepSeek-V3: "37B activated for each token".
    mixtral, dsv3 = find_model("Mixtral-8x7B"), find_model("DeepSeek-V3")
    assert mixtral.flops_per_token(0) / 2 / 1e9 == pytest.approx(12.9, rel=0.02)
    assert (dsv3.flops_per_token(0) / 2 + dsv3.embedding_params) / 1e9 == pytest.approx(37.5, rel=0.03)


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
