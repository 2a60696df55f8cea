"""Import of a local Hugging Face ``config.json`` into a :class:`~models.spec.ModelSpec`.

Supported ``model_type`` values and the keys read (transformers' configuration classes):

- ``llama``, ``mistral``: num_hidden_layers, hidden_size, num_attention_heads,
  num_key_value_heads, head_dim, intermediate_size, vocab_size, tie_word_embeddings; for
  ``mistral``, sliding_window (every layer windowed, as transformers' Mistral applies it; null: none).
- ``mixtral``: the Llama keys plus num_local_experts and num_experts_per_tok; intermediate_size is
  the width of one expert; sliding_window as for Mistral.
- ``qwen2`` (Qwen2, Qwen2.5), ``qwen3``: the Llama keys (Qwen3's head_dim defaults to 128, as in
  ``Qwen3Config``), and sliding-window attention where use_sliding_window is true: the layers from
  max_window_layers on (``Qwen2Config.layer_types``), taken where that is every layer or none.
  Qwen2's q, k and v projections carry biases (``Qwen2Attention``); like every bias, they are not
  counted (the parameter counts and the cost model have no biases: 0.002% of Qwen2.5-7B's weights).
- ``qwen3_moe``: the Qwen3 keys plus num_experts (``num_local_experts`` in newer files),
  num_experts_per_tok, moe_intermediate_size (one expert's width; intermediate_size is the dense
  MLP's), decoder_sparse_step and mlp_only_layers (a layer is MoE where ``(i + 1) %
  decoder_sparse_step == 0`` and ``i`` is not in mlp_only_layers, ``Qwen3MoeDecoderLayer``; ModelSpec
  holds leading dense layers only, so other mixes are refused).
- ``gpt2``: n_layer, n_embd, n_head, n_inner (None means 4 * n_embd), vocab_size, n_positions.
- ``gpt_neox``: num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size.

``dropout`` is on when the config's dropout probabilities (attention_dropout, hidden_dropout;
GPT-2: resid_pdrop, attn_pdrop, 0.1 by default) are positive.
- ``deepseek_v3`` (and ``deepseek_v2``, same keys): the Llama keys plus q_lora_rank,
  kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, n_routed_experts,
  num_experts_per_tok, moe_intermediate_size, n_shared_experts, first_k_dense_replace.

Every key read is checked for its type (a whole number, a probability, true/false): a value of
another type is a SpecError naming the key, the value and what is allowed, never coerced ("32")
or left to fail later.

Gated MLPs (Llama, Mistral, Mixtral, Qwen, DeepSeek) map to ``swiglu`` whatever ``hidden_act`` says:
``ffn_activation`` encodes the number of MLP matrices (3), which the gate fixes.

The default sequence length: ``max_position_embeddings`` is the longest context a model accepts,
often reached only in a long-context extension phase after pre-training (Llama 3.1: 131072 after
pre-training at 8192; Qwen2.5: 131072 after 4096 and 32768). Planning the main pre-training phase at
that length would overstate attention time and activation memory many times over, so the default
is the original context (``rope_scaling.original_max_position_embeddings`` when present, else
``max_position_embeddings``) capped at :data:`MAX_DEFAULT_SEQ_LEN`; where the cap applies, the spec's
``seq_len_note`` says so, and the report's job lines and the Plan document's ``inputs.origin`` carry
it. A job's own ``seq_len`` (``--seq-len``) overrides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from clusterplan.models.errors import MAX_GIVEN_CHARS, SpecError
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
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
HF_ONLY_KEYS = frozenset({"num_hidden_layers", "n_layer", "intermediate_size", "max_position_embeddings",
                          "num_key_value_heads", "n_embd", "n_head", "n_positions", "transformers_version",
                          "torch_dtype", "hidden_act", "rms_norm_eps", "layer_norm_eps", "tie_word_embeddings"})
"""Keys of Hugging Face configs that no clusterplan model file has: a file with the layer count's
key or two of these is a config.json, even without model_type."""


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """True when a mapping looks like a Hugging Face config: ``model_type`` or ``architectures``,
    the layer count's key (``num_hidden_layers``, ``n_layer``), or two other keys of
    :data:`HF_ONLY_KEYS`."""
    if "model_type" in data or "architectures" in data or "num_hidden_layers" in data or "n_layer" in data:
        return True
    return len(HF_ONLY_KEYS.intersection(data)) >= 2


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
    if model_type is None and not architectures:
        raise SpecError(
            f"config.json: model_type: missing; a Hugging Face config.json names its architecture there "
            f"(supported: {', '.join(_BUILDERS)}), or in architectures (e.g. [\"LlamaForCausalLM\"]). "
            "Add it, or write a clusterplan model file with the ModelSpec keys (num_layers, hidden_size, ...)"
        )
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
        raise SpecError(f"config.json: {key}: got {_shown(value)}; allowed: true or false")
    return value


_REQUIRED = object()


def _int(cfg: Mapping[str, Any], key: str, default: Any = _REQUIRED, low: int = 1) -> Any:
    """A whole-number key of config.json of at least ``low``; ``default`` where it is absent or null
    (without one, a missing key is an error naming it)."""
    value = cfg.get(key)
    if value is None:
        if default is _REQUIRED:
            raise SpecError(f"config.json: missing key {key!r}, needed for model_type {cfg.get('model_type')!r}")
        return default
    return _whole(value, key, low)


def _whole(value: Any, name: str, low: int = 1) -> int:
    """A whole number of at least ``low`` from a config value (an int, or a float with no fraction);
    else a SpecError naming the key. A string ("32") or true/false is refused, not coerced."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if not ok or value < low:
        raise SpecError(f"config.json: {name}: got {_shown(value)}; allowed: a whole number >= {low}")
    return int(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_GIVEN_CHARS else text[:MAX_GIVEN_CHARS] + "..."


def _seq_len_fields(cfg: Mapping[str, Any], key: str = "max_position_embeddings") -> dict[str, Any]:
    """``seq_len`` (the original context, capped at MAX_DEFAULT_SEQ_LEN) and, where the cap applies,
    ``seq_len_note`` saying why the plan does not use the file's figure (module docstring)."""
    scaling = cfg.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise SpecError(f"config.json: rope_scaling: got {_shown(scaling)}; allowed: an object or null")
    original = (scaling or {}).get("original_max_position_embeddings")
    name = "rope_scaling.original_max_position_embeddings" if original is not None else key
    context = _whole(original, name) if original is not None else _int(cfg, key)
    if context <= MAX_DEFAULT_SEQ_LEN:
        return {"seq_len": context}
    note = (f"{MAX_DEFAULT_SEQ_LEN:,}: the config's {name} is {context:,}, the longest context the model takes, "
            f"which training often reaches only in a last long-context phase, so clusterplan plans pre-training at "
            f"{MAX_DEFAULT_SEQ_LEN:,} (--seq-len {context} for the whole context)")
    return {"seq_len": MAX_DEFAULT_SEQ_LEN, "seq_len_note": note}


def _explicit_head_dim(cfg: Mapping[str, Any], default: int | None = None) -> int | None:
    """``head_dim`` (``default`` where the config has none) only where it differs from
    hidden_size / num_attention_heads."""
    head_dim = _int(cfg, "head_dim", default)
    heads, hidden = _int(cfg, "num_attention_heads"), _int(cfg, "hidden_size")
    if head_dim is None or head_dim * heads == hidden:
        return None
    return head_dim


def _has_dropout(cfg: Mapping[str, Any], keys: tuple[str, ...], default: float = 0.0) -> bool:
    """True when any of the config's dropout probabilities is positive."""
    def probability(key: str) -> float:
        value = cfg.get(key) if cfg.get(key) is not None else default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise SpecError(f"config.json: {key}: got {_shown(value)}; allowed: a probability from 0 to 1")
        return float(value)
    return any(probability(key) > 0 for key in keys)


def _llama_fields(cfg: Mapping[str, Any], head_dim: int | None = None) -> dict[str, Any]:
    """Llama's keys; ``head_dim``: the head size where the config has no head_dim key."""
    return {
        "num_layers": _int(cfg, "num_hidden_layers"),
        "hidden_size": _int(cfg, "hidden_size"),
        "num_attention_heads": _int(cfg, "num_attention_heads"),
        "num_kv_heads": _int(cfg, "num_key_value_heads", None),
        "head_dim": _explicit_head_dim(cfg, head_dim),
        "ffn_hidden_size": _int(cfg, "intermediate_size"),
        "vocab_size": _int(cfg, "vocab_size"),
        "ffn_activation": "swiglu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "dropout": _has_dropout(cfg, ("attention_dropout",)),
        **_seq_len_fields(cfg),
    }


def _mistral_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Llama's keys plus ``sliding_window``, which Mistral's and Mixtral's attention applies to every
    layer (Mistral 7B v0.1: 4096; v0.2 onwards and Mixtral: null)."""
    fields = _llama_fields(cfg)
    fields["sliding_window"] = _int(cfg, "sliding_window", None)
    return fields


def _mixtral_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    fields = _mistral_fields(cfg)
    fields["moe"] = {
        "num_experts": _int(cfg, "num_local_experts"),
        "top_k": _int(cfg, "num_experts_per_tok"),
        "expert_ffn_hidden_size": fields["ffn_hidden_size"],
    }
    return fields


QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim default (transformers configuration_qwen3.py)
QWEN_MAX_WINDOW_LAYERS = 28  # Qwen2Config's and Qwen3Config's max_window_layers default


def _qwen_fields(cfg: Mapping[str, Any], head_dim: int | None = None) -> dict[str, Any]:
    """Qwen2/2.5 and Qwen3: Llama's keys and their sliding window (:func:`_qwen_window`)."""
    fields = _llama_fields(cfg, head_dim)
    fields["sliding_window"] = _qwen_window(cfg, fields["num_layers"])
    return fields


def _qwen_window(cfg: Mapping[str, Any], num_layers: int) -> int | None:
    """The window where use_sliding_window is true: transformers windows the layers from
    max_window_layers on (Qwen2Config.layer_types); ModelSpec takes every layer windowed or none."""
    if not _flag(cfg, "use_sliding_window", False) or cfg.get("sliding_window") is None:
        return None
    window = _int(cfg, "sliding_window")
    first = min(num_layers, _int(cfg, "max_window_layers", QWEN_MAX_WINDOW_LAYERS, low=0))
    if first == num_layers:
        return None
    if first == 0:
        return window
    raise SpecError(f"config.json: use_sliding_window with max_window_layers={first}: layers {first} to "
                    f"{num_layers - 1} attend over a window of {window} and the first {first} over the whole "
                    "context, which ModelSpec cannot hold (every layer windowed, or every n-th full); write a "
                    "model file with sliding_window and sliding_window_pattern")


def _qwen3_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return _qwen_fields(cfg, QWEN3_HEAD_DIM)


def _qwen3_moe_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3's keys and its experts; head_dim where given, else hidden_size / num_attention_heads
    (``Qwen3MoeAttention``). The dense layers' MLP is intermediate_size wide."""
    fields = _qwen_fields(cfg)
    experts = _int(cfg, "num_experts", None) or _int(cfg, "num_local_experts")
    fields["moe"] = {
        "num_experts": experts,
        "top_k": _int(cfg, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _int(cfg, "moe_intermediate_size"),
        "num_dense_layers": _qwen_dense_layers(cfg, fields["num_layers"]),
    }
    return fields


def _qwen_dense_layers(cfg: Mapping[str, Any], num_layers: int) -> int:
    """How many leading layers have a dense MLP: layer ``i`` is MoE where ``(i + 1) %
    decoder_sparse_step == 0`` and ``i`` is not in mlp_only_layers (``Qwen3MoeDecoderLayer``)."""
    step = _int(cfg, "decoder_sparse_step", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
                                             for i in only):
        raise SpecError(f"config.json: mlp_only_layers: got {_shown(only)}; allowed: a list of layer indices "
                        f"0 to {num_layers - 1}")
    dense = [i for i in range(num_layers) if i in set(only) or (i + 1) % step]
    if dense != list(range(len(dense))):
        raise SpecError(f"config.json: decoder_sparse_step={step}, mlp_only_layers={_shown(only)}: the dense-MLP "
                        f"layers ({_shown(dense)}) are not the leading ones; ModelSpec holds leading dense layers "
                        "then MoE layers (moe.num_dense_layers): write a model file")
    return len(dense)


def _gpt2_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    hidden = _int(cfg, "n_embd")
    return {
        "num_layers": _int(cfg, "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": _int(cfg, "n_head"),
        "ffn_hidden_size": _int(cfg, "n_inner", 4 * hidden),
        "vocab_size": _int(cfg, "vocab_size"),
        "ffn_activation": "gelu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", True),  # GPT2Config ties by default
        "dropout": _has_dropout(cfg, ("resid_pdrop", "attn_pdrop"), default=0.1),  # GPT2Config: 0.1
        **_seq_len_fields(cfg, key="n_positions"),
    }


def _gpt_neox_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "num_layers": _int(cfg, "num_hidden_layers"),
        "hidden_size": _int(cfg, "hidden_size"),
        "num_attention_heads": _int(cfg, "num_attention_heads"),
        "ffn_hidden_size": _int(cfg, "intermediate_size"),
        "vocab_size": _int(cfg, "vocab_size"),
        "ffn_activation": "gelu",
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "dropout": _has_dropout(cfg, ("attention_dropout", "hidden_dropout")),
        **_seq_len_fields(cfg),
    }


def _deepseek_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    fields = _llama_fields(cfg)
    fields["num_kv_heads"] = None  # MLA: keys/values come from the shared latent, not kv heads
    fields["head_dim"] = None
    fields["moe"] = {
        "num_experts": _int(cfg, "n_routed_experts"),
        "top_k": _int(cfg, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _int(cfg, "moe_intermediate_size"),
        "num_shared_experts": _int(cfg, "n_shared_experts", 0, low=0),
        "num_dense_layers": _int(cfg, "first_k_dense_replace", 0, low=0),
    }
    groups, topk_group = _int(cfg, "n_group", 1), _int(cfg, "topk_group", None)
    if groups > 1 and topk_group:  # group-limited routing, groups = nodes
        fields["moe"]["max_nodes_per_token"] = topk_group
    fields["mla"] = {
        "q_lora_rank": _int(cfg, "q_lora_rank", 0, low=0),  # null: queries are not compressed (V2-Lite)
        "kv_lora_rank": _int(cfg, "kv_lora_rank"),
        "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim"),
        "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
        "v_head_dim": _int(cfg, "v_head_dim"),
    }
    _check_every_layer_moe(cfg)
    return fields


def _check_every_layer_moe(cfg: Mapping[str, Any]) -> None:
    freq = _int(cfg, "moe_layer_freq", 1)
    if freq != 1:
        raise SpecError(
            f"config.json: moe_layer_freq={freq} is not supported; ModelSpec needs every layer after "
            "first_k_dense_replace to be an MoE layer (moe_layer_freq: 1)"
        )


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "llama": _llama_fields,
    "mistral": _mistral_fields,
    "mixtral": _mixtral_fields,
    "qwen2": _qwen_fields,
    "qwen3": _qwen3_fields,
    "qwen3_moe": _qwen3_moe_fields,
    "gpt2": _gpt2_fields,
    "gpt_neox": _gpt_neox_fields,
    "deepseek_v2": _deepseek_fields,
    "deepseek_v3": _deepseek_fields,
}

SUPPORTED_MODEL_TYPES = tuple(_BUILDERS)
"""The ``model_type`` values :func:`from_hf_config` understands."""
