"""The pipeline: the split of the layers over the ranks, the head, the stage sends, the period and the slowest stage.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
import math
from dataclasses import dataclass
from functools import lru_cache

from clusterplan.cost import collectives as coll
from clusterplan.cost.compute import ops_time_s
from clusterplan.cost.framework import device_platform
from clusterplan.cost.layout import Layout
from clusterplan.cost.stages import rank_layers
from clusterplan.cost.terms.activations import MODEL_CODE_LOGIT_BYTES
from clusterplan.cost.terms.compute import compute_terms
from clusterplan.cost.terms.context import Context, _tokens, mixed_kinds
from clusterplan.models.ops import ACT_BYTES, head_ops


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
    per_logit = (MODEL_CODE_LOGIT_BYTES.get(ctx.job.model_code)
                 or ctx.job.profile.logit_bytes(platform=device_platform(ctx.cluster.device)))
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
    prof = placed.neighbour_profile(layout.pp, layout.stride("pp"))
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


def bubble_s(schedule: str, pp: int, vp: int, total_s: float, backward_s: float) -> float:
    """The pipeline bubble of one step under ``schedule`` (``cost.layout.PIPELINE_SCHEDULES``), from
    ``total_s``, one micro-batch's time through the slowest rank's layers, and its backward compute
    ``backward_s`` (input and weight gradients together).

    The weight gradient ``W`` is taken as half the backward: a linear layer's backward is two GEMMs
    of the forward's size, one for the input gradient (B) and one for the weights (W); the attention
    core has no weights, so this slightly overstates W at long sequences. Per ``vp``-th chunk:

    - 1F1B, interleaved, looped: ``(pp - 1) / vp * t`` (Narayanan et al. 2021 sec. 2.2; Lamy-Poirier
      2022 for the breadth-first loop, whose bubble equals interleaving's).
    - ZB-H1 (zb1p): ``(pp - 1)(T_F + T_B - T_W)`` with ``T_B`` the input gradient alone (Qi et al.
      2024, arXiv 2401.10241, sec. 2.1), ``= (pp - 1)(t - 2 W)``: a third of 1F1B's at ``F = B = W``.
    - ZB-V (zbv, two chunks in a V): ``(pp - 1)(T_F + T_B - 2 T_W)`` per chunk (ibid. sec. 6), zero
      at ``F = B = W``: ``(pp - 1)(t - 3 W) / 2``.
    - DualPipe: ``(pp / 2 - 1)(F&B + B - 3 W)`` with ``B`` the whole backward (DeepSeek-V3 report,
      arXiv 2412.19437, Table 2), ``F&B`` an overlapped forward and backward taken as ``F + B``:
      ``(pp / 2 - 1)(t - B / 2)``. DualPipeV is DualPipe on ``2 pp`` ranks folded in half, each
      chunk half a rank's layers: ``(pp - 1)(t - B / 2) / 2``.
    """
    if schedule in ("", "1f1b", "interleaved", "looped"):
        return (pp - 1) / vp * total_s
    w_s = backward_s / 2
    if schedule == "zb1p":
        return (pp - 1) / vp * max(0.0, total_s - 2 * w_s)
    if schedule == "zbv":
        return (pp - 1) * max(0.0, total_s - 3 * w_s) / 2
    if schedule == "dualpipe":
        return (pp / 2 - 1) * max(0.0, total_s - backward_s / 2)
    if schedule == "dualpipev":
        return (pp - 1) * max(0.0, total_s - backward_s / 2) / 2
    raise ValueError(f"unknown pipeline schedule {schedule!r}")


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


def chunks_fit(num_layers: int, pp: int, vp: int, head_slots: bool = False) -> bool:
    """The pp x vp model chunks fill :func:`stage_slots` at most, and interleaving (vp > 1) has a
    pipeline to interleave: the (pp, vp) cells the search's tables price."""
    return pp * vp <= stage_slots(num_layers, pp, head_slots) and (vp == 1 or pp > 1)


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
    return kind_windows_over(ctx, tp, cp, mbs, sp, recompute, ep, expert_tp, (tp_overlap,), (ep_overlap,), kind)[0][0]


def kind_windows_over(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, ep: int, expert_tp: bool,
                      tp_overlaps: tuple[bool, ...], ep_overlaps: tuple[bool, ...],
                      kind: bool | None = None) -> list[list[tuple[float, float]]]:
    """:func:`kind_windows` per TP overlap of ``tp_overlaps`` and per EP overlap of ``ep_overlaps``
    (the search's tables ask all of them: the compute terms are looked up once)."""
    c = compute_terms(ctx, tp, cp, mbs, sp, recompute, ep, expert_tp, kind)
    return [[(c.dp_window_s(to, cp), c.fsdp_window_s(to, cp, eo)) for eo in ep_overlaps] for to in tp_overlaps]


def head_in_period(ctx: Context, head_slots: bool) -> bool:
    """Whether the LM head's time adds to the pipeline period (:func:`period_layers`, pp > 1):
    always on the even split; with ``head_slots`` where the head takes longer than a layer."""
    return not head_slots or head_layer_ratio(ctx._base) >= 1  # tp 1: the rank order does not enter it
