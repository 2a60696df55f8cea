"""Communication of the layers: tensor-, context- and expert-parallel collectives, and what overlapping them costs.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
import math
from functools import lru_cache

from clusterplan.cost import collectives as coll
from clusterplan.cost.compute import ops_time_s
from clusterplan.cost.layout import Layout, interleaved_warmup
from clusterplan.cost.terms.compute import compute_terms
from clusterplan.cost.terms.context import Context, _comm_multiplier, _layer_kinds, _tokens
from clusterplan.models.ops import ACT_BYTES, layer_ops
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.precisions import low_precision


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


def ep_overlap_steady_share(pp: int, vp: int, m: int, recompute: str, group: int | None = None,
                            schedule: str = "") -> float:
    """Share of a stage's micro-batch chunks whose expert all-to-alls Megatron-Core's EP overlap
    hides (``--overlap-moe-expert-parallel-comm``, combined 1F1B): only the steady state pairs one
    chunk's forward with another's backward. The first rank warms up with ``2 (pp - 1) + (vp - 1) N``
    chunks (``N``: the micro-batch ``group``, default ``pp``) plus the one extra the overlap
    schedules (``schedules.py``), one chunk without a pipeline; warm-up forwards and cool-down
    backwards run alone. 0 where Megatron refuses the overlap (full recomputation; pp > 1 without
    virtual stages): priced as off. DualPipe (``schedule``) pairs each forward chunk with a backward
    chunk of the mirrored stage at vp 1 (DeepSeek-V3 report section 3.2.1, figure 5): a forward runs
    alone only while the rank fills its ``pp + 1`` micro-batches in flight (Table 2)."""
    if schedule == "dualpipe" and recompute != "full":
        return max(0, m - (pp + 1)) / m
    if recompute == "full" or (pp > 1 and vp == 1):
        return 0.0
    chunks = m * vp
    warmup = 1 if pp == 1 else interleaved_warmup(pp, vp, group) + 1
    return max(0, chunks - warmup) / chunks


def ep_ranks(layout: Layout) -> tuple[int, ...]:
    """The expert-parallel group of rank 0 (empty without expert parallelism)."""
    return layout.group("ep") if layout.ep > 1 else ()


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
    return tp_comm_over(ctx, tp, cp, mbs, sp, recompute, stride, (overlap,), moe_tp, ep, expert_tp, kind)[0]


def tp_comm_over(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, recompute: str, stride: int,
                 overlaps: tuple[bool, ...], moe_tp: bool = True, ep: int = 1, expert_tp: bool = True,
                 kind: bool | None = None) -> list[float]:
    """:func:`tp_comm_terms` with each TP overlap setting of ``overlaps``, the traffic asked once
    (the search's tables ask both settings of 22,000 cells on DeepSeek-V3 / 576 GB200)."""
    if tp == 1:
        return [0.0] * len(overlaps)
    total = _tp_comm_total_s(ctx, tp, cp, mbs, sp, recompute, stride, moe_tp, kind)
    out = []
    for overlap in overlaps:
        if overlap:
            window = compute_terms(ctx._base, tp, cp, mbs, sp, recompute, ep, expert_tp, kind).gemm_s
            out.append(overlapped_exposed_s(total, window, overlap_share(ctx, "tp")))
        else:
            out.append(total)
    return out


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
def cp_comm_terms(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, stride: int, kind: bool | None = None,
                  comm: str = "p2p") -> float:
    """Exposed context-parallel traffic of all layers, one micro-batch, for the kind ``comm``
    (``cost.layout.CP_COMM_KINDS``): the ring (``p2p``), the all-gather of keys and values
    (``allgather``), the heads' all-to-alls (``a2a``), or all-to-alls inside the scale-up domain and
    the ring across (``a2a+p2p``, :func:`cp_a2a_size`)."""
    if cp == 1:
        return 0.0
    n = _tokens(ctx, cp, mbs)
    total = 0.0
    for moe, count in _layer_kinds(ctx.model, kind):
        ops = layer_ops(ctx.model, n, ctx.job.seq_len, tp, sp, moe)
        total += count * _cp_layer_s(ctx, n, tp, cp, stride, ops, comm)
    return total


def cp_a2a_size(comm: str, cp: int, stride: int, domain_size: int) -> int:
    """The context-parallel ranks that exchange heads by all-to-all: all of them under ``a2a``, none
    under ``p2p`` and ``allgather``; under ``a2a+p2p`` those of one scale-up domain (the largest
    divisor of ``cp`` whose ranks, ``stride`` apart, fit in ``domain_size`` devices), the first of
    Megatron-Core's ``--hierarchical-context-parallel-sizes`` (its all-to-all groups are the inner
    ones, "e.g., via NVLink")."""
    if comm == "a2a":
        return cp
    if comm != "a2a+p2p":
        return 1
    return math.gcd(cp, max(1, domain_size // stride))


def cp_heads_split(model: ModelSpec, tp: int, k: int) -> bool:
    """Whether an all-to-all over ``k`` context-parallel ranks can split each tensor-parallel rank's
    query and key/value heads (Transformer Engine asserts "The number of attention heads needs to be
    divisible by CP size!"; key/value heads fewer than tp are replicated, one per rank)."""
    return (model.num_attention_heads // tp) % k == 0 and max(1, model.num_kv_heads_resolved // tp) % k == 0


@lru_cache(maxsize=65536)
def cp_comm_choice(ctx: Context, tp: int, cp: int, mbs: int, sp: bool, stride: int,
                   kinds: tuple[str, ...]) -> tuple[str, float] | None:
    """The kind of ``kinds`` with the least exposed traffic (:func:`cp_comm_terms`) and that traffic, among
    those whose all-to-all can split the heads; the first on a tie (the ring, listed first). None where
    none can. The kind changes no memory term, so the search decides it per factorization exactly."""
    best = None
    for comm in kinds:
        if not cp_heads_split(ctx.model, tp, cp_a2a_size(comm, cp, stride, ctx.cluster.domain_size)):
            continue
        seconds = cp_comm_terms(ctx, tp, cp, mbs, sp, stride, None, comm)
        if best is None or seconds < best[1]:
            best = (comm, seconds)
    return best


def _cp_layer_s(ctx: Context, n: float, tp: int, cp: int, stride: int, ops, comm: str) -> float:
    """One layer's exposed context-parallel traffic: the all-gather kind, or the all-to-alls of the
    inner group and the ring of the rest."""
    if comm == "allgather":
        return _cp_allgather_s(ctx, n, tp, ctx.cluster.strided_profile(cp, stride))
    inner = cp_a2a_size(comm, cp, stride, ctx.cluster.domain_size)
    a2a = _cp_a2a_s(ctx, n, tp, ctx.cluster.strided_profile(inner, stride)) if inner > 1 else 0.0
    ring = cp // inner
    if ring == 1:
        return a2a
    return a2a + _cp_comm_s(ctx, n, tp, ring, ctx.cluster.neighbour_profile(ring, stride * inner, ring=True), ops)


def _cp_allgather_s(ctx: Context, n: float, tp: int, prof) -> float:
    """Transformer Engine's ``AttnFuncWithCPAndKVAllGather`` (Megatron-Core ``--cp-comm-type
    allgather``; Llama 3 paper section 3.3.2): the forward all-gathers the keys and values of the
    whole sequence before attention, the backward gathers them again (only the local shards are
    saved) and reduce-scatters their gradients; "the all-gather is not async, and cannot be
    overlapped" (TransformerConfig.cp_comm_type), so all three are exposed."""
    model = ctx.model
    gathered = ACT_BYTES * n * prof.num_ranks * 2 * model.num_kv_heads_resolved * model.head_dim_resolved / tp
    return 2 * coll.all_gather_s(gathered, prof) + coll.reduce_scatter_s(gathered, prof)


def _cp_a2a_s(ctx: Context, n: float, tp: int, prof) -> float:
    """DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509; Megatron-Core ``--cp-comm-type a2a``):
    before attention an all-to-all turns each rank's ``n`` tokens of every head into the whole
    sequence of ``1/k`` of the heads, for the queries, keys and values; after it one turns the output
    back; the backward does the same with the gradients. Attention then runs on whole sequences
    (the same work per rank as the ring), and nothing hides the all-to-alls."""
    model = ctx.model
    d = model.head_dim_resolved
    qkv = ACT_BYTES * n * (model.num_attention_heads + 2 * model.num_kv_heads_resolved) * d / tp
    out = ACT_BYTES * n * model.num_attention_heads * d / tp
    return 2 * (coll.all_to_all_s(qkv, prof) + coll.all_to_all_s(out, prof))


@lru_cache(maxsize=65536)
def ep_comm_terms(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
                  ranks: tuple[int, ...], tp_overlap: bool = False, steady: float = 0.0,
                  expert_tp: bool = True, dispatcher: str = "auto") -> float:
    """Exposed all-to-all traffic of all MoE layers, one micro-batch, over the expert group ``ranks``.

    With EP overlap (``steady`` > 0: the share of chunks in combined forward/backward steps,
    :func:`ep_overlap_steady_share`) those chunks hide their all-to-alls behind the other chunk's
    compute of the MoE layers, less what TP overlap and the context-parallel ring already hide
    behind, at the price of the SMs the all-to-all kernels hold (``overlap_share(ctx, "ep")``);
    the others pay them in full. ``dispatcher``: ``Layout.moe_dispatcher`` (:func:`_dispatch_s`)."""
    if steady <= 0.0:
        return _ep_open_s(ctx, tp, cp, ep, mbs, sp, recompute, ranks, dispatcher)
    raw, hidden = ep_comm_parts(ctx, tp, cp, ep, mbs, sp, recompute, ranks, expert_tp, tp_overlap, dispatcher)
    return steady * hidden + (1.0 - steady) * raw


@lru_cache(maxsize=65536)
def _ep_open_s(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
               ranks: tuple[int, ...], dispatcher: str = "auto") -> float:
    """The MoE layers' all-to-alls of one micro-batch, in the open."""
    if ep == 1 or ctx.model.moe is None:
        return 0.0
    return _ep_layers_s(ctx, _tokens(ctx, cp, mbs), tp, sp, ranks, dispatcher) * _comm_multiplier(recompute)


@lru_cache(maxsize=65536)
def _ep_layers_s(ctx: Context, n: float, tp: int, sp: bool, ranks: tuple[int, ...], dispatcher: str) -> float:
    """:func:`_ep_open_s` before the recomputation's multiplier, for ``n`` tokens a rank: priced once
    for every recompute mode and every (cp, mbs) of one token count (the search asks each)."""
    return ctx.model.num_moe_layers * _ep_comm_s(ctx, n, tp, ctx.cluster.axis_profile(ranks), sp, dispatcher)


def dispatcher_choice(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
                      ranks: tuple[int, ...], dispatchers: tuple[str, ...]) -> tuple[str, float]:
    """The dispatcher of ``dispatchers`` whose MoE all-to-alls of one micro-batch take least in the open
    (:func:`_ep_open_s`) and that time; the first on a tie (``auto``, listed first, keeps a plan as it
    was). EP overlap hides a share of that same time and no memory term reads the dispatcher, so the
    search decides it per expert group exactly (``Layout.moe_dispatcher``)."""
    best = None
    for dispatcher in dispatchers:
        seconds = _ep_open_s(ctx, tp, cp, ep, mbs, sp, recompute, ranks, dispatcher)
        if best is None or seconds < best[1]:
            best = (dispatcher, seconds)
    return best


@lru_cache(maxsize=65536)
def ep_comm_parts(ctx: Context, tp: int, cp: int, ep: int, mbs: int, sp: bool, recompute: str,
                  ranks: tuple[int, ...], expert_tp: bool = True, tp_overlap: bool = False,
                  dispatcher: str = "auto") -> tuple[float, float]:
    """``(open, hidden)``: the MoE layers' all-to-alls per micro-batch in the open, and exposed in
    EP overlap's steady state (:func:`ep_comm_terms`)."""
    if ep == 1 or ctx.model.moe is None:
        return 0.0, 0.0
    raw = _ep_open_s(ctx, tp, cp, ep, mbs, sp, recompute, ranks, dispatcher)
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


def _ep_comm_s(ctx: Context, n: float, tp: int, prof, sp: bool, dispatcher: str = "auto") -> float:
    """Dispatch and combine all-to-alls of the routed tokens, forward and backward (4 in all), by the
    layout's ``dispatcher`` (``Layout.moe_dispatcher``, :func:`_dispatch_s`)."""
    e = ctx.model.moe
    token_bytes = ACT_BYTES * n * ctx.model.hidden_size / tp
    return 4 * max(_dispatch_s(e, token_bytes, shape, dispatcher) for shape in prof.shapes)  # the slowest group


def _dispatch_s(e, token_bytes: float, prof, dispatcher: str = "auto") -> float:
    """One all-to-all of :func:`_ep_comm_s` over one group shape; the most loaded rank receives the
    most (``MoESpec.load_factor``).

    ``alltoall`` (Megatron-Core's alltoall dispatcher, torchtitan's standard backend): tokens are
    permuted into expert order and exchanged with an NCCL all-to-all, so every one of a token's
    ``top_k`` routed copies crosses the links, the fabric included. ``deepep`` / ``hybridep``: the
    fused kernels send a token once to each rank holding any of its experts (DeepEP's
    ``is_token_in_rank``; :func:`ranks_per_token`) and, across domains, once over the fabric to each
    node holding any (:func:`remote_nodes_per_token`), forwarded there over the scale-up links.
    ``auto``: what every framework runs when the plan names no dispatcher, priced as ``alltoall``:
    Megatron-Core's alltoall dispatcher, which the Megatron export writes for it
    (``--moe-token-dispatcher-type alltoall``; Megatron-Core's own default is the allgather
    dispatcher, which the export never leaves it to), torchtitan's standard backend, DeepSpeed-MoE's
    ``all_to_all_single``, MaxText's XLA exchange (maxtext.yaml ``moe_alltoall``): none deduplicates. The phases run at
    the links' achieved rates: DeepEP's normal kernels measure 153-158 GB/s of the H800's ~160 GB/s
    NVLink maximum and 43-58 GB/s (logical) of a 400 Gb/s CX7's ~50 GB/s (DeepEP README, V1
    performance table), no slower than the NCCL bus bandwidth the link classes carry.
    A group straddling domains unevenly is timed at its rank in the emptiest domain, whose tokens
    find the fewest experts at home (``own_share``).

    Across domains whose NICs take no GPU-initiated RDMA (``GroupProfile.inter_gpu_initiated_rdma``:
    AWS EFA) every dispatcher is priced as NCCL's all-to-all: DeepEP's internode kernels post
    token-level RDMA from the GPU through NVSHMEM's IBGDA; on EFA, NVSHMEM's libfabric transport
    posts it from a host proxy thread, with a fence before each put-signal that quiets its queue
    pair (DeepEP PR #574: 'not close to the performance of IB'). Measured on EFA, DeepEP's RDMA leg
    moves at NCCL all-to-all's matched-size bus bandwidth, not above it (awsome-distributed-ai
    ep-backend-comparison: 43.7/46.1 GB/s dispatch/combine against NCCL's 45.1 on 4 p5 nodes), and
    Megatron-Bridge training with DeepEP over EFA measured slower than with the NCCL all-to-all
    dispatcher in 13 of 15 cells and at most 5.2% faster in the others (awsome-distributed-ai
    qwen3-30b and qwen3-235b benchmarks/RESULTS.md, 2026-06)."""
    dedup = dispatcher in ("deepep", "hybridep")
    proxied = prof.num_domains > 1 and not prof.inter_gpu_initiated_rdma
    copies = ranks_per_token(e.num_experts, e.top_k, prof.num_ranks) if dedup and not proxied else e.top_k
    size = token_bytes * copies * e.load_factor
    if prof.num_domains <= 1 or not dedup or proxied:
        return coll.all_to_all_s(size, prof)
    kmin = prof.fewest_ranks_per_domain
    own = None if kmin == prof.ranks_per_domain else kmin / prof.num_ranks
    remote = token_bytes * e.load_factor * remote_nodes_per_token(e.num_experts, e.top_k, prof.num_domains,
                                                                  e.max_nodes_per_token, own)
    return coll.hierarchical_all_to_all_s(size, remote, prof)


def ranks_per_token(num_experts: int, top_k: int, num_ranks: int) -> float:
    """Expected number of the ``num_ranks`` expert-parallel ranks (experts spread evenly, chosen
    uniformly) that hold any of a token's ``top_k`` experts: the copies a deduplicating dispatcher
    sends. Node-limited routing, which crowds a token's experts onto fewer ranks, is not counted
    (an upper bound)."""
    if num_ranks <= 1:
        return 1.0
    return remote_nodes_per_token(num_experts, top_k, num_ranks) * num_ranks / (num_ranks - 1)


def remote_nodes_per_token(num_experts: int, top_k: int, num_nodes: int, max_nodes: int | None = None,
                           own_share: float | None = None) -> float:
    """Expected number of other nodes a token's ``top_k`` experts lie on, with the experts spread
    evenly over ``num_nodes`` nodes and chosen uniformly (the uniform-load assumption); with
    node-limited routing they are chosen among the experts of ``max_nodes`` nodes (DeepSeek-V3,
    section 3.2). ``own_share``: the share of the experts on the token's own node where it differs
    from the others' (an expert group straddling domains unevenly), the other nodes sharing the rest
    equally."""
    if own_share is not None and num_nodes > 1:
        return _remote_nodes_uneven(num_experts, top_k, num_nodes, max_nodes, own_share)
    per_node = num_experts / num_nodes
    candidates = num_nodes if max_nodes is None else min(max_nodes, num_nodes)
    pool = candidates * per_node
    k = min(top_k, int(pool))
    miss = math.prod((pool - per_node - i) / (pool - i) for i in range(k)) if pool - per_node >= k else 0.0
    return candidates * (1.0 - miss) * (num_nodes - 1) / num_nodes


def _remote_nodes_uneven(num_experts: int, top_k: int, num_nodes: int, max_nodes: int | None,
                         own_share: float) -> float:
    """:func:`remote_nodes_per_token` where the token's own node holds ``own_share`` of the experts
    and the others ``(1 - own_share) / (num_nodes - 1)`` each: each other node is hit unless all
    ``top_k`` picks miss its experts (picks among every expert, or among ``max_nodes`` nodes' with
    node-limited routing, each of them another node with probability ``1 - own_share``). With equal
    shares it is the even formula."""
    per_node = num_experts * (1.0 - own_share) / (num_nodes - 1)
    limited = max_nodes is not None and max_nodes < num_nodes
    pool = max_nodes * per_node if limited else float(num_experts)
    k = min(top_k, int(pool))
    miss = math.prod((pool - per_node - i) / (pool - i) for i in range(k)) if pool - per_node >= k else 0.0
    return max_nodes * (1.0 - miss) * (1.0 - own_share) if limited else (num_nodes - 1) * (1.0 - miss)
