"""Cost terms, each a pure function of the few knobs it depends on.

The step time and memory are assembled from these in ``cost.step``; the search tabulates each term
over its own small domain (``planner.search.space``). Keeping a term's inputs explicit is what lets the
CP-SAT model stay small: compute depends on tp, cp, micro-batch and recompute; a collective on its
axis degree and placement; the bubble on pp, vp and the micro-batch count.

All results are seconds or bytes for one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from clusterplan.cost import collectives as coll
from clusterplan.cost.compute import memory_rate, op_time_s, ops_time_s
from clusterplan.cost.layout import Job, Layout, interleaved_warmup, split_order
from clusterplan.cost.stages import rank_index, rank_layers
from clusterplan.models.ops import ACT_BYTES, FUSED, Kernels, head_ops, layer_ops, linear_op
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.precisions import low_precision

OPTIMIZER_STATE_BYTES = 12.0  # fp32 master weights + two fp32 moments (Rajbhandari et al. 2020)
WEIGHT_BYTES = 2.0  # 16-bit weights (FP8 training keeps 16-bit masters of the weights in use)
NUM_GRAD_BUCKETS = 8  # the last of the bucketed gradient reductions cannot overlap (PyTorch DDP, Megatron DDP)
HF_MODEL_CODE = "huggingface"
"""``Job.model_code`` of a Hugging Face transformers model class (transformers 4.36 to 4.45, read at
``models/llama/modeling_llama.py``): eager modules, so autograd keeps what each op saves
(``activation_bytes``): SwiGLU keeps ``gate``, its SiLU, ``up`` and their product (``eager``);
``repeat_kv`` materialises K and V per query head (``kv_repeat``); ``LlamaRMSNorm`` upcasts to fp32
(``fp32_norms``); the rotary embedding keeps nothing large (its multiplies save only cos and sin,
which need no gradient) and the attention output's ``transpose(1, 2).contiguous()`` copies nothing.
The loss holds ``HF_LOGIT_BYTES`` per logit."""
FUSED_MODEL_CODE = "fused"  # a model of fused kernels (Transformer Engine layers) under any framework
LLMFOUNDRY_MODEL_CODE = "llmfoundry"  # llm-foundry's MPT modules (Composer FSDP, priced with the torchtitan profile)
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
RUNTIME_RESERVE_BYTES = 1.0 * 2**30
"""Device memory outside the framework's allocator where no measurement applies (XLA on TPU, HCCL on
Gaudi, the Neuron runtime, MaxText anywhere): a placeholder (docs/cost-model.md). The GPU frameworks
that run on PyTorch and NCCL (``semantics.nccl_runtime``) on NVIDIA and AMD devices count the CUDA
context and NCCL's buffers instead (``runtime_bytes``)."""
CUDA_CONTEXT_EAGER_BYTES = 1573 * 2**20
"""The CUDA context with every kernel module loaded at start-up: ``nvidia-smi`` after
``torch.ones(1).cuda()`` on an A100 40GB, PyTorch of February 2022 (BigScience tr11 chronicles-prequel:
"40GB A100 takes 1573MiB for cuda kernels"; 1271 MiB on V100 in 2021)."""
CUDA_CONTEXT_LAZY_BYTES = 883_752_960
"""The same with lazy module loading: device memory in use outside PyTorch's allocator on one H100,
torch 2.11 + CUDA 13.0, before NCCL (``context_bytes``, benchmarks/results/gpu_probe_h100_2026-11-26.json;
0.806 GB on H200)."""
LAZY_LOADING_SINCE = "2022-11"
"""PyTorch 1.13 (2022-10-28) sets ``CUDA_MODULE_LOADING=LAZY`` when the user has not (pytorch/pytorch
#86509: 287 MB instead of 667 MB for one small program); frameworks dated from then on load lazily."""
NCCL_COMMUNICATOR_BYTES = 688e6
"""Device memory one NCCL communicator of three or more ranks holds once it has run a collective:
its per-channel FIFOs (Simple 4 MiB, LL128 4.7 MB, LL 0.5 MB per connection: 9.19 MiB; ring and
tree connections on every channel). Measured through PyTorch process groups on 4 A100 with NVLink
after a 4 MB all-reduce (NVIDIA/nccl#964, 2023): 688 MB; two ranks 544 MB. NCCL's maintainers: more
communicators use more memory, linear in the channel count, no longer growing beyond two nodes
(NVIDIA/nccl#864, #986)."""
NCCL_PAIR_COMMUNICATOR_BYTES = 544e6
"""The same for a communicator of two ranks (NVIDIA/nccl#964): a pipeline stage's sends to its neighbour."""
NCCL_LAZY_CONNECT_SINCE = "2024-07"
"""NCCL 2.22.3 (2024-06-11, commit 178b6b75: "Add lazy connection establishment for collective
operations ... reduce memory usage"; NCCL_RUNTIME_CONNECT=1 by default) connects an algorithm's
peers and allocates their buffers at its first collective; before, ``initTransportsRank`` connected
the ring and the tree of every channel at start-up. From then a communicator is charged its ring
share of the measured figure (``NCCL_RING_SHARE``); frameworks dated from 2024-07 on (NGC containers
of that month ship 2.22) pay that."""
NCCL_RING_SHARE = {2: 1 / 2, 3: 1 / 3}
"""The ring's connections among those measured per channel: one receive connection of three (ring,
tree up, tree down) for three or more ranks, one of two for a pair. Training collectives at their
sizes run the ring (reduce-scatter and all-gather have no tree); derived, not measured: a small
all-reduce on the tree would add its connections."""
# Bytes per logit held by the loss: the framework's (semantics.logit_bytes: Megatron's fused
# vocab-parallel cross-entropy 6, torchtitan's fp32 cross-entropy 10).
# Overlapped communication is not free: its kernels occupy SMs (one CTA per NCCL channel, or the
# SMs a userbuffers kernel is launched on) that the compute it overlaps loses. Where a device has
# no SM figure, or a framework profile gives no SM count (TPU DMA engines, graph-compiled
# machines), this share is assumed: a placeholder, reported as unvalidated (docs/cost-model.md).
UNMEASURED_OVERLAP_SHARE = 0.10


@dataclass(frozen=True, eq=False)
class Context:
    """The fixed inputs of one planning problem.

    Every term is cached on (context, knobs); hashing the pydantic model each time would dominate,
    so the hash is computed once. Two contexts are equal when they ask the same terms: the same
    model, the same job up to its global batch, tokens to train and reliability (no cached term
    reads those: the number of micro-batches is passed in), and the same cluster object. So the
    points of a sweep over the batch share every term.

    The context also fixes the placement: terms that take a stride ask ``cluster`` as given, so
    their caller passes ``placed(layout.order)``; terms that take a layout or an order place it
    themselves. Compute and memory ignore placement and are cached on the unplaced context.
    """

    model: ModelSpec
    job: Job
    cluster: Cluster

    def __post_init__(self) -> None:
        key = (self.model, self.job.term_key, id(self.cluster))
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))
        # the same problem with ranks as device ids (see placed)
        base = self if self.cluster.base is None else Context(self.model, self.job, self.cluster.base)
        object.__setattr__(self, "_base", base)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self._key == other._key

    def placed(self, order: str) -> "Context":
        """This problem with ranks laid on the chips as ``order``'s torus traversal says (itself for
        the default traversal). Fabric questions then answer for that placement; memory and compute
        do not depend on it. One object per traversal, so the term caches hit."""
        traversal = split_order(order)[1]
        if traversal == self.cluster.traversal:
            return self
        return _placed_context(self._base, traversal)


@lru_cache(maxsize=64)
def _placed_context(base: Context, traversal: str) -> Context:
    cluster = base.cluster.placed(traversal)
    if cluster is base.cluster:
        return base
    ctx = Context(base.model, base.job, cluster)
    object.__setattr__(ctx, "_base", base)
    return ctx


@dataclass(frozen=True, slots=True)
class LayerTerms:
    """All transformer layers, one micro-batch, one device (as if the whole model sat on it)."""

    forward_s: float  # compute of the forward pass
    backward_s: float  # compute of the backward pass
    recompute_s: float  # forward recomputed during backward
    tp_comm_s: float  # exposed tensor-parallel collectives
    cp_comm_s: float  # exposed context-parallel ring traffic
    ep_comm_s: float  # expert-parallel all-to-all (dispatch + combine)
    act_bytes_per_layer: float  # stored activations per layer (average over layers)
    act_transient_bytes: float  # extra working memory of one layer's backward
    act_kind_bytes: tuple[float, float] = (0.0, 0.0)  # stored activations of one dense and one MoE layer

    @property
    def total_s(self) -> float:
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_comm_s
                + self.cp_comm_s + self.ep_comm_s)


def _tokens(ctx: Context, cp: int, mbs: int) -> float:
    return mbs * ctx.job.seq_len / cp


def layer_terms(ctx: Context, layout: Layout, m: int = 1, kind: bool | None = None) -> LayerTerms:
    """Per-micro-batch layer terms; depends on tp, cp, ep, mbs, sp, recompute, placement, the
    overlaps, and (EP overlap only) the ``m`` micro-batches per step and the pipeline. ``kind``:
    the model's dense layers alone (False) or its MoE layers alone (True); None: all of them."""
    if layout.recompute_layers and layout.recompute == "full":
        return _partial_recompute_terms(ctx, layout, m, kind)
    if layout.recompute_modules and layout.recompute == "selective":
        return _module_recompute_terms(ctx, layout, m, kind)
    ctx = ctx.placed(layout.order)
    tp, cp, mbs, sp, rc = layout.tp, layout.cp, layout.micro_batch_size, layout.sequence_parallel, layout.recompute
    c = compute_terms(ctx._base, tp, cp, mbs, sp, rc, layout.ep, layout.expert_tp, kind)
    steady = (ep_overlap_steady_share(layout.pp, layout.vp, m, rc, ctx.job.microbatch_group(m, layout.pp, layout.vp))
              if layout.ep_overlap else 0.0)
    ep_s = 0.0 if kind is False else ep_comm_terms(ctx, tp, cp, layout.ep, mbs, sp, rc, ep_ranks(layout),
                                                   layout.tp_overlap and tp > 1, steady, layout.expert_tp)
    return LayerTerms(
        forward_s=c.forward_s, backward_s=c.backward_s, recompute_s=c.recompute_s,
        tp_comm_s=tp_comm_terms(ctx, tp, cp, mbs, sp, rc, layout.stride("tp"), layout.tp_overlap,
                                layout.expert_tp or layout.ep == 1, layout.ep, layout.expert_tp, kind),
        cp_comm_s=cp_comm_terms(ctx, tp, cp, mbs, sp, layout.stride("cp"), kind),
        ep_comm_s=ep_s, act_bytes_per_layer=c.act_bytes_per_layer, act_transient_bytes=c.act_transient_bytes,
        act_kind_bytes=c.act_kind_bytes,
    )


def _module_recompute_terms(ctx: Context, layout: Layout, m: int, kind: bool | None = None) -> LayerTerms:
    """Megatron-Core's selective recomputation of the named submodules (``layout.recompute_modules``):
    the layer as without recomputation, less what those modules no longer keep, plus their forward
    run again in backward (:func:`recompute_module_terms`). The tensor-parallel collectives of a
    recomputed dense MLP are not priced again (the recomputed ops are local to a rank otherwise)."""
    none = layer_terms(ctx, layout.with_(recompute="none", recompute_modules=()), m, kind)
    rec_s, dropped = recompute_module_terms(ctx._base, layout.tp, layout.cp, layout.micro_batch_size,
                                            layout.sequence_parallel, layout.ep, layout.expert_tp,
                                            tuple(layout.recompute_modules), kind)
    kinds = tuple(kept - gone for kept, gone in zip(none.act_kind_bytes, dropped))
    return replace(none, recompute_s=rec_s, act_kind_bytes=kinds,
                   act_bytes_per_layer=none.act_bytes_per_layer - _kind_total(ctx.model, dropped) / ctx.model.num_layers)


def _kind_total(model: ModelSpec, per_layer: tuple[float, float]) -> float:
    """A per-layer figure of each kind ``(dense, moe)`` summed over the model's layers."""
    return model.num_dense_layers * per_layer[0] + model.num_moe_layers * per_layer[1]


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
    per_width = mlp_width_bytes(mlp_kept_tensors(model, kernels.eager), lin)
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


def _partial_recompute_terms(ctx: Context, layout: Layout, m: int, kind: bool | None = None) -> LayerTerms:
    """``recompute_layers`` of a stage's layers recompute whole and the rest keep every activation:
    each per-layer term is the share-weighted mean of full recomputation and none (a stage's time and
    stored activations are sums over its layers); one layer being recomputed still needs its working
    memory."""
    share = min(1.0, layout.recompute_layers / layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp))
    full = layer_terms(ctx, layout.with_(recompute_layers=0), m, kind)
    none = layer_terms(ctx, layout.with_(recompute="none", recompute_layers=0), m, kind)

    def mix(name: str) -> float:
        return share * getattr(full, name) + (1.0 - share) * getattr(none, name)
    kinds = tuple(share * f + (1.0 - share) * n for f, n in zip(full.act_kind_bytes, none.act_kind_bytes))
    return LayerTerms(forward_s=full.forward_s, backward_s=full.backward_s, recompute_s=mix("recompute_s"),
                      tp_comm_s=mix("tp_comm_s"), cp_comm_s=mix("cp_comm_s"), ep_comm_s=mix("ep_comm_s"),
                      act_bytes_per_layer=mix("act_bytes_per_layer"), act_transient_bytes=full.act_transient_bytes,
                      act_kind_bytes=kinds)


def ep_overlap_steady_share(pp: int, vp: int, m: int, recompute: str, group: int | None = None) -> float:
    """Share of a stage's micro-batch chunks whose expert all-to-alls Megatron-Core's EP overlap
    hides (``--overlap-moe-expert-parallel-comm``, combined 1F1B): only the steady state pairs one
    chunk's forward with another's backward. The first rank warms up with ``2 (pp - 1) + (vp - 1) N``
    chunks (``N``: the micro-batch ``group``, default ``pp``) plus the one extra the overlap
    schedules (``schedules.py``), one chunk without a pipeline; warm-up forwards and cool-down
    backwards run alone. 0 where Megatron refuses the overlap (full recomputation; pp > 1 without
    virtual stages): priced as off."""
    if recompute == "full" or (pp > 1 and vp == 1):
        return 0.0
    chunks = m * vp
    warmup = 1 if pp == 1 else interleaved_warmup(pp, vp, group) + 1
    return max(0, chunks - warmup) / chunks


def ep_ranks(layout: Layout) -> tuple[int, ...]:
    """The expert-parallel group of rank 0 (empty without expert parallelism)."""
    return layout.group("ep") if layout.ep > 1 else ()


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


def _layer_kinds(model: ModelSpec, kind: bool | None = None) -> list[tuple[bool, int]]:
    """``(moe, count)`` of each layer kind the model has (``kind``: that kind alone)."""
    return [(moe, count) for moe, count in ((False, model.num_dense_layers), (True, model.num_moe_layers))
            if count and kind in (None, moe)]


def mixed_kinds(model: ModelSpec) -> bool:
    """The model has dense and MoE layers both (DeepSeek-V3's first three layers are dense): a
    pipeline stage's time then depends on which of them it holds (``cost.stages``)."""
    return model.num_dense_layers > 0 and model.num_moe_layers > 0


_COMPUTE_CONTEXTS: dict = {}


@lru_cache(maxsize=32)
def _compute_context(ctx: Context) -> Context:
    """One context per (model, job terms, device): compute and activation memory depend on the
    device alone, not on the cluster's size or fabric, so clusters of one device share them (a
    sweep over device counts computes each layer's terms once). The device is keyed by value: each
    cluster build copies its device, and keyed by identity every size kept a context (and its
    cluster graph) of its own, which took ``fit`` to 21.7 GB (issue 41); the cache of contexts
    asked for is small for the same reason."""
    key = (ctx.model, ctx._key[1], ctx.cluster.device.model_dump_json())
    if len(_COMPUTE_CONTEXTS) > 256:
        _COMPUTE_CONTEXTS.clear()
    return _COMPUTE_CONTEXTS.setdefault(key, ctx)


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
        # per-op SAC re-runs what it does not save; an unsaved attention runs its forward again
        sac_rec += count * (t[3] if saved is None else t[6] + (0.0 if saved else t[3]))
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


@lru_cache(maxsize=65536)
def _activation_terms(ctx: Context, tp: int, n: float, sp: bool, recompute: str) -> tuple[float, float, float]:
    model = ctx.model
    kernels = layer_kernels(ctx)
    style = {"eager": kernels.eager, "kv_repeat": kernels.kv_repeat, "fp32_norms": ctx.job.model_code == HF_MODEL_CODE,
             "fp8_inputs": fp8_saved_inputs(ctx)}
    act, transient = [0.0, 0.0], 0.0
    for moe, _ in _layer_kinds(model):
        saved = _op_sac_saved(ctx, recompute, moe)
        if saved is not None:
            act[moe] = op_sac_activation_bytes(model, n, tp, sp, ctx.job.compiled, saved)
        else:
            act[moe] = activation_bytes(model, n, tp, sp, recompute, moe, _score_elements(ctx, n), **style)
        if saved is not None or recompute == "full":  # the layer being recomputed holds its full activations once
            transient = max(transient, activation_bytes(model, n, tp, sp, "none", moe, _score_elements(ctx, n), **style))
    return act[0], act[1], transient


def layer_kernels(ctx: Context) -> Kernels:
    """How the job's layers run their element-wise passes (:class:`models.ops.Kernels`): eager
    PyTorch ops for a Hugging Face transformers class (``HF_MODEL_CODE``: its ``LlamaRMSNorm`` is
    always PyTorch ops) and for a profile of eager modules (``semantics.eager_activations``, with
    its release's RMSNorm kernel) not run under ``torch.compile``; K and V copied per query head
    where the code calls ``repeat_kv`` (compiled or not: the copy is the graph's output either way).
    A model of fused kernels (``FUSED_MODEL_CODE``) runs none of these."""
    prof = ctx.job.profile
    if ctx.job.model_code == FUSED_MODEL_CODE:
        return FUSED
    hf = ctx.job.model_code == HF_MODEL_CODE
    eager = hf or (prof.profile.eager_activations and not ctx.job.compiled)
    return Kernels(eager=eager, composite_norm=eager and (hf or prof.eager_norm_composite),
                   kv_repeat=hf or prof.kv_repeated)


@lru_cache(maxsize=65536)
def _kind_times(ctx: Context, tp: int, n: float, sp: bool, moe: bool,
                local_experts: int | None, expert_tp: bool = True) -> tuple[float, ...]:
    """Forward, backward, GEMM (fwd+bwd), attention-forward, backward-GEMM, attention-backward and
    per-op-SAC recompute time of one layer of a kind."""
    dev, prec = ctx.cluster.device, ctx.job.gemm_format
    ops = layer_ops(ctx.model, n, ctx.job.seq_len, tp, sp, moe, local_experts, ctx.job.attention,
                    expert_tp, layer_kernels(ctx))
    # each op priced once forward and once backward; the sums run in the ops' order, as
    # cost.compute.ops_time_s does
    fwd = [op_time_s(op, dev, prec) for op in ops]
    bwd = [op_time_s(op, dev, prec, backward=True) for op in ops]
    gemm = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    core = [i for i, op in enumerate(ops) if op.core]
    gemm_bwd = sum(bwd[i] for i in gemm)
    return (sum(fwd), sum(bwd), sum(fwd[i] for i in gemm) + gemm_bwd, sum(fwd[i] for i in core), gemm_bwd,
            sum(bwd[i] for i in core),
            sum(share * fwd[i] for i, op in enumerate(ops) if (share := op_sac_recomputed_share(ctx.model, op))))


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


def _local_experts(model: ModelSpec, ep: int) -> int | None:
    return None if model.moe is None else max(1, model.moe.num_experts // ep)


def _comm_multiplier(recompute: str) -> float:
    """Full recomputation repeats the forward collectives: 3 passes of traffic instead of 2."""
    return 1.5 if recompute == "full" else 1.0


@lru_cache(maxsize=65536)
def tp_comm_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, stride: int,
                  overlap: bool, moe_tp: bool = True, ep: int = 1, expert_tp: bool = True,
                  kind: bool | None = None) -> float:
    """Exposed tensor-parallel traffic of all layers, one micro-batch.

    Each layer has two collectives around attention and two around the MLP (forward and
    backward). ``moe_tp=False`` (folded experts): MoE layers keep their tokens sequence-sharded
    through dispatch, experts and combine, so only their attention collectives remain. With
    ``overlap`` they hide behind the GEMMs of the compute the step prices, at the layout's ``ep``
    and ``expert_tp`` (EP overlap's window is the rest of that same compute: ``ep_window_s``).
    """
    if tp == 1:
        return 0.0
    total = _tp_comm_total_s(ctx, tp, cp, mbs, sp, recompute, stride, moe_tp, kind)
    if overlap:
        window = compute_terms(ctx._base, tp, cp, mbs, sp, recompute, ep, expert_tp, kind).gemm_s
        total = overlapped_exposed_s(total, window, overlap_share(ctx, "tp"))
    return total


@lru_cache(maxsize=65536)
def _tp_comm_total_s(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, stride: int,
                     moe_tp: bool, kind: bool | None = None) -> float:
    """:func:`tp_comm_terms` before overlap: it does not depend on the expert layout, which only sets
    the overlap's window (cached apart, as the search asks for it under every ``ep``)."""
    prof = ctx.cluster.strided_profile(tp, stride)
    n = _tokens(ctx, cp, mbs)
    per_layer = _tp_comm_s(n, ctx.model.hidden_size, prof, sp, tp_gather_bytes(ctx)) * _comm_multiplier(recompute)
    # each layer has two collectives around attention, and two around its MLP where the MLP is split
    # over tp (dense MLPs always; experts unless folded)
    layers = sum(count * (2 if not moe or moe_tp else 1) for moe, count in _layer_kinds(ctx.model, kind))
    return per_layer * layers / 2


def overlap_share(ctx: Context, stream: str, beside: str = "gemm") -> float:
    """Share of the device's compute that an overlapped ``stream`` (tp, dp or ep) takes from the
    compute it hides behind (:func:`overlap_charge`)."""
    return overlap_charge(ctx.job.profile.profile, ctx.cluster.device, stream, beside)[0]


def overlap_charge(prof, dev, stream: str, beside: str = "gemm") -> tuple[float, str]:
    """``(share, basis)``: the share of the compute an overlapped ``stream`` takes from what it hides
    behind, and why. A published overlap measurement of the framework's mechanism where the profile
    has one (``overlap.tp_comm_share``); else from the SMs its kernels hold (the profile's
    ``overlap`` figures: TE userbuffers' SM count, NCCL channels) and the device.

    Compute launched on the SMs the communication leaves (TE userbuffers' SM margin,
    ``tp_comm_sm_margin``) loses that share of the SMs. Compute launched for the whole device beside
    a resident communication kernel (NCCL collectives) loses more: its kernels are sized for every
    SM, and the tiles that cannot start wait a whole tile's time (the tail effect). The device's
    measured ``comm_kernel_slowdown`` (GEMM slowdown ``s`` at an SM share) prices that: the compute
    runs at ``1 / (1 + s)`` of its speed while the communication runs, a share ``s / (1 + s)``.
    Without a measurement: the SM share, labelled in the plan; without an SM count: the unmeasured
    placeholder. Fused attention (``beside="attention"``, what the context-parallel ring hides
    behind) schedules many small blocks and measured no tail effect (11% slower beside 16 copy
    blocks, 28% beside 32 on an H100, against 14% and 32% for the bare SM share): the SM share."""
    measured = getattr(prof, f"{stream}_comm_share", None)
    if measured is not None:  # a published overlap measurement of the mechanism (overlap.tp_comm_share)
        return measured, "the framework's own overlap measurement"
    sms = getattr(prof, f"{stream}_comm_sms", None)
    count = dev.gemm.sm_count
    if not (sms and count):
        return UNMEASURED_OVERLAP_SHARE, "assumed (no SM-count figure)"
    share = min(1.0, sms / count)
    held = f"{sms} of {count} SMs"
    if beside == "attention":
        return share, f"{held} beside attention (no tail effect measured)"
    if getattr(prof, f"{stream}_comm_sm_margin", False):
        return share, f"{held}; the GEMMs run on the rest (SM margin)"
    if not dev.comm_kernel_slowdown:
        return share, f"{held} (the tail effect is not measured on this device)"
    slowdown = comm_kernel_slowdown(dev.comm_kernel_slowdown, share)
    where = "measured on H100" if dev.comm_kernel_slowdown_measured else "H100's measurement, borrowed"
    return max(share, slowdown / (1.0 + slowdown)), f"{held} beside GEMMs sized for every SM (tail effect, {where})"


def comm_kernel_slowdown(curve: tuple[tuple[float, float], ...], share: float) -> float:
    """The measured GEMM slowdown at SM ``share``, linear between the measured points and from no
    slowdown at no SMs; past the last point it grows in proportion to the share."""
    points = ((0.0, 0.0),) + tuple(curve)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if share <= x1:
            return y0 + (y1 - y0) * (share - x0) / (x1 - x0)
    x, y = points[-1]
    return y * share / x


def overlapped_exposed_s(comm_s: float, window_s: float, share: float) -> float:
    """Time a step gains from ``comm_s`` of communication overlapped with ``window_s`` of compute.

    While they run together the compute runs at ``1 - share`` of its speed. If the compute is the
    longer, it ends ``share * comm_s`` late; otherwise the communication sets the end, ``comm_s -
    window_s`` after the compute would have. So the cost is ``max(share * comm_s, comm_s -
    window_s)``: never zero, and never less when the window shrinks or the traffic grows.
    """
    return max(share * comm_s, comm_s - window_s)


@lru_cache(maxsize=65536)
def cp_comm_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, stride: int, kind: bool | None = None) -> float:
    if cp == 1:
        return 0.0
    n = _tokens(ctx, cp, mbs)
    prof = ctx.cluster.group_profile([0, stride])
    total = 0.0
    for moe, count in _layer_kinds(ctx.model, kind):
        ops = layer_ops(ctx.model, n, ctx.job.seq_len, tp, sp, moe)
        total += count * _cp_comm_s(ctx, n, tp, cp, prof, ops)
    return total


@lru_cache(maxsize=65536)
def ep_comm_terms(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
                  ranks: tuple[int, ...], tp_overlap: bool = False, steady: float = 0.0,
                  expert_tp: bool = True) -> float:
    """Exposed all-to-all traffic of all MoE layers, one micro-batch, over the expert group ``ranks``.

    With EP overlap (``steady`` > 0: the share of chunks in combined forward/backward steps,
    :func:`ep_overlap_steady_share`) those chunks hide their all-to-alls behind the other chunk's
    compute of the MoE layers, less what TP overlap and the context-parallel ring already hide
    behind, at the price of the SMs the all-to-all kernels hold (``overlap_share(ctx, "ep")``);
    the others pay them in full."""
    if steady <= 0.0:
        return _ep_open_s(ctx, tp, cp, ep, mbs, sp, recompute, ranks)
    raw, hidden = ep_comm_parts(ctx, tp, cp, ep, mbs, sp, recompute, ranks, expert_tp, tp_overlap)
    return steady * hidden + (1.0 - steady) * raw


@lru_cache(maxsize=65536)
def _ep_open_s(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
               ranks: tuple[int, ...]) -> float:
    """The MoE layers' all-to-alls of one micro-batch, in the open."""
    if ep == 1 or ctx.model.moe is None:
        return 0.0
    prof = ctx.cluster.group_profile(ranks)
    return (ctx.model.num_moe_layers * _ep_comm_s(ctx, _tokens(ctx, cp, mbs), tp, prof, sp)
            * _comm_multiplier(recompute))


@lru_cache(maxsize=65536)
def ep_comm_parts(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
                  ranks: tuple[int, ...], expert_tp: bool = True, tp_overlap: bool = False) -> tuple[float, float]:
    """``(open, hidden)``: the MoE layers' all-to-alls per micro-batch in the open, and exposed in
    EP overlap's steady state (:func:`ep_comm_terms`)."""
    if ep == 1 or ctx.model.moe is None:
        return 0.0, 0.0
    raw = _ep_open_s(ctx, tp, cp, ep, mbs, sp, recompute, ranks)
    window = ep_overlap_window_s(ctx.model, compute_terms(ctx._base, tp, cp, mbs, sp, recompute, ep, expert_tp),
                                 tp_overlap, cp)
    return raw, overlapped_exposed_s(raw, window, overlap_share(ctx, "ep"))


def ep_overlap_window_s(model: ModelSpec, c: "ComputeTerms", tp_overlap: bool, cp: int) -> float:
    """The compute EP overlap's all-to-alls hide behind per micro-batch: the MoE layers' share of
    what TP overlap and the context-parallel ring leave (:meth:`ComputeTerms.ep_window_s`)."""
    return model.num_moe_layers / model.num_layers * c.ep_window_s(tp_overlap, cp)


def _tp_comm_s(n: float, h: int, prof, sp: bool, gather_bytes: float = ACT_BYTES) -> float:
    """Forward + backward tensor-parallel collectives of one layer (Megatron: 2 + 2).

    Without sequence parallelism each is an all-reduce of the ``n x h`` activation; with it, a
    reduce-scatter plus an all-gather of the same buffer (Korthikanti et al. 2022, section 4.2.2),
    the all-gather at ``gather_bytes`` per element (:func:`tp_gather_bytes`).
    """
    size = ACT_BYTES * n * h
    gathered = gather_bytes * n * h
    one = coll.all_gather_s(gathered, prof) + coll.reduce_scatter_s(size, prof) if sp else coll.all_reduce_s(size, prof)
    return 4 * one


def tp_gather_bytes(ctx: Context) -> float:
    """Bytes per element of a sequence-parallel all-gather: the low-precision copy (FP8 1 B, MXFP8
    and NVFP4 with their scales) where the framework gathers the quantized tensor (Transformer
    Engine: ``semantics.tp_gather_quantized``) and the device runs the format; else 16-bit."""
    fmt = low_precision(ctx.job.precision)
    quantized = fmt and ctx.job.profile.profile.tp_gather_quantized and ctx.cluster.device.supports(fmt.name)
    return fmt.element_bytes if quantized else float(ACT_BYTES)


def _cp_comm_s(ctx: Context, n: float, tp: int, cp: int, prof, ops) -> float:
    """Ring attention: ``cp - 1`` key/value block passes forward, twice that backward (K, V and
    their gradients), each hidden behind the attention compute of the block already present
    (Liu et al. 2023, Ring Attention; Megatron-Core context parallelism), at the price of the SMs
    its kernels take (:func:`overlapped_exposed_s`)."""
    model = ctx.model
    kv_bytes = ACT_BYTES * n * 2 * model.num_kv_heads_resolved * model.head_dim_resolved / tp
    step_s = coll.p2p_s(kv_bytes, prof)
    attn = [op for op in ops if op.core]
    attn_fwd = ops_time_s(attn, ctx.cluster.device, ctx.job.gemm_format) / cp
    attn_bwd = ops_time_s(attn, ctx.cluster.device, ctx.job.gemm_format, backward=True) / cp
    share = overlap_share(ctx, "dp", beside="attention")  # the ring's sends are NCCL point-to-point kernels
    return (cp - 1) * (overlapped_exposed_s(step_s, attn_fwd, share) + overlapped_exposed_s(2 * step_s, attn_bwd, share))


def _ep_comm_s(ctx: Context, n: float, tp: int, prof, sp: bool) -> float:
    """Dispatch and combine all-to-alls of the routed tokens, forward and backward (4 in all).

    Inside one scale-up domain a flat all-to-all of every routed copy. Across domains, hierarchical
    dispatch (DeepEP, used by DeepSeek-V3, Megatron-Core's flex dispatcher and NeMo Automodel):
    each token crosses the fabric once per remote node holding any of its experts
    (:func:`remote_nodes_per_token`), and combine returns one reduced copy per node.
    """
    e = ctx.model.moe
    token_bytes = ACT_BYTES * n * ctx.model.hidden_size / tp
    size = token_bytes * e.top_k * e.load_factor  # the most loaded rank receives the most
    if prof.num_domains <= 1:
        return 4 * coll.all_to_all_s(size, prof)
    remote = token_bytes * e.load_factor * remote_nodes_per_token(e.num_experts, e.top_k, prof.num_domains,
                                                                  e.max_nodes_per_token)
    return 4 * coll.hierarchical_all_to_all_s(size, remote, prof)


def remote_nodes_per_token(num_experts: int, top_k: int, num_nodes: int, max_nodes: int | None = None) -> float:
    """Expected number of other nodes a token's ``top_k`` experts lie on, with the experts spread
    evenly over ``num_nodes`` nodes and chosen uniformly (the uniform-load assumption); with
    node-limited routing they are chosen among the experts of ``max_nodes`` nodes (DeepSeek-V3,
    section 3.2)."""
    per_node = num_experts / num_nodes
    candidates = num_nodes if max_nodes is None else min(max_nodes, num_nodes)
    pool = candidates * per_node
    k = min(top_k, int(pool))
    miss = math.prod((pool - per_node - i) / (pool - i) for i in range(k)) if pool - per_node >= k else 0.0
    return candidates * (1.0 - miss) * (num_nodes - 1) / num_nodes


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
                     fp32_norms: bool = False, fp8_inputs: float = 0.0) -> float:
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
    backward needs.
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
        sharded += moe_mlp_activation_bytes(model, n, kept, lin)
    else:
        sharded += n * model.ffn_hidden_size * mlp_width_bytes(kept, lin)
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


def mlp_width_bytes(kept: int, lin: float) -> float:
    """Bytes per element of the MLP width for ``kept`` tensors: 16-bit, except the last, fc2's
    input, at ``lin`` bytes (:func:`linear_input_bytes`)."""
    return ACT_BYTES * (kept - 1) + lin


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


def moe_mlp_activation_bytes(model: ModelSpec, n: float, kept: int, lin: float = ACT_BYTES) -> float:
    """What an MoE MLP keeps for ``n`` tokens (before tensor-parallel sharding) on the most loaded
    expert-parallel rank: the router's scores and choices, the permuted tokens into and out of the
    experts (``2 n top_k h`` each, times the routing's load factor, ``MoESpec.load_factor``; the
    way in is the experts' fc1 input, ``lin`` bytes per element), ``kept`` tensors of the expert
    width per routed token (SwiGLU fused: 3; eager: 4; the last the fc2 input) and the shared
    experts' alike."""
    e = model.moe
    routed = n * e.top_k * e.load_factor
    router = n * (e.num_experts * ROUTER_BYTES_PER_SCORE + e.top_k * ROUTER_BYTES_PER_CHOICE)
    per_width = mlp_width_bytes(kept, lin)
    return (router + (lin + ACT_BYTES) * routed * model.hidden_size + routed * e.expert_ffn_hidden_size * per_width
            + n * e.num_shared_experts * e.expert_ffn_hidden_size * per_width)


def allocator_fraction(ctx: Context) -> float:
    """The caching allocator's reserved-but-unallocated bytes as a share of the allocated peak: the
    framework's allocator (PyTorch's caching allocator for the GPU frameworks; ``semantics.
    allocator_reserved_fraction``), on devices with a runtime heap (HBM); 0 on SRAM machines."""
    if ctx.cluster.device.memory_kind != "hbm":
        return 0.0
    return ctx.job.profile.profile.allocator_reserved_fraction


def nccl_communicator_sizes(layout: Layout) -> tuple[int, ...]:
    """Ranks of each NCCL communicator a rank of the first pipeline stage runs collectives on: the
    default group (start-up barrier, loss and timer reductions), the tensor-, context-, data- (with
    context: the gradients' dp x cp group), expert- and expert-data-parallel groups, and with
    pipeline parallelism the pipeline group (gradient norm) and the pair it sends activations to.
    The default group is not counted again where another group spans every rank (torchtitan's mesh
    and DeepSpeed reuse it for such a dimension); groups over the same ranks for different purposes
    (an expert group equal to the data-parallel one) are separate communicators, as the frameworks
    create them."""
    world = layout.tp * layout.cp * layout.dp * layout.pp
    inner = layout.tp if layout.expert_tp else 1
    groups = {("world", world), ("tp", layout.tp), ("cp", layout.cp), ("dp", layout.dp * layout.cp)}
    if layout.ep > 1:
        groups |= {("ep", layout.ep), ("edp", layout.tp * layout.dp * layout.cp // (layout.ep * inner))}
    if layout.pp > 1:
        groups |= {("pp", layout.pp), ("p2p", 2)}
    sizes = {name: size for name, size in groups if size > 1}
    spans_world = [name for name, size in sizes.items() if size == world and name != "world"]
    if spans_world:
        sizes.pop("world", None)
    return tuple(sorted(sizes.values()))


def runtime_bytes(ctx: Context, layout: Layout) -> float:
    """Device memory a rank holds outside its framework's allocator: on NVIDIA and AMD devices under
    a PyTorch framework (``semantics.nccl_runtime``) the CUDA context, eager or lazily loaded by the
    framework's date (``LAZY_LOADING_SINCE``), plus NCCL's buffers for each communicator it uses
    (``nccl_communicator_sizes``), their ring share once NCCL connects lazily
    (``NCCL_LAZY_CONNECT_SINCE``); elsewhere ``RUNTIME_RESERVE_BYTES``; nothing on SRAM machines."""
    device = ctx.cluster.device
    if device.memory_kind != "hbm":
        return 0.0
    prof = ctx.job.profile
    if not (prof.profile.nccl_runtime and device.family.startswith(("nvidia", "amd"))):
        return RUNTIME_RESERVE_BYTES
    context = CUDA_CONTEXT_LAZY_BYTES if prof.date >= LAZY_LOADING_SINCE else CUDA_CONTEXT_EAGER_BYTES
    lazy = prof.date >= NCCL_LAZY_CONNECT_SINCE
    buffers = 0.0
    for size in nccl_communicator_sizes(layout):
        measured = NCCL_PAIR_COMMUNICATOR_BYTES if size == 2 else NCCL_COMMUNICATOR_BYTES
        buffers += measured * (NCCL_RING_SHARE[min(size, 3)] if lazy else 1.0)
    return context + buffers


@dataclass(frozen=True, slots=True)
class HeadTerms:
    """LM head and loss on the last stage, per micro-batch."""

    time_s: float
    logits_bytes: float


@lru_cache(maxsize=16384)
def head_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, tp_stride: int) -> HeadTerms:
    """Forward and backward of the final norm, LM head and cross-entropy, plus its TP traffic."""
    n = _tokens(ctx, cp, mbs)
    ops = head_ops(ctx.model, n, tp)
    dev, prec = ctx.cluster.device, ctx.job.gemm_format
    t = ops_time_s(ops, dev, prec) + ops_time_s(ops, dev, prec, backward=True)
    if tp > 1:
        prof = ctx.cluster.strided_profile(tp, tp_stride)
        size = ACT_BYTES * n * ctx.model.hidden_size
        t += 2 * (coll.all_gather_s(size, prof) if sp else coll.all_reduce_s(size, prof))
    per_logit = MODEL_CODE_LOGIT_BYTES.get(ctx.job.model_code) or ctx.job.profile.logit_bytes()
    return HeadTerms(t, per_logit * n * ctx.model.vocab_size / tp)


def p2p_s(ctx: Context, layout: Layout) -> float:
    """Pipeline sends per micro-batch slot: one activation forward and one gradient backward.

    Each is ``b s h / cp`` elements, over the link between neighbouring stages. Where the framework
    scatters it over the tensor-parallel ranks (Megatron's scatter-gather, Narayanan et al. 2021
    section 4.1, 2021-02 to 2023-03) or sequence parallelism already shards it, each TP rank sends
    ``1/tp`` of it; otherwise every TP rank sends the whole tensor (DeepSpeed's PipelineEngine,
    Megatron-Core without SP); a scattered tensor is all-gathered over the TP ranks on arrival
    (``semantics.p2p_gathers_per_slot`` per slot: Megatron 2, DeepSpeed 3, which also re-gathers its
    own output before the backward). Paired non-blocking sends (Megatron's batched isend/irecv, PyTorch
    pipelining) cost two transfers per slot. DeepSpeed's are blocking, one after the other: a middle
    stage exchanges with the previous stage (RecvActivation, SendGrad) and then with the next
    (SendActivation, RecvGrad), four transfers per slot; with two stages each has one neighbour, two.
    """
    if layout.pp == 1:
        return 0.0
    placed = ctx.placed(layout.order).cluster
    prof = placed.group_profile((0, layout.stride("pp")))
    fw = ctx.job.profile
    full = ACT_BYTES * _tokens(ctx, layout.cp, layout.micro_batch_size) * ctx.model.hidden_size
    scattered = fw.p2p_scatter_gather and layout.tp > 1 and not layout.sequence_parallel
    size = full / layout.tp if layout.sequence_parallel or scattered else full
    transfers = 4 if fw.profile.p2p_blocking and layout.pp > 2 else 2
    gather_s = 0.0
    if scattered:  # the receiver rebuilds the whole tensor: an all-gather over the TP ranks
        tp_prof = placed.strided_profile(layout.tp, layout.stride("tp"))
        gather_s = fw.profile.p2p_gathers_per_slot * coll.all_gather_s(full, tp_prof)
    return transfers * coll.p2p_s(size, prof) + gather_s


# ---- parameters per device --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters held by the most loaded pipeline stage, per device, before ZeRO sharding."""

    dense: float  # replicated across data-parallel ranks (attention, norms, dense MLPs, embeddings)
    expert: float  # expert weights, replicated only across the expert-data-parallel ranks


def layers_on_stage(num_layers: int, pp: int, vp: int) -> int:
    """Layers on the most loaded pipeline rank: ``vp`` chunks of ``ceil(L / (pp vp))`` layers."""
    return math.ceil(num_layers / (pp * vp)) * vp


@dataclass(frozen=True, slots=True)
class StageSplit:
    """Layers per pipeline rank: the first, the most loaded of the middle ones (the first's with
    pp = 2) and the last; ``slots``, the places a rank has (with ``head_slots`` the first and the
    last give one each to the embedding and the head)."""

    first: int
    middle: int
    last: int
    slots: int


def stage_slots(num_layers: int, pp: int, head_slots: bool = False) -> int:
    """The most pipeline stages (pp x vp) the layers can fill: one layer each, and with ``head_slots``
    (pp > 1) the embedding and the head a slot each (Megatron-Core lets a virtual stage hold the
    embedding alone: ``num_layers + 2`` divisible by pp x vp)."""
    return num_layers + (2 if head_slots and pp > 1 else 0)


@lru_cache(maxsize=4096)
def stage_split(num_layers: int, pp: int, vp: int, head_slots: bool = False) -> StageSplit:
    """How the layers fall on the pipeline ranks (``Layout.head_slots``).

    Even split: every rank is charged ``ceil(L / (pp vp)) vp`` layers (:func:`layers_on_stage`), the
    LM head on top of the last rank's. With ``head_slots`` the embedding and the output layer each
    count as one layer: ``L + 2`` slots over the ``pp vp`` stages, the larger parts first (torchtitan
    gives the extra layers to the first stages, DeepSpeed's balanced partition likewise; Megatron
    needs them even), and the first and the last rank give one slot each to the embedding and the
    head."""
    if not head_slots or pp == 1:
        n = layers_on_stage(num_layers, pp, vp)
        return StageSplit(n, n, n, n)
    stages = pp * vp
    high = math.ceil((num_layers + 2) / stages) * vp
    low = (num_layers + 2) // stages * vp
    return StageSplit(high - 1, high if pp > 2 else high - 1, low - 1, high)


@lru_cache(maxsize=4096)
def head_layer_ratio(ctx: Context) -> float:
    """The LM head's time over one layer's, forward and backward, at the job's precision on its
    device (one sequence, no parallelism, no recomputation): what the head weighs on the last rank,
    in layers. Time, not FLOPs: an FP8 job keeps the head in 16 bits (``Op.high_precision``) and the
    loss is memory-bound. BLOOM (250,880 x 14,336) on an A100: 1.4; Llama 3 405B in bf16 on an H100:
    0.65, in FP8 there 1.08 and on a GB200 1.16; GPT-3 175B: 0.34; Llama 3 8B: 2.3."""
    model, job = ctx.model, ctx.job
    n = float(job.seq_len)
    ops = head_ops(model, n, 1)
    dev, prec = ctx.cluster.device, job.gemm_format
    head = ops_time_s(ops, dev, prec) + ops_time_s(ops, dev, prec, backward=True)
    c = compute_terms(ctx._base, 1, 1, 1, False, "none")
    return head / max(1e-30, (c.forward_s + c.backward_s) / model.num_layers)


def period_layers(ctx: Context, pp: int, vp: int, head_slots: bool = False) -> tuple[int, bool]:
    """The layers whose time sets the pipeline's steady-state period (one micro-batch on the slowest
    rank), and whether the LM head's time adds to it.

    Even split: ``ceil(L / (pp vp)) vp`` layers and the head, on the last rank. With ``head_slots``
    each rank has ``n = ceil((L + 2) / (pp vp)) vp`` slots: the last rank runs ``n - 1`` layers and
    the head, a middle rank ``n`` layers; the head sets the period where it takes longer than a layer
    (:func:`head_layer_ratio` >= 1), else a middle rank does and the head hides in the last rank's
    spare slot. The ratio is taken without recomputation (which lengthens a layer and not the head)
    and without tensor parallelism, where the split is uneven the last rank is charged ``n - 1``
    layers though it may hold one fewer, and with pp = 2 (no middle rank) a light head is charged a
    whole layer: each errs toward the slower period. The choice depends on the model and the job
    alone, so the search's tables take it whole."""
    if not head_slots or pp == 1:
        return layers_on_stage(ctx.model.num_layers, pp, vp), True
    n = stage_split(ctx.model.num_layers, pp, vp, True).slots
    return (n - 1, True) if head_in_period(ctx, head_slots) else (n, False)


def stage_kind_shares(ctx: Context, pp: int, vp: int, head_slots: bool = False) -> tuple[tuple[float, float], ...]:
    """The slowest pipeline stage's share of the dense layers' and of the MoE layers' time, one pair
    per candidate: the stage (of those whose layers set the period, :func:`period_layers`) with the
    most dense layers and the one with the fewest (``cost.stages.rank_layers``). A stage's time is
    linear in its dense count, so the slower of the two is the slowest stage, whichever kind of
    layer is the slower (DeepSeek-V3's leading dense layers all sit on rank 0). One pair for a model
    of one kind: the period's share of all layers."""
    model = ctx.model
    period = period_layers(ctx, pp, vp, head_slots)[0]
    if not mixed_kinds(model):
        share = period / model.num_layers
        return ((share, share),)
    ranks = [rank_layers(model.num_layers, model.num_dense_layers, pp, vp, r, head_slots and pp > 1) for r in range(pp)]
    dense = [r.num_dense for r in ranks if r.layers == period] or [r.num_dense for r in ranks]
    return tuple(dict.fromkeys((a / model.num_dense_layers, (period - a) / model.num_moe_layers)
                               for a in (max(dense), min(dense))))


def kind_windows(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, ep: int, expert_tp: bool,
                 tp_overlap: bool, ep_overlap: bool, kind: bool | None = None) -> tuple[float, float]:
    """The compute one micro-batch of the layers of ``kind`` (None: all) leaves to hide the per-step
    data-parallel traffic and the per-micro-batch ZeRO-2/3 traffic behind
    (:meth:`ComputeTerms.dp_window_s`, ``fsdp_window_s``), as totals over those layers: a stage's
    window is its share of each kind's (``cost.step``)."""
    c = compute_terms(ctx, tp, cp, mbs, sp, recompute, ep, expert_tp, kind)
    return c.dp_window_s(tp_overlap, cp), c.fsdp_window_s(tp_overlap, cp, ep_overlap)


def head_in_period(ctx: Context, head_slots: bool) -> bool:
    """Whether the LM head's time adds to the pipeline period (:func:`period_layers`, pp > 1):
    always on the even split; with ``head_slots`` where the head takes longer than a layer."""
    return not head_slots or head_layer_ratio(ctx._base) >= 1  # tp 1: the rank order does not enter it


@lru_cache(maxsize=65536)
def param_counts(model: ModelSpec, tp: int, pp: int, vp: int, ep: int, expert_tp: bool = True,
                 head_slots: bool = False, rank: str | None = None) -> ParamCounts:
    """Parameters on the heaviest stage: its layers (MoE layers first, they are the heavier) plus,
    on the first and the last stage, the larger of the embedding and the output layer, sharded
    ``tp`` ways (vocab-parallel). Routed experts: ``num_experts / ep`` of them, split ``tp`` ways
    unless folded (whole experts). With ``head_slots`` the ranks that hold the vocabulary matrix
    hold one layer fewer (:func:`stage_split`): the heaviest is then either of them or a middle one.
    ``rank`` (``cost.stages.RANKS``): that rank's own layers by kind (``cost.stages.rank_layers``)
    and, on the first and the last, the vocabulary matrix."""
    if rank is not None:
        return _rank_params(model, tp, pp, vp, ep, expert_tp, head_slots, rank)
    if pp == 1:
        whole = _stage_params(model, layers_on_stage(model.num_layers, pp, vp), tp, ep, expert_tp)
        return ParamCounts(whole.dense + (model.embedding_params + model.output_params) / tp, whole.expert)
    split = stage_split(model.num_layers, pp, vp, head_slots)
    vocab = max(model.embedding_params, model.vocab_size * model.hidden_size) / tp
    ends = _stage_params(model, max(split.first, split.last), tp, ep, expert_tp)
    ends = ParamCounts(ends.dense + vocab, ends.expert)
    middle = _stage_params(model, split.middle, tp, ep, expert_tp)
    return max(ends, middle, key=lambda pc: pc.dense + pc.expert) if head_slots else ends


def _rank_params(model: ModelSpec, tp: int, pp: int, vp: int, ep: int, expert_tp: bool, head_slots: bool,
                 rank: str) -> ParamCounts:
    """:func:`param_counts` of one rank (``rank``: first, second or last)."""
    index = rank_index(pp, rank)
    layers = rank_layers(model.num_layers, model.num_dense_layers, pp, vp, index, head_slots and pp > 1,
                         model.num_moe_layers == 0)
    pc = _layer_params(model, layers.num_dense, layers.layers - layers.num_dense, tp, ep, expert_tp)
    if pp == 1:
        vocab = (model.embedding_params + model.output_params) / tp
    else:
        vocab = max(model.embedding_params, model.vocab_size * model.hidden_size) / tp if layers.vocab else 0.0
    return ParamCounts(pc.dense + vocab, pc.expert)


def _stage_params(model: ModelSpec, n_stage: int, tp: int, ep: int, expert_tp: bool) -> ParamCounts:
    """Parameters of ``n_stage`` layers on one rank (MoE layers first)."""
    n_moe = min(n_stage, model.num_moe_layers)
    return _layer_params(model, n_stage - n_moe, n_moe, tp, ep, expert_tp)


def _layer_params(model: ModelSpec, n_dense: int, n_moe: int, tp: int, ep: int, expert_tp: bool) -> ParamCounts:
    """Parameters of ``n_dense`` dense and ``n_moe`` MoE layers on one rank."""
    n_stage = n_dense + n_moe
    shared = model.attention_params + model.norm_params_per_layer
    dense = (n_stage * shared + n_dense * model.dense_mlp_params) / tp
    expert = 0.0
    if n_moe:
        e = model.moe
        dense += n_moe * (model.hidden_size * e.num_experts + e.num_shared_experts * model.expert_params / tp)
        expert = n_moe * e.num_experts / ep * model.expert_params / (tp if expert_tp else 1)
    return ParamCounts(dense, expert)


def partitioned_modules(model: ModelSpec, tp: int, pp: int, vp: int, ep: int, expert_tp: bool,
                        threshold: int) -> tuple[int, int]:
    """Modules on the heaviest stage whose weights ZeRO-3 partitions, ``(dense, expert)``: each
    linear layer (Megatron's layout: fused QKV and the attention output, five projections with MLA;
    the fused first and the second MLP projection), each MoE layer's router and shared experts,
    each local expert's two projections, and the embedding and (untied) output layers. A weight
    with fewer than ``threshold`` elements stays whole on every rank (DeepSpeed's
    ``stage3_param_persistence_threshold``): biases and norms always, small matrices too."""
    n_stage = layers_on_stage(model.num_layers, pp, vp)
    n_moe = min(n_stage, model.num_moe_layers)
    attention = 5 if model.mla is not None else 2

    def count(modules: int, numel: float) -> int:
        return modules if numel >= threshold else 0
    dense = count(n_stage * attention, model.attention_params / attention / tp)
    dense += count((n_stage - n_moe) * 2, model.dense_mlp_params / 2 / tp)
    expert = 0
    if n_moe:
        e = model.moe
        dense += count(n_moe, model.hidden_size * e.num_experts)
        dense += count(n_moe * 2 * min(1, e.num_shared_experts), e.num_shared_experts * model.expert_params / 2 / tp)
        expert = count(n_moe * 2 * e.num_experts // ep, model.expert_params / 2 / (tp if expert_tp else 1))
    heads = 2 if pp == 1 and not model.tied_embeddings else 1
    dense += count(heads, model.vocab_size * model.hidden_size / tp)
    return dense, expert


@dataclass(frozen=True, slots=True)
class StaticMemory:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float


def owned_params(pc: ParamCounts, layout: Layout, sharded: bool, replicas: int = 1) -> float:
    """Parameters a device holds state for: all of them, or its ZeRO shard.

    Megatron-Core's distributed optimizer shards over the data- and context-parallel ranks;
    expert weights over the expert-data-parallel ranks (``dp * cp / ep``; folded ``tp * cp * dp / ep``).
    ``replicas``: copies of each shard kept across scale-up domains (:func:`zero_replicas`).
    """
    if not sharded:
        return pc.dense + pc.expert
    shard = layout.dp * layout.cp // replicas
    return pc.dense / shard + pc.expert / (shard * (1 if layout.expert_tp else layout.tp) // layout.ep)


def zero_replicas(ctx: Context, dp: int, pp: int, cp: int, ep: int, zero: int) -> int:
    """Copies of each ZeRO-3 shard: 1, except where the framework shards only inside a scale-up
    domain and runs plain data parallelism between domains (``semantics.zero3_across_domains:
    replicate``: MaxText's base.yml puts the fsdp axis on ICI, ``ici_fsdp_parallelism: -1``, and the
    data axis on DCN, ``dcn_data_parallelism: -1``). Then a data-parallel group spanning D slices
    keeps D copies of each shard, gathered and reduce-scattered inside its slice, with one
    all-reduce of the shard's gradients across slices a step. Taken where the data axis alone
    crosses the slices (no pipeline, context or expert parallelism), so every rank order agrees."""
    return shard_copies(ctx.job.profile.profile, ctx.cluster, dp, pp, cp, ep, zero)


def shard_copies(profile, cluster, dp: int, pp: int, cp: int, ep: int, zero: int) -> int:
    """:func:`zero_replicas` from the framework profile and the cluster alone (what a report needs)."""
    if profile.zero3_across_domains != "replicate" or zero < 3 or pp > 1 or cp > 1 or ep > 1:
        return 1
    domains = cluster.num_domains
    return domains if domains > 1 and dp % domains == 0 else 1


def effective_zero_stage(ctx: Context, zero: int, pp: int) -> int:
    """The ZeRO stage whose memory and traffic a layout really has under the job's framework.

    torchtitan with pipeline parallelism keeps FSDP's parameters gathered through all micro-batches
    and accumulates gradients unsharded until the last one (``semantics.fsdp_with_pp: unsharded``):
    ZeRO-1's memory and traffic, whatever sharding was asked for.
    """
    if zero >= 2 and pp > 1 and ctx.job.profile.profile.fsdp_with_pp == "unsharded":
        return 1
    return zero


def static_memory(ctx: Context, layout: Layout, rank: str | None = None) -> StaticMemory:
    """Weights, gradients and Adam states per device, divided per ZeRO stage: on the heaviest stage,
    or on ``rank`` (:func:`param_counts`)."""
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots, rank)
    z = effective_zero_stage(ctx, layout.zero_stage, layout.pp)
    copies = zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, z)
    weights = WEIGHT_BYTES * owned_params(pc, layout, z >= 3, copies)
    if z >= 3 and not ctx.job.profile.profile.sharded_weight_copy:
        weights = 0.0  # FSDP2: the fp32 shard (with the optimizer states) is cast at each gather
    if z >= 3:  # FSDP keeps the gathered weights of the layer in use and the one prefetched
        per_layer = (pc.dense + pc.expert) / max(1, layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp))
        weights += 2 * WEIGHT_BYTES * per_layer
    grads = ctx.job.grad_bytes * owned_params(pc, layout, z >= 2, copies)
    if _lp_grads_kept(ctx, z):  # DeepSpeed's BF16_Optimizer: the 16-bit .grad tensors besides
        grads += WEIGHT_BYTES * owned_params(pc, layout, False, copies)
    optim = OPTIMIZER_STATE_BYTES * owned_params(pc, layout, z >= 1, copies)
    return StaticMemory(weights, grads, optim)


def _lp_grads_kept(ctx: Context, zero_stage: int) -> bool:
    """The framework keeps each parameter's 16-bit gradient beside its fp32 accumulation buffer:
    DeepSpeed's BF16_Optimizer (ZeRO 0/1 with gradients accumulated in fp32 under a 16-bit
    precision; ``semantics.lp_grads_beside_fp32``)."""
    return (ctx.job.profile.profile.lp_grads_beside_fp32 and ctx.job.grad_bytes == 4 and zero_stage <= 1
            and not low_precision(ctx.job.precision))


def grads_freed_bytes(ctx: Context, layout: Layout, rank: str | None = None) -> float:
    """Gradient bytes that do not exist yet while a step's only micro-batch holds its activations:
    the framework frees gradients between steps and shards them as they are reduced (FSDP2 under
    torchtitan, ``semantics.grads_freed_between_steps``). 0 elsewhere; with several micro-batches
    the caller keeps them (the first micro-batch's shards are held through the next ones), and
    under weight streaming, which holds no gradient on the device."""
    if not ctx.job.profile.profile.grads_freed_between_steps or ctx.cluster.weight_streaming:
        return 0.0  # weight streaming (Cerebras MemoryX): the gradients live off-chip, none to free
    if effective_zero_stage(ctx, layout.zero_stage, layout.pp) < 2:
        return 0.0
    return static_memory(ctx, layout, rank).gradients_bytes


def optimizer_s(ctx: Context, layout: Layout) -> float:
    """The Adam step, memory-bound. Fused (one kernel): per parameter it reads and writes the fp32
    master weight and both moments (24 B), reads the gradient and writes the 16-bit weight
    (``grad_bytes + 2``). PyTorch's foreach AdamW (``ProfileAt.optimizer_kernel``) makes one pass
    per multi-tensor op (``torch.optim.adamw._multi_tensor_adamw``): weight decay on p (r+w 8 B),
    lerp of m toward g (8 + g), scale v (8), addcmul of g squared into v (8 + 2 g), sqrt of v,
    divide, add eps (8 each), addcdiv into p (16): ``72 + 3 grad_bytes``, 84 B with fp32
    gradients."""
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
    copies = zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, layout.zero_stage)
    count = owned_params(pc, layout, layout.zero_stage >= 1, copies)
    dev = ctx.cluster.device
    gb = ctx.job.grad_bytes
    per_param = 72.0 + 3 * gb if ctx.job.profile.optimizer_kernel == "foreach" else 24.0 + gb + WEIGHT_BYTES
    return count * per_param / memory_rate(dev)


@dataclass(frozen=True, slots=True)
class DataParallelTerms:
    """Data-parallel traffic: per step, overlappable (ZeRO 0-1: the gradient reduction and weight
    gather), per micro-batch (ZeRO-2 reduce-scatters, ZeRO-3 gathers) and per step, not
    overlapped (ZeRO-2's weight all-gather after the optimizer step)."""

    per_step_s: float
    per_microbatch_s: float
    blocking_s: float = 0.0
    regather_s: float = 0.0  # per micro-batch, with full recomputation (zero3_regather_s)


def dp_terms(ctx: Context, layout: Layout) -> DataParallelTerms:
    """The data-parallel collectives of ``layout`` under the job's framework (:func:`dp_traffic`)."""
    if layout.dp * layout.cp == 1:
        return DataParallelTerms(0.0, 0.0)
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
    profiles = dp_profiles(ctx, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.order, layout.expert_tp)
    return dp_terms_of(ctx, pc, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.order, layout.expert_tp,
                       layout.vp, layout.zero_stage, profiles)


def dp_terms_of(ctx: Context, pc: ParamCounts, tp: int, pp: int, dp: int, cp: int, ep: int, order: str,
                expert_tp: bool, vp: int, zero: int, profiles: tuple) -> DataParallelTerms:
    """:func:`dp_traffic` for the degrees and the groups' ``profiles`` (:func:`dp_profiles`); where
    ZeRO-3 shards inside each scale-up domain only (:func:`zero_replicas`), its collectives run
    over the domain's ranks of the data-parallel group and the shards' gradients are all-reduced
    across the domains once a step."""
    z = effective_zero_stage(ctx, zero, pp)
    modules = zero3_collectives(ctx, tp, pp, vp, ep, expert_tp) if z == 3 else None
    prof = ctx.job.profile.profile
    copy_s = zero3_host_s(ctx) if modules else (0.0, 0.0)
    copies = zero_replicas(ctx, dp, pp, cp, ep, z)
    if copies == 1:
        t = dp_traffic(ctx.job.grad_bytes, pc, *profiles, z, prof.zero2_param_gather, modules,
                       gather_bytes(ctx.job), copy_s)
        return replace(t, regather_s=zero3_regather_s(ctx, tp, pp, vp, z, profiles[0]))
    placed, shard, stride = ctx.placed(order).cluster, dp // copies, tp  # pp = cp = 1: dp's stride is tp
    inner = placed.strided_profile(shard, stride) if shard > 1 else None
    t = dp_traffic(ctx.job.grad_bytes, pc, inner, inner, z, prof.zero2_param_gather, modules, gather_bytes(ctx.job),
                   copy_s)
    across = coll.all_reduce_s(ctx.job.grad_bytes * (pc.dense + pc.expert) / shard,
                               placed.strided_profile(copies, stride * shard))
    return DataParallelTerms(t.per_step_s + across, t.per_microbatch_s, t.blocking_s,
                             zero3_regather_s(ctx, tp, pp, vp, z, inner))


def regather_share(ctx: Context, layout: Layout) -> float:
    """The share of a stage's layers whose recomputation gathers ZeRO-3's released modules a third
    time (``DataParallelTerms.regather_s``): all with full recomputation, ``recompute_layers`` of
    them with partial recomputation, none otherwise."""
    if layout.recompute != "full":
        return 0.0
    if not layout.recompute_layers:
        return 1.0
    return min(1.0, layout.recompute_layers / layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp))


def zero3_collectives(ctx: Context, tp: int, pp: int, vp: int, ep: int, expert_tp: bool) -> tuple[int, int] | None:
    """Collectives per ZeRO-3 gather pass over the stage's dense and expert weights. Where the
    framework prefetches in buckets or layers (``bucketed``) the traffic is priced as one collective
    per pass, its per-collective latency hidden with it. DeepSpeed before v0.6.0 fetched module by
    module, each gather waiting for the device to go idle (``per_module_blocking``): every module
    pays a collective's latency, in the open (:func:`partitioned_modules`); None for one per pass."""
    prof = ctx.job.profile
    if prof.zero3_fetch != "per_module_blocking":
        return None
    return partitioned_modules(ctx.model, tp, pp, vp, ep, expert_tp, prof.profile.zero3_persistence_threshold)


PYTHON_COPY_S = 18e-6
"""Host seconds of one ``full.narrow(...).copy_(part.narrow(...))`` in a Python loop, the copy
DeepSpeed's ZeRO-3 made per rank and gathered module before v0.5.5: 16 to 20 us each (median 18.4
over two runs), the same at 384, 768 and 1,536 ranks and at every GPT-3 175B module size (the copies
are host-bound), on the probe's host (``benchmarks/gpu_probe.py --only launch,zero3_list_copies``,
H100 machine, torch 2.11; benchmarks/results/gpu_probe_zero3_copies_h100_2026-11-27.json; an eager
add took 9.0-9.7 us there)."""
PYTHON_VIEW_S = 6e-6
"""Host seconds of one ``grad.view(-1).narrow(...)`` appended to a list in a Python loop, the view
DeepSpeed's ZeRO-3 built per rank for each parameter's gradient reduce-scatter before v0.6.0: 5.4 to
6.5 us each in the same probe run."""


def zero3_host_s(ctx: Context) -> tuple[float, float]:
    """Host seconds per rank of the group that one ZeRO-3 module gather and one gradient
    reduce-scatter spend building and copying partitions, at the framework's release
    (``ProfileAt.zero3_host_copies``): each Python-loop copy at ``PYTHON_COPY_S``, each Python view
    at ``PYTHON_VIEW_S``, each copy PyTorch's list collectives issue from C++ at the device's
    per-kernel overhead. The fetch is blocking, so they run with the device idle. Only the weights
    the model counts as partitioned modules are counted (biases and norms under the persistence
    threshold have their own, smaller reduce-scatters, left out)."""
    python, listed, views, scattered = ctx.job.profile.zero3_host_copies
    launch = ctx.cluster.device.kernel_overhead_s
    return python * PYTHON_COPY_S + listed * launch, views * PYTHON_VIEW_S + scattered * launch


def zero3_released_modules(ctx: Context, tp: int) -> tuple[float, int]:
    """Weights (elements per rank) and modules of one dense layer that ZeRO-3 gathers a third time
    per micro-batch under full recomputation: the framework releases a module after its recomputed
    forward unless it is reused within ``semantics.zero3_reuse_distance_numel`` elements of other
    gathers (DeepSpeed's ``stage3_max_reuse_distance``, 1e9 by default: ``_keep_for_later``), and
    gathers it again for its backward. Between a module's recomputed forward and its backward run
    the later modules' forwards and their backwards, ``2 x`` their elements; the last module is
    reused at once. Modules in forward order: QKV, the attention output, the first and the second
    MLP projection (Megatron's fused linears). (0, 0) where the framework keeps what the recompute
    gathered (FSDP2 skips resharding in a forward run inside backward)."""
    limit = ctx.job.profile.profile.zero3_reuse_distance_numel
    if not limit:
        return 0.0, 0
    m = ctx.model
    heads = m.num_attention_heads * (m.mla.v_head_dim if m.mla is not None else m.head_dim_resolved)
    out = heads * m.hidden_size
    first_mlp = m.dense_mlp_params * (m.mlp_matrices - 1) / m.mlp_matrices
    sizes = [(m.attention_params - out) / tp, out / tp, first_mlp / tp, (m.dense_mlp_params - first_mlp) / tp]
    sizes = [x for x in sizes if x >= ctx.job.profile.profile.zero3_persistence_threshold]
    released = [x for i, x in enumerate(sizes) if 2 * sum(sizes[i + 1:]) >= limit]
    return sum(released), len(released)


def zero3_regather_s(ctx: Context, tp: int, pp: int, vp: int, zero: int, profile) -> float:
    """Seconds per micro-batch of the stage's third ZeRO-3 gathers under full recomputation
    (:func:`zero3_released_modules`) over the data-parallel group ``profile``: the dense layers'
    released modules, one collective each (with its host work) where the framework fetches module
    by module, else one per pass. MoE layers are left out (their experts' reuse is not modelled)."""
    numel, k = zero3_released_modules(ctx, tp) if zero == 3 and profile is not None else (0.0, 0)
    if not k:
        return 0.0
    dense_layers = min(layers_on_stage(ctx.model.num_layers, pp, vp), ctx.model.num_dense_layers)
    if not dense_layers:
        return 0.0
    per_module = ctx.job.profile.zero3_fetch == "per_module_blocking"
    n = dense_layers * k if per_module else 1
    host = zero3_host_s(ctx)[0] if per_module else 0.0
    return n * (coll.all_gather_s(gather_bytes(ctx.job) * dense_layers * numel / n, profile) + profile.num_ranks * host)


def gather_bytes(job: Job) -> float:
    """Bytes per parameter a sharded data-parallel group all-gathers: the 16-bit weights, or one byte
    where an FP8 job gathers them already cast (torchao's float8 all-gather under FSDP2,
    ``Job.fp8_all_gather``: ``enable_fsdp_float8_all_gather``)."""
    return 1.0 if job.fp8_all_gather and job.precision == "fp8" else WEIGHT_BYTES


def dp_traffic(grad_bytes: int, pc: ParamCounts, dense_prof, expert_prof, zero_stage: int,
               zero2_param_gather: str | None = "per_step",
               zero3_modules: tuple[int, int] | None = None, weight_bytes: float = WEIGHT_BYTES,
               host_s: tuple[float, float] = (0.0, 0.0)) -> DataParallelTerms:
    """The collectives of :func:`dp_terms` for given parameter counts and group profiles.

    - ZeRO-0 (DDP): one all-reduce of the gradients per step.
    - ZeRO-1 (Megatron-Core's distributed optimizer, DeepSpeed ZeRO-1): gradients accumulate in a
      full buffer over the micro-batches, then one reduce-scatter, the optimizer step on the
      shard, and an all-gather of the updated 16-bit weights per step.
    - ZeRO-2 (DeepSpeed ZeRO-2, FSDP2 without resharding after forward): gradients are kept only
      as shards, so every micro-batch's backward reduce-scatters them. DeepSpeed then all-gathers
      the updated weights once after the step, outside any backward (``per_step``); FSDP2 gathers
      them at every micro-batch's forward (``per_microbatch``).
    - ZeRO-3 (FSDP, DeepSpeed ZeRO-3): weights all-gathered in forward and again in backward, and
      gradients reduce-scattered, every micro-batch (Rajbhandari et al. 2020, section 7). Each pass
      is one collective, or ``zero3_modules`` (dense, expert) collectives each paying its latency
      (:func:`zero3_collectives`) and, per rank of its group, ``host_s`` (gather, reduce-scatter)
      of host work around each (:func:`zero3_host_s`).
    """
    if expert_prof is dense_prof:  # ep = 1: experts are reduced with the dense weights, one stream
        pc = ParamCounts(pc.dense + pc.expert, 0.0)
        zero3_modules = zero3_modules and (sum(zero3_modules), 0)

    def over(fn, collectives: tuple[int, int] = (1, 1)) -> float:
        """``fn`` over the dense and expert streams, each split into its number of collectives
        (the bandwidth term is shared, each collective pays its latency)."""
        streams = ((pc.dense, dense_prof, collectives[0]), (pc.expert, expert_prof, collectives[1]))
        return sum(k * fn(count / k, prof) for count, prof, k in streams if prof is not None and count)

    def rs(count, prof):
        return coll.reduce_scatter_s(grad_bytes * count, prof)

    def ag(count, prof):
        return coll.all_gather_s(weight_bytes * count, prof)

    if zero_stage == 0:
        return DataParallelTerms(over(lambda c, p: coll.all_reduce_s(grad_bytes * c, p)), 0.0)
    if zero_stage == 1:
        return DataParallelTerms(over(rs) + over(ag), 0.0)
    if zero_stage == 2:
        if zero2_param_gather == "per_microbatch":
            return DataParallelTerms(0.0, over(rs) + over(ag))
        return DataParallelTerms(0.0, over(rs), over(ag))
    per_pass = (1, 1) if zero3_modules is None else tuple(max(1, k) for k in zero3_modules)

    def host(per_rank_s: float) -> float:
        return over(lambda count, prof: prof.num_ranks * per_rank_s, per_pass)
    return DataParallelTerms(0.0, 2 * (over(ag, per_pass) + host(host_s[0])) + over(rs, per_pass) + host(host_s[1]))


@lru_cache(maxsize=65536)
def dp_profiles(ctx: Context, tp: int, pp: int, dp: int, cp: int, ep: int, order: str, expert_tp: bool = True):
    """Fabric profiles of the dense (data x context) and expert-data-parallel groups."""
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order, expert_tp=expert_tp)
    ctx = ctx.placed(order)
    if ep > 1 and not expert_tp:  # folded: every (ep / (tp cp))-th data-parallel rank holds the same experts
        dense = dp_profiles(ctx._base, tp, pp, dp, cp, 1, order)[0]
        step = max(1, ep // (tp * cp))
        return dense, ctx.cluster.strided_profile(dp // step, layout.stride("dp") * step) if dp // step > 1 else None
    if cp == 1:  # an arithmetic progression: profile it by (count, stride) without listing ranks
        stride = layout.stride("dp")
        dense = ctx.cluster.strided_profile(dp, stride)
        if ep == 1:
            return dense, dense
        return dense, ctx.cluster.strided_profile(dp // ep, stride * ep) if dp // ep > 1 else None
    inner, outer = sorted((("dp", layout.stride("dp")), ("cp", layout.stride("cp"))), key=lambda a: a[1])
    if ep == 1 and outer[1] == inner[1] * layout.degree(inner[0]):  # dp and cp adjacent: one progression
        dense = ctx.cluster.strided_profile(dp * cp, inner[1])
        return dense, dense
    dense = ctx.cluster.group_profile(_dp_cp_group(layout))
    if ep == 1:  # experts replicated like the dense weights: reduced over the same group
        return dense, dense
    # Expert weights are replicated over the data-parallel ranks outside their expert group, and
    # over the context-parallel ranks (Megatron-Core's expert-data-parallel group, dp * cp / ep).
    cp_offsets = [c - layout.group("cp")[0] for c in layout.group("cp")]
    edp_group = tuple(sorted(d + c for d in layout.group("edp") for c in cp_offsets))
    expert = ctx.cluster.group_profile(edp_group) if len(edp_group) > 1 else None
    return dense, expert


def _dp_cp_group(layout: Layout) -> tuple[int, ...]:
    """The ranks that share a copy of the dense weights: data- and context-parallel together."""
    dp = layout.group("dp")
    if layout.cp == 1:
        return dp
    cp = layout.group("cp")
    return tuple(sorted(d + c for d in dp for c in cp))
