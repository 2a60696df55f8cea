"""Step time and peak memory of one layout, assembled from the terms in ``cost.terms``.

Step time (1F1B or interleaved 1F1B, Narayanan et al. 2021 section 2.2), with ``m`` micro-batches
per pipeline, ``t`` the time of one micro-batch through the most loaded stage and ``t_h`` the LM
head on the last stage::

    T = (m + (pp - 1) / vp) * t  +  m * (t_h + t_p2p)  +  exposed DP  +  optimizer  +  gradient accumulation

``(pp - 1) / vp * t`` is the bubble. A stage with uneven work (the last one, holding the head) sets
the steady-state period, hence ``m * t_h`` rather than ``(m + pp - 1) * t_h``. The breakdown
returned sums exactly to the step time and the memory categories exactly to the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

from clusterplan.cost.assembly import (
    STEP_TERMS, ScalarOps, breakdown_fields, dp_exposed, layout_dp_terms, mix, stage_share,
)
from clusterplan.cost.energy import busy_s
from clusterplan.cost.layout import Job, Layout, interleaved_warmup, num_microbatches, offloads_activations
from clusterplan.cost.stages import RANKS, InFlight, dualpipe_inflight, inflight, rank_index, rank_layers
from clusterplan.cost.terms import (
    WEIGHT_BYTES, Context, LayerTerms, allocator_fraction, bubble_s, compute_terms, head_terms,
    kind_windows, mixed_kinds, stage_kind_shares, grad_accumulation_adds, grad_accumulation_s,
    grads_freed_bytes, host_optimizer_bytes, host_tier, layer_terms, layers_on_stage, offload_exposed_s, overlap_share,
    param_counts, regather_share, runtime_bytes, stage_split, static_memories, static_memory, step_gradients,
)
from clusterplan.cost.terms.context import graphed_context

from clusterplan.models.ops import model_flops_per_token
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.precisions import low_precision


@lru_cache(maxsize=None)
def _field_names(cls) -> tuple[str, ...]:
    """A breakdown's fields in declaration order (the order ``asdict`` sums them in)."""
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per step by cause; the fields sum to the step time."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    optimizer_s: float
    offload_s: float = 0.0  # host offload transfers beyond the compute they overlap (layout.offload)
    # each micro-batch's weight gradients added into the step's (cost.terms.grad_accumulation_s): a
    # memory-bound pass of its own per micro-batch unless the framework fuses it into the GEMM
    grad_accum_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(getattr(self, name) for name in _field_names(TimeBreakdown))  # asdict() deep-copies: slow


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device on the most loaded pipeline stage; the fields sum to the peak."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    working_bytes: float  # one layer's recomputed activations, logits, FSDP gather buffers
    reserved_bytes: float  # runtime: CUDA context, library workspaces, communication buffers
    allocator_bytes: float = 0.0  # the caching allocator's reserved-but-unallocated share
    # the optimizer step's copies of the gradient partition where they set the peak (terms.step_gradients)
    step_copies_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        """Peak reserved bytes: what must fit in the device's memory."""
        return sum(getattr(self, name) for name in _field_names(MemoryBreakdown))

    @property
    def allocated_bytes(self) -> float:
        """Peak bytes held by live tensors (``torch.cuda.max_memory_allocated``)."""
        return self.total_bytes - self.reserved_bytes - self.allocator_bytes

    @property
    def fit_bytes(self) -> float:
        """What must fit: live tensors and the runtime. The allocator's cached blocks do not count:
        before failing an allocation PyTorch's caching allocator frees its unused cached blocks and
        retries (``num_alloc_retries``), so a plan fits when the allocated peak does."""
        return self.total_bytes - self.allocator_bytes


@dataclass(frozen=True)
class Evaluation:
    """The prediction for one layout."""

    layout: Layout
    num_microbatches: int
    step_time_s: float
    time: TimeBreakdown
    memory: MemoryBreakdown
    capacity_bytes: float
    tokens_per_s: float
    model_flops_per_s_per_device: float
    mfu: float
    hfu: float
    mfu_palm_count: float = 0.0  # attention counted over the full square (PaLM's count)
    stage_memory_bytes: tuple[float, float] | None = None  # (first, last) pipeline stage, with pp > 1
    # MFU over the dense peak of the precision the GEMMs run in (the FP8 peak for an FP8 job on a
    # device with FP8 math; otherwise equal to ``mfu``): at most 1, unlike ``mfu`` under FP8
    mfu_precision_peak: float = 0.0
    # seconds of the step the mean device computes, each device on its own stage (:func:`device_busy_s`):
    # what the energy's busy power multiplies (``cost.energy.step_energy_j``)
    busy_s: float = 0.0

    @property
    def peak_memory_bytes(self) -> float:
        return self.memory.total_bytes

    @property
    def fits(self) -> bool:
        return self.memory.fit_bytes <= self.capacity_bytes

    @property
    def overflow_bytes(self) -> float:
        return max(0.0, self.memory.fit_bytes - self.capacity_bytes)


def host_offload_problem(ctx: Context, layout: Layout) -> str | None:
    """What the offload mode puts in host memory against the device's share of the host tier: with
    ``activations``, every micro-batch the most loaded rank holds in flight (what it would hold on the
    device); with ``optimizer``, the rank's Adam states and fp32 gradients (``cost.terms.host_optimizer_bytes``)."""
    tier = host_tier(ctx.cluster.device)
    if layout.offload == "none" or tier is None:
        return None
    acts, optim = _host_activation_bytes(ctx, layout), host_optimizer_bytes(ctx, layout)
    if acts + optim <= tier.capacity_bytes:
        return None
    parts = [f"the activations in flight {acts / 1e9:,.1f} GB"] if offloads_activations(layout.offload) else []
    parts += [f"the optimizer states and fp32 gradients {optim / 1e9:,.1f} GB"] if optim else []
    return (f"offload={layout.offload}: {' and '.join(parts)} need {(acts + optim) / 1e9:,.1f} GB of host memory; "
            f"{ctx.cluster.device.name} has {tier.capacity_bytes / 1e9:,.1f} GB per device (memory_tiers: host)")


def _host_activation_bytes(ctx: Context, layout: Layout) -> float:
    """What ``offload=activations`` holds in host memory: every micro-batch the most loaded rank holds
    in flight but the layers the framework keeps on the device; 0 without activation offload."""
    if not offloads_activations(layout.offload):
        return 0.0
    lt, m = layer_terms(ctx, layout), num_microbatches(ctx.job, layout)
    kept = ctx.job.profile.profile.offload_layers_kept * max(lt.act_kind_bytes)
    return max(_inflight(ctx, layout, m, rank).bytes(*lt.act_kind_bytes) for rank in memory_ranks(layout.pp)) - kept


def inflight_layers(num_layers: int, pp: int, vp: int, m: int, group: int | None = None,
                    head_slots: bool = False) -> tuple[float, float]:
    """Layers' worth of stored activations on the first and on the last pipeline rank.

    1F1B: the first rank holds ``min(m, pp)`` micro-batches of its layers, the last one
    (Narayanan et al. 2021). Interleaved: Megatron-LM's warm-up holds ``2 (pp - 1) + (vp - 1) N + 1``
    model chunks on the first rank, ``N`` the micro-batch group (``group``, default ``pp``:
    :func:`cost.layout.microbatch_group_size`; with ``pp``, Korthikanti et al.'s about
    ``L (1 + (pp - 1) / (pp vp))``). With ``head_slots`` the first rank holds a layer fewer, and the
    second rank's ``pp - 1`` micro-batches of its full share can be the larger (reported as the first).
    """
    split = stage_split(num_layers, pp, vp, head_slots)
    if vp == 1:
        first = split.first * min(m, pp)
        if head_slots and pp > 2:
            first = max(first, split.middle * min(m, pp - 1))
        return first, split.last * 1.0
    first = min(m * vp, interleaved_warmup(pp, vp, group) + 1) * split.first / vp
    if head_slots and pp > 2:
        first = max(first, min(m * vp, interleaved_warmup(pp, vp, group, rank=1) + 1) * split.middle / vp)
    last = min(m * vp, interleaved_warmup(pp, vp, group, rank=pp - 1) + 1) * split.last / vp
    return first, last


def _inflight(ctx: Context, layout: Layout, m: int, rank: str) -> InFlight:
    """The layers ``rank`` holds in flight at its peak (``cost.stages.inflight``), with the
    micro-batch group the job's framework runs."""
    return rank_inflight(ctx.model, layout.pp, layout.vp, m, ctx.job.microbatch_group(m, layout.pp, layout.vp),
                         layout.head_slots, rank, layout.schedule)


def rank_inflight(model: ModelSpec, pp: int, vp: int, m: int, group: int | None, head_slots: bool,
                  rank: str, schedule: str = "") -> InFlight:
    """``cost.stages.inflight`` of ``rank`` (first, second or last) for this model's layer kinds."""
    index = rank_index(pp, rank)
    if schedule == "dualpipe" and vp == 1 and pp > 1:
        return dualpipe_inflight(model.num_layers, model.num_dense_layers, pp, m, index, head_slots,
                                 model.num_moe_layers == 0)
    layers = rank_layers(model.num_layers, model.num_dense_layers, pp, vp, index, head_slots and pp > 1,
                         model.num_moe_layers == 0)
    return inflight(layers, pp, vp, m, group, index, schedule)


def evaluate(model: ModelSpec, job: Job, cluster: Cluster, layout: Layout) -> Evaluation:
    """Predict step time and peak memory of ``layout`` (assumed structurally valid)."""
    ctx = Context(model, job, cluster)
    return evaluate_ctx(ctx, layout)


def evaluate_ctx(ctx: Context, layout: Layout) -> Evaluation:
    ctx = graphed_context(ctx, layout.cuda_graph)
    model, job, cluster = ctx.model, ctx.job, ctx.cluster
    m = num_microbatches(job, layout)
    stage, time = slowest_stage(ctx, layout, m)
    memory = memory_breakdown(ctx, layout, m)
    step = time.total_s
    tokens_per_s = job.tokens_per_step / step
    flops_per_device = model_flops_per_token(model, job.seq_len) * tokens_per_s / cluster.num_devices
    peak16 = cluster.device.peak("bf16")
    recompute_share = time.recompute_s / max(1e-30, time.compute_s)
    mfu = flops_per_device / peak16
    palm = model_flops_per_token(model, job.seq_len, causal=False) * tokens_per_s / cluster.num_devices / peak16
    return Evaluation(layout, m, step, time, memory, cluster.device.memory_bytes, tokens_per_s,
                      flops_per_device, mfu, mfu * (1 + recompute_share), palm,
                      stage_memory(ctx, layout, m) if layout.pp > 1 else None,
                      flops_per_device / cluster.device.peak(gemm_precision(job, cluster)),
                      device_busy_s(ctx, layout, m, stage, time))


def gemm_precision(job: Job, cluster: Cluster) -> str:
    """The precision whose dense peak bounds the job's GEMMs: the job's low precision (FP8, MXFP8,
    NVFP4) where the device has its math, else the 16-bit peak (a device without it runs them in
    bf16)."""
    low = low_precision(job.precision) and cluster.device.supports(job.precision)
    return job.precision if low else "bf16"


def time_breakdown(ctx: Context, layout: Layout, m: int) -> TimeBreakdown:
    """The step's time by cause, on the slowest pipeline stage: with dense and MoE layers both, the
    slower of the candidate stages (``cost.terms.stage_kind_shares``), each with the compute it
    leaves to hide its data-parallel traffic behind."""
    return slowest_stage(ctx, layout, m)[1]


def device_busy_s(ctx: Context, layout: Layout, m: int, stage: LayerTerms, slowest: TimeBreakdown) -> float:
    """Seconds of the step the mean device computes (``cost.energy.busy_s`` of its own stage's step).
    Each device is busy for its own stage's compute and idles otherwise, so the devices' busy time
    sums every layer's compute once per pipeline: the mean stage holds 1/pp of all layers' (not the
    slowest stage's share, which counts the heaviest stage's layers on every device). The additive
    terms (optimizer, head, gradient accumulation) are the slowest stage's step's (``slowest``, of
    the layer terms ``stage``). Where that stage holds 1/pp of all layers (one kind of layer, an even
    split) its own figure, to the bit."""
    share = 1 / layout.pp
    if not mixed_kinds(ctx.model) and stage_kind_shares(ctx, layout.pp, layout.vp, layout.head_slots)[0][0] == share:
        return busy_s(slowest)
    at = ctx.placed(layout.order)
    kinds = (layer_terms(at, layout, m, kind=k) for k in (False, True)) if mixed_kinds(ctx.model) else (
        layer_terms(at, layout, m),)
    every_layer = sum(k.forward_s + k.backward_s + k.recompute_s for k in kinds)
    return busy_s(slowest) + m * (share * every_layer - (stage.forward_s + stage.backward_s + stage.recompute_s))


def slowest_stage(ctx: Context, layout: Layout, m: int) -> tuple[LayerTerms, TimeBreakdown]:
    """The pipeline stage whose step :func:`time_breakdown` reports: its layer terms for one
    micro-batch (what a drawing of the schedule is made of) and its step's breakdown."""
    ctx = ctx.placed(layout.order)
    dp = layout_dp_terms(ctx, layout)
    added = {term.name: term.seconds(ctx, layout) for term in STEP_TERMS}  # the same on every stage
    return max(((stage, _stage_breakdown(ctx, layout, m, stage, windows, dp, added))
                for stage, windows in _stages(ctx, layout, m)), key=lambda pair: pair[1].total_s)


def _stage_breakdown(ctx: Context, layout: Layout, m: int, stage: LayerTerms, windows: tuple[float, float],
                     dp, added: dict) -> TimeBreakdown:
    """One candidate stage's step: its layers' terms ``stage`` (one micro-batch), the pipeline, the
    data-parallel traffic exposed beyond its ``windows`` (per step, per micro-batch), and the step's
    additive terms (``added``: seconds by name of ``cost.assembly.STEP_TERMS``: the head where it adds
    to the period, the sends, the optimizer, the DP traffic nothing overlaps, ...)."""
    per_mb = dp.per_microbatch_s + regather_share(ctx, layout) * dp.regather_s
    # per step and per micro-batch beyond the stage's windows (cost.assembly.dp_exposed)
    exposed = dp_exposed(ScalarOps(dp_share=overlap_share(ctx, "dp")), dp.per_step_s, per_mb, *windows, m,
                         layout.dp_overlap)
    step_base = dict(pp_bubble_s=bubble_s(layout.schedule, layout.pp, layout.vp, stage.total_s, stage.backward_s),
                     dp_comm_s=exposed,
                     grad_accum_s=grad_accumulation_adds(ctx, layout, m) * grad_accumulation_s(ctx, layout))
    mb_base = dict(compute_s=stage.forward_s + stage.backward_s, recompute_s=stage.recompute_s,
                   tp_comm_s=stage.tp_comm_s, cp_comm_s=stage.cp_comm_s, ep_comm_s=stage.ep_comm_s,
                   offload_s=_offload_s(ctx, layout, stage))
    return TimeBreakdown(**breakdown_fields(step_base, mb_base, m, added))


def _offload_s(ctx: Context, layout: Layout, stage: LayerTerms) -> float:
    """One micro-batch's exposed host-offload time on the stage (``cost.terms.offload_exposed_s``):
    the stage's layers' kept activations against its forward, backward and recompute."""
    if not offloads_activations(layout.offload):
        return 0.0
    return offload_exposed_s(ctx, layout, _offload_kept_bytes(ctx, layout, stage),
                             stage.forward_s + stage.backward_s + stage.recompute_s)


def _offload_kept_bytes(ctx: Context, layout: Layout, stage: LayerTerms) -> float:
    """What one micro-batch's layers of the stage keep in host memory: all but the layers the
    framework keeps on the device (``semantics.offload_layers_kept``)."""
    layers = layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp) - ctx.job.profile.profile.offload_layers_kept
    return stage.act_bytes_per_layer * max(0, layers)


def offload_copies(ctx: Context, layout: Layout) -> tuple[float, float, float]:
    """One micro-batch's host-offload copies on the slowest stage, out and back over the host link
    (s), the compute they run beside (s; 0 where the framework copies on the compute stream:
    ``semantics.offload_copies_overlap``) and the link's bytes per second; zeros without offload."""
    tier = host_tier(ctx.cluster.device)
    if not offloads_activations(layout.offload) or tier is None:
        return 0.0, 0.0, 0.0
    stage = slowest_stage(ctx, layout, num_microbatches(ctx.job, layout))[0]
    window = stage.forward_s + stage.backward_s + stage.recompute_s
    overlap = ctx.job.profile.profile.offload_copies_overlap
    return 2.0 * _offload_kept_bytes(ctx, layout, stage) / tier.bytes_per_s, window if overlap else 0.0, tier.bytes_per_s


def offload_hidden(ctx: Context, tp: int, pp: int, cp: int, ep: int, expert_tp: bool, vp: int, mbs: int, sp: bool,
                   head_slots: bool = False) -> bool:
    """Whether ``offload=activations`` with the framework's recompute mode (``semantics.offload_recompute``)
    adds no time on any candidate slowest stage (:func:`_stages`, :func:`_offload_s`): the round trip of the stage's kept layer inputs over
    the host link hides behind its forward, backward and recompute. The search offers offload only
    there (``planner.search.space.split_spaces``), so its tables need no transfer term."""
    tier, sem = host_tier(ctx.cluster.device), ctx.job.profile.profile
    if tier is None or not sem.offload_copies_overlap or (sem.offload_pp_max or pp) < pp:
        return False
    stages, kept_layers, in_flight = _offload_stages(ctx, tp, pp, cp, ep, expert_tp, vp, mbs, sp, head_slots)
    return all(2.0 * act * kept_layers / tier.bytes_per_s <= window and act * kept_layers * in_flight
               <= tier.capacity_bytes for act, window in stages)


def offload_host_bound_bytes(ctx: Context, tp: int, pp: int, cp: int, ep: int, expert_tp: bool, vp: int, mbs: int,
                             sp: bool, head_slots: bool = False) -> float:
    """The bound on what ``offload=activations`` holds in host memory that :func:`offload_hidden` checks
    against the host tier: the stage's offloaded layers' inputs for every micro-batch the first stage
    may hold in flight (the search's stand-in for :func:`host_offload_problem`'s activations)."""
    stages, kept_layers, in_flight = _offload_stages(ctx, tp, pp, cp, ep, expert_tp, vp, mbs, sp, head_slots)
    return max(act * kept_layers * in_flight for act, _ in stages)


def _offload_stages(ctx: Context, tp: int, pp: int, cp: int, ep: int, expert_tp: bool, vp: int, mbs: int, sp: bool,
                    head_slots: bool) -> tuple[list[tuple[float, float]], int, int]:
    """For :func:`offload_hidden`: per candidate slowest stage, one offloaded layer's input bytes and the
    compute its copies overlap, under the framework's offload recompute mode; the layers whose inputs
    are offloaded; the micro-batches the first stage may hold in flight."""
    sem = ctx.job.profile.profile
    base, model, mode = ctx._base, ctx.model, sem.offload_recompute
    kept_layers = max(0, layers_on_stage(model.num_layers, pp, vp) - sem.offload_layers_kept)
    shares = stage_kind_shares(base, pp, vp, head_slots and pp > 1)
    if not mixed_kinds(model):
        c = compute_terms(base, tp, cp, mbs, sp, mode, ep, expert_tp)
        stages = [(c.act_bytes_per_layer, shares[0][0] * (c.forward_s + c.backward_s + c.recompute_s))]
    else:
        d, m = (compute_terms(base, tp, cp, mbs, sp, mode, ep, expert_tp, kind) for kind in (False, True))
        stages = [(m.act_bytes_per_layer, a * (d.forward_s + d.backward_s + d.recompute_s)
                   + b * (m.forward_s + m.backward_s + m.recompute_s)) for a, b in shares]
    in_flight = pp * (2 if vp > 1 else 1)  # micro-batches the first stage may hold: a bound (host_offload_problem)
    return stages, kept_layers, in_flight


STAGE_TERMS = ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s")


def _stages(ctx: Context, layout: Layout, m: int) -> list[tuple[LayerTerms, tuple[float, float]]]:
    """The candidate slowest pipeline stages: one micro-batch's layer terms on each and the windows
    its compute leaves for data-parallel traffic. One stage, the period's share of every layer's,
    for a model of one kind; with dense and MoE layers both, the stage with the most dense layers
    and the one with the fewest, each kind weighted by the share of it the stage holds
    (``cost.terms.stage_kind_shares``: a stage's time is linear in its dense count, so these two
    bound every stage)."""
    shares = stage_kind_shares(ctx, layout.pp, layout.vp, layout.head_slots)
    knobs = (layout.tp, layout.cp, layout.micro_batch_size, layout.sequence_parallel, layout.recompute, layout.ep,
             layout.expert_tp, layout.tp_overlap and layout.tp > 1, layout.ep_overlap and layout.ep > 1)
    if not mixed_kinds(ctx.model):
        lt, frac = layer_terms(ctx, layout, m), shares[0][0]
        windows = kind_windows(ctx._base, *knobs)
        return [(replace(lt, **{name: stage_share(frac, getattr(lt, name)) for name in STAGE_TERMS}),
                 (stage_share(frac, windows[0]), stage_share(frac, windows[1])))]
    dense, moe = layer_terms(ctx, layout, m, kind=False), layer_terms(ctx, layout, m, kind=True)
    wd, wm = kind_windows(ctx._base, *knobs, kind=False), kind_windows(ctx._base, *knobs, kind=True)
    return [(replace(moe, **{name: mix(a, getattr(dense, name), b, getattr(moe, name)) for name in STAGE_TERMS}),
             (mix(a, wd[0], b, wm[0]), mix(a, wd[1], b, wm[1]))) for a, b in shares]


def memory_breakdown(ctx: Context, layout: Layout, m: int) -> MemoryBreakdown:
    """Memory of the pipeline rank whose peak is the highest (:func:`memory_ranks`)."""
    return max(rank_memories(ctx, layout, m).values(), key=lambda b: b.fit_bytes)


def rank_memories(ctx: Context, layout: Layout, m: int) -> dict[str, MemoryBreakdown]:
    """The memory peak of each rank of :func:`memory_ranks` (first, second, last), by category."""
    lt = layer_terms(ctx, layout)
    head = head_terms(ctx, layout.tp, layout.cp, layout.micro_batch_size, layout.sequence_parallel,
                      layout.stride("tp"))
    return {rank: _rank_memory(ctx, layout, m, lt, head.logits_bytes, rank) for rank in memory_ranks(layout.pp)}


def memory_ranks(pp: int) -> tuple[str, ...]:
    """The ranks whose peaks bound every rank's (``cost.stages.RANKS``): one rank without a pipeline
    (it holds the logits too), the first and the last with two, and rank 1 besides from three."""
    return ("last",) if pp == 1 else ("first", "last") if pp == 2 else RANKS


def _rank_memory(ctx: Context, layout: Layout, m: int, lt, logits_bytes: float, rank: str) -> MemoryBreakdown:
    """One rank's peak: its weights, gradients and optimizer states, the activations it holds in
    flight (by layer kind, ``cost.stages.inflight``) and one layer's transient, with the logits on
    the last rank."""
    # offload=activations: what each layer keeps lives in host memory (cost.layout.OFFLOAD_MODES), but
    # for the layers the framework keeps on the device (semantics.offload_layers_kept: Megatron's last)
    activations = (ctx.job.profile.profile.offload_layers_kept * max(lt.act_kind_bytes) if offloads_activations(layout.offload)
                   else _inflight(ctx, layout, m, rank).bytes(*lt.act_kind_bytes))
    working = working_bytes(ctx, lt.act_transient_bytes, logits_bytes if rank == "last" else 0.0)
    weights, grads, optim = _static_parts(ctx, layout, rank)
    freed = grads_freed_bytes(ctx, layout, rank) if m == 1 else 0.0
    # One micro-batch: no gradient yet at the activation peak; at backward's end every gradient and
    # one layer's transient. The peak is the larger of the two.
    if freed and lt.act_transient_bytes > activations + working - freed:
        activations, working = 0.0, lt.act_transient_bytes
    elif freed:
        grads -= freed
    # The optimizer step, where the framework copies the gradient partition (DeepSpeed ZeRO-1/2): no
    # activation left, the partition and its copies; the rank's peak is the larger of the two moments.
    held, copies = step_gradients(ctx, layout, rank)
    if copies and held > grads + activations + working:
        grads, activations, working = held - copies, 0.0, 0.0
    else:
        copies = 0.0
    reserve = runtime_bytes(ctx, layout)
    allocator = _allocator_cache(ctx, weights + grads + optim + activations + working + copies, reserve, layout.pp)
    return MemoryBreakdown(weights, grads, optim, activations, working, reserve, allocator, copies)


def working_bytes(ctx: Context, transient_bytes: float, logits_bytes: float) -> float:
    """One layer's transient and the logits: both at once under a caching allocator, the larger of
    the two where the framework's compiler plans buffers by liveness and the logits die in the head's
    backward before any layer is recomputed (``semantics.logits_freed_before_layers``: XLA)."""
    if ctx.job.profile.profile.logits_freed_before_layers:
        return max(transient_bytes, logits_bytes)
    return transient_bytes + logits_bytes


def _allocator_cache(ctx: Context, allocated: float, runtime: float, pp: int = 1) -> float:
    """What the caching allocator keeps reserved beyond ``allocated``: its measured share, but never
    past the device's memory (before an allocation fails it frees its cached blocks and retries, so
    the reserved peak cannot exceed the device)."""
    room = max(0.0, ctx.cluster.device.memory_bytes - allocated - runtime)
    return min(allocator_fraction(ctx, pp) * allocated, room)


def stage_memory(ctx: Context, layout: Layout, m: int) -> tuple[float, float]:
    """Peak bytes (reserved) on the first and on the last pipeline stage: the first holds the most
    in-flight micro-batches (1F1B warm-up; reported with rank 1's where that is higher: no
    vocabulary matrix, but no dense layers either), the last one micro-batch plus the logits."""
    peaks = {rank: b.total_bytes for rank, b in rank_memories(ctx, layout, m).items()}
    return max(peaks["first"], peaks.get("second", 0.0)), peaks["last"]


def _static_parts(ctx: Context, layout: Layout, rank: str | None = None) -> tuple[float, float, float]:
    """Weights, gradients and optimizer states on the device (the heaviest stage's, or ``rank``'s).

    With weight streaming (Cerebras MemoryX) they live off-chip and the wafer holds one layer's
    weights at a time, double-buffered.
    """
    if ctx.cluster.weight_streaming:
        pc = param_counts(ctx.model, layout.tp, layout.pp, layout.vp, layout.ep, layout.expert_tp, layout.head_slots)
        per_layer = (pc.dense + pc.expert) / ctx.model.num_layers
        return 2 * WEIGHT_BYTES * per_layer, 0.0, 0.0
    static = static_memory(ctx, layout, rank)
    if layout.schedule != "dualpipe":
        return static.weights_bytes, static.gradients_bytes, static.optimizer_bytes
    # DualPipe: each rank holds its stage and the mirrored one (rank r: stages r and pp - 1 - r), twice
    # the parameters with their gradients and optimizer states (DeepSeek-V3 report, Table 2: "2x"), so
    # the first and the last rank both hold the embedding and the output head (section 3.2.3); a middle
    # rank's mirror is a middle stage, and the heaviest stage (rank None) is counted twice
    mirror = static_memory(ctx, layout, DUALPIPE_MIRROR.get(rank, rank))
    return (static.weights_bytes + mirror.weights_bytes, static.gradients_bytes + mirror.gradients_bytes,
            static.optimizer_bytes + mirror.optimizer_bytes)


def static_parts_of(ctx: Context, layout: Layout, ranks: tuple) -> list[tuple[float, float, float]]:
    """:func:`_static_parts` on each rank of ``ranks``, what does not depend on the rank asked once
    (``terms.static_memories``) where the device holds its own stage's states."""
    if ctx.cluster.weight_streaming or layout.schedule == "dualpipe":
        return [_static_parts(ctx, layout, rank) for rank in ranks]
    return [(s.weights_bytes, s.gradients_bytes, s.optimizer_bytes) for s in static_memories(ctx, layout, ranks)]


DUALPIPE_MIRROR = {"first": "last", "last": "first"}
"""The rank (``cost.stages.RANKS``) whose stage DualPipe places beside each rank's own: stage 0 and
stage pp - 1 share a rank; rank 1's mirror, pp - 2, is a middle stage like it."""


def optimizer_step_bytes(ctx: Context, layout: Layout, rank: str | None = None) -> float:
    """Bytes the rank's live tensors hold at its optimizer step where the framework copies the
    gradient partition there (the weights, the optimizer states, the partition and its copies:
    ``terms.step_gradients``; every activation freed), without the runtime; 0 elsewhere (the step
    then holds less than backward's end). :func:`_rank_memory` takes it where it exceeds the
    backward's peak."""
    held, copies = step_gradients(ctx, layout, rank)
    if not copies:
        return 0.0
    weights, _, optim = _static_parts(ctx, layout, rank)
    return weights + optim + held


def memory_static_bytes(ctx: Context, layout: Layout, rank: str | None = None) -> float:
    """Weights + gradients + optimizer states per device (what does not depend on activations), on
    the heaviest stage or on ``rank``."""
    return sum(_static_parts(ctx, layout, rank))
