"""FLOPs and bytes of each operation of one transformer layer, forward pass, on one device.

Counts follow Narayanan et al. 2021 section 3.2 (2 FLOPs per multiply-add; a GEMM of ``m x k`` by
``k x n`` is ``2 m k n`` FLOPs) and split the work ``tp`` ways the way Megatron does (column- then
row-parallel linears, heads split across ranks). ``num_tokens`` is the number of tokens this
device's micro-batch holds along the sequence (``b * s / cp``); ``kv_len`` is the length each query
attends over (the full ``s``, spread over the context-parallel ring). Element-wise bytes count a
read and a write of every tensor the op touches, 16-bit activations.

Only the hardware-free part lives here; ``cost.compute`` turns these into seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from clusterplan.models.spec import ModelSpec

OpKind = Literal["gemm", "attention", "bmm", "memory"]
ACT_BYTES = 2  # 16-bit activations
ATTENTION_KINDS: tuple[str, ...] = ("flash", "flash2", "flash1", "unfused")
_VARIANTS = {"flash2": "fa2", "flash1": "fa1"}  # cost.compute.attention_rate
ATTENTION_KEY_TILE = 128
"""Keys per block of a fused attention kernel: FlashAttention-2's and -3's forward tiles on Ampere and
Hopper are 128 x 128 for head dims up to 128 (Dao 2023, Shah et al. 2024), as are cuDNN's. Only the
windowed layers' cost depends on it (``ModelSpec.attention_pair_fraction``)."""


@dataclass(frozen=True, slots=True)
class Op:
    """One forward operation: FLOPs, bytes moved to/from memory, and the GEMM input elements."""

    name: str
    kind: OpKind
    flops: float
    bytes: float
    input_elements: float = 0.0  # activations fed to a GEMM (what FP8 must cast)
    causal_fraction: float = 1.0  # share of ``flops`` a causal fused kernel executes
    core: bool = False  # part of the core attention (what selective recomputation re-runs)
    backward_factor: float = 0.0  # backward over forward work; 0: the kind's default (cost.compute)
    rows: float = 0.0  # GEMM output rows (M) of one group; 0: unknown (no tile quantization)
    cols: float = 0.0  # GEMM output columns (N) of one group
    groups: int = 1  # independent GEMMs of that shape in one launch (grouped experts, batched heads)
    variant: str = ""  # kernel variant of a fused attention op: "" (the device's best) or "fa2"
    fp8_input_fused: bool = False  # an FP8 job casts this GEMM's input inside the norm before it
    high_precision: bool = False  # a GEMM that stays in 16 bits in FP8 jobs (LM head, MoE router)
    unaligned: bool = False  # K or N not a multiple of ALIGN_ELEMENTS: no 16-byte tensor-core loads
    head_dim: int = 0  # fused attention: the query/key head size (cost.compute.attention_rate); 0: not given


ALIGN_ELEMENTS = 8
"""Elements of a 16-bit operand per 16-byte load: tensor-core GEMM kernels load their operands 16
bytes at a time and need the leading dimensions (K of the first operand, N of the second and the
output, in row-major storage) to be multiples of it; otherwise the library runs a narrower-load
kernel (cuBLAS, "Tensor Core Usage" restrictions; NVIDIA's Matrix Multiplication Background guide,
"Tensor Core Requirements"). Priced at the device's ``unaligned_gemm_fraction``."""


def is_unaligned(*dims: float) -> bool:
    """Whether any of ``dims`` (integral element counts) is not a multiple of ``ALIGN_ELEMENTS``."""
    return any(float(d).is_integer() and int(d) % ALIGN_ELEMENTS for d in dims)


EAGER_RMSNORM_BYTES = 36.0
"""Bytes per element of an RMSNorm written as PyTorch ops and run eagerly (torchtitan's ``RMSNorm``
class ``x.float()``, ``pow(2).mean(-1)``, ``rsqrt``, ``x * rsqrt``, ``.type_as(x)``, ``* weight``;
Hugging Face's ``LlamaRMSNorm`` the same ops; PyTorch's ``F.rms_norm`` before its fused CUDA kernel
was the same composite): upcast r2 w4, square r4 w4, mean r4, scale r4 w4, cast back r4 w2,
weight r2 w2. A fused kernel reads 2 and writes 2 (``FUSED_NORM_BYTES``): 9x, as PyTorch PR
#153666 (2025-05) measured for its fused kernel against the unfused one ("around 9x speedup")."""
FUSED_NORM_BYTES = 2.0 * ACT_BYTES
EAGER_ROTARY_BYTES = 20.0
"""Bytes per query/key element of rotary embedding run as eager ops: torchtitan's
``view_as_complex(x.float())`` (r2 w4), the complex product with ``freqs_cis`` (r4 w4) and
``type_as`` (r4 w2); Hugging Face's ``q * cos + rotate_half(q) * sin`` (product r2 w2, negate
and concatenate the halves r2 w2 plus r1 w1, product r2 w2, sum r4 w2) comes to the same 20. A fused
kernel (Transformer Engine, Megatron's Apex rope, a compiled graph) reads 2 and writes 2."""


@dataclass(frozen=True)
class Kernels:
    """How a layer's element-wise passes run.

    ``eager``: as separate eager PyTorch kernels (torchtitan's Llama modules without
    ``torch.compile``, a Hugging Face transformers class): rotary in fp32 complex arithmetic
    (``EAGER_ROTARY_BYTES``) and SwiGLU as ``silu`` then a product, whose intermediate is written and
    read back; LayerNorm and GELU are one kernel each even then. ``composite_norm``: the RMSNorm is
    PyTorch ops (``EAGER_RMSNORM_BYTES``), not a fused kernel. ``kv_repeat``: K and V are copied per
    query head before attention (``repeat_kv``). ``fused_rotary``: eager modules that still apply
    rotary embedding as one fused kernel (nanotron calls flash-attn's Triton ``apply_rotary``). The
    default is the fused kernels of Megatron-LM, Transformer Engine and compiled graphs.
    ``softmax_rule``: the shapes the unfused attention's fused scale-mask-softmax kernel takes
    (:func:`softmax_fused`): the dimension its rows per block are read from (``"keys"``, or
    ``"heads"`` where the dispatch passed the heads per rank in the key length's place) and the
    longest key length it takes; ``("", 0)``: every shape."""

    eager: bool = False
    composite_norm: bool = False
    kv_repeat: bool = False
    fused_rotary: bool = False
    softmax_rule: tuple[str, int] = ("", 0)


FUSED = Kernels()


def _gemm(name: str, m: float, k: float, n: float, fp8_input_fused: bool = False,
          high_precision: bool = False) -> Op:
    """A linear layer's GEMM: ``m`` tokens x ``k`` in-features x ``n`` out-features.

    ``fp8_input_fused``: the input comes straight from a norm, and FP8 training casts it there
    (Transformer Engine's ``LayerNormLinear``, Megatron-Core's QKV and dense fc1). ``high_precision``:
    FP8 training leaves this GEMM in 16 bits: the LM head (Megatron-Core's output layer is a plain
    ``ColumnParallelLinear``, outside Transformer Engine; torchtitan's float8 converter skips
    ``output``: ``fqn != "output"`` until 2025-04, ``filter_fqns = ["output"]`` in its configs since,
    PR #1063) and the MoE router (Megatron-Core's ``TopKRouter`` is a plain linear)."""
    flops = 2.0 * m * k * n
    data = ACT_BYTES * (m * k + k * n + m * n)
    return Op(name, "gemm", flops, data, input_elements=m * k, rows=m, cols=n,
              fp8_input_fused=fp8_input_fused, high_precision=high_precision)


def linear_op(name: str, m: float, k: float, n: float) -> Op:
    """A linear layer's forward GEMM (``m`` tokens, ``k`` in, ``n`` out features) outside the
    layer's op list, e.g. a recomputed up-projection."""
    return _gemm(name, m, k, n)


def attention_ops(model: ModelSpec, num_tokens: float, kv_len: float, tp: int, attention: str = "flash",
                  kernels: Kernels = FUSED) -> list[Op]:
    """QKV projection, attention core, output projection.

    The attention core counts ``4 * n * kv_len * a * d`` FLOPs (scores and values, no causal
    halving: the PaLM/MFU convention). ``attention="flash"``: one fused kernel that never writes
    the scores and skips the masked half (``causal_fraction``), and in a sliding-window layer all but
    the window's band (``ModelSpec.attention_pair_fraction``), at the device's best attention
    efficiency; ``"flash2"``: the same with FlashAttention-2 kernels (slower on Hopper); ``"flash1"``:
    FlashAttention-1-era kernels (flash-attn 1.x, 2023's Triton ports), 0.55 of FlashAttention-2's rate; ``"unfused"``:
    the pre-FlashAttention path (:func:`unfused_attention_ops`).
    """
    h, a = model.hidden_size, model.num_attention_heads
    d = model.head_dim_resolved
    out_params = a * (model.mla.v_head_dim if model.mla else d) * h
    qkv_params = model.attention_params - out_params
    qk, v = model.attention_dims
    g = model.num_kv_heads_resolved
    if attention == "unfused":
        core = unfused_attention_ops(model, num_tokens, kv_len, tp, kernels)
    else:
        core_flops = 2.0 * num_tokens * kv_len * a * (qk + v) / tp
        core_bytes = ACT_BYTES * num_tokens * (2 * a + 2 * g) * d / tp
        executed = model.attention_pair_fraction(kv_len, ATTENTION_KEY_TILE)
        core = [Op("attention", "attention", core_flops, core_bytes, causal_fraction=executed, core=True,
                   variant=_VARIANTS.get(attention, ""), head_dim=int(qk))]
    return [_gemm("qkv", num_tokens, h, qkv_params / h / tp, fp8_input_fused=True), *core,
            _gemm("attn_out", num_tokens, out_params / h / tp, h)]


def unfused_attention_ops(model: ModelSpec, num_tokens: float, kv_len: float, tp: int,
                          kernels: Kernels = FUSED) -> list[Op]:
    """Megatron-LM's core attention before FlashAttention (Narayanan et al. 2021; Korthikanti et al.
    2022, section 4.1, Figure 5): ``Q K^T`` as a batched GEMM whose ``a n kv_len`` scores are written
    to memory, a fused scale + mask + softmax kernel (read the scores, write the probabilities),
    attention dropout where the model has it (read, write, and a 1-byte mask), and the batched GEMM
    with ``V`` that reads the probabilities back. The full square of scores is computed (no causal
    skipping). Backward: two batched GEMMs per forward one (their bytes twice: the score gradient
    is written once and read twice); the softmax backward reads the probabilities and their
    gradient and writes one gradient (3 passes against the forward's 2); the dropout backward
    reads a gradient and the mask and writes one gradient (as many bytes as its forward). Where the
    fused softmax kernel does not take the shape (:func:`softmax_fused`), the softmax runs as PyTorch
    ops (``EAGER_SOFTMAX_BYTES``). A head size
    that is not a multiple of 8 (BigScience's 225 and 108) leaves both batched GEMMs, forward and
    backward, without 16-byte loads (``Op.unaligned``: K of the scores GEMM, N of the context GEMM).
    """
    a, g = model.num_attention_heads, model.num_kv_heads_resolved
    qk, v = model.attention_dims
    scores = ACT_BYTES * num_tokens * kv_len * a / tp
    q, k = ACT_BYTES * num_tokens * a * qk / tp, ACT_BYTES * kv_len * g * qk / tp
    vals, out = ACT_BYTES * kv_len * g * v / tp, ACT_BYTES * num_tokens * a * v / tp
    heads = max(1, round(a / tp))
    ops = [
        Op("scores", "bmm", 2.0 * num_tokens * kv_len * a * qk / tp, q + k + scores, core=True,
           rows=num_tokens, cols=kv_len, groups=heads, unaligned=is_unaligned(qk)),
        _softmax_op(scores, softmax_fused(kernels, num_tokens, kv_len, heads)),
    ]
    if model.dropout:
        ops.append(Op("attention_dropout", "memory", 0.0, 2.5 * scores, core=True, backward_factor=1.0))
    ops.append(Op("context", "bmm", 2.0 * num_tokens * kv_len * a * v / tp, scores + vals + out, core=True,
                  rows=num_tokens, cols=v, groups=heads, unaligned=is_unaligned(v)))
    return ops


EAGER_SOFTMAX_BYTES = (36.0, 40.0)
"""Bytes per score, forward and backward, of Megatron's softmax where its fused kernel does not take
the shape (``FusedScaleMaskSoftmax.forward_torch_softmax``, with the fp32 softmax that query-key
layer scaling, on by default, imposes, its 1/layer scale and the causal mask): ``input.float()``
r2 w4, ``input * scale`` r4 w4, ``masked_fill_`` r4 w4 (the boolean mask, shared by the heads, left
out), ``Softmax(dim=-1)`` r4 w4 (a 2048-key fp32 row is 8 KiB, re-read from cache), the cast back to
16 bits r4 w2: 36. Backward, autograd in reverse: the cast's r2 w4, the softmax's (the gradient
and its fp32 output read, one gradient written) r8 w4, the mask's r4 w4, the scale's r4 w4, the
cast to 16 bits r4 w2: 40. The fused kernel reads 2 and writes 2 forward, reads 4 and writes 2
backward. Sources: bigscience-workshop/Megatron-DeepSpeed megatron/model/fused_softmax.py and
transformer.py (ParallelAttention: ``attention_softmax_in_fp32 = True`` under
``apply_query_key_layer_scaling``, ``coeff = layer_number``), 2021-12 (10386f89)."""


def _softmax_op(scores: float, fused: bool) -> Op:
    """The unfused attention's softmax over ``scores`` bytes of 16-bit scores: the fused kernel
    (read, write; backward 1.5 times that) or the PyTorch ops (``EAGER_SOFTMAX_BYTES``)."""
    if fused:
        return Op("softmax", "memory", 0.0, 2 * scores, core=True, backward_factor=1.5)
    fwd, bwd = EAGER_SOFTMAX_BYTES
    return Op("softmax", "memory", 0.0, fwd / ACT_BYTES * scores, core=True, backward_factor=bwd / fwd)


def softmax_batches_per_block(width: float) -> int:
    """Rows of scores one 128-thread block of Megatron's fused softmax takes for rows of ``width``
    elements (``scaled_masked_softmax.h`` ``get_batch_per_block``): a warp of the next power of two
    of ``width`` threads, at most 32, and two rows per warp up to 128 elements, one beyond."""
    pow2 = 1
    while pow2 < width:
        pow2 *= 2
    return (128 // min(pow2, 32)) * (2 if pow2 <= 128 else 1)


def softmax_fused(kernels: Kernels, num_tokens: float, kv_len: float, heads: int) -> bool:
    """Whether Megatron's fused causal softmax (``scaled_upper_triang_masked_softmax``) takes one
    micro-batch's scores under ``kernels.softmax_rule`` (``FusedScaleMaskSoftmax.is_kernel_available``):
    16 < keys <= the longest it takes, keys and ``b x np`` (sequences times heads per rank) multiples
    of 4, and ``b x np`` a multiple of :func:`softmax_batches_per_block` of the rule's dimension.
    The sequences per micro-batch are ``num_tokens / kv_len`` (self-attention over the whole
    sequence: no profile with a rule offers context parallelism)."""
    dim, max_keys = kernels.softmax_rule
    if not max_keys:
        return True
    batches = max(1, round(num_tokens / kv_len)) * heads
    if not 16 < kv_len <= max_keys or kv_len % 4 or batches % 4:
        return False
    return batches % softmax_batches_per_block(heads if dim == "heads" else kv_len) == 0


def activation_bytes_per_element(model: ModelSpec, kernels: Kernels = FUSED) -> float:
    """Bytes per element of the MLP width that the activation moves: GELU reads one tensor and
    writes one, SwiGLU reads two; eager SwiGLU (``F.silu(w1 x) * w3 x``) also writes the SiLU's
    output and reads it back."""
    ups = model.mlp_matrices - 1
    extra = 2 if kernels.eager and ups == 2 else 0
    return ACT_BYTES * (ups + 1 + extra)


def mlp_ops(model: ModelSpec, num_tokens: float, ffn: int, tp: int, name: str = "mlp",
            kernels: Kernels = FUSED) -> list[Op]:
    """Up (and gate) projection, activation, down projection of one MLP of width ``ffn``."""
    h = model.hidden_size
    ups = model.mlp_matrices - 1
    return [
        _gemm(f"{name}_up", num_tokens, h, ups * ffn / tp, fp8_input_fused=name == "mlp"),
        Op(f"{name}_act", "memory", 0.0, activation_bytes_per_element(model, kernels) * num_tokens * ffn / tp),
        _gemm(f"{name}_down", num_tokens, ffn / tp, h),
    ]


def moe_ops(model: ModelSpec, num_tokens: float, tp: int, sp: bool, local_experts: int | None = None,
            expert_tp: bool = True, kernels: Kernels = FUSED) -> list[Op]:
    """Router, token permutation and un-permutation, routed and shared experts, on the most loaded
    expert-parallel rank: ``top_k`` copies per token times the routing's load factor
    (``MoESpec.load_factor``: 1 for balanced routing, the capacity factor when experts are padded
    to capacity); the step waits for that rank.

    Dispatch gathers each token's ``top_k`` copies into expert order before the all-to-all, and the
    combine reads the experts' outputs back, weights them by the router probabilities and sums
    them per token: two memory-bound passes (Megatron-Core ``token_dispatcher.py``: ``permute`` in
    ``dispatch_preprocess``, ``unpermute`` in ``combine_postprocess``; torchtitan's MoE likewise
    gathers and scatter-adds).

    The routed experts run as one grouped GEMM over the ``local_experts`` experts this device holds
    (``num_experts / ep``): FLOPs follow the routed tokens, but every local expert's weights are
    read once per pass, which makes few-token experts memory-bound. With ``expert_tp`` each expert
    is split ``tp`` ways and sees all ``n top_k`` routed tokens; folded (no expert tensor
    parallelism) each rank routes its ``n / tp`` sequence-parallel tokens to whole experts: the
    same FLOPs and activation bytes, ``tp`` times the weights.
    """
    assert model.moe is not None
    e, h = model.moe, model.hidden_size
    local = num_tokens / tp if sp else num_tokens
    routed = num_tokens * e.top_k * e.load_factor
    experts = e.num_experts if local_experts is None else local_experts
    ups = model.mlp_matrices - 1
    ffn = e.expert_ffn_hidden_size
    shards = tp if expert_tp else 1
    up_weights, down_weights = experts * h * ups * ffn / shards, experts * ffn / shards * h
    per_expert = routed / experts / (1 if expert_tp else tp)  # rows of each expert's GEMM on this rank
    ops = [
        _gemm("router", local, h, e.num_experts, high_precision=True),
        Op("permute", "memory", 0.0, 2 * ACT_BYTES * routed * h / tp),
        Op("unpermute", "memory", 0.0, ACT_BYTES * (routed + num_tokens) * h / tp),
        Op("experts_up", "gemm", 2.0 * routed * h * ups * ffn / tp,
           ACT_BYTES * (routed * h + up_weights + routed * ups * ffn / tp), input_elements=routed * h,
           rows=per_expert, cols=ups * ffn / shards, groups=max(1, round(experts))),
        Op("experts_act", "memory", 0.0, activation_bytes_per_element(model, kernels) * routed * ffn / tp),
        Op("experts_down", "gemm", 2.0 * routed * ffn / tp * h,
           ACT_BYTES * (routed * ffn / tp + down_weights + routed * h), input_elements=routed * ffn / tp,
           rows=per_expert, cols=h, groups=max(1, round(experts))),
    ]
    if e.num_shared_experts:
        ops += mlp_ops(model, num_tokens, e.num_shared_experts * ffn, tp, name="shared", kernels=kernels)
    return ops


MLP_BLOCK_OPS = frozenset({"router", "permute", "unpermute", "experts_up", "experts_act", "experts_down",
                           "shared_up", "shared_act", "shared_down", "mlp_up", "mlp_act", "mlp_down"})
"""The ops of a layer's MLP block (:func:`moe_ops`, :func:`mlp_ops`): what Megatron's ``_forward_mlp``
runs. A dropless MoE block has data-dependent shapes, so for a dropless MoE model Megatron's per-layer
CUDA graphs capture the attention alone (``--cuda-graph-modules attn``; Megatron-LM
megatron/core/transformer/moe/README.md, "CUDA Graph": "when --moe-expert-capacity-factor and
--moe-pad-expert-input-to-capacity are not set, the resulting dynamic shapes make MoE layers
uncapturable ... leaving the MoE layers (operations in TransformerLayer._forward_mlp()) unmodified"),
and leave these eager (``cost.compute.graphed_device``). A dense layer's MLP stays eager too: graphing
it (``mlp``) is refused beside EP overlap (TransformerConfig: "CUDA graph scope on moe and mlp is not
supported with overlap_moe_expert_parallel_comm")."""


def elementwise_ops(model: ModelSpec, num_tokens: float, tp: int, sp: bool, kernels: Kernels = FUSED) -> list[Op]:
    """Two norms, two residual adds (Megatron's fused bias-dropout-add, with its masks when the model
    uses dropout), rotary embedding where the model has it: memory-bound passes over ``h``; with ``kernels.kv_repeat`` the
    copy of K and V per query head (read ``g``, write ``a`` heads of each).

    Without sequence parallelism these run replicated on the full ``num_tokens`` on every
    tensor-parallel rank; with it each rank handles ``1/tp`` of the tokens (Korthikanti et al.).
    """
    h = model.hidden_size
    local = num_tokens / tp if sp else num_tokens
    d, a, g = model.head_dim_resolved, model.num_attention_heads, model.num_kv_heads_resolved
    composite = kernels.composite_norm and model.norm_resolved == "rmsnorm"
    norm_bytes = EAGER_RMSNORM_BYTES if composite else FUSED_NORM_BYTES
    rotary_bytes = EAGER_ROTARY_BYTES if kernels.eager and not kernels.fused_rotary else 2 * ACT_BYTES
    ops = [
        Op("norms", "memory", 0.0, norm_bytes * local * h * 2),  # two norms
        Op("residuals", "memory", 0.0, ACT_BYTES * local * h * 6),  # 2 x (read 2h, write h)
    ]
    if model.rotary:
        # backward rotates the gradient back (no saved input): the forward's bytes again
        ops.append(Op("rotary", "memory", 0.0, rotary_bytes * num_tokens * (a + g) * d / tp, backward_factor=1.0))
    if kernels.kv_repeat and g < a:
        # backward sums the copies' gradients back into g heads: the forward's bytes again
        ops.append(Op("kv_repeat", "memory", 0.0, 2 * ACT_BYTES * num_tokens * (g + a) * d / tp, backward_factor=1.0))
    if model.dropout:  # the fused bias-dropout-add kernels also write a 1-byte mask each; backward reads it
        ops.append(Op("dropout_masks", "memory", 0.0, 2 * local * h, backward_factor=1.0))
    return ops


def layer_ops(model: ModelSpec, num_tokens: float, kv_len: float, tp: int, sp: bool, moe: bool,
              local_experts: int | None = None, attention: str = "flash", expert_tp: bool = True,
              kernels: Kernels = FUSED) -> list[Op]:
    """All forward ops of one dense (``moe=False``) or MoE layer on one device."""
    ops = attention_ops(model, num_tokens, kv_len, tp, attention, kernels) + elementwise_ops(model, num_tokens, tp, sp, kernels)
    if moe:
        return ops + moe_ops(model, num_tokens, tp, sp, local_experts, expert_tp, kernels)
    return ops + mlp_ops(model, num_tokens, model.ffn_hidden_size, tp, kernels=kernels)


def head_ops(model: ModelSpec, num_tokens: float, tp: int) -> list[Op]:
    """Final norm, LM head GEMM and the vocab-parallel cross-entropy (fp32 logits)."""
    h, v = model.hidden_size, model.vocab_size
    return [
        Op("final_norm", "memory", 0.0, ACT_BYTES * num_tokens * h * 2),
        _gemm("lm_head", num_tokens, h, v / tp, high_precision=True),
        Op("cross_entropy", "memory", 0.0, 4.0 * num_tokens * v / tp * 3),  # fp32 read, exp, write
    ]


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs per token for MFU: ``6 N + 12 L s a d`` (PaLM, Chowdhery et al. 2022, app. B),
    with the attention term halved for causal attention (``causal``, the default), and cut to the
    window's band in sliding-window layers.

    ``N`` counts the active parameters that take part in matrix multiplies (input embedding
    lookup excluded, LM head included); the attention term counts scores and values, forward and
    backward. A causal kernel executes only the lower half of the score matrix
    (``Op.causal_fraction``): counting the full square (the PaLM count, ``causal=False``) credits
    FLOPs no kernel runs, and with a fast attention kernel (FlashAttention-3 on Hopper) MFU could
    then exceed the device's matmul ceiling. clusterplan's MFU counts the executed half, as
    Megatron-LM (since March 2025), NeMo and MaxText do; the PaLM count is reported beside it
    (``mfu_palm_count``) for comparison with figures published that way (PaLM, Narayanan et al. 2021).
    """
    n_matmul = model.num_active_params - model.embedding_params
    if model.tied_embeddings:
        n_matmul += model.embedding_params  # the tied matrix still does the LM-head GEMM
    qk, v = model.attention_dims
    attention = 6.0 * model.num_layers * seq_len * model.num_attention_heads * (qk + v)
    return 6.0 * n_matmul + attention * (model.attention_pair_fraction(seq_len) if causal else 1.0)


def megatron_flops_per_iteration(model: ModelSpec, batch: int, seq_len: int, recompute: bool) -> float:
    """Narayanan et al. 2021 eq. (3) (with full recompute) or its 72-factor form without it.

    ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))`` counts the recomputed forward; without recompute
    the factor is 72 and the last term ``V/(12 L h)`` (Korthikanti et al. 2022). Valid for the
    GPT-3 shape (``f = 4h``, multi-head attention, GELU); used to check the op counts above.
    """
    h, L, V = model.hidden_size, model.num_layers, model.vocab_size
    if recompute:
        return 96.0 * batch * seq_len * L * h * h * (1 + seq_len / (6 * h) + V / (16 * L * h))
    return 72.0 * batch * seq_len * L * h * h * (1 + seq_len / (6 * h) + V / (12 * L * h))
