"""Tests of the bundled model library, model files and Hugging Face config import."""

from __future__ import annotations

import json

import pytest

from clusterplan.models import (
    ModelSpec,
    SpecError,
    from_hf_config,
    get_model,
    job_defaults,
    list_models,
    load_model,
    load_model_library,
    model_from_mapping,
)
from clusterplan.models.library import ENTRY_ONLY_KEYS

LIBRARY = load_model_library()
REQUIRED_IDS = {
    "gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "megatron-1t", "llama2-7b", "llama2-13b",
    "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3",
    "bloom-176b", "mt-nlg-530b", "palm-540b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "gpt-oss-20b", "gpt-oss-120b",
}


# ---- the bundled library ----------------------------------------------------------------------
def test_library_has_every_required_model():
    assert REQUIRED_IDS <= set(LIBRARY)


@pytest.mark.parametrize("model_id", sorted(LIBRARY))
def test_num_params_within_1_percent_of_published(model_id):
    entry = LIBRARY[model_id]
    published = entry["published_params"]
    assert isinstance(published, (int, float)), "write exponents with a sign (175.0e+9) for PyYAML"
    assert get_model(model_id).num_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("model_id", sorted(LIBRARY))
def test_entry_is_complete(model_id):
    entry = LIBRARY[model_id]
    spec_keys = set(entry) - ENTRY_ONLY_KEYS
    assert spec_keys <= set(ModelSpec.model_fields)
    assert {"name", "num_layers", "hidden_size", "vocab_size", "seq_len", "source"} <= spec_keys
    assert entry["published_params_source"] and entry["job_defaults_source"]
    defaults = job_defaults(model_id)
    assert set(defaults) == {"global_batch_size", "seq_len", "precision", "tokens_to_train"}
    assert defaults["precision"] in {"bf16", "fp16", "fp8"}
    assert defaults["seq_len"] == get_model(model_id).seq_len


def test_names_and_aliases_are_unique():
    seen: dict[str, str] = {}
    for model_id, entry in LIBRARY.items():
        for key in (model_id, entry["name"], *entry["aliases"]):
            assert seen.setdefault(key.lower(), model_id) == model_id


def test_gpt_is_an_alias_of_gpt3_175b():
    assert get_model("gpt") == get_model("gpt3-175b")
    assert get_model("GPT") is get_model("Gpt3-175B")
    assert load_model("gpt").name == "GPT-3 175B"
    assert get_model("GPT-3 175B") is get_model("gpt")  # display names resolve too


@pytest.mark.parametrize(
    "model_id, published_active",
    [("mixtral-8x7b", 12.9e9), ("deepseek-v3", 37e9), ("qwen3-30b-a3b", 3.3e9), ("qwen3-235b-a22b", 22e9)],
)
def test_moe_active_params(model_id, published_active):
    spec = get_model(model_id)
    assert spec.num_active_params == pytest.approx(published_active, rel=0.03)
    assert LIBRARY[model_id]["published_active_params"] == published_active


@pytest.mark.parametrize("model_id", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_active_count_is_the_model_cards_without_the_input_embedding(model_id):
    """gpt-oss's model card counts the unembedding but not the embedding as active (5.13B, 3.61B)."""
    spec = get_model(model_id)
    published = LIBRARY[model_id]["published_active_params"]
    assert spec.num_active_params - spec.vocab_size * spec.hidden_size == pytest.approx(published, rel=0.03)


def test_job_defaults_match_published_setups():
    assert job_defaults("gpt") == {
        "global_batch_size": 1536, "seq_len": 2048, "precision": "fp16", "tokens_to_train": 300 * 10**9,
    }
    assert job_defaults("deepseek-v3")["precision"] == "fp8"
    assert job_defaults("mixtral-8x7b")["global_batch_size"] is None  # not published


def test_list_models_rows():
    rows = {row.id: row for row in list_models()}
    assert set(rows) == set(LIBRARY)
    mixtral = rows["mixtral-8x7b"]
    assert mixtral.num_active_params < mixtral.num_params
    assert "mixtral" in mixtral.aliases and mixtral.source


def test_load_model_library_returns_a_copy():
    load_model_library()["gpt3-175b"]["num_layers"] = 1
    assert get_model("gpt3-175b").num_layers == 96


# ---- model files ------------------------------------------------------------------------------
TINY = {
    "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2,
    "ffn_hidden_size": 1024, "vocab_size": 32000, "ffn_activation": "swiglu", "seq_len": 1024,
}


def test_yaml_model_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in TINY.items()) + "\n")
    spec = load_model(str(path))
    assert spec.name == "tiny"  # file stem when the file has no name
    assert spec.num_kv_heads == 2 and spec.ffn_activation == "swiglu" and spec.seq_len == 1024


def test_json_model_file_with_moe(tmp_path):
    data = {**TINY, "name": "tiny-moe", "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 512}}
    path = tmp_path / "tiny_moe.json"
    path.write_text(json.dumps(data))
    spec = load_model(path)
    assert spec.name == "tiny-moe" and spec.moe.num_experts == 4


def test_yaml_model_file_under_model_key(tmp_path):
    path = tmp_path / "wrapped.yml"
    path.write_text("model:\n" + "".join(f"  {k}: {v}\n" for k, v in TINY.items()))
    assert load_model(path).hidden_size == 256


def test_model_from_mapping_accepts_validation_blocks():
    block = {
        "name": "DeepSeek-V3 671B-A37B", "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "num_kv_heads": None, "ffn_hidden_size": 18432, "vocab_size": 129280, "ffn_activation": "swiglu",
        "moe": {"num_experts": 256, "top_k": 8, "expert_ffn_hidden_size": 2048, "num_shared_experts": 1,
                "num_dense_layers": 3},
    }
    spec = model_from_mapping(block, name="ignored")
    assert spec.name == "DeepSeek-V3 671B-A37B" and spec.num_kv_heads_resolved == 128


# ---- bad input --------------------------------------------------------------------------------
def test_unknown_name_suggests_close_names():
    with pytest.raises(SpecError) as err:
        get_model("lama2-7b")
    message = str(err.value)
    assert "'lama2-7b'" in message and "llama2-7b" in message and "clusterplan models" in message


def test_unknown_name_via_load_model():
    with pytest.raises(SpecError, match="mixtral-8x7b"):
        load_model("mixtrl-8x7b")


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_model(str(tmp_path / "nope.yaml"))


def test_hub_id_is_not_fetched():
    with pytest.raises(SpecError, match="config.json"):
        load_model("meta-llama/Llama-2-7b-hf")


def test_malformed_yaml_reports_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("num_layers: 4\nhidden_size: [256\nvocab_size: 10\n")
    with pytest.raises(SpecError, match=r"line \d+ column \d+"):
        load_model(path)


def test_malformed_json_reports_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "num_layers": 4,\n  "hidden_size": \n}')
    with pytest.raises(SpecError, match=r"line 4 column 1"):
        load_model(path)


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_model(path)


@pytest.mark.parametrize("field, value", [("hidden_size", -256), ("num_layers", 0), ("vocab_size", -1)])
def test_non_positive_size_names_the_field(tmp_path, field, value):
    path = tmp_path / "neg.yaml"
    path.write_text("\n".join(f"{k}: {value if k == field else v}" for k, v in TINY.items()))
    with pytest.raises(SpecError) as err:
        load_model(path)
    message = str(err.value)
    assert f"{field}: " in message and str(value) in message and "Traceback" not in message


def test_unknown_field_suggests_the_right_one():
    with pytest.raises(SpecError) as err:
        model_from_mapping({**TINY, "num_layer": 4}, name="typo")
    assert "num_layer: unknown field" in str(err.value) and "'num_layers'" in str(err.value)


def test_missing_field_and_cross_field_errors():
    with pytest.raises(SpecError, match="vocab_size: Field required"):
        model_from_mapping({k: v for k, v in TINY.items() if k != "vocab_size"}, name="x")
    with pytest.raises(SpecError, match="num_kv_heads=3"):
        model_from_mapping({**TINY, "num_kv_heads": 3}, name="x")
    with pytest.raises(SpecError, match="expected a mapping"):
        model_from_mapping([1, 2], name="x")


# ---- Hugging Face config.json, modelled on the published files --------------------------------
LLAMA2_7B = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}
LLAMA31_405B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 16384,
    "intermediate_size": 53248, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 128, "num_hidden_layers": 126, "num_key_value_heads": 8,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}
MISTRAL_NEMO = {
    "architectures": ["MistralForCausalLM"], "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "intermediate_size": 14336, "max_position_embeddings": 1024000, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 131072,
}
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "vocab_size": 32000,
}
GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024,
    "vocab_size": 50257,
}
GPT_NEOX_20B = {
    "architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu", "hidden_size": 6144,
    "intermediate_size": 24576, "max_position_embeddings": 2048, "model_type": "gpt_neox",
    "num_attention_heads": 64, "num_hidden_layers": 44, "rotary_pct": 0.25,
    "attention_dropout": 0, "hidden_dropout": 0,
    "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50432,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128,
    "vocab_size": 129280,
}


def _write_config(tmp_path, cfg, folder="model"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg, indent=2))
    return str(path)


def test_hf_llama2_matches_the_bundled_spec(tmp_path):
    spec = load_model(_write_config(tmp_path, LLAMA2_7B))
    bundled = get_model("llama2-7b")
    assert spec.name == "meta-llama/Llama-2-7b-hf"
    fields = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
              "vocab_size", "ffn_activation", "tied_embeddings", "seq_len")
    assert {f: getattr(spec, f) for f in fields} == {f: getattr(bundled, f) for f in fields}
    assert spec.num_params == 6_738_415_616


def test_hf_llama31_uses_original_context_and_gqa(tmp_path):
    spec = load_model(_write_config(tmp_path, LLAMA31_405B, folder="Llama-3.1-405B"))
    assert spec.name == "Llama-3.1-405B"  # folder name when _name_or_path is absent
    assert spec.seq_len == 8192 and spec.num_kv_heads == 8
    assert spec.num_params == get_model("llama3-405b").num_params


def test_hf_mistral_keeps_explicit_head_dim(tmp_path):
    spec = load_model(_write_config(tmp_path, MISTRAL_NEMO))
    assert spec.head_dim == 128 and spec.head_dim_resolved == 128  # 5120 / 32 would be 160
    assert spec.seq_len == 8192  # 1M max position capped
    assert spec.ffn_activation == "swiglu" and not spec.tied_embeddings


def test_hf_mixtral(tmp_path):
    spec = load_model(_write_config(tmp_path, MIXTRAL))
    assert spec.moe.num_experts == 8 and spec.moe.top_k == 2
    assert spec.moe.expert_ffn_hidden_size == 14336 and spec.moe.num_dense_layers == 0
    assert spec.num_params == get_model("mixtral-8x7b").num_params


def test_hf_gpt2(tmp_path):
    spec = load_model(_write_config(tmp_path, GPT2, folder="gpt2"))
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (12, 768, 12)
    assert spec.ffn_hidden_size == 3072 and spec.ffn_activation == "gelu"
    assert spec.tied_embeddings and spec.seq_len == 1024 and spec.dropout  # GPT2Config: 0.1
    assert spec.num_params == pytest.approx(124.4e6, rel=0.01)  # 124M incl. position embeddings


def test_hf_gpt_neox(tmp_path):
    spec = load_model(_write_config(tmp_path, GPT_NEOX_20B))
    assert spec.ffn_activation == "gelu" and not spec.tied_embeddings and not spec.dropout
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (44, 6144, 24576)
    assert spec.num_params == pytest.approx(20.55e9, rel=0.01)  # GPT-NeoX-20B: 20,554,567,680


def test_hf_deepseek_v3_matches_the_bundled_spec(tmp_path):
    spec = load_model(_write_config(tmp_path, DEEPSEEK_V3))
    bundled = get_model("deepseek-v3")
    assert spec.mla == bundled.mla and spec.moe == bundled.moe
    assert spec.num_kv_heads is None and spec.seq_len == 4096
    assert spec.num_params == bundled.num_params


def test_hf_architectures_without_model_type():
    cfg = {k: v for k, v in LLAMA2_7B.items() if k != "model_type"}
    assert from_hf_config(cfg, name="x").num_layers == 32


def test_hf_unsupported_model_type_lists_supported():
    with pytest.raises(SpecError) as err:
        from_hf_config({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, name="t5")
    assert "'t5'" in str(err.value) and "llama" in str(err.value) and "deepseek_v3" in str(err.value)


def test_hf_missing_key_is_named():
    cfg = {k: v for k, v in MIXTRAL.items() if k != "num_local_experts"}
    with pytest.raises(SpecError, match="num_local_experts"):
        from_hf_config(cfg, name="x")


def test_hf_bad_value_names_the_field():
    with pytest.raises(SpecError, match="n_embd: got -768; allowed: a whole number >= 1"):
        from_hf_config({**GPT2, "n_embd": -768}, name="x")


# Modelled on the published config.json files (huggingface.co/Qwen/<name>/blob/main/config.json).
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 152064,
}
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_size": 1024,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rope_scaling": None,
    "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "rope_scaling": None, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}


def test_hf_qwen25_matches_the_published_parameter_count(tmp_path):
    """Qwen2.5-7B: 7.61 B parameters, 6.53 B without the embeddings (its model card). The q/k/v biases
    (28 x 4,608) are not counted, as no bias is."""
    spec = load_model(_write_config(tmp_path, QWEN25_7B, folder="Qwen2.5-7B"))
    assert spec.num_kv_heads == 4 and spec.head_dim_resolved == 128 and spec.sliding_window is None
    assert spec.num_params == pytest.approx(7.61e9, rel=0.001)
    assert spec.num_params - spec.embedding_params - spec.output_params == pytest.approx(6.53e9, rel=0.001)
    assert spec.seq_len == 8192 and "131,072" in spec.seq_len_note


def test_hf_qwen3_keeps_head_dim_and_tied_embeddings():
    """Qwen3-0.6B: head_dim 128 where 1024 / 16 would be 64, tied embeddings; 0.6 B parameters, 0.44 B
    without the embedding (its model card)."""
    spec = from_hf_config(QWEN3_06B, name="Qwen3-0.6B")
    assert spec.head_dim == 128 and spec.tied_embeddings and spec.output_params == 0
    assert spec.num_params == pytest.approx(0.596e9, rel=0.005)
    assert spec.num_params - spec.embedding_params == pytest.approx(0.44e9, rel=0.01)
    no_head_dim = {k: v for k, v in QWEN3_06B.items() if k != "head_dim"}  # Qwen3Config's default is 128
    assert from_hf_config(no_head_dim, name="x").head_dim == 128


def test_hf_qwen3_moe_matches_the_published_total_and_active_counts():
    """Qwen3-30B-A3B: 30.5 B parameters, 3.3 B activated, 128 experts of which 8 per token (its model
    card); head_dim 128 (2048 / 32 would be 64)."""
    spec = from_hf_config(QWEN3_30B_A3B, name="Qwen3-30B-A3B")
    assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.expert_ffn_hidden_size) == (128, 8, 768)
    assert spec.moe.num_dense_layers == 0 and spec.head_dim == 128
    assert spec.num_params == pytest.approx(30.5e9, rel=0.005)
    assert spec.num_active_params == pytest.approx(3.3e9, rel=0.03)


def test_hf_qwen3_moe_leading_dense_layers_and_other_mixes():
    spec = from_hf_config({**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]}, name="x")
    assert spec.moe.num_dense_layers == 2 and spec.ffn_hidden_size == 6144
    with pytest.raises(SpecError, match="decoder_sparse_step=2"):
        from_hf_config({**QWEN3_30B_A3B, "decoder_sparse_step": 2}, name="x")
    with pytest.raises(SpecError, match="mlp_only_layers: got"):
        from_hf_config({**QWEN3_30B_A3B, "mlp_only_layers": [48]}, name="x")
    renamed = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert from_hf_config(renamed, name="x").moe.num_experts == 128


def test_hf_qwen_sliding_window_every_layer_or_none():
    windowed = {**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096}
    assert from_hf_config({**windowed, "max_window_layers": 0}, name="x").sliding_window == 4096
    assert from_hf_config({**windowed, "max_window_layers": 28}, name="x").sliding_window is None
    with pytest.raises(SpecError, match="max_window_layers=20"):
        from_hf_config({**windowed, "max_window_layers": 20}, name="x")


@pytest.mark.parametrize("base, key, value", [
    (DEEPSEEK_V3, "n_group", "8"), (DEEPSEEK_V3, "topk_group", "4"), (DEEPSEEK_V3, "q_lora_rank", 1536.5),
    (LLAMA2_7B, "hidden_size", "4096"), (LLAMA2_7B, "num_key_value_heads", True), (GPT2, "n_inner", "3072"),
    (MIXTRAL, "sliding_window", "4096"), (QWEN3_30B_A3B, "num_experts", [128]), (QWEN25_7B, "use_sliding_window", 1),
    (LLAMA2_7B, "rope_scaling", "yarn"), (DEEPSEEK_V3, "moe_layer_freq", "1"),
])
def test_hf_fields_of_the_wrong_type_are_named_not_coerced(base, key, value):
    """Issue 41 item 6: ``n_group: "8"`` raised TypeError; a string "4096" was coerced by pydantic."""
    with pytest.raises(SpecError) as err:
        from_hf_config({**base, key: value}, name="x")
    assert f"{key}: got {value!r}; allowed:" in str(err.value)


def test_hf_looking_file_without_model_type_names_model_type(tmp_path):
    """A config.json with neither model_type nor architectures was read as a clusterplan model file
    and refused for its unknown keys; it is a Hugging Face config missing its model_type."""
    cfg = {k: v for k, v in LLAMA2_7B.items() if k not in ("model_type", "architectures")}
    with pytest.raises(SpecError) as err:
        load_model(_write_config(tmp_path, cfg))
    assert "model_type: missing" in str(err.value) and "qwen3_moe" in str(err.value) and "llama" in str(err.value)


def test_widths_off_the_tensor_core_alignment_are_labelled_unvalidated():
    """BigScience's head-size-225 trials ran 30-37% slower than predicted (docs/cost-model.md):
    a model whose head, hidden or FFN width is not a multiple of 8 says so in every report."""
    from clusterplan.planner.report.plan import shape_caveats
    odd = get_model("llama3-8b").model_copy(update={"hidden_size": 3600, "num_attention_heads": 16,
                                                    "num_kv_heads": 16})
    (line,) = shape_caveats(odd)
    assert line.startswith("unvalidated:") and "attention head size 225" in line and "hidden size" not in line
    assert shape_caveats(get_model("llama3-8b")) == []


# ---- sliding-window attention -----------------------------------------------------------------
def _windowed(window: int | None = None, pattern: int | None = None, layers: int = 12) -> ModelSpec:
    return ModelSpec(name="swa", num_layers=layers, hidden_size=2048, num_attention_heads=16, num_kv_heads=4,
                     ffn_hidden_size=8192, vocab_size=32000, ffn_activation="swiglu", seq_len=8192,
                     sliding_window=window, sliding_window_pattern=pattern)


def test_sliding_window_fraction_of_the_score_square():
    assert _windowed().attention_pair_fraction(8192) == 0.5
    assert _windowed(8192).attention_pair_fraction(8192) == 0.5  # a window as long as the sequence
    # every layer windowed at 1024 of 8192: w/s - w^2/(2 s^2) = 0.125 - 0.0078125
    assert _windowed(1024).attention_pair_fraction(8192) == pytest.approx(0.1171875)
    # every 2nd layer full (gpt-oss): half the layers at 0.5, half windowed
    assert _windowed(1024, 2).num_windowed_layers == 6
    assert _windowed(1024, 2).attention_pair_fraction(8192) == pytest.approx((0.5 + 0.1171875) / 2)
    # every 6th full (Gemma 3): 12 layers -> 2 full, 10 windowed
    assert _windowed(1024, 6).num_windowed_layers == 10
    # the kernel's partly masked key blocks are computed whole: a tile costs half a block more per query
    assert _windowed(128).attention_pair_fraction(4096, tile=128) > _windowed(128).attention_pair_fraction(4096)


def test_sliding_window_makes_attention_cheaper_and_mfu_stays_under_the_ceiling():
    from clusterplan.cost.layout import Job, Layout
    from clusterplan.cost.step import evaluate
    from clusterplan.topologies.library import build_cluster

    cluster = build_cluster("dgx-h100-superpod", num_devices=8)
    job, layout = Job(global_batch_size=64, seq_len=8192), Layout(dp=8)
    full = evaluate(_windowed(), job, cluster, layout)
    gemma = evaluate(_windowed(1024, 6), job, cluster, layout)
    mistral = evaluate(_windowed(1024), job, cluster, layout)
    assert mistral.step_time_s < gemma.step_time_s < full.step_time_s
    assert mistral.time.compute_s < full.time.compute_s
    ceiling = cluster.device.gemm.large
    assert max(full.mfu, gemma.mfu, mistral.mfu) < ceiling


def test_sliding_window_pattern_without_window_is_refused():
    with pytest.raises(SpecError, match="sliding_window"):
        model_from_mapping({"name": "x", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                            "ffn_hidden_size": 256, "vocab_size": 100, "sliding_window_pattern": 2}, where="test")
    with pytest.raises(SpecError, match="sliding_window"):
        model_from_mapping({"name": "x", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                            "ffn_hidden_size": 256, "vocab_size": 100, "sliding_window": 0}, where="test")


def test_mistral_config_keeps_its_sliding_window():
    v01 = dict(MISTRAL_NEMO, sliding_window=4096, head_dim=None)
    assert from_hf_config(v01, name="mistral-7b-v0.1").sliding_window == 4096
    assert from_hf_config(MISTRAL_NEMO, name="nemo").sliding_window is None
    assert from_hf_config(MIXTRAL, name="mixtral").sliding_window is None
