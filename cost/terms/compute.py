"""Compute of the layers for one micro-batch: time per layer kind on the device's roofline, and the activations it leaves.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from dataclasses import dataclass
from functools import lru_cache

from clusterplan.cost.compute import op_time_s
from clusterplan.cost.terms.activations import _score_elements, activation_bytes, dots_activation_bytes, dots_recomputed_share, fp8_saved_inputs, glu_input_bytes, linear_input_bytes, mlp_kept_tensors, mlp_width_bytes, op_sac_activation_bytes, op_sac_recomputed_share, score_bytes
from clusterplan.cost.terms.context import Context, FUSED_MODEL_CODE, HF_MODEL_CODE, _compute_context, _kind_total, _layer_kinds, _local_experts, _tokens
from clusterplan.models.ops import ACT_BYTES, FUSED, Kernels, layer_ops, linear_op
from clusterplan.models.spec import ModelSpec


def recompute_module_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, ep: int, expert_tp: bool,
                           modules: tuple[str, ...], kind: bool | None = None) -> tuple[float, tuple[float, float]]:
    """Seconds of forward re-run over all layers of one micro-batch, and the bytes one dense and
    one MoE layer no longer keep, for
    Megatron-Core's ``recompute_modules`` (TransformerConfig: "moe_act, layernorm and mla_up_proj use
    output-discarding checkpointing": their outputs are freed once consumed and restored before
    backward; core_attn, mlp and shared_experts checkpoint the module, keeping its input):

    * ``core_attn``: the attention output and any kept scores (as ``recompute="selective"``), the
      attention core again;
    * ``layernorm``: the two norms' outputs (the attention and MLP inputs, ``2 x 2 n h``), the norms;
    * ``mla_up_proj``: the up-projected queries, keys and values (``2 n a (2 d_qk + d_v)``), the
      query and key-value up-projection GEMMs and the rotary;
    * ``mlp`` (dense layers): the MLP intermediates, the MLP;
    * ``moe_act`` (MoE layers): the experts' activation output (``2`` bytes per routed token and
      expert width), the activation;
    * ``shared_experts`` (MoE layers): their intermediates, the shared MLP.

    Sharding as :func:`activation_bytes`: the norms' outputs are replicated across tensor-parallel
    ranks unless sequence parallelism splits them; the rest is split ``tp`` ways."""
    model, job = ctx.model, ctx.job
    n = _tokens(ctx, cp, mbs)
    dev, prec = ctx.cluster.device, job.gemm_format
    kernels = layer_kernels(ctx)
    rec, dropped = 0.0, [0.0, 0.0]
    for moe, count in _layer_kinds(model, kind):
        ops = {op.name: op for op in layer_ops(model, n, job.seq_len, tp, sp, moe, _local_experts(model, ep) if moe else None,
                                                job.attention, expert_tp, kernels)}
        names, replicated, sharded = _recompute_module_parts(ctx, n, modules, moe, kernels)
        rerun = [ops[name] for name in names if name in ops]
        if "core_attn" in modules:
            rerun += [op for op in ops.values() if op.core]
        if "mla_up_proj" in modules and model.mla is not None:
            rerun += _mla_up_ops(model, n, tp)
        rec += count * sum(op_time_s(op, dev, prec) for op in rerun)
        dropped[moe] = (replicated / tp if sp else replicated) + sharded / tp
    return rec, (dropped[0], dropped[1])


def _recompute_module_parts(ctx: Context, n: float, modules: tuple[str, ...], moe: bool,
                            kernels: Kernels) -> tuple[list[str], float, float]:
    """For one layer kind: the layer's ops re-run, by name (the attention core and MLA's
    up-projection GEMMs are added by the caller), and the bytes no longer kept, replicated and
    tensor-parallel-split (before dividing)."""
    model = ctx.model
    h, a = model.hidden_size, model.num_attention_heads
    d_qk, d_v = model.attention_dims
    lin = linear_input_bytes(fp8_saved_inputs(ctx))
    per_width = mlp_width_bytes(mlp_kept_tensors(model, kernels.eager), lin, glu_input_bytes(ctx.job, model))
    names, replicated, sharded = [], 0.0, 0.0
    if "core_attn" in modules:  # only the scores: the output stays as the out-projection's input
        sharded += score_bytes(model, _score_elements(ctx, n))
    if "layernorm" in modules:
        names.append("norms")
        replicated += 2 * lin * n * h
    if "mla_up_proj" in modules and model.mla is not None:
        names.append("rotary")
        sharded += ACT_BYTES * n * a * (2 * d_qk + d_v)
    if "mlp" in modules and not moe:
        names += ["mlp_up", "mlp_act", "mlp_down"]
        sharded += n * model.ffn_hidden_size * per_width
    if "moe_act" in modules and moe:
        names.append("experts_act")
        sharded += lin * n * model.moe.top_k * model.moe.load_factor * model.moe.expert_ffn_hidden_size
    if "shared_experts" in modules and moe and model.moe.num_shared_experts:
        names += ["shared_up", "shared_act", "shared_down"]
        sharded += n * model.moe.num_shared_experts * model.moe.expert_ffn_hidden_size * per_width
    return names, replicated, sharded


def _mla_up_ops(model: ModelSpec, n: float, tp: int) -> list:
    """MLA's query and key-value up-projection GEMMs (the query is projected straight from the
    hidden state when ``q_lora_rank`` is 0, not an up-projection)."""
    m, a = model.mla, model.num_attention_heads
    ops = [linear_op("kv_up", n, m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim) / tp)]
    if m.q_lora_rank:
        ops.append(linear_op("q_up", n, m.q_lora_rank, a * (m.qk_nope_head_dim + m.qk_rope_head_dim) / tp))
    return ops


@dataclass(frozen=True, slots=True)
class ComputeTerms:
    """Compute of all layers for one micro-batch, and what it leaves in memory."""

    forward_s: float
    backward_s: float
    recompute_s: float
    gemm_s: float  # forward + backward GEMM time, what TP overlap can hide behind
    act_bytes_per_layer: float
    act_transient_bytes: float
    gemm_bwd_s: float = 0.0  # backward GEMMs alone
    attn_s: float = 0.0  # attention core, forward + backward: what the context-parallel ring hides behind
    attn_bwd_s: float = 0.0  # its backward alone
    act_kind_bytes: tuple[float, float] = (0.0, 0.0)  # stored activations of one dense and one MoE layer

    def dp_window_s(self, tp_overlap: bool, cp: int) -> float:
        """The backward compute left to hide one gradient reduction behind, per micro-batch.

        One stretch of compute hides one stream of communication in this model: with TP overlap the
        GEMMs are TP's window, with context parallelism the attention core is the ring's. So no
        second of compute is counted twice, and more compute never makes a layout faster.
        """
        return max(0.0, self.backward_s - (self.gemm_bwd_s if tp_overlap else 0.0)
                   - (self.attn_bwd_s if cp > 1 else 0.0))

    def fsdp_window_s(self, tp_overlap: bool, cp: int, ep_overlap: bool = False) -> float:
        """The compute left to hide per-micro-batch ZeRO-2/3 traffic behind (see :meth:`dp_window_s`);
        none with EP overlap, whose all-to-alls take it (:meth:`ep_window_s`)."""
        return 0.0 if ep_overlap else self.ep_window_s(tp_overlap, cp)

    def ep_window_s(self, tp_overlap: bool, cp: int) -> float:
        """The compute of one micro-batch that another's expert all-to-alls can hide behind under EP
        overlap: all of it, less TP overlap's GEMMs and the context-parallel ring's attention."""
        whole = self.forward_s + self.backward_s + self.recompute_s
        return max(0.0, whole - (self.gemm_s if tp_overlap else 0.0) - (self.attn_s if cp > 1 else 0.0))


def compute_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, ep: int = 1,
                  expert_tp: bool = True, kind: bool | None = None) -> ComputeTerms:
    """Compute of all layers (``kind``: of the dense or of the MoE layers alone) for one
    micro-batch and the activations it leaves (:class:`ComputeTerms`)."""
    # keyed by what the terms depend on: the tokens of one micro-batch on one rank (cp x mbs pairs of
    # one ratio share them) and the experts on a rank (every ep of a dense model shares them)
    return _compute_terms(_compute_context(ctx), tp, _tokens(ctx, cp, mbs), sp, recompute,
                          _local_experts(ctx.model, ep), expert_tp, kind)


@lru_cache(maxsize=65536)
def _compute_terms(ctx: Context, tp: int, n: float, sp: bool, recompute: str, local_experts: int | None,
                   expert_tp: bool, kind: bool | None = None) -> ComputeTerms:
    model = ctx.model
    fwd = bwd = gemm = attn = gemm_bwd = attn_bwd = sac_rec = 0.0
    for moe, count in _layer_kinds(model, kind):
        t = _kind_times(ctx, tp, n, sp, moe, local_experts if moe else None, expert_tp)
        fwd, bwd, gemm, attn = fwd + count * t[0], bwd + count * t[1], gemm + count * t[2], attn + count * t[3]
        gemm_bwd, attn_bwd = gemm_bwd + count * t[4], attn_bwd + count * t[5]
        saved = _op_sac_saved(ctx, recompute, moe)
        # per-op SAC re-runs what it does not save; an unsaved attention runs its forward again;
        # MaxText's minimal re-runs the attention core and the element-wise ops (dots_*)
        sac_rec += count * (t[7] if _dots_saved(ctx, recompute, moe) else
                            t[3] if saved is None else t[6] + (0.0 if saved else t[3]))
    # full: the whole forward again; selective: Megatron-Core checkpoints the core-attention module,
    # so one more flash forward; torchtitan's per-op SAC re-runs what it does not save (op_sac_*)
    rec = {"full": fwd, "selective": sac_rec}.get(recompute, 0.0)
    dense, moe, transient = _activation_terms(ctx, tp, n, sp, recompute)
    act = _kind_total(model, (dense, moe)) / model.num_layers
    return ComputeTerms(fwd, bwd, rec, gemm, act, transient, gemm_bwd, attn + attn_bwd, attn_bwd, (dense, moe))


def activation_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str) -> tuple[float, float, float]:
    """Stored activations of one dense and of one MoE layer (0 for a kind the model lacks) and one
    layer's transient working memory, for one micro-batch: :class:`ComputeTerms`' memory without its
    times (the search's memory tables)."""
    return _activation_terms(_compute_context(ctx), tp, _tokens(ctx, cp, mbs), sp, recompute)


def _op_sac_saved(ctx: Context, recompute: str, moe: bool) -> bool | None:
    """Under torchtitan's per-op selective checkpointing of a dense layer, whether it saves the
    attention's output (:meth:`ProfileAt.op_sac_saves_attention`); None where it does not apply."""
    if recompute != "selective" or ctx.job.profile.profile.selective_recompute != "op_sac" or moe:
        return None
    return ctx.job.profile.op_sac_saves_attention(ctx.cluster.device.compute_capability)


def _dots_saved(ctx: Context, recompute: str, moe: bool) -> bool:
    """Whether a layer keeps what MaxText's ``remat_policy: minimal`` keeps (:func:`dots_activation_bytes`):
    selective recomputation under a profile of that kind, in a dense layer with plain attention (MoE
    and MLA layers, whose extra dots are not counted, are priced as the attention-core kind)."""
    return (recompute == "selective" and ctx.job.profile.profile.selective_recompute == "dots" and not moe
            and ctx.model.mla is None)


@lru_cache(maxsize=65536)
def _activation_terms(ctx: Context, tp: int, n: float, sp: bool, recompute: str) -> tuple[float, float, float]:
    model = ctx.model
    kernels = layer_kernels(ctx)
    style = {"eager": kernels.eager, "kv_repeat": kernels.kv_repeat, "fp32_norms": ctx.job.model_code == HF_MODEL_CODE,
             "fp8_inputs": fp8_saved_inputs(ctx), "glu_input": glu_input_bytes(ctx.job, model)}
    act, transient = [0.0, 0.0], 0.0
    for moe, _ in _layer_kinds(model):
        saved, dots = _op_sac_saved(ctx, recompute, moe), _dots_saved(ctx, recompute, moe)
        if dots:
            act[moe] = dots_activation_bytes(model, n, tp, sp)
        elif saved is not None:
            act[moe] = op_sac_activation_bytes(model, n, tp, sp, ctx.job.compiled, saved)
        else:
            act[moe] = activation_bytes(model, n, tp, sp, recompute, moe, _score_elements(ctx, n), **style)
        if dots or saved is not None or recompute == "full":  # the layer being recomputed holds its full activations once
            transient = max(transient, activation_bytes(model, n, tp, sp, "none", moe, _score_elements(ctx, n), **style))
    return act[0], act[1], transient


def layer_kernels(ctx: Context) -> Kernels:
    """How the job's layers run their element-wise passes (:class:`models.ops.Kernels`): eager
    PyTorch ops for a Hugging Face transformers class (``HF_MODEL_CODE``: its ``LlamaRMSNorm`` is
    always PyTorch ops) and for a profile of eager modules (``semantics.eager_activations``, with
    its release's RMSNorm kernel, and its rotary kernel where ``semantics.fused_rotary`` says it is
    fused) not run under ``torch.compile``; K and V copied per query head
    where the code calls ``repeat_kv`` (compiled or not: the copy is the graph's output either way).
    A model of fused kernels (``FUSED_MODEL_CODE``) runs none of these. The unfused attention's
    softmax is fused only for the shapes the release's kernel takes (``semantics.softmax_fusion_history``)."""
    prof = ctx.job.profile
    if ctx.job.model_code == FUSED_MODEL_CODE:
        return FUSED
    hf = ctx.job.model_code == HF_MODEL_CODE
    eager = hf or (prof.profile.eager_activations and not ctx.job.compiled)
    return Kernels(eager=eager, composite_norm=eager and (hf or prof.eager_norm_composite),
                   kv_repeat=hf or prof.kv_repeated, fused_rotary=not hf and prof.profile.fused_rotary,
                   softmax_rule=prof.softmax_rule)


@lru_cache(maxsize=32)
def _op_times(ctx: Context) -> dict:
    """``(op, backward) -> seconds`` of one compute context (its device and GEMM format), filled by
    :func:`_kind_times`: the layer kinds it is asked for share most of their ops (an MoE layer's
    attention at every ep; DeepSeek-V3 on 576 GB200 asks 49,656 op times, 3,680 of them distinct)."""
    return {}


@lru_cache(maxsize=65536)
def _kind_times(ctx: Context, tp: int, n: float, sp: bool, moe: bool,
                local_experts: int | None, expert_tp: bool = True) -> tuple[float, ...]:
    """Forward, backward, GEMM (fwd+bwd), attention-forward, backward-GEMM, attention-backward,
    per-op-SAC recompute and MaxText-minimal recompute time of one layer of a kind."""
    dev, prec = ctx.cluster.device, ctx.job.gemm_format
    ops = layer_ops(ctx.model, n, ctx.job.seq_len, tp, sp, moe, local_experts, ctx.job.attention,
                    expert_tp, layer_kernels(ctx))
    # each op priced once forward and once backward; the sums run in the ops' order, as
    # cost.compute.ops_time_s does
    times = _op_times(ctx)

    def priced(op, backward: bool) -> float:
        if (op, backward) not in times:
            times[op, backward] = op_time_s(op, dev, prec, backward)
        return times[op, backward]
    fwd = [priced(op, False) for op in ops]
    bwd = [priced(op, True) for op in ops]
    gemm = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    core = [i for i, op in enumerate(ops) if op.core]
    gemm_bwd = sum(bwd[i] for i in gemm)
    return (sum(fwd), sum(bwd), sum(fwd[i] for i in gemm) + gemm_bwd, sum(fwd[i] for i in core), gemm_bwd,
            sum(bwd[i] for i in core),
            sum(share * fwd[i] for i, op in enumerate(ops) if (share := op_sac_recomputed_share(ctx.model, op))),
            sum(share * fwd[i] for i, op in enumerate(ops) if (share := dots_recomputed_share(op))))
