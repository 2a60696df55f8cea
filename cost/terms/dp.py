"""Data parallelism: gradient reductions, ZeRO gathers, their host work, and the optimizer step.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from dataclasses import dataclass, replace
from functools import lru_cache

from clusterplan.cost import collectives as coll
from clusterplan.cost.compute import memory_rate
from clusterplan.cost.layout import Job, Layout, num_microbatches, offloads_optimizer
from clusterplan.cost.terms.context import LLMFOUNDRY_MODEL_CODE, Context
from clusterplan.cost.terms.memory import (ParamCounts, WEIGHT_BYTES, effective_zero_stage, host_tier, optimizer_state_bytes,
                                           owned_params, param_counts, param_gather_bytes, partitioned_modules,
                                           zero_replicas)
from clusterplan.cost.terms.pipeline import layers_on_stage


NUM_GRAD_BUCKETS = 8  # the last of the bucketed gradient reductions cannot overlap (PyTorch DDP, Megatron DDP)


def optimizer_s(ctx: Context, layout: Layout) -> float:
    """The Adam step, memory-bound. Fused (one kernel): per parameter it reads and writes the fp32
    master weight and both moments (24 B), reads the gradient and writes the 16-bit weight
    (``grad_bytes + 2``). PyTorch's foreach AdamW (``ProfileAt.optimizer_kernel``) makes one pass
    per multi-tensor op (``torch.optim.adamw._multi_tensor_adamw``): weight decay on p (r+w 8 B),
    lerp of m toward g (8 + g), scale v (8), addcmul of g squared into v (8 + 2 g), sqrt of v,
    divide, add eps (8 each), addcdiv into p (16): ``72 + 3 grad_bytes``, 84 B with fp32
    gradients. With the optimizer offloaded (``layout.offload``) the step runs on the host instead,
    its copies and CPU step all exposed (:func:`host_optimizer_terms`)."""
    if offloads_optimizer(layout.offload):
        return sum(host_optimizer_terms(ctx, layout))
    count = optimizer_params(ctx, layout)
    dev = ctx.cluster.device
    gb = ctx.job.grad_bytes
    per_param = 72.0 + 3 * gb if ctx.job.profile.optimizer_kernel == "foreach" else 24.0 + gb + WEIGHT_BYTES
    return count * per_param / memory_rate(dev)


GRAD_ACCUMULATION_BYTES = {
    # Megatron-Core's gradient_accumulation_fusion (on by default since NVIDIA/Megatron-LM 83b1e42f30,
    # 2022-02): the weight-gradient GEMM accumulates into the fp32 main_grad itself, no pass of its own
    "fused": 0.0,
    # PyTorch's AccumulateGrad (torchtitan, DeepSpeed with 16-bit accumulation) and FSDP2's
    # foreach_reduce (``sharded_param.grad._local_tensor += new_sharded_grad``): the first
    # micro-batch's gradient becomes .grad, each later one is added in place: read both, write one,
    # ``3 * grad_bytes``
    "autograd": 3.0,
    # an fp32 buffer += the 16-bit .grad in one mixed-dtype kernel, every micro-batch (the buffer is
    # zeroed at the step): read 2 B + 4 B, write 4 B. Megatron-LM's DDP hook
    # ``param.main_grad.add_(param.grad.data)`` (b4bc51b1e7, 2021-03); nanotron's
    # FP32GradientAccumulator ``fp32_grad.add_(half_param.grad)`` (2411b022, gradient_accumulator.py)
    "fp32_add": 10.0,
    # DeepSpeed's BF16_Optimizer.update_hp_grads after every backward, the first included:
    # ``hp_grad.add_(lp.grad.to(fp32))`` (microsoft/DeepSpeed v0.6.2 32d97976, bf16_optimizer.py;
    # unchanged at 38327e07): the upcast reads 2 B and writes a 4 B temporary, the add reads 4 + 4 B
    # and writes 4 B
    "upcast_add": 18.0,
    # MaxText's gradient accumulation (AI-Hypercomputer/maxtext 344b46c34, 2024-08; e591f30c
    # src/maxtext/utils/gradient_accumulation.py): a jax.lax.scan whose carry starts as zeros_like
    # the parameters and takes ``x + y`` of each micro-batch's gradient tree, outside the backward's
    # layer scan that writes the gradients, so its own pass: read both, write one, in the gradient
    # dtype (``3 * grad_bytes``; with ZeRO-1, shard_optimizer_over_data, the scan differentiates
    # parameters cast to bf16 first, so 2 B), every micro-batch; only with gradient_accumulation_steps
    # > 1 (trainers/pre_train/train.py L330), so with pp = 1 (a pipeline's micro-batches accumulate in
    # its own scan, not priced)
    "carry_add": 3.0,
}
"""Bytes moved per parameter per accumulating micro-batch, by ``semantics.grad_accumulation_history``
kind (``autograd`` and ``carry_add``: per byte of the gradient dtype)."""


def grad_accumulation_kind(ctx: Context, zero_stage: int) -> str:
    """The accumulation the rank runs: the framework's (``ProfileAt.grad_accumulation``), where its
    fp32 buffer exists (fp32 gradients over the whole rank's parameters: ZeRO 0/1); else autograd's
    add into ``.grad`` (DeepSpeed's 16-bit accumulation and its ZeRO-2/3 partitions, FSDP2's shards)."""
    kind = ctx.job.profile.grad_accumulation
    if kind in ("fp32_add", "upcast_add") and (ctx.job.grad_bytes != 4 or zero_stage >= 2):
        return "autograd"
    return kind


def grad_accumulation_adds(ctx: Context, layout: Layout, m: int) -> int:
    """The micro-batches whose gradients are added in: all ``m`` into a buffer zeroed at the step,
    ``m - 1`` with autograd, whose first gradient is taken as it comes, and MaxText's scan only
    where it runs (``m > 1``)."""
    kind = grad_accumulation_kind(ctx, effective_zero_stage(ctx, layout.zero_stage, layout.pp))
    if kind == "autograd":
        return m - 1
    return 0 if kind == "carry_add" and m == 1 else m


def grad_accumulation_parts(ctx: Context, layout: Layout) -> tuple[float, float, float]:
    """One micro-batch's add (:func:`grad_accumulation_s`), the add taken off once where the first
    gradient is taken as it comes (autograd), and once more where a single micro-batch adds none
    (MaxText's scan): a step of ``m`` micro-batches pays ``m`` times the first less the others."""
    add_s = grad_accumulation_s(ctx, layout)
    first, only = (grad_accumulation_adds(ctx, layout, n) < n for n in (2, 1))
    return add_s, add_s * first, add_s * (only and not first)


def grad_accumulation_s(ctx: Context, layout: Layout) -> float:
    """One micro-batch's gradient accumulation, a memory-bound pass over the gradients the rank
    holds (its ZeRO-2/3 shard, else all of its parameters; ``GRAD_ACCUMULATION_BYTES``) at the
    device's memory rate. 0 under weight streaming (no gradient on the device) and where the
    offloaded optimizer accumulates in host memory (``semantics.optimizer_offload_host_accumulation``,
    priced by :func:`host_optimizer_terms`)."""
    z = effective_zero_stage(ctx, layout.zero_stage, layout.pp)
    host = z in ctx.job.profile.profile.optimizer_offload_host_accumulation
    if ctx.cluster.weight_streaming or (offloads_optimizer(layout.offload) and host):
        return 0.0
    kind = grad_accumulation_kind(ctx, z)
    if kind == "carry_add" and layout.pp > 1:
        return 0.0
    per_param = GRAD_ACCUMULATION_BYTES[kind] * _accumulated_element_bytes(ctx, kind, z)
    if not per_param:
        return 0.0
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
    copies = zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, z, layout.shard_across_domains,
                           layout.dp_shard)
    return owned_params(pc, layout, z >= 2, copies) * per_param / memory_rate(ctx.cluster.device)


def _accumulated_element_bytes(ctx: Context, kind: str, zero_stage: int) -> float:
    """The element size ``GRAD_ACCUMULATION_BYTES`` multiplies for ``kind``: the gradient dtype for
    autograd's and MaxText's adds (bf16 in MaxText's ZeRO-1 scan), 1 for the kinds counted in bytes."""
    if kind == "carry_add" and zero_stage == 1:
        return min(ctx.job.grad_bytes, WEIGHT_BYTES)
    return ctx.job.grad_bytes if kind in ("autograd", "carry_add") else 1


def optimizer_params(ctx: Context, layout: Layout) -> float:
    """The parameters whose optimizer step the rank runs: its ZeRO shard (stage >= 1) or all it holds."""
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
    copies = zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, layout.zero_stage,
                           layout.shard_across_domains, layout.dp_shard)
    return owned_params(pc, layout, layout.zero_stage >= 1, copies)


HOST_GRAD_BYTES = 4.0
"""The fp32 gradient the host keeps per offloaded parameter: ZeRO-Offload copies each reduced gradient
partition into an fp32 CPU buffer (Ren et al. 2021, ZeRO-Offload, USENIX ATC, section 4: 'gradients ...
offloaded to CPU memory'), Megatron-Core's HybridDeviceOptimizer steps CPU parameters with CPU .grad
tensors (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py, pinned by --pin-cpu-grads)."""
CPU_ADAM_BYTES = 30.0
"""Host-memory bytes the CPU Adam step touches per parameter: the fp32 master weight and both moments
read and written (24 B), the fp32 gradient read (4 B), and the 16-bit weight written for the copy back
to the device (2 B); DeepSpeedCPUAdam and torch's CPU Adam are memory-bound at these sizes (ZeRO-Offload
section 5.1 vectorizes the update so that memory, not arithmetic, bounds it)."""


def host_optimizer_bytes(ctx: Context, layout: Layout) -> float:
    """Host memory the rank's offloaded optimizer holds (``layout.offload``): Adam's states and the
    fp32 gradient of each parameter it steps; 0 without optimizer offload."""
    if not offloads_optimizer(layout.offload):
        return 0.0
    return optimizer_params(ctx, layout) * (optimizer_state_bytes(ctx.job) + HOST_GRAD_BYTES)


def host_optimizer_terms(ctx: Context, layout: Layout) -> tuple[float, float, float]:
    """The offloaded optimizer step's parts, each step (``layout.offload``): the rank's gradient shard
    copied to the host (``grad_bytes`` each; where the framework accumulates gradients in host memory,
    ``semantics.optimizer_offload_host_accumulation``, every micro-batch after the first also brings
    the running sum back and sends it out again), the CPU Adam step (:data:`CPU_ADAM_BYTES` per parameter
    over the host memory's bandwidth per device, ``MemoryTier.dram_bytes_per_s``: nominal, so the time
    is a lower bound, unvalidated), and the updated 16-bit weights copied back, both copies over the
    host link (``cost.terms.host_tier``). All exposed: DeepSpeed steps the CPU optimizer after the
    backward and before the next forward (ZeRO-Offload's one-step delayed parameter update, Ren et al.
    2021 section 4.3, is not a DeepSpeed option), Megatron-Core's --overlap-cpu-optimizer-d2h-h2d is off
    by default (megatron/training/arguments.py). Zeros without a host tier (``layout_problems`` refuses)."""
    tier = host_tier(ctx.cluster.device)
    if tier is None or not tier.dram_bytes_per_s:
        return 0.0, 0.0, 0.0
    count = optimizer_params(ctx, layout)
    grad_copies = 1
    if layout.zero_stage in ctx.job.profile.profile.optimizer_offload_host_accumulation:
        grad_copies += 2 * (num_microbatches(ctx.job, layout) - 1)
    return (grad_copies * count * ctx.job.grad_bytes / tier.bytes_per_s,
            count * CPU_ADAM_BYTES / tier.dram_bytes_per_s, count * WEIGHT_BYTES / tier.bytes_per_s)


@dataclass(frozen=True, slots=True)
class DataParallelTerms:
    """Data-parallel traffic: per step, overlappable (ZeRO 0-1: the gradient reduction and weight
    gather), per micro-batch (ZeRO-2 reduce-scatters, ZeRO-3 gathers) and per step, not
    overlapped (ZeRO-2's weight all-gather after the optimizer step)."""

    per_step_s: float
    per_microbatch_s: float
    blocking_s: float = 0.0
    regather_s: float = 0.0  # per micro-batch, with full recomputation (zero3_regather_s)
    copy_s: float = 0.0  # per micro-batch, on the compute stream, never overlapped (fsdp_copy_s)


def dp_terms(ctx: Context, layout: Layout) -> DataParallelTerms:
    """The data-parallel collectives of ``layout`` under the job's framework (:func:`dp_traffic`)."""
    if layout.dp * layout.cp == 1:
        return DataParallelTerms(0.0, 0.0)
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
    profiles = dp_profiles(ctx, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.order, layout.expert_tp)
    return dp_terms_of(ctx, pc, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.order, layout.expert_tp,
                       layout.vp, layout.zero_stage, profiles, layout.shard_across_domains, layout.param_gather,
                       layout.dp_shard)


def dp_terms_of(ctx: Context, pc: ParamCounts, tp: int, pp: int, dp: int, cp: int, ep: int, order: str,
                expert_tp: bool, vp: int, zero: int, profiles: tuple, across: bool = False,
                param_gather: str = "bf16", dp_shard: int = 0) -> DataParallelTerms:
    """:func:`dp_traffic` for the degrees and the groups' ``profiles`` (:func:`dp_profiles`); where
    ZeRO-3 shards inside each scale-up domain only (:func:`zero_replicas`), its collectives run
    over the domain's ranks of the data-parallel group and the shards' gradients are all-reduced
    across the domains once a step (unless ``across``: ``Layout.shard_across_domains``). With
    ``dp_shard`` (hybrid sharding, cp = ep = 1) the same over the ``dp_shard`` innermost
    data-parallel ranks, on whichever fabric tiers they and the replicas span. The
    parameters are gathered at :func:`gather_bytes` of ``param_gather``, with
    :func:`amax_all_reduce_s` once a step."""
    t = _dp_terms_of(ctx, pc, tp, pp, dp, cp, ep, order, expert_tp, vp, zero, profiles, across, param_gather,
                     dp_shard)
    amax_s = amax_all_reduce_s(ctx, pp, vp, zero, profiles[0], param_gather)
    sharded = profiles[0] is not None  # dp x cp > 1
    per_step_copy_s, copy_s = fsdp_copy_s(ctx, pc, effective_zero_stage(ctx, zero, pp), param_gather) if sharded else (0, 0)
    if amax_s or per_step_copy_s or copy_s:
        return replace(t, per_step_s=t.per_step_s + amax_s, blocking_s=t.blocking_s + per_step_copy_s, copy_s=copy_s)
    return t


def fsdp_copy_s(ctx: Context, pc: ParamCounts, zero: int, param_gather: str = "bf16") -> tuple[float, float]:
    """Seconds (per step, per micro-batch) of the copies per-parameter FSDP (FSDP2's ``fully_shard``)
    makes around its collectives on the compute stream, where nothing hides them
    (``semantics.fsdp_copies``). After each all-gather, ``foreach_all_gather_copy_out`` waits for
    it on the current stream and ``split_with_sizes_copy`` copies the gathered buffer into each
    parameter (read and write :func:`gather_bytes` per parameter); before each reduce-scatter,
    ``foreach_reduce_scatter_copy_in`` (``chunk_cat``) copies the 16-bit unsharded gradients into
    the reduce-scatter buffer, widened to the reduce dtype (read 2 B, write ``grad_bytes``), on the
    current stream before the reduce-scatter stream waits for it (PyTorch
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). All at the memory-bound rate, over
    the weights of the rank's stage. ZeRO-3 gathers twice a micro-batch (forward, and backward
    after resharding) and ZeRO-2 once; both reduce-scatter every micro-batch (torchtitan never
    skips the gradient sync). Under pipeline parallelism the parameters stay gathered and the
    gradients unsharded through the micro-batches (``effective_zero_stage`` 1): one copy of each
    kind a step. llm-foundry runs Composer's FSDP (flat parameters: gathered into the buffer its
    parameters view, the flat gradient reduce-scattered in place), which has no such copies."""
    prof = ctx.job.profile.profile
    if not prof.fsdp_copies or ctx.job.model_code == LLMFOUNDRY_MODEL_CODE or zero == 0:
        return 0.0, 0.0
    gather, scatter = 2.0 * gather_bytes(ctx.job, param_gather), WEIGHT_BYTES + ctx.job.grad_bytes
    per_byte_s = (pc.dense + pc.expert) / memory_rate(ctx.cluster.device)
    if zero == 1:
        return (gather + scatter) * per_byte_s, 0.0
    return 0.0, ((2 if zero == 3 else 1) * gather + scatter) * per_byte_s


def amax_all_reduce_s(ctx: Context, pp: int, vp: int, zero: int, profile, param_gather: str) -> float:
    """Seconds a step of the one all-reduce of the weights' amaxes over the data-parallel group that a
    sharded per-tensor FP8 cast needs under current scaling (every rank casts its shard with the
    whole tensor's scale): torchtitan's ``precompute_float8_dynamic_scale_for_fsdp`` ("communicate
    AMAX/scales efficiently in a single all-reduce for all parameters", docs/float8.md at v0.2.2) and
    Megatron-LM's current-scaling ``--fp8-param-gather`` (!2811). One fp32 amax per linear weight,
    four per layer of the stage (QKV, attention output, the MLP's two): latency-bound. Delayed
    scaling takes the scale from the amax history (no extra collective); MXFP8 scales each 32-element
    block locally."""
    if not _amax_reduced(ctx.job, param_gather) or zero == 0 or profile is None:
        return 0.0
    return coll.all_reduce_s(4.0 * 4 * layers_on_stage(ctx.model.num_layers, pp, vp), profile)


def _amax_reduced(job: Job, param_gather: str) -> bool:
    """Whether gathering in ``param_gather`` needs :func:`amax_all_reduce_s`'s all-reduce (current scaling)."""
    return param_gather == "fp8" and job.gemm_format == "fp8_current"


def fp8_gathers_no_slower(job: Job) -> bool:
    """Whether gathering the parameters in fp8 lengthens no data-parallel term of any layout: it moves
    no more bytes per weight than bf16 (:func:`gather_bytes`, through the same collectives, whose time
    does not fall as bytes grow) and adds no amax all-reduce (:func:`amax_all_reduce_s`; delayed or
    per-block scaling). The search then needs no bf16 price to know fp8 is no slower."""
    return gather_bytes(job, "fp8") <= gather_bytes(job, "bf16") and not _amax_reduced(job, "fp8")


def _dp_terms_of(ctx: Context, pc: ParamCounts, tp: int, pp: int, dp: int, cp: int, ep: int, order: str,
                 expert_tp: bool, vp: int, zero: int, profiles: tuple, across: bool,
                 param_gather: str, dp_shard: int) -> DataParallelTerms:
    z = effective_zero_stage(ctx, zero, pp)
    modules = zero3_collectives(ctx, tp, pp, vp, ep, expert_tp) if z == 3 else None
    prof = ctx.job.profile.profile
    copy_s = zero3_host_s(ctx) if modules else (0.0, 0.0)
    copies = zero_replicas(ctx, dp, pp, cp, ep, z, across, dp_shard)
    all_reduce = prof.zero1_grad_reduce == "all_reduce"
    if copies == 1:
        t = dp_traffic(ctx.job.grad_bytes, pc, *profiles, z, prof.zero2_param_gather, modules,
                       gather_bytes(ctx.job, param_gather), copy_s, zero1_all_reduce=all_reduce)
        # built field by field: dataclasses.replace costs more than the collectives here (34k calls a search)
        return DataParallelTerms(t.per_step_s, t.per_microbatch_s, t.blocking_s,
                                 zero3_regather_s(ctx, tp, pp, vp, z, profiles[0], param_gather))
    placed, shard = ctx.placed(order).cluster, dp // copies
    # the domain rule holds with pp = cp = 1 (dp's stride tp); hybrid sharding reads the order's stride
    stride = Layout(tp=tp, pp=pp, dp=dp, cp=cp, order=order).stride("dp") if dp_shard else tp
    inner = placed.strided_profile(shard, stride) if shard > 1 else None
    t = dp_traffic(ctx.job.grad_bytes, pc, inner, inner, z, prof.zero2_param_gather, modules,
                   gather_bytes(ctx.job, param_gather), copy_s, zero1_all_reduce=all_reduce)
    across_s = coll.all_reduce_s(ctx.job.grad_bytes * (pc.dense + pc.expert) / shard,
                                 placed.strided_profile(copies, stride * shard))
    return DataParallelTerms(t.per_step_s + across_s, t.per_microbatch_s, t.blocking_s,
                             zero3_regather_s(ctx, tp, pp, vp, z, inner, param_gather))


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


def zero3_regather_s(ctx: Context, tp: int, pp: int, vp: int, zero: int, profile, param_gather: str = "bf16") -> float:
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
    return n * (coll.all_gather_s(gather_bytes(ctx.job, param_gather) * dense_layers * numel / n, profile) + profile.num_ranks * host)


def gather_bytes(job: Job, param_gather: str = "bf16") -> float:
    """Bytes per parameter a sharded data-parallel group all-gathers: the 16-bit weights, or the
    8-bit format where the layout gathers them cast (``Layout.param_gather``, :func:`param_gather_bytes`),
    or one byte where a run says an FP8 job gathered them cast (torchao's float8 all-gather under FSDP2,
    ``Job.fp8_all_gather``: ``enable_fsdp_float8_all_gather``)."""
    if param_gather == "fp8":
        return param_gather_bytes(job, param_gather)
    return 1.0 if job.fp8_all_gather and job.precision == "fp8" else WEIGHT_BYTES


def dp_traffic(grad_bytes: int, pc: ParamCounts, dense_prof, expert_prof, zero_stage: int,
               zero2_param_gather: str | None = "per_step",
               zero3_modules: tuple[int, int] | None = None, weight_bytes: float = WEIGHT_BYTES,
               host_s: tuple[float, float] = (0.0, 0.0), zero1_all_reduce: bool = False) -> DataParallelTerms:
    """The collectives of :func:`dp_terms` for given parameter counts and group profiles.

    - ZeRO-0 (DDP): one all-reduce of the gradients per step.
    - ZeRO-1 (Megatron-Core's distributed optimizer, DeepSpeed ZeRO-1): gradients accumulate in a
      full buffer over the micro-batches, then one reduce-scatter, the optimizer step on the
      shard, and an all-gather of the updated 16-bit weights per step. ``zero1_all_reduce`` (nanotron's
      ``semantics.zero1_grad_reduce``): the whole buffer is all-reduced instead, each rank updating its shard.
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

    def rs(count, prof, all_reduce: bool = False):  # the gradients' reduction (all-reduce: twice the ring bytes)
        return (coll.all_reduce_s if all_reduce else coll.reduce_scatter_s)(grad_bytes * count, prof)

    def ag(count, prof):
        return coll.all_gather_s(weight_bytes * count, prof)

    if zero_stage == 0:
        return DataParallelTerms(over(lambda c, p: rs(c, p, True)), 0.0)
    if zero_stage == 1:
        return DataParallelTerms(over(lambda c, p: rs(c, p, zero1_all_reduce)) + over(ag), 0.0)
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
    dense = ctx.cluster.axis_profile(_dp_cp_group(layout))
    if ep == 1:  # experts replicated like the dense weights: reduced over the same group
        return dense, dense
    # Expert weights are replicated over the context x data ranks outside their expert group
    # (Megatron-Core's expert-data-parallel group, dp * cp / ep: ``Layout.group``).
    edp_group = layout.group("edp")
    expert = ctx.cluster.axis_profile(edp_group) if len(edp_group) > 1 else None
    return dense, expert


def _dp_cp_group(layout: Layout) -> tuple[int, ...]:
    """The ranks that share a copy of the dense weights: data- and context-parallel together."""
    dp = layout.group("dp")
    if layout.cp == 1:
        return dp
    cp = layout.group("cp")
    return tuple(sorted(d + c for d in dp for c in cp))
