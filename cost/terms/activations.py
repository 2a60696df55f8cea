"""What a layer keeps for its backward: activation bytes per layer and per token (Korthikanti et al. 2022, generalised).

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from clusterplan.cost.terms.context import Context, HF_MODEL_CODE, LLMFOUNDRY_MODEL_CODE
from clusterplan.models.ops import ACT_BYTES
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.precisions import low_precision


FUSED_LOSS_LOGIT_BYTES = 4.0
"""Bytes per logit a fused cross-entropy kernel holds at its peak: the 16-bit logits it saves for
backward and the 16-bit gradient its backward writes (a per-row log-sum-exp besides). llm-foundry's
MPT defaults to it (``llmfoundry/models/mpt/modeling_mpt.py``: ``loss_fn`` 'fused_crossentropy',
flash-attn's ``CrossEntropyLoss`` on its ``xentropy_cuda_lib``, installed by the ``gpu`` extras at
commit b2a43a147); the same 4.0 the GPU probe measured for a compiled loss (torchtitan profile,
``compiled_logit_bytes``)."""


HF_LOGIT_BYTES = 12.0
"""Bytes per logit a transformers causal-LM loss holds at its peak (``logits = logits.float()``,
``logits[..., :-1, :].contiguous()``, ``CrossEntropyLoss``): at the forward's end the fp32 logits,
the shifted fp32 copy and log_softmax's saved output (3 x 4 B; the bf16 logits are freed once cast),
and in backward log_softmax's output, the incoming gradient and its own (3 x 4 B). torchtitan's
``cross_entropy(pred.float())`` peaked at the measured 12.0 B at the same backward step
(benchmarks/gpu_probe.py)."""


MODEL_CODE_LOGIT_BYTES = {HF_MODEL_CODE: HF_LOGIT_BYTES, LLMFOUNDRY_MODEL_CODE: FUSED_LOSS_LOGIT_BYTES}
"""Bytes per logit of the loss of model code that brings its own; other code: the profile's."""


def op_sac_recomputed_share(model: ModelSpec, op) -> float:
    """The share of a forward op that torchtitan's per-op selective checkpointing re-runs in backward.

    Its policy (torchtitan distributed/activation_checkpoint.py) saves the outputs of matmuls, SDPA
    and reduce-scatters, except every second matmul of a layer. A Llama-style layer runs wq, wk, wv,
    wo, w1, w3, w2: wk, wo and w3 (gelu: fc2) are recomputed, and so is every element-wise op
    (norms, residual adds, rotary, the activation)."""
    if op.kind == "memory" and not op.core:
        return 1.0
    d_qk, d_v = model.attention_dims
    a, g = model.num_attention_heads, model.num_kv_heads_resolved
    if op.name == "qkv":
        return g * d_qk / (a * d_qk + g * d_qk + g * d_v)
    if op.name == "attn_out":
        return 1.0
    if op.name == "mlp_up" and model.mlp_matrices == 3:
        return 0.5  # w3 of w1 and w3
    if op.name == "mlp_down" and model.mlp_matrices == 2:
        return 1.0  # fc1 is the 5th matmul (saved), fc2 the 6th (recomputed)
    return 0.0


def op_sac_activation_bytes(model: ModelSpec, n: float, tp: int, sp: bool, compiled: bool = False,
                            attention_saved: bool = True) -> float:
    """Stored activations of one dense layer under torchtitan's per-op selective checkpointing
    (:func:`op_sac_recomputed_share`): the layer input ``2nh``, Q ``2n a d``, V ``2n g d``, the SDPA
    output ``2n a d`` (and its fp32 log-sum-exp), the first up projection ``2nf`` and the down
    projection's output ``2nh`` (swiglu; gelu keeps fc1's ``2nf`` and recomputes fc2), plus the two
    reduce-scatter outputs ``2 x 2nh`` under tensor parallelism. Tensor-parallel regions divide by
    ``tp``; torchtitan's TP always shards the sequence. ``attention_saved=False``: the SDPA output and
    its log-sum-exp are not kept (:meth:`ProfileAt.op_sac_saves_attention`)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    d_qk, d_v = model.attention_dims
    a, g = model.num_attention_heads, model.num_kv_heads_resolved
    sharded = ACT_BYTES * n * (a * d_qk + g * d_v + f)
    if attention_saved:
        sharded += ACT_BYTES * n * a * d_v + 4.0 * n * a  # the SDPA output and its fp32 log-sum-exp
    if model.mlp_matrices == 3 and not compiled:
        # w2's output (the 7th matmul, saved by the policy though backward never reads it; the
        # compiled graph drops it: measured, benchmarks/compare_probe.py)
        sharded += ACT_BYTES * n * h
    replicated = ACT_BYTES * n * h * (1 + (2 if tp > 1 else 0))
    return (replicated + sharded) / tp if sp or tp == 1 else replicated + sharded / tp


def dots_activation_bytes(model: ModelSpec, n: float, tp: int, sp: bool) -> float:
    """Stored activations of one dense layer under MaxText's ``remat_policy: minimal``
    (``semantics.selective_recompute: dots``): ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``
    until 2025-08 (MaxText ``MaxText/layers/models.py`` at 4378403a, 2024-06), the same outputs by
    name since (``minimal_policy``, 6426085e, 2025-08-29: query_proj, key_proj, value_proj, out_proj,
    mlpwi_0, mlpwi_1, mlpwo). The scanned layer keeps its input ``2nh`` (the remat's argument), Q
    ``2n a d``, K and V ``2n g d``, the out-projection's output ``2nh`` (the residual the MLP's norm
    reads is rebuilt from it) and the MLP's up projections, ``2nf`` each: ``5h + 2f`` elements a token
    for MHA and SwiGLU. Not kept: the down projection's output (saveable, but no backward reads it
    and JAX's remat drops such residuals), the norms, the rotary, the attention core (its dots have
    batch dimensions; a flash kernel's output is not a dot) and the activation function, which
    backward re-runs (:func:`dots_recomputed_share`). The forward scan's residuals of a jaxpr under
    either policy are exactly these (``benchmarks/xla_tpu_probe.py``; XLA's TPU buffers 13.6 layer
    inputs a layer against these 13, as full recomputation holds 1.9 against 1). MaxText shards the
    embed dimension over the tensor axis (``sp``), so everything divides by ``tp``."""
    h = model.hidden_size
    d_qk, d_v = model.attention_dims
    a, g = model.num_attention_heads, model.num_kv_heads_resolved
    replicated = ACT_BYTES * n * h * 2  # the layer input and the out-projection's output
    sharded = ACT_BYTES * n * (a * d_qk + g * d_qk + g * d_v + (model.mlp_matrices - 1) * model.ffn_hidden_size)
    return (replicated + sharded) / tp if sp or tp == 1 else replicated + sharded / tp


def dots_recomputed_share(op) -> float:
    """The share of a forward op that backward re-runs under MaxText's ``minimal`` policy
    (:func:`dots_activation_bytes`): the attention core and every element-wise op (norms, rotary,
    the activation function), one of the two residual adds (the one into the MLP's norm); no GEMM,
    whose outputs are saved or never read."""
    if op.core:
        return 1.0
    if op.kind != "memory":
        return 0.0
    return 0.5 if op.name == "residuals" else 1.0


def _score_elements(ctx: Context, n: float) -> float:
    """Attention scores of one layer over all heads (``a n s``; each device holds ``1/tp``); 0 with
    flash attention, which never materialises them."""
    if ctx.job.attention != "unfused":
        return 0.0
    return ctx.model.num_attention_heads * n * ctx.job.seq_len


def fp8_saved_inputs(ctx: Context) -> float:
    """Bytes per element of the low-precision input copy a job's linears keep for the weight
    gradient, where its framework keeps one (``semantics.fp8_saved_inputs``: Transformer Engine under
    Megatron keeps the column-wise FP8, MXFP8 or NVFP4 copy, scales included); 0: none kept."""
    fmt = low_precision(ctx.job.precision)
    return fmt.element_bytes if fmt and ctx.job.profile.profile.fp8_saved_inputs else 0.0


def activation_bytes(model: ModelSpec, n: float, tp: int, sp: bool, recompute: str, moe: bool,
                     score_elements: float = 0.0, eager: bool = False, kv_repeat: bool = False,
                     fp32_norms: bool = False, fp8_inputs: float = 0.0, glu_input: float = ACT_BYTES) -> float:
    """Stored activations of one layer for one micro-batch (Korthikanti et al. 2022, section 4).

    Generalises ``s b h (34 + 5 a s / h)`` to GQA, any FFN width, SwiGLU and MoE. With flash
    attention there is no ``5 a s^2 b`` score term; with unfused attention (``score_elements`` > 0)
    the softmax output is kept (2 bytes per score) and, with dropout, its mask and output (1 + 2
    bytes): Korthikanti's ``5 a s^2 b``. Selective recomputation re-runs the attention core and so
    drops the scores (Korthikanti's selective ``34 s b h / t``; with flash attention nothing large):
    layer norms ``4 n h``, attention input ``2 n h``, Q/K/V ``2 n (a + 2g) d`` (MLA: its own
    query/key and value widths), attention output
    ``2 n a d``, MLP input ``2 n h``, MLP intermediates ``2 n f (1 + ups)``, dropout masks ``2 n h``
    (1 byte each, when the model uses dropout). Tensor-parallel regions divide by ``tp``; with
    sequence parallelism everything does. Full recomputation keeps only the layer input ``2 n h``.

    ``eager``: the layer is written as eager PyTorch modules (torchtitan's Llama model), and autograd
    keeps what each op saves rather than what a fused kernel keeps: SwiGLU's ``w2(silu(w1 x) * w3 x)``
    keeps ``w1 x``, its silu, ``w3 x`` and the product (``4 x 2 n f`` against 3). ``kv_repeat``:
    GQA's K and V are repeated per query head before attention (``repeat_kv``), so attention keeps
    them at ``a`` heads. Both measured to 1% on torchtitan's own block by ``benchmarks/gpu_probe.py``
    (``benchmarks/compare_probe.py``; docs/cost-model.md), as were op-SAC and full recomputation.
    ``fp32_norms``: the norms upcast to fp32 as Hugging Face's ``LlamaRMSNorm`` does
    (``HF_MODEL_CODE``): each keeps its fp32 input copy (``4 n h``, saved by ``pow``) and the
    bf16-cast normalised tensor (``2 n h``, saved by the weight multiply) instead of its bf16 input.
    ``fp8_inputs``: low-precision training under Transformer Engine (:func:`fp8_saved_inputs`, the
    bytes per element; 0: none): the linears keep their low-precision inputs (the attention and MLP
    inputs, the MLP activation output, the experts' inputs), 1 byte per element in FP8, and the
    out-projection keeps such a copy of the attention output beside the 16-bit one the attention
    backward needs. ``glu_input``: SwiGLU's input bytes (:func:`glu_input_bytes`).
    """
    h = model.hidden_size
    lin = linear_input_bytes(fp8_inputs)
    # layer-norm inputs 2 x 2nh bytes, attention and MLP inputs (the linears' inputs), masks 1 byte x 2nh
    replicated = ACT_BYTES * n * h * 2 + lin * n * h * 2 + (2 * n * h if model.dropout else 0)
    if fp32_norms:  # two norms, each keeping 4 + 2 B (fp32 copy, normalised) for the 2 B input counted above
        replicated += 2 * 4.0 * n * h
    if recompute == "full":
        return ACT_BYTES * n * h / (tp if sp else 1)
    sharded = _attention_kept_bytes(model, n, recompute, score_elements, kv_repeat, fp8_inputs)
    kept = mlp_kept_tensors(model, eager)
    if moe:
        sharded += moe_mlp_activation_bytes(model, n, kept, lin, glu_input)
    else:
        sharded += n * model.ffn_hidden_size * mlp_width_bytes(kept, lin, glu_input)
    if sp:
        return (replicated + sharded) / tp
    return replicated + sharded / tp


def _attention_kept_bytes(model: ModelSpec, n: float, recompute: str, score_elements: float, kv_repeat: bool,
                         fp8_inputs: float) -> float:
    """Q, K, V and the attention output an attention block keeps (before tensor-parallel sharding).
    Selective recomputation re-runs the core attention, but its output stays: the out-projection
    keeps it as its input (Korthikanti et al. Table 2: selective is ``34 s b h / t``, only the
    ``5 a s^2 b`` scores term goes; Megatron-Core's checkpointed core attention returns the output
    that Transformer Engine's linear_proj then saves). In FP8 (``fp8_inputs``) the out-projection
    keeps its FP8 copy beside it."""
    a, g = model.num_attention_heads, model.num_kv_heads_resolved
    d_qk, d_v = model.attention_dims
    g_kv = a if kv_repeat else g
    kept = ACT_BYTES * n * (a * d_qk + g_kv * d_qk + g_kv * d_v) + ACT_BYTES * n * a * d_v
    if fp8_inputs:
        kept += fp8_inputs * n * a * d_v
    if recompute != "selective":
        kept += score_bytes(model, score_elements)
    return kept


def score_bytes(model: ModelSpec, score_elements: float) -> float:
    """What unfused attention keeps of its scores: the softmax output (2 B) and, with dropout, its
    mask and output (1 + 2 B); heads split by tp. Selective recomputation drops exactly this."""
    return score_elements * (ACT_BYTES + (3 if model.dropout else 0))


def mlp_kept_tensors(model: ModelSpec, eager: bool = False) -> int:
    """Tensors of the MLP width an MLP keeps per token: fc1's outputs (GELU one, SwiGLU gate and up),
    the activation's output (fc2's input), and eager SwiGLU's SiLU output besides."""
    ups = model.mlp_matrices - 1
    return 1 + ups + (1 if eager and ups == 2 else 0)


def mlp_width_bytes(kept: int, lin: float, glu_input: float = ACT_BYTES) -> float:
    """Bytes per element of the MLP width for ``kept`` tensors: 16-bit, except the last, fc2's
    input, at ``lin`` bytes (:func:`linear_input_bytes`), and SwiGLU's two inputs (gate and up) at
    ``glu_input`` bytes (:func:`glu_input_bytes`: 1 where Megatron-Core stores them in FP8)."""
    return ACT_BYTES * (kept - 1) + lin - 2 * (ACT_BYTES - glu_input)


def glu_input_bytes(job, model: ModelSpec) -> float:
    """Bytes per element a SwiGLU keeps of its gate and up inputs: 1 where the job stores them in FP8
    (``Job.activation_func_fp8_input_store``: Megatron-Core's ``--activation-func-fp8-input-store``,
    21648b5ab0, 2024-04: the fused bias-SwiGLU saves ``input.to(torch.float8_e4m3fn)``; DeepSeek-V3's
    "inputs of the SwiGLU operator in MoE ... stored in FP8", report s3.3.3), else 16-bit."""
    if job.activation_func_fp8_input_store and model.mlp_matrices == 3:
        return 1.0
    return ACT_BYTES


ROUTER_BYTES_PER_SCORE = 4.0
"""The router's fp32 softmax over every expert, kept for its backward (Megatron-Core
``moe/router.py`` scores in fp32; torchtitan's router likewise)."""


ROUTER_BYTES_PER_CHOICE = 12.0
"""Per chosen expert: its int64 index and the fp32 probability the combine multiplies by and keeps."""


def linear_input_bytes(fp8_inputs: float) -> float:
    """Bytes per element a linear layer keeps of its input for the weight gradient: 16-bit, or the
    low-precision copy (``fp8_inputs`` bytes: 1 in FP8) Transformer Engine keeps in FP8, MXFP8 or
    NVFP4 training (``semantics.fp8_saved_inputs``)."""
    return float(fp8_inputs) if fp8_inputs else float(ACT_BYTES)


def moe_mlp_activation_bytes(model: ModelSpec, n: float, kept: int, lin: float = ACT_BYTES,
                             glu_input: float = ACT_BYTES) -> float:
    """What an MoE MLP keeps for ``n`` tokens (before tensor-parallel sharding) on the most loaded
    expert-parallel rank: the router's scores and choices, the permuted tokens into and out of the
    experts (``2 n top_k h`` each, times the routing's load factor, ``MoESpec.load_factor``; the
    way in is the experts' fc1 input, ``lin`` bytes per element), ``kept`` tensors of the expert
    width per routed token (SwiGLU fused: 3; eager: 4; the last the fc2 input; SwiGLU's inputs at
    ``glu_input`` bytes) and the shared experts' alike."""
    e = model.moe
    routed = n * e.top_k * e.load_factor
    router = n * (e.num_experts * ROUTER_BYTES_PER_SCORE + e.top_k * ROUTER_BYTES_PER_CHOICE)
    per_width = mlp_width_bytes(kept, lin, glu_input)
    return (router + (lin + ACT_BYTES) * routed * model.hidden_size + routed * e.expert_ffn_hidden_size * per_width
            + n * e.num_shared_experts * e.expert_ffn_hidden_size * per_width)
