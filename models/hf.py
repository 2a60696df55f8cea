"""Import of a local Hugging Face ``config.json`` into a :class:`~models.spec.ModelSpec`.

Supported ``model_type`` values and the keys read (transformers' configuration classes):

- ``llama``, ``mistral``: num_hidden_layers, hidden_size, num_attention_heads,
  num_key_value_heads, head_dim, intermediate_size, vocab_size, tie_word_embeddings; for
  ``mistral``, sliding_window (every layer windowed, as transformers' Mistral applies it; null: none).
- ``mixtral``: the Llama keys plus num_local_experts and num_experts_per_tok; intermediate_size is
  the width of one expert; sliding_window as for Mistral.
- ``gpt2``: n_layer, n_embd, n_head, n_inner (None means 4 * n_embd), vocab_size, n_positions.
- ``gpt_neox``: num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size.

``dropout`` is on when the config's dropout probabilities (attention_dropout, hidden_dropout;
GPT-2: resid_pdrop, attn_pdrop, 0.1 by default) are positive.
- ``deepseek_v3`` (and ``deepseek_v2``, same keys): the Llama keys plus q_lora_rank,
  kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, n_routed_experts,
  num_experts_per_tok, moe_intermediate_size, n_shared_experts, first_k_dense_replace.

Gated MLPs (Llama, Mistral, Mixtral, DeepSeek) map to ``swiglu`` whatever ``hidden_act`` says:
``ffn_activation`` encodes the number of MLP matrices (3), which the gate fixes.

The default sequence length: ``max_position_embeddings`` is the longest context a model accepts,
often reached only in a long-context extension phase after pre-training (Llama 3.1: 131072 after
pre-training at 8192). Planning the main pre-training phase at that length would overstate
attention time and activation memory many times over, so the default is the original context
(``rope_scaling.original_max_position_embeddings`` when present, else ``max_position_embeddings``)
capped at :data:`MAX_DEFAULT_SEQ_LEN`. A job's own ``seq_len`` overrides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from clusterplan.models.errors import SpecError
from clusterplan.models.spec import ModelSpec, model_from_mapping

MAX_DEFAULT_SEQ_LEN = 8192
"""Cap on the default seq_len taken from a config (see the module docstring)."""

_ARCHITECTURE_TO_TYPE = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """True when a mapping looks like a Hugging Face config (``model_type`` or ``architectures``)."""
    return "model_type" in data or "architectures" in data


def from_hf_config(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    """Convert a Hugging Face ``config.json`` mapping into a ModelSpec.

    Parameters
    ----------
    cfg
        The parsed config.json.
    name
        Name of the resulting spec (e.g. the repository id).

    Raises
    ------
    SpecError
        For an unsupported ``model_type``, a missing key, or values ModelSpec rejects.

    Examples
    --------
    >>> spec = from_hf_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
    ...                        "vocab_size": 50257, "n_positions": 1024}, name="gpt2")
    >>> spec.ffn_hidden_size, spec.tied_embeddings, spec.seq_len
    (3072, True, 1024)
    """
    model_type = _model_type(cfg)
    fields = _BUILDERS[model_type](cfg)
    fields["name"] = name
    fields["source"] = f"Hugging Face config.json (model_type={model_type})"
    return model_from_mapping(fields, where=f"config.json ({name}, model_type={model_type})")


def _model_type(cfg: Mapping[str, Any]) -> str:
    model_type = cfg.get("model_type")
    architectures = cfg.get("architectures")
    if model_type is not None and not isinstance(model_type, str):
        raise SpecError(f"config.json: model_type: got {model_type!r}; expected a string such as 'llama'")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise SpecError(f"config.json: architectures: got {architectures!r}; expected a list of class names")
    if model_type is None:
        known = [a for a in architectures or [] if a in _ARCHITECTURE_TO_TYPE]
        model_type = _ARCHITECTURE_TO_TYPE[known[0]] if known else None
    if model_type not in _BUILDERS:
        raise SpecError(
            f"config.json: model_type {model_type!r} (architectures {cfg.get('architectures')}) is not "
            f"supported; supported: {', '.join(_BUILDERS)}. Write a clusterplan model YAML file with "
            "the ModelSpec keys (num_layers, hidden_size, ...) instead"
        )
    return model_type


def _flag(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    """A true/false key of config.json; anything else (a string, a number) is refused, not guessed."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"config.json: {key}: got {value!r}; allowed: true or false")
    return value


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise SpecError(
            f"config.json: missing key {key!r}, needed for model_type {cfg.get('model_type')!r}"
        )
    return cfg[key]


def _default_seq_len(cfg: Mapping[str, Any], key: str = "max_position_embeddings") -> int:
    scaling = cfg.get("rope_scaling") or {}
    original = scaling.get("original_max_position_embeddings") if isinstance(scaling, Mapping) else None
    context = original or _require(cfg, key)
    name = "rope_scaling.original_max_position_embeddings" if original else key
    return min(_whole(context, name), MAX_DEFAULT_SEQ_LEN)


def _whole(value: Any, name: str) -> int:
    """A positive whole number from a config value (an int, or a float with no fraction); else a
    SpecError naming the key."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if not ok or value <= 0:
        raise SpecError(f"config.json: {name}: got {value!r}; expected a positive whole number")
    return int(value)


def _explicit_head_dim(cfg: Mapping[str, Any]) -> int | None:
    """``head_dim`` only where it differs from hidden_size / num_attention_heads."""
    head_dim = cfg.get("head_dim")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if head_dim is None or (heads and hidden and head_dim * heads == hidden):
        return None
    return head_dim


def _has_dropout(cfg: Mapping[str, Any], keys: tuple[str, ...], default: float = 0.0) -> bool:
    """True when any of the config's dropout probabilities is positive."""
    def probability(key: str) -> float:
        value = cfg.get(key) if cfg.get(key) is not None else default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise SpecError(f"config.json: {key}: got {value!r}; expected a probability from 0 to 1")
        return float(value)
    return any(probability(key) > 0 for key in keys)


def _llama_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "num_layers": _require(cfg, "num_hidden_layers"),
        "hidden_size": _require(cfg, "hidden_size"),
        "num_attention_heads": _require(cfg, "num_attention_heads"),
        "num_kv_heads": cfg.get("num_key_value_heads"),
        "head_dim": _explicit_head_dim(cfg),
        "ffn_hidden_size": _require(cfg, "intermediate_size"),
        "vocab_size": _require(cfg, "vocab_size"),
        "ffn_activation": "swiglu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "dropout": _has_dropout(cfg, ("attention_dropout",)),
        "seq_len": _default_seq_len(cfg),
    }


def _mistral_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Llama's keys plus ``sliding_window``, which Mistral's and Mixtral's attention applies to every
    layer (Mistral 7B v0.1: 4096; v0.2 onwards and Mixtral: null)."""
    fields = _llama_fields(cfg)
    fields["sliding_window"] = cfg.get("sliding_window")
    return fields


def _mixtral_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    fields = _mistral_fields(cfg)
    fields["moe"] = {
        "num_experts": _require(cfg, "num_local_experts"),
        "top_k": _require(cfg, "num_experts_per_tok"),
        "expert_ffn_hidden_size": fields["ffn_hidden_size"],
    }
    return fields


def _gpt2_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    hidden = _require(cfg, "n_embd")
    return {
        "num_layers": _require(cfg, "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": _require(cfg, "n_head"),
        "ffn_hidden_size": cfg.get("n_inner") or 4 * hidden,
        "vocab_size": _require(cfg, "vocab_size"),
        "ffn_activation": "gelu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", True),  # GPT2Config ties by default
        "dropout": _has_dropout(cfg, ("resid_pdrop", "attn_pdrop"), default=0.1),  # GPT2Config: 0.1
        "seq_len": _default_seq_len(cfg, key="n_positions"),
    }


def _gpt_neox_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "num_layers": _require(cfg, "num_hidden_layers"),
        "hidden_size": _require(cfg, "hidden_size"),
        "num_attention_heads": _require(cfg, "num_attention_heads"),
        "ffn_hidden_size": _require(cfg, "intermediate_size"),
        "vocab_size": _require(cfg, "vocab_size"),
        "ffn_activation": "gelu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "dropout": _has_dropout(cfg, ("attention_dropout", "hidden_dropout")),
        "seq_len": _default_seq_len(cfg),
    }


def _deepseek_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    fields = _llama_fields(cfg)
    fields["num_kv_heads"] = None  # MLA: keys/values come from the shared latent, not kv heads
    fields["head_dim"] = None
    fields["moe"] = {
        "num_experts": _require(cfg, "n_routed_experts"),
        "top_k": _require(cfg, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _require(cfg, "moe_intermediate_size"),
        "num_shared_experts": cfg.get("n_shared_experts") or 0,
        "num_dense_layers": cfg.get("first_k_dense_replace") or 0,
    }
    if (cfg.get("n_group") or 1) > 1 and cfg.get("topk_group"):  # group-limited routing, groups = nodes
        fields["moe"]["max_nodes_per_token"] = cfg["topk_group"]
    fields["mla"] = {
        "q_lora_rank": cfg.get("q_lora_rank") or 0,  # null: queries are not compressed (V2-Lite)
        "kv_lora_rank": _require(cfg, "kv_lora_rank"),
        "qk_nope_head_dim": _require(cfg, "qk_nope_head_dim"),
        "qk_rope_head_dim": _require(cfg, "qk_rope_head_dim"),
        "v_head_dim": _require(cfg, "v_head_dim"),
    }
    _check_every_layer_moe(cfg)
    return fields


def _check_every_layer_moe(cfg: Mapping[str, Any]) -> None:
    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise SpecError(
            f"config.json: moe_layer_freq={freq} is not supported; ModelSpec needs every layer after "
            "first_k_dense_replace to be an MoE layer (moe_layer_freq: 1)"
        )


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "llama": _llama_fields,
    "mistral": _mistral_fields,
    "mixtral": _mixtral_fields,
    "gpt2": _gpt2_fields,
    "gpt_neox": _gpt_neox_fields,
    "deepseek_v2": _deepseek_fields,
    "deepseek_v3": _deepseek_fields,
}

SUPPORTED_MODEL_TYPES = tuple(_BUILDERS)
"""The ``model_type`` values :func:`from_hf_config` understands."""
