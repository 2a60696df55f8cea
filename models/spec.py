"""The model description: a frozen, validated transformer spec with parameter counts.

Conventions follow Narayanan et al. 2021 (SC21) section 3.2 and the FORMULAS card: ``h`` hidden size,
``a`` attention heads, ``g`` key/value heads, ``d`` head dimension, ``f`` FFN width, ``V`` vocabulary.
A SwiGLU MLP has three matrices (gate, up, down) of ``h*f`` each; a GELU MLP has two.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from clusterplan.models.errors import SpecError, format_validation_error

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_HASH_KEY = "_field_hash"  # where ModelSpec keeps its hash (not a field: pydantic refuses leading underscores)
MAX_SEQ_LEN = 2**31 - 1  # the command line's bound on --seq-len (cli.POSITIVE_INT)


class _Spec(BaseModel):
    """A spec whose numeric fields refuse true/false: YAML and JSON booleans would otherwise pass as
    1 and 0 (``num_layers: true`` a one-layer model)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value, info: ValidationInfo):
        annotation = str(cls.model_fields[info.field_name].annotation)
        if isinstance(value, bool) and "bool" not in annotation and ("int" in annotation or "float" in annotation):
            raise ValueError(f"got {value!r}; expected a number")
        return value


class MoESpec(_Spec):
    """Mixture-of-experts feed-forward layers (Switch/GShard style, top-k routing)."""

    model_config = _FROZEN

    num_experts: int = Field(gt=0, le=2**20, description="Routed experts per MoE layer (at most 2^20, the "
                             "million-expert PEER layers of He 2024; DeepSeek-V3 has 256).")
    top_k: int = Field(gt=0, description="Routed experts each token is sent to (at most num_experts).")
    expert_ffn_hidden_size: int = Field(gt=0, le=10_000_000, description="FFN width of one expert (at most "
                                        "10,000,000, as ffn_hidden_size).")
    num_shared_experts: int = Field(0, ge=0, le=2**20, description="Always-active experts per MoE layer (at most "
                                    "2^20, as num_experts).")
    num_dense_layers: int = Field(
        0, ge=0, description="Leading layers that use a dense MLP instead of experts."
    )
    max_nodes_per_token: int | None = Field(
        None, gt=0, le=2**20,
        description="Node-limited routing: each token's experts lie on at most this many nodes "
                    "(DeepSeek-V3: 4, section 3.2; config.json topk_group). None: unlimited.",
    )
    capacity_factor: float | None = Field(
        None, ge=1.0, le=64.0, allow_inf_nan=False,
        description="Expert capacity as a multiple of the mean load, tokens beyond it dropped and each "
                    "expert's input padded to it (Megatron-Core --moe-expert-capacity-factor with "
                    "--moe-pad-expert-input-to-capacity; GShard/Switch). None: dropless routing.",
    )
    load_imbalance: float = Field(
        1.0, ge=1.0, le=64.0, allow_inf_nan=False,
        description="Dropless routing: routed tokens on the most loaded expert-parallel rank over the mean "
                    "(1: balanced, as benchmarks that force balance run). Ignored with a capacity factor.",
    )

    @property
    def load_factor(self) -> float:
        """Routed tokens the most loaded expert-parallel rank processes, over the mean: the capacity
        factor where tokens are capped and padded to it, else the dropless imbalance."""
        return self.capacity_factor if self.capacity_factor is not None else self.load_imbalance

    @model_validator(mode="after")
    def _top_k_fits(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; top_k must be <= num_experts"
            )
        return self


class MLASpec(_Spec):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed queries and keys/values."""

    model_config = _FROZEN

    # each at most 1,000,000, as hidden_size: a rank or head dim beyond the model's width means nothing
    q_lora_rank: int = Field(ge=0, le=1_000_000, description="Rank of the query compression (0: no compression).")
    kv_lora_rank: int = Field(gt=0, le=1_000_000, description="Rank of the joint key/value compression.")
    qk_nope_head_dim: int = Field(gt=0, le=1_000_000, description="Per-head query/key dim without rotary part.")
    qk_rope_head_dim: int = Field(gt=0, le=1_000_000, description="Per-head rotary query/key dim.")
    v_head_dim: int = Field(gt=0, le=1_000_000, description="Per-head value dim.")


class ModelSpec(_Spec):
    """A decoder-only transformer, dense or MoE.

    Examples
    --------
    >>> m = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
    ...               ffn_hidden_size=256, vocab_size=1000)
    >>> m.head_dim_resolved, m.num_kv_heads_resolved
    (16, 4)
    """

    model_config = _FROZEN

    def __hash__(self) -> int:
        """pydantic's frozen hash (the fields' values, nested specs included) computed once: it took
        1.5 us a call, and every cost term cached on the model asks it (param_counts: 70,000 times a
        plan of DeepSeek-V3 on 576 GB200). Kept in ``__dict__`` like the cached properties, which
        pydantic's equality ignores; a copy or a pickle drops it (``model_copy``, ``__getstate__``)."""
        cached = self.__dict__.get(_HASH_KEY)
        if cached is None:
            cached = self.__dict__[_HASH_KEY] = hash(tuple(self.__dict__[name] for name in type(self).model_fields))
        return cached

    def model_copy(self, *, update=None, deep: bool = False) -> "ModelSpec":
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop(_HASH_KEY, None)  # another model's fields where update changes them
        return copied

    def __getstate__(self) -> dict:
        state = super().__getstate__()  # another process hashes strings with another seed
        return {**state, "__dict__": {k: v for k, v in state["__dict__"].items() if k != _HASH_KEY}}

    name: str = Field(description="Identifier shown in reports.")
    num_layers: int = Field(gt=0, le=100_000, description="Transformer layers (L; at most 100,000: beyond any model described).")
    hidden_size: int = Field(gt=0, le=1_000_000, description="Model width (h; at most 1,000,000).")
    num_attention_heads: int = Field(gt=0, le=1_000_000, description="Query heads (a; at most 1,000,000).")
    num_kv_heads: int | None = Field(
        None, gt=0, description="Key/value heads (g); None means equal to num_attention_heads."
    )
    head_dim: int | None = Field(
        None, gt=0, le=1_000_000, description="Per-head dimension; None means hidden_size / num_attention_heads "
        "(at most 1,000,000, as hidden_size)."
    )
    ffn_hidden_size: int = Field(gt=0, le=10_000_000, description="Dense MLP width (f); per up projection for SwiGLU "
                                 "(at most 10,000,000).")
    vocab_size: int = Field(gt=0, le=100_000_000, description="Vocabulary (V; at most 100,000,000).")
    ffn_activation: Literal["gelu", "swiglu"] = Field(
        "gelu", description="gelu: 2 MLP matrices; swiglu: 3 (gate, up, down)."
    )
    norm: Literal["layernorm", "rmsnorm"] | None = Field(
        None, description="Normalisation: rmsnorm (Llama, DeepSeek, Qwen) or layernorm (GPT-2/3, BLOOM, MPT); "
        "None: rmsnorm with swiglu, layernorm with gelu."
    )
    position_embedding: Literal["rope", "learned", "alibi"] | None = Field(
        None, description="rope (Llama, DeepSeek, Qwen, Nemotron-4), learned (GPT-2/3) or alibi (BLOOM, MPT); "
        "None: rope with swiglu, learned with gelu. Only rope runs a kernel in every layer."
    )
    rope_theta: float | None = Field(
        None, gt=0, le=1e12, description="Base of the rotary position embedding's frequencies (Llama 3: 500,000; "
        "Mixtral: 1e6); None: RoPE's original 10,000 (Su et al. 2021). Launchers need it to build the model.")
    sliding_window: int | None = Field(
        None, gt=0, le=MAX_SEQ_LEN, description="Keys a query attends back over in the windowed layers (Mistral 7B v0.1: 4096, "
        "gpt-oss: 128); None: every layer attends over the whole causal context."
    )
    sliding_window_pattern: int | None = Field(
        None, ge=2, le=100_000, description="With sliding_window: every n-th layer attends over the whole context and the "
        "others over the window (gpt-oss: 2, Gemma 3: 6); None: every layer is windowed (Mistral)."
    )
    tied_embeddings: bool = Field(False, description="Output layer shares the input embedding.")
    dropout: bool = Field(
        False, description="Hidden/attention dropout on (GPT-3 era); stores 1-byte masks per Korthikanti."
    )
    moe: MoESpec | None = Field(None, description="Mixture-of-experts layers, if any.")
    mla: MLASpec | None = Field(None, description="Multi-head latent attention, if used.")
    seq_len: int = Field(2048, gt=0, le=MAX_SEQ_LEN, description="Default training sequence length (at most 2^31 - 1, "
                         "as --seq-len).")
    seq_len_note: str = Field("", description="Why seq_len is not the model file's own context, where it is not "
                              "(a Hugging Face config's context capped for pre-training: models.hf); reports print it.")
    source: str = Field("", description="Where the architecture was published.")

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelSpec":
        g = self.num_kv_heads_resolved
        if self.num_attention_heads % g != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_kv_heads={g}; grouped-query attention needs heads divisible by kv heads"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; give head_dim explicitly"
            )
        if self.sliding_window_pattern is not None and self.sliding_window is None:
            raise ValueError(
                f"sliding_window_pattern={self.sliding_window_pattern} needs sliding_window (the window's "
                "length in tokens); without it every layer attends over the whole context"
            )
        if self.moe is not None and self.moe.num_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.num_dense_layers={self.moe.num_dense_layers} exceeds num_layers={self.num_layers}"
            )
        return self

    # ---- derived dimensions -------------------------------------------------------------------
    @property
    def num_kv_heads_resolved(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim_resolved(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def norm_resolved(self) -> str:
        """``norm``, else the norm that goes with the MLP in the published families: RMSNorm with
        SwiGLU (Llama, Mistral, DeepSeek, Qwen), LayerNorm with GELU (GPT-2/3, BLOOM, MPT)."""
        return self.norm or ("rmsnorm" if self.ffn_activation == "swiglu" else "layernorm")

    @property
    def rotary(self) -> bool:
        """Rotary position embedding in every layer: ``position_embedding``, else the family default
        (RoPE with SwiGLU; learned absolute positions with GELU, GPT-2/3)."""
        return (self.position_embedding or ("rope" if self.ffn_activation == "swiglu" else "learned")) == "rope"

    @property
    def num_windowed_layers(self) -> int:
        """Layers that attend over ``sliding_window`` only: all of them without a pattern, else all but
        every ``sliding_window_pattern``-th (gpt-oss alternates windowed and full layers)."""
        if self.sliding_window is None:
            return 0
        p = self.sliding_window_pattern
        return self.num_layers if p is None else self.num_layers - self.num_layers // p

    def attention_pair_fraction(self, seq_len: float, tile: int = 0) -> float:
        """Share of the ``seq_len x seq_len`` score square a causal attention kernel computes,
        averaged over the layers: half in a full causal layer; in a windowed one, query ``i`` attends
        ``min(i, w)`` keys, ``w / s - w^2 / (2 s^2)`` of the square. ``tile``: the kernel's key block,
        computed whole where the window's edge cuts it (FlashAttention skips only fully masked
        blocks, Dao 2023 section 3.1), so a windowed query pays about ``w + tile / 2`` keys, the same
        half block the causal count leaves out on the diagonal."""
        windowed = self.num_windowed_layers
        if windowed == 0:
            return 0.5
        w = min(float(seq_len), self.sliding_window + tile / 2)
        local = w / seq_len - w * w / (2.0 * seq_len * seq_len)
        return (0.5 * (self.num_layers - windowed) + local * windowed) / self.num_layers

    @property
    def attention_dims(self) -> tuple[int, int]:
        """Per-head (query/key, value) widths of the attention core; MLA has its own."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim, self.mla.v_head_dim
        return self.head_dim_resolved, self.head_dim_resolved

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.num_dense_layers

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for SwiGLU (gate, up, down), 2 for GELU."""
        return 3 if self.ffn_activation == "swiglu" else 2

    # ---- parameter counts (Narayanan et al. 2021 eq. 2 generalised to GQA, SwiGLU, MoE, MLA) ----
    @cached_property
    def attention_params(self) -> int:
        """Weights of one attention block: Q, K, V and output projections (biases ignored)."""
        h, a, d = self.hidden_size, self.num_attention_heads, self.head_dim_resolved
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * a * qk if m.q_lora_rank == 0 else h * m.q_lora_rank + m.q_lora_rank * a * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * a * (
                m.qk_nope_head_dim + m.v_head_dim
            )
            return q + kv + a * m.v_head_dim * h
        g = self.num_kv_heads_resolved
        return h * a * d + 2 * h * g * d + a * d * h

    @cached_property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.ffn_hidden_size

    @cached_property
    def expert_params(self) -> int:
        """Weights of one expert MLP."""
        assert self.moe is not None
        return self.mlp_matrices * self.hidden_size * self.moe.expert_ffn_hidden_size

    @cached_property
    def moe_mlp_params(self) -> int:
        """All weights of one MoE layer's feed-forward part: router, routed and shared experts."""
        assert self.moe is not None
        e = self.moe
        return self.hidden_size * e.num_experts + (e.num_experts + e.num_shared_experts) * self.expert_params

    @cached_property
    def moe_active_mlp_params(self) -> int:
        """Weights one token touches in an MoE layer: router, top_k routed and the shared experts."""
        assert self.moe is not None
        e = self.moe
        return self.hidden_size * e.num_experts + (e.top_k + e.num_shared_experts) * self.expert_params

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def output_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def num_params(self) -> int:
        """Total parameters (all experts counted)."""
        per_layer = self.attention_params + self.norm_params_per_layer
        total = self.num_layers * per_layer + self.num_dense_layers * self.dense_mlp_params
        if self.moe is not None:
            total += self.num_moe_layers * self.moe_mlp_params
        return total + self.embedding_params + self.output_params + self.hidden_size

    @cached_property
    def num_active_params(self) -> int:
        """Parameters one token uses (routed experts counted top_k times, not num_experts)."""
        if self.moe is None:
            return self.num_params
        return self.num_params - self.num_moe_layers * (self.moe_mlp_params - self.moe_active_mlp_params)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None


def model_from_mapping(
    mapping: Mapping[str, Any], name: str | None = None, *, where: str = "model"
) -> ModelSpec:
    """Build a ModelSpec from a mapping of its fields, turning validation errors into SpecError.

    Parameters
    ----------
    mapping
        ModelSpec keys, e.g. the ``model:`` block of a validation run (``num_kv_heads: null``
        means multi-head attention).
    name
        Used as ``name`` when the mapping has none.
    where
        Prefix of error messages: the file or block the mapping came from.

    Raises
    ------
    SpecError
        One ``field: message (given: value)`` line per problem.

    Examples
    --------
    >>> model_from_mapping({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    ...                     "ffn_hidden_size": 256, "vocab_size": 1000}, name="tiny").num_params
    226624
    """
    if not isinstance(mapping, Mapping):
        raise SpecError(f"{where}: expected a mapping of model fields, got {type(mapping).__name__}")
    fields = dict(mapping)
    if name is not None and fields.get("name") is None:
        fields["name"] = name
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, where, "model spec", ModelSpec)) from None
