"""The one adapter where floats become integers: every cost term tabulated over its own knobs.

Each table is a numpy ``int64`` array indexed by the positions of its knobs in the
:class:`~planner.search.space.Space`. Quanta (named below) turn seconds and bytes into integers; memory
rounds up and capacity rounds down, so whatever the integer model accepts also fits in floats.
CP-SAT (``planner.search.cpsat``) reads these tables through element constraints; the exhaustive
enumerator (``planner.search.exhaustive``) broadcasts them with numpy. Both therefore optimise exactly
the same integer objective.

Objective, in units of ``TIME_QUANTUM_S / SLOT_QUANTUM`` (assembled by ``cost.assembly``, as the floats)::

    U[f,mb,v] * X  -  EO * UG[f,mb,v] * min((SHARE_PARTS - ep_share) EPC // SHARE_PARTS, WE)  -  ZU[f,mb,v] * BK
    +  dp_exposed  +  M * fsdp_exposed  +  SLOT_QUANTUM * (M[f,mb] * per micro-batch terms  +  per-step terms  +  GA)

where ``exposed = max(ceil(SLOT_QUANTUM * traffic / NUM_GRAD_BUCKETS), ceil(SLOT_QUANTUM * traffic *
dp_share / SHARE_PARTS), SLOT_QUANTUM * traffic - FRAC * window)`` with DP overlap on (the window is
BWD per step, FW per micro-batch), ``SLOT_QUANTUM * traffic`` with it off.

with ``X = C + TPC + CPC + EPC`` the per-micro-batch layer time, ``U`` the micro-batch slots
(including the bubble) times the share of layers on the most loaded stage, and the second term what EP
overlap saves: the slots in its steady state times the all-to-all time it hides there (what the
kernels' SM share leaves of it, at most the window WE; ``cost.terms.ep_comm_parts``). ``ZU * BK`` is
what zero bubble takes off the bubble where the search runs it (``space.cell_schedule``): its slots
times the backward compute per micro-batch (``Tables.ZU``; per kind on a stage of both kinds). The
additive terms: the tables of ``cost.assembly.STEP_TERMS``; ``GA = M GA - GAW - [M = 1] GA1``. For
``--objective energy``: ``time_weight * (the above) + busy_weight * (M * BF * C + SLOT_QUANTUM *
(M * busy per micro-batch terms + busy per-step terms + GA))``, waiting power over the step plus the
extra power while computing (``cost.energy``; ``BF`` = 1 / pp: ``cost.step.device_busy_s``); for time and cost the weights are ``(1, 0)``.
"""

from __future__ import annotations

from clusterplan.models.errors import SpecError

import math
from dataclasses import dataclass, field

import numpy as np

from clusterplan.cost.assembly import STEP_TERMS
from clusterplan.cost.collectives import memoized
from clusterplan.cost.layout import Layout, offloads_activations, split_order
from clusterplan.cost.stages import RANKS, rank_index
from clusterplan.cost.step import rank_inflight, working_bytes
from clusterplan.cost.terms import (
    Context, activation_terms, compute_terms, cp_comm_choice, cp_comm_terms, dispatcher_choice, dp_profiles,
    mixed_kinds, kind_windows_over, stage_kind_shares, ep_overlap_steady_share, ep_overlap_window_s, head_in_period,
    head_terms, overlap_share, param_counts, period_layers,
    runtime_bytes, chunks_fit, tp_comm_over,
)
from clusterplan.planner.search.cells import AddedTables, cell_rows, cell_table
from clusterplan.planner.search.masks import (
    canonical_mask, ep_overlap_mask, framework_mask, masks, order_representatives,
)
from clusterplan.planner.search.gathers import compared_gathers, dp_cell
from clusterplan.planner.search.graphs import etp_dispatchers, searched_choices  # the dispatchers searched_choices names
from clusterplan.planner.search.offload import host_refused_statics
from clusterplan.planner.search.reuse import (
    fewer_collections, key_use, kept, kept_cells, kept_keys, kept_rows, per_pp_dp, time_in_use,
)
from clusterplan.planner.search.hsdp import layout_shard, priced_shard, with_groups
from clusterplan.planner.search.space import Space, _representative, cell_schedule, expert_ok, layout_of, traversal_duplicates

TIME_QUANTUM_S = 1e-7  # 100 ns: per-micro-batch terms; a 1 s term is 10^7 units
SLOT_QUANTUM = 1000  # micro-batch slots and stage shares in thousandths
SHARE_PARTS = 1000  # the overlap share of compute in thousandths (rounded up: never cheaper than the floats)
MEMORY_QUANTUM_BYTES = 2**20  # 1 MiB


def q_bytes_up(num_bytes: float) -> int:
    return int(math.ceil(num_bytes / MEMORY_QUANTUM_BYTES))


@dataclass
class Tables(AddedTables):
    """Integer tables and the index maps that tie them to knobs."""

    space: Space
    # index maps over (f,), (f, o), (f, o, e)
    tc_of_fe: np.ndarray  # (F, E) -> index of (tp, cp, ep, expert_tp): compute
    ta_of_f: np.ndarray  # (F,) -> index of (tp, cp): activation memory
    tpg_of_fo: np.ndarray  # (F, O) -> index of (tp, cp, tp_stride, devices): LM head
    tpc_of_foe: np.ndarray  # (F, O, E) -> index of (tp group, whether MoE layers have TP comm): layer TP comm
    cpg_of_fo: np.ndarray  # (F, O) -> index of (tp, cp, cp_stride, devices)
    epg_of_foe: np.ndarray  # (F, O, E) -> index of (tp, cp, ep, expert group ranks or devices)
    # time tables (TIME_QUANTUM_S)
    C: np.ndarray  # (TC, MB, S, R) compute fwd+bwd+recompute, all layers, one micro-batch; TC = (tp, cp, ep, etp)
    BWD: np.ndarray  # (TC, MB, S, R, TO) backward compute left to hide the per-step DP traffic behind
    FW: np.ndarray  # (TC, MB, S, R, TO, EO) compute left to hide per-micro-batch ZeRO-2/3 traffic behind
    TPC: np.ndarray  # (TPC, MB, S, R, TO)
    CPC: np.ndarray  # (CPG, MB, S)
    EPC: np.ndarray  # (EPG, MB, S, R) expert all-to-alls in the open; EPG = (tp, cp, ep, etp, group)
    WE: np.ndarray  # (TC, MB, S, R, TO) the compute EP overlap's all-to-alls hide behind (0 where it is refused)
    H: np.ndarray  # (TPG, MB, S) LM head per micro-batch
    DPS: np.ndarray  # (F, O, V, E, Z) per-step data-parallel traffic
    DPM: np.ndarray  # (F, O, V, E, Z) per-micro-batch FSDP traffic
    RG: np.ndarray  # (F, O, V, E, Z) ZeRO-3's third gathers per micro-batch, paid with full recomputation
    DPX: np.ndarray  # (F, O, V, E, Z) per-step traffic that is never overlapped (ZeRO-2's weight gather)
    DPC: np.ndarray  # (F, O, V, E, Z) FSDP2's copies per micro-batch on the compute stream (cost.terms.fsdp_copy_s)
    OPT: np.ndarray  # (F, V, E, Z); with optimizer offload its host copies and CPU step (planner.search.offload)
    GA: np.ndarray  # (F, V, E, Z) one micro-batch's gradient accumulation (cost.terms.grad_accumulation_parts)
    GAW: np.ndarray  # (F, V, E, Z) less this where the first gradient is taken as it comes (autograd)
    GA1: np.ndarray  # (F, V, E, Z) less this where one micro-batch adds none (MaxText)
    # counts (exact integers or SLOT_QUANTUM)
    U: np.ndarray  # (F, MB, V) slots * stage share, SLOT_QUANTUM
    UG: np.ndarray  # (F, MB, V) U times the share of chunks EP overlap pairs (cost.terms.ep_overlap_steady_share)
    FRAC: np.ndarray  # (F, V) stage share, SLOT_QUANTUM
    BF: np.ndarray  # (F,) the mean device's share of all layers' compute, 1 / pp (FRAC on an even split), SLOT_QUANTUM
    M: np.ndarray  # (F, MB) micro-batches
    # memory (MEMORY_QUANTUM_BYTES)
    ACT_D: np.ndarray  # (TA, MB, S, R) one dense layer's stored activations (0: the model has none)
    ACT_M: np.ndarray  # (TA, MB, S, R) one MoE layer's
    TRANS: np.ndarray  # (TA, MB, S, R)
    LOGITS: np.ndarray  # (TA, MB, S, R): what the logits add to TRANS on the last rank (cost.step.working_bytes)
    rows: tuple  # MemoryRow per pipeline rank and moment whose peak can bind (memory_rows)
    capacity: int
    # feasibility masks, False = rejected, with the reason masks
    ok_f: np.ndarray  # (F,) reason codes per f: -1 ok else REASON_ORDER index
    ok_fmbv: np.ndarray  # (F, MB, V)
    ok_fe: np.ndarray  # (F, E)
    ok_foe: np.ndarray  # (F, O, E)
    ok_fes: np.ndarray  # (F, E, S): sequence parallelism needs tp > 1; folded experts with tp > 1 need it
    ok_fo: np.ndarray  # (F, O)
    canon: np.ndarray  # (F, E, S, Z, O, DO, TO) bool
    eo_canon: np.ndarray  # (E, EO) bool: EP overlap means nothing at ep=1 (its representative only)
    eo_ok: np.ndarray  # (F, V, R, EO) bool: False where the framework refuses EP overlap (outside the space)
    # objective = time_weight * step time + busy_weight * busy time (cost.energy.objective_weights)
    time_weight: int = 1
    busy_weight: int = 0
    # the share of compute overlapped DP traffic takes (cost.terms.overlap_share), as SHARE_PARTS ths
    dp_share: int = 0
    ep_share: int = 0  # the same for EP overlap's all-to-alls
    # the rules and memory alone (build_tables(memory_only=True)): the time tables are empty
    memory_only: bool = False
    # dense and MoE layers both (cost.terms.mixed_kinds): the MoE layers' part of C, TPC, BWD and FW,
    # and the candidate slowest stages (StageCandidate, cost.terms.stage_kind_shares); None otherwise
    C_M: np.ndarray | None = None
    TPC_M: np.ndarray | None = None
    BWD_M: np.ndarray | None = None
    FW_M: np.ndarray | None = None
    stages: tuple | None = None
    # zero bubble where the search runs it (space.cell_schedule; else None): ``BK`` (TC, MB, S, R) the
    # backward compute of all layers for one micro-batch (``BK_M`` the MoE layers' part), ``ZU`` (F, MB,
    # V) the bubble's slots it takes off per unit of the stage's backward (SLOT_QUANTUM; 0 elsewhere)
    BK: np.ndarray | None = None
    BK_M: np.ndarray | None = None
    ZU: np.ndarray | None = None
    # with bf16 and fp8 parameter gathers offered (Space.param_gather): (F, O, V, E, Z) bool, True where
    # the cell is priced with fp8 (gathers.gather_pick); layout_from_indices puts it on the layout. None otherwise
    PG: np.ndarray | None = None
    added: dict = field(default_factory=dict)  # the tables planner.search.cells prices (P2P (F, O, MB, S), ...)


@dataclass
class StageCandidate:
    """One candidate slowest pipeline stage of a model with dense and MoE layers both: its slots on
    the dense and on the MoE layers' totals (``ud``, ``um``, SLOT_QUANTUM), the MoE slots in EP
    overlap's steady state (``ugm``), over (F, MB, V); and its share of each kind's layers (``fd``,
    ``fm``, SLOT_QUANTUM, over (F, V)), which sets its data-parallel windows."""

    ud: np.ndarray
    um: np.ndarray
    ugm: np.ndarray
    fd: np.ndarray
    fm: np.ndarray
    zd: np.ndarray | None = None  # (F, MB, V) zero bubble's saved slots on the dense layers' backward (Tables.ZU)
    zm: np.ndarray | None = None  # on the MoE layers'


@dataclass
class MemoryRow:
    """One pipeline rank's peak at one moment of its steady state (``cost.stages``): every layout
    must keep ``static + ACT_D * IFD + ACT_M * IFM + TRANS (+ LOGITS on the last rank)`` within the
    capacity, at backward's end ``static + TRANS``, and at the optimizer step ``step``."""

    name: str  # the rank (cost.stages.RANKS) and the moment
    static: np.ndarray  # (F, V, E, Z) weights, gradients and optimizer states, with the runtime
    static1: np.ndarray  # (F, V, E, Z) less the gradients absent at a one-micro-batch step's activation peak
    step: np.ndarray  # (F, V, E, Z) the optimizer step's peak with the runtime, where it copies gradients; else 0
    ifd: np.ndarray  # (F, MB, V) dense layers' activations in flight
    ifm: np.ndarray  # (F, MB, V) MoE layers'
    logits: bool  # the rank holds the logits (the last)

    def frees_gradients(self, sl: slice = slice(None)) -> bool:
        """Whether some layout holds fewer gradients at a one-micro-batch step's activation peak
        than at backward's end (``grads_freed_bytes``)."""
        return bool((self.static1[sl] < self.static[sl]).any())

    def copies_gradients(self, sl: slice = slice(None)) -> bool:
        """Whether some layout has an optimizer-step peak of its own (``cost.step.optimizer_step_bytes``)."""
        return bool(self.step[sl].any())


def _index(keys: list) -> tuple[dict, list]:
    pos: dict = {}
    for k in keys:
        pos.setdefault(k, len(pos))
    return pos, list(pos)


def _group_index(keys: np.ndarray, placed: list[Context]) -> tuple[np.ndarray, list, list[Context]]:
    """Index a group key per (f, o[, e]) (an object array); each key keeps the placed context of
    the order it first appears under, which its terms are computed in."""
    pos: dict = {}
    key_ctx: list[Context] = []
    index = np.empty(keys.shape, dtype=np.int64)
    for at, key in np.ndenumerate(keys):
        if key not in pos:
            pos[key] = len(pos)
            key_ctx.append(placed[at[1]])
        index[at] = pos[key]
    return index, list(pos), key_ctx


def _group_keys(ctx: Context, S: Space, probe: list[list[Layout]], placed: list[Context]) -> tuple[np.ndarray, ...]:
    """Keys of the tensor-, context- and expert-parallel communicators over (f, o) and (f, o, e).

    A key is what the term depends on: the degrees, the stride and, on a torus, the devices the
    group lands on under the order's traversal (so traversals that put a group on the same chips
    share one table row); context parallelism's, the traversal: its ring and gathers run over every
    group in rank order, which rank 0's chips do not fix. Elsewhere the stride says it all."""
    torus, n_dev = ctx.cluster.torus_shape is not None, ctx.cluster.num_devices

    def where(c: Context, count: int, stride: int):
        return c.cluster.devices(range(0, count * stride, stride)) if torus and count * stride <= n_dev else None

    F, O, E = len(probe), len(S.order), len(S.ep)
    tp_keys, cp_keys, head_keys = np.empty((F, O), object), np.empty((F, O), object), np.empty((F, O), object)
    tpc_keys, ep_keys = np.empty((F, O, E), object), np.empty((F, O, E), object)
    # with head_slots and a head lighter than a layer, a pipeline's head hides in its last rank's spare slot
    hidden = not head_in_period(ctx, S.head_slots[0])
    for i, row in enumerate(probe):
        for j, (l, c) in enumerate(zip(row, placed)):
            tp_keys[i, j] = (l.tp, l.cp, l.stride("tp"), where(c, l.tp, l.stride("tp")))
            head_keys[i, j] = tp_keys[i, j][:3] + ((tp_keys[i, j][3], hidden and l.pp > 1),)
            cp_keys[i, j] = (l.tp, l.cp, l.stride("cp"), c.cluster.traversal if l.cp > 1 else None)
            for k, (e, et) in enumerate(zip(S.ep, S.expert_tp)):
                tpc_keys[i, j, k] = tp_keys[i, j] + (et or e == 1, e, et)
                ranks = ()
                if e > 1 and expert_ok(ctx.model, l.tp, l.dp, l.cp, e, et, ctx.job.profile) is None:
                    ranks = l.with_(ep=e, expert_tp=et).group("ep")
                ep_keys[i, j, k] = (l.tp, l.cp, e, et, c.cluster.devices(ranks) if torus and ranks else ranks)
    return (*_group_index(head_keys, placed), *_group_index(tpc_keys, placed), *_group_index(cp_keys, placed),
            *_group_index(ep_keys, placed))


@fewer_collections()
def build_tables(ctx: Context, space: Space, memory_headroom: float = 0.0, ignore_memory: bool = False,
                 weights: tuple[int, int] = (1, 0), memory_only: bool = False) -> Tables:
    """Tabulate every term over its own domain (see module docstring); ``weights`` are the
    objective's ``(time_weight, busy_weight)``. ``memory_only``: the rules and the memory terms
    alone, the time tables left empty (``Tables.memory_only``): whether some layout fits, as
    ``clusterplan fit`` asks at each size, without the price of every layout's step time."""
    S = space
    tc_of_fe, tc_keys, ta_of_f, ta_keys = _compute_keys(ctx, S)
    ACT_D, ACT_M, TRANS, LOGITS = kept(("act", ctx, S), lambda: _activation_tables(ctx, S, ta_keys))
    ok_f, ok_fmbv, ok_fe, ok_foe, ok_fes, ok_fo = masks(ctx, S)
    use = ((ok_fmbv < 0).any(axis=2) & (ok_f < 0)[:, None])  # (f, mb) pairs some layout can take
    timed = _no_time_tables(S) if memory_only else kept_cells(
        ("time", ctx, S), use, lambda u: _time_tables(ctx, S, tc_of_fe, tc_keys, u),
        lambda t, u: time_in_use(t, u, tc_of_fe))
    with memoized():
        DPS, DPM, RG, DPX, DPC, OPT, (GA, GAW, GA1), statics, PG = kept_rows(("dp", ctx, S, not memory_only), use.any(axis=1),
                                                        lambda valid: _dp_tables(ctx, S, valid, times=not memory_only))
    U, UG, FRAC, M, stages = per_pp_dp(S, lambda sub: _count_tables(ctx, sub))
    ZU = None if memory_only else _zero_bubble_slots(ctx, S, stages)
    order_ok = order_representatives(S)
    if not memory_only and len({split_order(o)[1] for o in S.order}) > 1:
        order_ok &= _traversal_representatives(S, timed, (DPS, DPM, RG, DPX, DPC), ok_fo, ok_foe, order_ok, use)
    canon = canonical_mask(S, order_ok, ok_fe, kept(("framework", ctx, S), lambda: with_groups(ctx, S, framework_mask(ctx, S))))
    eo_canon = ~((np.array(S.ep) == 1)[:, None]
                 & (np.array(S.ep_overlap, bool) != _representative(S.ep_overlap, False))[None, :])
    capacity = _capacity(ctx, memory_headroom, ignore_memory)
    statics = host_refused_statics(ctx, S, statics, capacity + 1)  # optimizer offload: what host memory holds
    rows = memory_rows(ctx, S, statics, M)
    if not ignore_memory:
        # A memory term beyond the capacity rules its layouts out whatever it is, so it is clamped
        # to capacity + 1: the integer model then never multiplies huge byte counts (unfused
        # attention at 32k tokens gives terabytes per layer), which made CP-SAT exhaust memory.
        ACT_D, ACT_M, TRANS, LOGITS = (np.minimum(a, capacity + 1) for a in (ACT_D, ACT_M, TRANS, LOGITS))
        for row in rows:
            row.static, row.static1 = np.minimum(row.static, capacity + 1), np.minimum(row.static1, capacity + 1)
            row.step = np.minimum(row.step, capacity + 1)
    bk, bk_m = timed.pop("BK", None), timed.pop("BK_M", None)
    added = {term.table: timed.pop(term.table, np.zeros(0, np.int64)) for term in STEP_TERMS if not term.priced_by}
    return Tables(space=space, tc_of_fe=tc_of_fe, ta_of_f=ta_of_f, **timed, DPS=DPS, DPM=DPM, RG=RG, DPX=DPX, DPC=DPC,
                  OPT=OPT, GA=GA, GAW=GAW, GA1=GA1, BF=np.array([round(SLOT_QUANTUM / f[1]) for f in S.factorizations], np.int64),
                  U=U, UG=UG, stages=stages, FRAC=FRAC, M=M, ACT_D=ACT_D, ACT_M=ACT_M, TRANS=TRANS, LOGITS=LOGITS, rows=rows,
                  capacity=capacity, ok_f=ok_f, ok_fmbv=ok_fmbv, ok_fe=ok_fe, ok_foe=ok_foe,
                  ok_fes=ok_fes, ok_fo=ok_fo, canon=canon, eo_canon=eo_canon, PG=PG,
                  eo_ok=kept(("ep_overlap", ctx, S), lambda: ep_overlap_mask(ctx, S)),
                  time_weight=int(weights[0]), busy_weight=int(weights[1]),
                  dp_share=int(math.ceil(SHARE_PARTS * overlap_share(ctx, "dp"))),
                  ep_share=int(math.ceil(SHARE_PARTS * overlap_share(ctx, "ep"))), memory_only=memory_only,
                  ZU=ZU, BK=None if ZU is None else bk, BK_M=None if ZU is None else bk_m, added=added)


def _time_tables(ctx: Context, S: Space, tc_of_fe: np.ndarray, tc_keys: list, use: np.ndarray) -> dict:
    """The per-layer and per-micro-batch time tables with the group index maps they are read through.

    A row is priced only at the micro-batch sizes some factorization reading it can take (``use``,
    over (f, mb): the batch and factorization rules); its other entries are 0 and never read, since
    every layout with them is refused by ``ok_f`` or ``ok_fmbv``. Where a step is one micro-batch
    (``Job.one_microbatch``) each factorization takes one size of many, so this prices a few
    entries of each row instead of all of them."""
    probe = [[layout_of(f, 1, 1, 1, False, "none", 0, o, True, False) for o in S.order] for f in S.factorizations]
    placed = [ctx.placed(o) for o in S.order]  # fabric terms are asked under each order's traversal
    (tpg_of_fo, tpg_keys, tpg_ctx, tpc_of_foe, tpc_keys, tpc_ctx, cpg_of_fo, cpg_keys, cpg_ctx,
     epg_of_foe, epg_keys, epg_ctx) = _group_keys(ctx, S, probe, placed)
    axes = (ctx, S.micro_batch_size, S.sequence_parallel, S.recompute, S.tp_overlap, S.ep_overlap, S.cp_comm, S.moe_dispatcher)
    C, C_M, BWD, FW, WE, BWD_M, FW_M, BK, BK_M = kept_keys(("compute", axes), tc_keys, key_use(
        tc_of_fe, len(tc_keys), use), lambda keys, u: _compute_tables(ctx, S, keys, u))
    (TPC, TPC_M), (CPC,), (ep_open,), (H,) = (kept_keys(
        (part, axes), list(zip(keys, at)), key_use(index, len(keys), use), lambda k, u, part=part: _comm_part(S, part, k, u))
        for part, index, keys, at in ((0, tpc_of_foe, tpc_keys, tpc_ctx), (1, cpg_of_fo, cpg_keys, cpg_ctx),
                                      (2, epg_of_foe, epg_keys, epg_ctx), (3, tpg_of_fo, tpg_keys, tpg_ctx)))
    added = {term.table: _qt(cell_table(ctx, S, term, use, probe)) for term in STEP_TERMS if not term.priced_by}
    return dict(tpg_of_fo=tpg_of_fo, tpc_of_foe=tpc_of_foe, cpg_of_fo=cpg_of_fo, epg_of_foe=epg_of_foe, C=C, BWD=BWD,
                FW=FW, WE=WE, TPC=TPC, CPC=CPC, EPC=_qt(ep_open), H=H, C_M=C_M, TPC_M=TPC_M, BWD_M=BWD_M,
                FW_M=FW_M, BK=BK, BK_M=BK_M, **added)


def _no_time_tables(S: Space) -> dict:
    """Empty time tables (a memory-only build); an objective read through them fails loudly."""
    F, O, E = len(S.factorizations), len(S.order), len(S.ep)
    none = np.zeros(0, np.int64)
    return dict(tpg_of_fo=np.zeros((F, O), np.int64), tpc_of_foe=np.zeros((F, O, E), np.int64),
                cpg_of_fo=np.zeros((F, O), np.int64), epg_of_foe=np.zeros((F, O, E), np.int64),
                C=none, BWD=none, FW=none, WE=none, TPC=none, CPC=none, EPC=none, H=none)


def _traversal_representatives(S: Space, t: dict, dp: tuple[np.ndarray, ...], ok_fo: np.ndarray, ok_foe: np.ndarray,
                               order_ok: np.ndarray, use: np.ndarray) -> np.ndarray:
    """(f, o): False for a torus traversal that changes nothing (every term of its row equal to an
    earlier traversal's: the time tables ``t`` at the micro-batch sizes the factorization takes
    (``use``), the data-parallel tables ``dp`` over (f, o, ...) and the masks): it counts once."""
    def rows(i, j):
        def at(name, index):  # a group table's row (first axes: per-e keys, then mb) at f's sizes
            return (t[name][index][:, use[i]] if np.ndim(index) else t[name][index][use[i]]).tobytes()
        moe_tp = () if t.get("TPC_M") is None else (at("TPC_M", t["tpc_of_foe"][i, j]),)
        return (*moe_tp, at("TPC", t["tpc_of_foe"][i, j]), at("H", t["tpg_of_fo"][i, j]),
                at("CPC", t["cpg_of_fo"][i, j]), at("EPC", t["epg_of_foe"][i, j]),
                *cell_rows(t, i, j), *(table[i, j].tobytes() for table in dp), int(ok_fo[i, j]),
                ok_foe[i, j].tobytes())
    return np.array([~np.array(traversal_duplicates(S.order, list(order_ok[i]), [rows(i, j) for j in range(len(S.order))]))
                     for i in range(len(S.factorizations))], bool).reshape(order_ok.shape)


def _compute_keys(ctx: Context, S: Space):
    """Rows of the compute tables per (tp, cp, ep, expert_tp) and of the memory tables per (tp, cp).

    A (factorization, expert layout) that breaks the expert rules (masked by ok_fe) points at its
    ep=1 row instead, so its terms are never computed."""
    experts = list(zip(S.ep, S.expert_tp))

    def tc_key(f, e, et):
        valid = expert_ok(ctx.model, f[0], f[2], f[3], e, et, ctx.job.profile) is None
        return (f[0], f[3], e, et) if valid else (f[0], f[3], 1, True)
    tc_pos, tc_keys = _index([tc_key(f, e, et) for f in S.factorizations for e, et in experts])
    tc_of_fe = np.array([[tc_pos[tc_key(f, e, et)] for e, et in experts] for f in S.factorizations])
    ta_pos, ta_keys = _index([(f[0], f[3]) for f in S.factorizations])  # memory does not depend on ep
    ta_of_f = np.array([ta_pos[(f[0], f[3])] for f in S.factorizations])
    return tc_of_fe, tc_keys, ta_of_f, ta_keys


def _compute_tables(ctx: Context, S: Space, tc_keys: list, use: np.ndarray) -> tuple[np.ndarray, ...]:
    """Compute time per layer (C) and the windows the data-parallel (BWD) and FSDP (FW) traffic
    may overlap, per (tp, cp, ep, expert_tp) x micro-batch x sp x recompute (x tp_overlap, x ep_overlap
    for FW), and the window EP overlap's all-to-alls hide behind (WE); each key at the micro-batch
    sizes ``use`` (key, mb) marks (``_time_tables``), 0 elsewhere."""
    MB, SP, RC, TO, EO = S.micro_batch_size, S.sequence_parallel, S.recompute, S.tp_overlap, S.ep_overlap
    cells = [(k, m) for k in range(len(tc_keys)) for m in range(len(MB))]

    def grid(term):  # term(tp, cp, mb, sp, rc, e, et) over (key, mb, sp, rc), None where unused
        return [[[[term(*tc_keys[k][:2], MB[m], sp, rc, *tc_keys[k][2:]) if use[k, m] else None for rc in RC]
                  for sp in SP] for m in range(len(MB))] for k in range(len(tc_keys))]
    comp = grid(lambda tp, cp, mb, sp, rc, e, et: compute_terms(ctx, tp, cp, mb, sp, rc, e, et))
    C = _qt([[[[0.0 if c is None else _busy_s(c) for c in r] for r in s] for s in m] for m in comp])
    BK = _qt([[[[0.0 if c is None else c.backward_s for c in r] for r in s] for s in m] for m in comp])
    C_M = BK_M = None
    if mixed_kinds(ctx.model):  # the MoE layers' part (the stage's mix of the two: Tables.stages)
        moe_comp = grid(lambda tp, cp, mb, sp, rc, e, et: compute_terms(ctx, tp, cp, mb, sp, rc, e, et, True))
        C_M = _qt([[[[0.0 if c is None else _busy_s(c) for c in r] for r in s] for s in m] for m in moe_comp])
        BK_M = _qt([[[[0.0 if c is None else c.backward_s for c in r] for r in s] for s in m] for m in moe_comp])
    def windows(kind):
        w = np.zeros((len(tc_keys), len(MB), len(SP), len(RC), len(TO), len(EO), 2))
        for k, m in cells:
            if use[k, m]:
                tp, cp, e, et = tc_keys[k]
                w[k, m] = [[kind_windows_over(ctx, tp, cp, MB[m], sp, rc, e, et, [to and tp > 1 for to in TO],
                                              [eo and e > 1 for eo in EO], kind) for rc in RC] for sp in SP]
        return w
    BWD_M = FW_M = None
    if C_M is None:
        both = windows(None)
    else:  # each kind's windows, the stage's share of each (Tables.stages)
        moe = windows(True)
        both = windows(False) + moe
        BWD_M, FW_M = _qt(moe[..., 0, 0]), _qt(moe[..., 1])
    BWD, FW = _qt(both[..., 0, 0]), _qt(both[..., 1])  # the per-step window does not depend on EP overlap
    # EP overlap's window (cost.terms.ep_overlap_window_s); none where Megatron refuses it (full recomputation)
    WE = _qt([[[[[0.0 if c is None or rc == "full" or e == 1 else ep_overlap_window_s(ctx.model, c, to and tp > 1, cp)
                   for to in TO]
                 for c, rc in zip(r, RC)] for r in s] for s in m] for m, (tp, cp, e, _) in zip(comp, tc_keys)])
    return C, C_M, BWD, FW, WE, BWD_M, FW_M, BK, BK_M


def _busy_s(c) -> float:
    """Forward, backward and recompute time of :class:`~cost.terms.ComputeTerms` (the C table)."""
    return c.forward_s + c.backward_s + c.recompute_s


def _activation_tables(ctx: Context, S: Space, ta_keys: list) -> tuple[np.ndarray, ...]:
    """Activation bytes of one dense and one MoE layer, the transient bytes of the largest op, and
    what the logits add to that transient on the last rank (all of them, or under a compiler that
    frees them before any layer is recomputed, what they exceed it by: ``cost.step.working_bytes``)."""
    MB, SP, RC = S.micro_batch_size, S.sequence_parallel, S.recompute
    mem = [[[[activation_terms(ctx, tp, cp, mb, sp, rc) for rc in RC] for sp in SP] for mb in MB] for tp, cp in ta_keys]
    ACT_D, ACT_M, TRANS = (_qb([[[[c[k] for c in r] for r in s] for s in m] for m in mem]) for k in range(3))
    if offloads_activations(S.offload[0]):  # what each layer keeps lives in host memory (cost.step._rank_memory) but for
        kept = ctx.job.profile.profile.offload_layers_kept  # the layers kept on the device, whatever is in flight
        ACT_D, ACT_M = np.zeros_like(ACT_D), np.zeros_like(ACT_M)
        TRANS = _qb([[[[c[2] + kept * max(c[0], c[1]) for c in r] for r in s] for s in m] for m in mem])
    logits = [[head_terms(ctx, tp, cp, mb, False, 1).logits_bytes for mb in MB] for tp, cp in ta_keys]
    LOGITS = _qb([[[[working_bytes(ctx, c[2], logits[t][b]) - c[2] for c in r] for r in s] for b, s in enumerate(m)]
                  for t, m in enumerate(mem)])
    return ACT_D, ACT_M, TRANS, LOGITS


def _comm_tables(S: Space, tpc, cpg, epg, tpg):
    """Tensor-, context- and expert-parallel communication per layer, and the head's time, per group;
    each of ``tpc``, ``cpg``, ``epg`` and ``tpg`` is (keys, their contexts, (key, mb) in use): a
    term is priced where in use, 0 elsewhere (``_time_tables``)."""
    MB, SP, RC, TO = S.micro_batch_size, S.sequence_parallel, S.recompute, S.tp_overlap
    (tpc_keys, tpc_ctx, tpc_use), (cpg_keys, cpg_ctx, cpg_use), (epg_keys, epg_ctx, epg_use), (tpg_keys, tpg_ctx,
                                                                                                 tpg_use) = tpc, cpg, epg, tpg
    unused = [0.0] * len(TO)

    def tp_comm(kind):
        return [[[[tp_comm_over(c, tp, cp, mb, sp, rc, st, TO, moe_tp, e, et, kind) if u else unused
                   for rc in RC] for sp in SP] for mb, u in zip(MB, used)]
                for (tp, cp, st, _, moe_tp, e, et), c, used in zip(tpc_keys, tpc_ctx, tpc_use)]
    TPC_M = None
    if tpc_ctx and mixed_kinds(tpc_ctx[0].model):  # each kind's TP traffic hides behind its own GEMMs
        moe = np.array(tp_comm(True), dtype=float)
        TPC, TPC_M = _qt(np.array(tp_comm(False), dtype=float) + moe), _qt(moe)
    else:
        TPC = _qt(tp_comm(None))
    CPC = _qt([[[_cp_comm_s(c, tp, cp, mb, sp, st, S.cp_comm) if u else 0.0 for sp in SP] for mb, u in zip(MB, used)]
               for (tp, cp, st, _), c, used in zip(cpg_keys, cpg_ctx, cpg_use)])
    # Invalid (ep, tp, dp) combinations have no group (masked by ok_fe) and cost 0 here.
    ep_ranks = [_ranks(c, group) for (_, _, _, _, group), c in zip(epg_keys, epg_ctx)]
    EPC = np.array([[[[dispatcher_choice(c, tp, cp, e, mb, sp, rc, ranks, etp_dispatchers(c.job, S.moe_dispatcher, tp, et))[1]
                       if ranks and u else 0.0
                       for rc in RC] for sp in SP] for mb, u in zip(MB, used)]
                    for (tp, cp, e, et, _), c, ranks, used in zip(epg_keys, epg_ctx, ep_ranks, epg_use)],
                   dtype=float).reshape(len(epg_keys), len(MB), len(SP), len(RC))  # seconds: build_tables quantizes
    # a key (tp, cp, stride, (devices, hidden)): hidden, the head hides in a pipeline's spare slot
    H = _qt([[[0.0 if hidden or not u else head_terms(c, tp, cp, mb, sp, st).time_s for sp in SP]
              for mb, u in zip(MB, used)] for (tp, cp, st, (_, hidden)), c, used in zip(tpg_keys, tpg_ctx, tpg_use)])
    return TPC, TPC_M, CPC, EPC, H


def _comm_part(S: Space, part: int, picked: list, use: np.ndarray) -> tuple:
    """:func:`_comm_tables` of one group (0 TP, 1 CP, 2 EP, 3 head) for (key, context) pairs ``picked``."""
    groups = [([], [], np.zeros((0, len(S.micro_batch_size)), bool))] * 4
    groups[part] = ([k for k, _ in picked], [c for _, c in picked], use)
    TPC, TPC_M, CPC, EPC, H = _comm_tables(S, *groups)
    return ((TPC, TPC_M), (CPC,), (EPC,), (H,))[part]


def _cp_comm_s(ctx: Context, tp: int, cp: int, mb: int, sp: bool, stride: int, kinds: tuple[str, ...]) -> float:
    """The context-parallel traffic of the fastest kind of ``kinds`` (the ring alone: as priced before
    the kinds); 0 where none splits the heads (``masks.masks`` refuses those cells)."""
    if kinds == ("p2p",):
        return cp_comm_terms(ctx, tp, cp, mb, sp, stride)
    best = cp_comm_choice(ctx, tp, cp, mb, sp, stride, kinds)
    return 0.0 if best is None else best[1]


def _capacity(ctx: Context, memory_headroom: float, ignore_memory: bool) -> int:
    """Device memory in quanta: the allocated peak and the runtime (in ``STATIC``) must fit
    (Evaluation.fits: cached blocks are released first)."""
    if ignore_memory:
        return 2**50
    return int(math.floor(ctx.cluster.device.memory_bytes * (1 - memory_headroom) / MEMORY_QUANTUM_BYTES))


MAX_TERM_S = 1e9  # about 30 years per step: any term beyond it comes from input no real cluster has


def _qt(values) -> np.ndarray:
    """Times in integer quanta; a term that is not finite or beyond ``MAX_TERM_S`` is bad input (a
    bandwidth or a size near zero or infinity), refused rather than wrapped round in 64 bits."""
    arr = np.asarray(values, dtype=float)
    if arr.size and not (np.isfinite(arr).all() and arr.max() <= MAX_TERM_S):
        raise SpecError(f"the inputs give a step-time term of {arr.max():.3g} s (or a non-finite one); allowed: up to "
                        f"{MAX_TERM_S:g} s: check the cluster's bandwidths and the model's sizes for extreme values")
    return np.rint(arr / TIME_QUANTUM_S).astype(np.int64)


def _qb(values) -> np.ndarray:
    return np.ceil(np.asarray(values, dtype=float) / MEMORY_QUANTUM_BYTES).astype(np.int64)


def _dp_tables(ctx: Context, S: Space, valid: np.ndarray, times: bool = True) -> tuple[np.ndarray, ...]:
    """Data-parallel traffic (per step, per micro-batch, ZeRO-3's third gathers under full
    recomputation, never overlapped, FSDP2's copies per micro-batch), optimizer step and static memory over (f, o, v, e, z), for the
    factorizations some layout of which passes the structural rules (``valid``; the others' rows
    stay 0: every layout of theirs is refused before memory); ``times=False``: the static memory
    alone (the time tables stay 0). Each (f, v, e, z) cell is priced at the parameter-gather dtype
    :func:`~planner.search.gathers.gather_pick` takes per order; the last array is True over (f, o, v, e, z) where that is
    fp8 among two offered (``Tables.PG``), None where the space holds one dtype."""
    F, O, V, E, Z = len(S.factorizations), len(S.order), len(S.vp), len(S.ep), len(S.zero_stage)
    dps, dpm, rg, dpx, dpc = (np.zeros((F, O, V, E, Z)) for _ in range(5))
    fp8 = np.zeros((F, O, V, E, Z), bool)
    opt, acc = np.zeros((F, V, E, Z)), np.zeros((3, F, V, E, Z))  # acc: Tables.GA, GAW, GA1
    static = {rank: np.zeros((F, V, E, Z)) for rank in RANKS}
    gfree = {rank: np.zeros((F, V, E, Z)) for rank in RANKS}
    step = {rank: np.zeros((F, V, E, Z)) for rank in RANKS}
    L, offered, compared = ctx.model.num_layers, len(S.param_gather) > 1, compared_gathers(ctx, S)
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        for ei, (e, et) in enumerate(zip(S.ep, S.expert_tp)):
            if not valid[i] or expert_ok(ctx.model, tp, dp, cp, e, et, ctx.job.profile) is not None:
                continue
            # the traffic is priced for the time tables, and for the choice of the gathers' dtype
            profiles = [dp_profiles(ctx, tp, pp, dp, cp, e, o, et) if (times or len(compared) > 1) and dp * cp > 1
                        else (None, None) for o in S.order]
            # Orders whose groups get the same fabric profiles (torus traversals, often) share the
            # traffic: ``first[oi]`` is the first order with oi's profiles.
            seen: dict = {}
            first = [seen.setdefault((d, x, x is d), oi) for oi, (d, x) in enumerate(profiles)]
            # the runtime outside the allocator (CUDA context, NCCL buffers) depends on the groups only
            runtime = runtime_bytes(ctx, Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=e, expert_tp=et))
            hs = S.head_slots[0] and pp > 1
            shards = [priced_shard(ctx, S, (tp, pp, dp, cp), e, zi) for zi in range(len(S.zero_stage))]  # not by vp
            for vi, v in enumerate(S.vp):
                if not chunks_fit(L, pp, v, hs):
                    continue
                pc, cells = param_counts(ctx.model, tp, pp, v, e, et, hs), {}  # cells: per (stage, Layout.dp_shard)
                for zi, (z, n) in enumerate(zip(S.zero_stage, shards)):  # a hybrid entry without a group is its stage's
                    if (z, n) not in cells:
                        base = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=e, vp=v, zero_stage=z, expert_tp=et, head_slots=hs,
                                      param_gather=(compared if z >= 1 else S.param_gather)[0], dp_shard=n, offload=S.offload[0])
                        cells[z, n] = dp_cell(ctx, S, pc, base, compared, (profiles, first, runtime), times)
                    opt[i, vi, ei, zi], acc[:, i, vi, ei, zi], (picks, held, terms) = cells[z, n]
                    fp8[i, :, vi, ei, zi] = [g == "fp8" for g in picks]
                    for rank in RANKS:
                        static[rank][i, vi, ei, zi], gfree[rank][i, vi, ei, zi], step[rank][i, vi, ei, zi] = held[rank]
                    for oi, t in enumerate(terms if times else ()):
                        if t is not None:
                            dps[i, oi, vi, ei, zi], dpm[i, oi, vi, ei, zi], rg[i, oi, vi, ei, zi], \
                                dpx[i, oi, vi, ei, zi], dpc[i, oi, vi, ei, zi] = t
    statics = {rank: (_qb(static[rank]), _qb(static[rank] - gfree[rank]), _qb(step[rank])) for rank in RANKS}
    return _qt(dps), _qt(dpm), _qt(rg), _qt(dpx), _qt(dpc), _qt(opt), tuple(_qt(acc)), statics, (fp8 if offered else None)


def full_recompute(S: Space) -> np.ndarray:
    """1 where the recompute knob is full recomputation (ZeRO-3's third gathers, ``RG``), else 0."""
    return np.array([r == "full" for r in S.recompute], dtype=np.int64)


def _count_tables(ctx: Context, S: Space) -> tuple[np.ndarray, ...]:
    """Over (f, mb, v): micro-batch slots x stage share (U), the same times EP overlap's steady
    share (UG), micro-batches (M), stage share (FRAC), and with dense and MoE layers both the
    candidate slowest stages (``Tables.stages``, else None)."""
    F, MB, V = len(S.factorizations), len(S.micro_batch_size), len(S.vp)
    U, UG = (np.zeros((F, MB, V), np.int64) for _ in range(2))
    M, FRAC = np.zeros((F, MB), np.int64), np.zeros((F, V), np.int64)
    mixed = mixed_kinds(ctx.model)
    stages = [StageCandidate(*(np.zeros((F, MB, V), np.int64) for _ in range(3)), np.zeros((F, V), np.int64),
                             np.zeros((F, V), np.int64)) for _ in range(2)] if mixed else None
    L, B, hs = ctx.model.num_layers, ctx.job.global_batch_size, S.head_slots[0]
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        period = [period_layers(ctx, pp, v, hs)[0] for v in S.vp]
        # each candidate stage's (dense, MoE) share per vp, asked once (not per micro-batch size)
        kinds = [stage_kind_shares(ctx, pp, v, hs) if mixed else () for v in S.vp]
        kinds = [[shares[min(k, len(shares) - 1)] for k in range(len(stages or ()))] for shares in kinds]
        for vi, v in enumerate(S.vp):
            FRAC[i, vi] = round(SLOT_QUANTUM * period[vi] / L)
            for stage, (wd, wm) in zip(stages or (), kinds[vi]):
                stage.fd[i, vi], stage.fm[i, vi] = round(SLOT_QUANTUM * wd), round(SLOT_QUANTUM * wm)
        for j, mb in enumerate(S.micro_batch_size):
            M[i, j] = m = max(1, B // (dp * mb))
            for vi, v in enumerate(S.vp):
                slots = SLOT_QUANTUM * (m + (pp - 1) / v) * period[vi] / L
                U[i, j, vi] = round(slots)
                group = ctx.job.microbatch_group(m, pp, v)
                steady = ep_overlap_steady_share(pp, v, m, "none", group)
                UG[i, j, vi] = round(slots * steady)
                for stage, (wd, wm) in zip(stages or (), kinds[vi]):
                    whole = SLOT_QUANTUM * (m + (pp - 1) / v)
                    stage.ud[i, j, vi], stage.um[i, j, vi] = round(whole * wd), round(whole * wm)
                    stage.ugm[i, j, vi] = round(whole * wm * steady)
    return U, UG, FRAC, M, (tuple(stages) if mixed else None)


def _zero_bubble_slots(ctx: Context, S: Space, stages: tuple | None) -> np.ndarray | None:
    """``Tables.ZU`` over (f, mb, v): where the search runs zero bubble (``space.cell_schedule``), the
    slots its bubble loses per unit of the stage's backward, ``(pp - 1) / vp`` times the stage's share
    of the layers (``cost.terms.bubble_s``: ``(pp - 1) / vp * (t - 2 W)``, ``W`` half the backward;
    ``t`` holds the backward, so it never clamps); with dense and MoE layers both, each candidate
    stage's per kind (``StageCandidate.zd``, ``zm``). None where no layout runs it."""
    F, MB, V = len(S.factorizations), len(S.micro_batch_size), len(S.vp)
    cells = [(i, vi) for i, f in enumerate(S.factorizations) for vi, v in enumerate(S.vp) if cell_schedule(S, f[1], v)]
    if not cells:
        return None
    L, hs = ctx.model.num_layers, S.head_slots[0]
    ZU = np.zeros((F, MB, V), np.int64)
    for stage in stages or ():
        stage.zd, stage.zm = np.zeros((F, MB, V), np.int64), np.zeros((F, MB, V), np.int64)
    for i, vi in cells:
        pp, v = S.factorizations[i][1], S.vp[vi]
        ZU[i, :, vi] = round(SLOT_QUANTUM * (pp - 1) / v * period_layers(ctx, pp, v, hs)[0] / L)
        shares = stage_kind_shares(ctx, pp, v, hs) if stages else ()
        for k, stage in enumerate(stages or ()):
            wd, wm = shares[min(k, len(shares) - 1)]
            stage.zd[i, :, vi], stage.zm[i, :, vi] = round(SLOT_QUANTUM * (pp - 1) / v * wd), round(SLOT_QUANTUM * (pp - 1) / v * wm)
    return ZU


def memory_rows(ctx: Context, S: Space, statics: dict, M: np.ndarray) -> tuple[MemoryRow, ...]:
    """The memory rows every layout must satisfy: per pipeline rank of ``cost.stages.RANKS`` and
    per moment of its steady state (``cost.stages.inflight``: one or two), its static memory
    (``statics``, from ``_dp_tables``) and its layers in flight by kind over (f, mb, v). A row that
    another row bounds everywhere (rank 1 of a dense model without head slots, a repeated moment)
    is left out: it can never bind."""
    F, MB, V = len(S.factorizations), len(S.micro_batch_size), len(S.vp)
    L, hs = ctx.model.num_layers, S.head_slots[0]
    flight = {(rank, k): (np.zeros((F, MB, V), np.int64), np.zeros((F, MB, V), np.int64))
              for rank in RANKS for k in range(2)}
    cells: dict = {}  # (pp, v, m) -> the (dense, moe) layers in flight per (rank, moment): factorizations share them
    seen: dict = {}  # (pp, dp) -> its first factorization: m is the batch over dp x mbs, so the rows are alike
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        for j, mb in enumerate(S.micro_batch_size if seen.setdefault((pp, dp), i) == i else ()):
            for vi, v in enumerate(S.vp):
                m = int(M[i, j])
                if not chunks_fit(L, pp, v, hs):
                    continue
                if (pp, v, m) not in cells:
                    cells[pp, v, m] = _flight_cell(ctx, pp, v, m, hs)
                for key, (d, e) in cells[pp, v, m].items():
                    flight[key][0][i, j, vi], flight[key][1][i, j, vi] = d, e
    index = [seen[f[1], f[2]] for f in S.factorizations]
    rows = [MemoryRow(f"{rank}/{k}", *statics[rank], *(a[index] for a in flight[rank, k]), rank == "last")
            for rank in RANKS for k in range(2)]
    return tuple(r for n, r in enumerate(rows) if not any(_bounds(o, r) and (not _bounds(r, o) or n > m)
                                                          for m, o in enumerate(rows) if m != n))


def _flight_cell(ctx: Context, pp: int, v: int, m: int, hs: bool) -> dict:
    """The (dense, MoE) layers in flight per (rank of ``RANKS``, moment 0 or 1) at (pp, vp, m)."""
    group, out = ctx.job.microbatch_group(m, pp, v), {}
    for rank in RANKS:
        held = rank if rank_index(pp, rank) is not None else "first"
        moments = rank_inflight(ctx.model, pp, v, m, group, hs, held).moments
        for k in range(2):
            out[rank, k] = moments[min(k, len(moments) - 1)]
    return out


def _bounds(a: MemoryRow, b: MemoryRow) -> bool:
    """Row ``a`` is at least row ``b`` for every layout (so ``b`` never binds where ``a`` holds)."""
    return ((a.logits or not b.logits) and bool((a.static >= b.static).all()) and bool((a.static1 >= b.static1).all())
            and bool((a.step >= b.step).all()) and bool((a.ifd >= b.ifd).all()) and bool((a.ifm >= b.ifm).all()))


def _ranks(ctx: Context, group) -> tuple[int, ...]:
    """The ranks of an expert-group key's devices (keys hold devices on a torus, ranks elsewhere)."""
    return ctx.cluster.ranks(group) if group and ctx.cluster.rank_to_device is not None else tuple(group)


def layout_from_indices(space: Space, idx: dict, ctx: Context | None = None,
                        fp8_gathers: np.ndarray | None = None) -> Layout:
    """Build the :class:`Layout` for a dict of knob indices (keys as in ``planner.search.cpsat``), with
    the pipeline schedule (``space.cell_schedule``), the context-parallel kind the tables priced for it
    (``ctx``: the search's context) and the parameter-gather dtype they priced it with (``fp8_gathers``:
    the tables' ``PG``, needed where the space offers both dtypes)."""
    S = space
    if len(S.param_gather) > 1 and fp8_gathers is None:
        raise ValueError("the space offers two parameter-gather dtypes: pass the tables' choice (Tables.PG)")
    lay = _layout_of_indices(S, idx)
    lay = lay.with_(schedule=cell_schedule(S, lay.pp, lay.vp))
    lay = searched_choices(S, lay, ctx)  # the graph scope and the MoE dispatcher the tables priced
    if fp8_gathers is not None and fp8_gathers[idx["f"], idx["o"], idx["v"], idx["e"], idx["z"]]:
        lay = lay.with_(param_gather="fp8")
    if ctx is None or lay.cp == 1 or S.cp_comm == ("p2p",):
        return lay
    best = cp_comm_choice(ctx.placed(lay.order), lay.tp, lay.cp, lay.micro_batch_size, lay.sequence_parallel,
                          lay.stride("cp"), S.cp_comm)
    return lay.with_(cp_comm=best[0]) if best else lay


def _layout_of_indices(S: Space, idx: dict) -> Layout:
    return layout_of(S.factorizations[idx["f"]], S.ep[idx["e"]], S.vp[idx["v"]], S.micro_batch_size[idx["mb"]],
                     S.sequence_parallel[idx["s"]], S.recompute[idx["r"]], S.zero_stage[idx["z"]],
                     S.order[idx["o"]], S.dp_overlap[idx["do"]], S.tp_overlap[idx["to"]], S.expert_tp[idx["e"]],
                     S.ep_overlap[idx.get("eo", 0)], S.head_slots[0], S.offload[0], S.moe_dispatcher[0],
                     S.param_gather[0], layout_shard(S, S.factorizations[idx["f"]], S.ep[idx["e"]], idx["z"]))
