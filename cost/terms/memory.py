"""Memory outside the activations: parameters per rank, weights, gradients and optimizer states by ZeRO stage, the runtime.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from dataclasses import dataclass
from functools import lru_cache

from clusterplan.cost.layout import Layout, offloads_activations, offloads_optimizer
from clusterplan.cost.stages import rank_index, rank_layers
from clusterplan.cost.terms.comm import NCCL_RING_SHARE
from clusterplan.cost.terms.context import Context
from clusterplan.cost.terms.pipeline import layers_on_stage, stage_split
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.precisions import low_precision


OPTIMIZER_STATE_BYTES = 12.0  # fp32 master weights + two fp32 moments (Rajbhandari et al. 2020)


def optimizer_state_bytes(job) -> float:
    """Optimizer bytes per parameter: the master copy and Adam's two moments, each of
    ``job.weight_bytes`` (12 for fp32; 6 for MaxText's ``weight_dtype: bfloat16``, where ``mu_dtype``
    inherits the weight dtype and optax keeps ``nu`` in the parameter's), the moments of
    ``job.moment_bytes`` where set (8 for fp32 masters with BF16 moments: DeepSeek-V3 report s3.3.3,
    "BF16 ... to track the first and second moments in the AdamW optimizer", the master weights kept
    in FP32; Megatron-Core's precision-aware optimizer with ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``)."""
    return float(job.weight_bytes + 2 * (job.moment_bytes or job.weight_bytes))  # 4 + 2 x 4 = OPTIMIZER_STATE_BYTES


WEIGHT_BYTES = 2.0  # 16-bit weights (FP8 training keeps 16-bit masters of the weights in use)


def param_gather_bytes(job, param_gather: str) -> float:
    """Bytes per element of the parameters a data-parallel group gathers and the gathered copy it
    keeps (``Layout.param_gather``): with ``fp8``, the job's 8-bit format with its scales (FP8 1 B,
    MXFP8 1 + 1/32 B: Megatron-LM's ``--fp8-param-gather`` keeps the model's params in it, the fp32 main
    params in the optimizer, instead of bf16 ones; torchtitan's FSDP2 float8 all-gather unshards float8
    weights); else 16-bit."""
    fmt = low_precision(job.precision) if param_gather == "fp8" and job.precision in ("fp8", "mxfp8") else None
    return fmt.element_bytes if fmt else WEIGHT_BYTES


def kept_param_bytes(job, param_gather: str) -> float:
    """Bytes per element of the gathered weights a rank keeps (:func:`param_gather_bytes`), times two
    where the framework keeps a row- and a column-wise low-precision copy (Transformer Engine under
    Megatron-LM's ``--fp8-param-gather``: ``semantics.lp_param_both_layouts``). torchao's float8
    all-gather unshards one float8 weight and transposes it in the backward."""
    gathered = param_gather_bytes(job, param_gather)
    both = gathered != WEIGHT_BYTES and job.profile.profile.lp_param_both_layouts
    return 2 * gathered if both else gathered


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


def allocator_fraction(ctx: Context, pp: int = 1) -> float:
    """The caching allocator's reserved-but-unallocated bytes as a share of the allocated peak: the
    framework's allocator (PyTorch's caching allocator for the GPU frameworks; ``semantics.
    allocator_reserved_fraction``), on devices with a runtime heap (HBM); 0 on SRAM machines. With a
    pipeline (``pp`` > 1), the share measured for the framework's pipeline engine where the profile
    has one (``semantics.allocator_reserved_fraction_pipeline``)."""
    if ctx.cluster.device.memory_kind != "hbm":
        return 0.0
    prof = ctx.job.profile.profile
    if pp > 1 and prof.allocator_reserved_fraction_pipeline is not None:
        return prof.allocator_reserved_fraction_pipeline
    return prof.allocator_reserved_fraction


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
    (``NCCL_LAZY_CONNECT_SINCE``); elsewhere what the device's runtime is measured to keep
    (``DeviceSpec.program_memory_bytes``: XLA's available HBM on TPUs, none below 0 where the
    catalogue's capacity is the smaller), else ``RUNTIME_RESERVE_BYTES``; nothing on SRAM machines."""
    device = ctx.cluster.device
    if device.memory_kind != "hbm":
        return 0.0
    prof = ctx.job.profile
    if not (prof.profile.nccl_runtime and device.family.startswith(("nvidia", "amd"))):
        if device.program_memory_bytes is not None:
            return max(0.0, device.memory_bytes - device.program_memory_bytes)
        return RUNTIME_RESERVE_BYTES
    context = CUDA_CONTEXT_LAZY_BYTES if prof.date >= LAZY_LOADING_SINCE else CUDA_CONTEXT_EAGER_BYTES
    lazy = prof.date >= NCCL_LAZY_CONNECT_SINCE
    buffers = 0.0
    for size in nccl_communicator_sizes(layout):
        measured = NCCL_PAIR_COMMUNICATOR_BYTES if size == 2 else NCCL_COMMUNICATOR_BYTES
        buffers += measured * (NCCL_RING_SHARE[min(size, 3)] if lazy else 1.0)
    return context + buffers


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters held by the most loaded pipeline stage, per device, before ZeRO sharding."""

    dense: float  # replicated across data-parallel ranks (attention, norms, dense MLPs, embeddings)
    expert: float  # expert weights, replicated only across the expert-data-parallel ranks


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


def zero_replicas(ctx: Context, dp: int, pp: int, cp: int, ep: int, zero: int, across: bool = False,
                  shard: int = 0) -> int:
    """Copies of each ZeRO-3 shard: 1, except where the framework shards only inside a scale-up
    domain and runs plain data parallelism between domains (``semantics.zero3_across_domains:
    replicate``: MaxText's base.yml puts the fsdp axis on ICI, ``ici_fsdp_parallelism: -1``, and the
    data axis on DCN, ``dcn_data_parallelism: -1``). Then a data-parallel group spanning D slices
    keeps D copies of each shard, gathered and reduce-scattered inside its slice, with one
    all-reduce of the shard's gradients across slices a step. Taken where the data axis alone
    crosses the slices (no pipeline, context or expert parallelism), so every rank order agrees.
    ``across`` (``Layout.shard_across_domains``: MaxText's ``dcn_fsdp_parallelism``): the layout
    shards over every data-parallel rank, one copy. ``shard`` (``Layout.dp_shard``, hybrid sharded
    data parallelism): each copy spans that many data-parallel ranks, ``dp / shard`` copies, for
    every sharded stage (torchtitan's HSDP, ``data_parallel_replicate_degree``; Megatron-Core's
    partial distributed optimizer, ``--num-distributed-optimizer-instances``, 2024-11)."""
    return shard_copies(ctx.job.profile.profile, ctx.cluster, dp, pp, cp, ep, zero, across, shard)


def shard_copies(profile, cluster, dp: int, pp: int, cp: int, ep: int, zero: int, across: bool = False,
                 shard: int = 0) -> int:
    """:func:`zero_replicas` from the framework profile and the cluster alone (what a report needs)."""
    if shard:
        return dp // shard if zero >= 1 else 1
    if profile.zero3_across_domains != "replicate" or across or zero < 3 or pp > 1 or cp > 1 or ep > 1:
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
    return static_memories(ctx, layout, (rank,))[0]


def static_memories(ctx: Context, layout: Layout, ranks: tuple) -> list[StaticMemory]:
    """:func:`static_memory` on each rank of ``ranks``, what does not depend on the rank asked once
    (the search's tables ask three ranks of 17,000 cells on DeepSeek-V3 / 576 GB200)."""
    z = effective_zero_stage(ctx, layout.zero_stage, layout.pp)
    copies = zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, z, layout.shard_across_domains,
                           layout.dp_shard)
    kept = kept_param_bytes(ctx.job, layout.param_gather)
    # FSDP2 keeps no sharded weight copy: the fp32 shard (with the optimizer states) is cast at each gather
    no_weights = z >= 3 and not ctx.job.profile.profile.sharded_weight_copy
    lp_grads = _lp_grads_kept(ctx, z)  # DeepSpeed's BF16_Optimizer: the 16-bit .grad tensors besides
    # the fp32 master weights and moments live in host memory with the optimizer offloaded (ZeRO-Offload,
    # Megatron-Core's HybridDeviceOptimizer: cost.terms.dp.host_optimizer_terms)
    optim_bytes, offloaded = optimizer_state_bytes(ctx.job), offloads_optimizer(layout.offload)
    out = []
    for rank in ranks:
        pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots,
                          rank)
        weights = 0.0 if no_weights else kept * owned_params(pc, layout, z >= 3, copies)
        live_weights, live_grads = zero3_live_bytes(ctx, layout, pc, kept) if z >= 3 else (0.0, 0.0)
        weights += live_weights
        grads = ctx.job.grad_bytes * owned_params(pc, layout, z >= 2, copies) + live_grads
        if lp_grads:
            grads += WEIGHT_BYTES * owned_params(pc, layout, False, copies)
        optim = 0.0 if offloaded else optim_bytes * owned_params(pc, layout, z >= 1, copies)
        out.append(StaticMemory(weights, grads, optim))
    return out


def zero3_live_bytes(ctx: Context, layout: Layout, pc: ParamCounts, kept: float) -> tuple[float, float]:
    """ZeRO-3's live set beside the shards: ``(gathered weights, full-size gradients)`` bytes at its
    peak, as the framework holds them at the job's release (``ProfileAt.zero3_live``).

    ``layers``: FSDP keeps the gathered weights of the layer in use and the one prefetched, each
    gradient reduce-scattered as it is made. ``module_prefetch`` (DeepSpeed before v0.6.0,
    ``ds_zero3_live``): weights are gathered one module at a time, and the next module is
    prefetched only while fewer than ``semantics.zero3_max_live_numel`` gathered elements are live
    (stage3.py ``prefetch_next_sub_modules``, ``stage3_max_live_parameters``); a module is
    released after its forward and after its backward. A gradient larger than the reduce bucket
    (``semantics.zero3_reduce_bucket_numel``, ``reduce_bucket_size``) is reduced whole, and every
    reduced gradient is freed only when the next reduction starts (``partition_previous_reduced_grads``),
    so while a module's weight gradient is made the previous module's full gradient (or a bucket of
    smaller ones) is still held: :func:`module_live_numel`."""
    if ctx.job.profile.zero3_live != "module_prefetch":
        per_layer = (pc.dense + pc.expert) / max(1, layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp))
        return 2 * kept * per_layer, 0.0
    prof = ctx.job.profile.profile
    sizes = [n for n in _layer_modules(ctx.model, layout.tp, layout.ep, layout.expert_tp)
             if n >= prof.zero3_persistence_threshold]
    vocab = ctx.model.vocab_size * ctx.model.hidden_size / layout.tp
    gathered, grads = module_live_numel(sizes, vocab, prof.zero3_max_live_numel, prof.zero3_reduce_bucket_numel)
    return kept * gathered, ctx.job.grad_bytes * grads


def _layer_modules(model: ModelSpec, tp: int, ep: int, expert_tp: bool) -> list[float]:
    """Elements of each partitioned module of one layer on a rank, in forward order (Megatron's layout,
    as :func:`partitioned_modules`): fused QKV and the attention output (five equal projections with
    MLA), then the fused first and the second MLP projection, or an MoE layer's router and each local
    expert's two projections (the heavier layer kind where the model has both)."""
    h = model.hidden_size
    if model.mla is not None:
        attention = [model.attention_params / 5 / tp] * 5
    else:
        out = model.num_attention_heads * model.head_dim_resolved * h / tp
        attention = [model.attention_params / tp - out, out]
    first = (model.mlp_matrices - 1) / model.mlp_matrices
    dense = [first * model.dense_mlp_params / tp, (1 - first) * model.dense_mlp_params / tp]
    if model.moe is None or model.num_moe_layers == 0:
        return attention + dense
    e = model.moe
    width = model.expert_params / (tp if expert_tp else 1)
    shared = [first * model.expert_params / tp, (1 - first) * model.expert_params / tp] * e.num_shared_experts
    moe = [h * e.num_experts, *shared, *[first * width, (1 - first) * width] * max(1, e.num_experts // ep)]
    return attention + (moe if sum(moe) >= sum(dense) or model.num_moe_layers == model.num_layers else dense)


def module_live_numel(sizes: list[float], vocab: float, max_live: int, bucket: int) -> tuple[float, float]:
    """``(gathered, gradient)`` elements at the peak of DeepSpeed's module-by-module ZeRO-3
    (:func:`zero3_live_bytes`), over two consecutive layers of partitioned modules ``sizes`` (forward
    order) after the vocabulary matrix ``vocab``. In the forward, module ``i`` and, while it holds
    fewer than ``max_live`` elements, the next one prefetched; in the backward (reverse order), the
    same gathered pair, module ``i``'s full gradient and the one before it still held (a whole
    gradient above ``bucket``, else a bucket of smaller ones, or all made so far where fewer).

    >>> module_live_numel([3.0, 1.0, 4.0, 4.0], 0.0, max_live=2, bucket=2)  # a 4, its gradient and the 4 before
    (4.0, 8.0)
    >>> module_live_numel([3.0, 1.0, 4.0, 4.0], 0.0, max_live=5, bucket=2)  # under 5 live, a 4 prefetches the next
    (8.0, 7.0)
    """
    forward = [vocab, *sizes, *sizes]
    backward = [vocab, *reversed(sizes), *reversed(sizes)]
    best = (0.0, 0.0)
    for seq, with_grads in ((forward, False), (backward, True)):
        for i in range(1, len(seq) - 1):
            cur, nxt, prev = seq[i], seq[i + 1], seq[i - 1]
            gathered = cur + (nxt if cur < max_live else 0.0)
            grads = cur + (prev if prev > bucket else min(bucket, sum(seq[:i]))) if with_grads else 0.0
            if gathered + grads > sum(best):
                best = (gathered, grads)
    return best


def _lp_grads_kept(ctx: Context, zero_stage: int) -> bool:
    """The framework keeps each parameter's 16-bit gradient beside its fp32 accumulation buffer:
    DeepSpeed's BF16_Optimizer (ZeRO 0/1 with gradients accumulated in fp32 under a 16-bit
    precision; ``semantics.lp_grads_beside_fp32``)."""
    return (ctx.job.profile.profile.lp_grads_beside_fp32 and ctx.job.grad_bytes == 4 and zero_stage <= 1
            and not low_precision(ctx.job.precision))


FP32_BYTES = 4.0


def step_gradients(ctx: Context, layout: Layout, rank: str | None = None) -> tuple[float, float]:
    """``(held, copies)``: the gradient bytes a rank holds at its optimizer step, where the framework
    copies its gradient partition there (``ProfileAt.step_grad_copies``), and the copies among them;
    ``(0, 0)`` elsewhere. DeepSpeed's ZeRO-1/2 optimizer (``stage2.py``, ``stage_1_and_2.py`` from
    v0.5.9; its ``step()`` from the ZeRO-2 release, f2ac7eaf of 2020-05, to v0.16.4) has by then freed every gradient outside the
    rank's partition (the reduction's epilogue: ``zero_grad``) and keeps the partition
    (``averaged_gradients``: views of the 16-bit gradients, or of ZeRO-2's ``grads_in_partition``
    buffer); ``self.flatten(...)`` copies it
    into a new 16-bit tensor and ``.to(fp32)`` casts that into another, both alive while the cast
    runs: 2 + 2 + 4 bytes per parameter of the partition, beside the weights and the optimizer
    states, with every activation freed. None with 32-bit gradients (BF16_Optimizer steps its fp32
    buffer in place), with the optimizer offloaded (the copies are in host memory) and under
    weight streaming."""
    job, z = ctx.job, effective_zero_stage(ctx, layout.zero_stage, layout.pp)
    if (not job.profile.step_grad_copies(z) or job.grad_bytes != WEIGHT_BYTES or offloads_optimizer(layout.offload)
            or ctx.cluster.weight_streaming):
        return 0.0, 0.0
    pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots, rank)
    part = owned_params(pc, layout, True, zero_replicas(ctx, layout.dp, layout.pp, layout.cp, layout.ep, z,
                                                         layout.shard_across_domains, layout.dp_shard))
    copies = (job.grad_bytes + FP32_BYTES) * part
    return job.grad_bytes * part + copies, copies


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


HOST_TIER = "host"
"""The name of the host-memory tier in a device's ``memory_tiers`` (``topologies/data/devices.yaml``):
the memory activations are offloaded to, with the bandwidth of the link to it."""


def host_tier(device):
    """The device's host-memory tier with a bandwidth (:data:`HOST_TIER`), or None."""
    return next((t for t in device.memory_tiers if t.name == HOST_TIER and t.bytes_per_s), None)


def offload_exposed_s(ctx: Context, layout: Layout, kept_bytes: float, window_s: float) -> float:
    """Time a micro-batch's host offload adds on the stage (``layout.offload``): what its layers keep
    (``kept_bytes``) goes to host memory in the forward and comes back in the backward, twice over the
    device's host link (:func:`host_tier`). XLA issues the copies as asynchronous transfers its
    latency-hiding scheduler overlaps with the micro-batch's compute (``window_s``: forward, backward
    and recompute; MaxText's recipes add its HOST_OFFLOAD_FLAGS), and Megatron-Core's offload runs
    them on Transformer Engine's own d2h/h2d streams beside the layers, so only what exceeds that
    compute is exposed; where the framework copies on the compute stream
    (``semantics.offload_copies_overlap`` false) all of it is. 0 without offload or without a host tier (``layout_problems`` refuses that)."""
    tier = host_tier(ctx.cluster.device)
    if not offloads_activations(layout.offload) or tier is None:
        return 0.0
    if not ctx.job.profile.profile.offload_copies_overlap:
        window_s = 0.0  # blocking copies on the compute stream (DeepSpeed's cpu_checkpointing at 0.19.5)
    return max(0.0, 2.0 * kept_bytes / tier.bytes_per_s - window_s)
