"""Brute force over the same integer tables as CP-SAT, with numpy, one factorization at a time.

It exists to check the CP-SAT model (tests assert both find the same optimum and the same
rejection counts) and as ``--search exhaustive``. Axes of the broadcast arrays, in order:
``f, o, e, v, mb, s, r, z, do, to, eo`` (factorization, order, ep, vp, micro-batch, sequence
parallel, recompute, ZeRO stage, DP overlap, TP overlap, EP overlap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from clusterplan.cost.assembly import (
    STEP_TERMS, IntegerOps, StepTerm, ep_hidden as hidden_per_slot, exposed_traffic, mix, pipeline, slowest_step, stage_share,
)
from clusterplan.planner.search.masks import REASON_ORDER
from clusterplan.planner.search.reuse import fewer_collections
from clusterplan.planner.search.tables import SHARE_PARTS, SLOT_QUANTUM, Tables, full_recompute

DIMS = ("f", "o", "e", "v", "mb", "s", "r", "z", "do", "to", "eo")


def _place(arr: np.ndarray, dims: tuple[str, ...]) -> np.ndarray:
    """Reshape ``arr`` whose axes are ``dims`` (in DIMS order) for broadcasting over DIMS."""
    order, at = _placement(dims)
    if order is not None:
        arr = arr.transpose(order)
    shape = [1] * len(DIMS)
    for k, pos in enumerate(at):
        shape[pos] = arr.shape[k]
    return arr.reshape(shape)


@lru_cache(maxsize=256)
def _placement(dims: tuple[str, ...]) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """The axis order that sorts ``dims`` as DIMS does (None where they are sorted already), and the
    DIMS position of each sorted axis (asked hundreds of thousands of times by a batch sweep's warm
    starts: computed once per ``dims``)."""
    order = tuple(sorted(range(len(dims)), key=lambda k: DIMS.index(dims[k])))
    return (None if order == tuple(range(len(dims))) else order), tuple(DIMS.index(dims[k]) for k in order)


@dataclass
class Scored:
    """Objective and reason code of every layout of one factorization ``f``."""

    objective: np.ndarray  # int64, units TIME_QUANTUM_S / SLOT_QUANTUM
    code: np.ndarray  # -1 feasible, else index into REASON_ORDER
    memory: np.ndarray  # peak memory, MEMORY_QUANTUM_BYTES (ties on the objective go to the least)
    canon: np.ndarray  # bool: representative layouts (others are symmetric duplicates)


def layer_time(T: Tables, sl: slice) -> np.ndarray:
    """Per-micro-batch layer time ``X = C + TPC + CPC + EPC`` of the factorizations in ``sl``."""
    tc, tpc, cpg, epg = T.tc_of_fe[sl], T.tpc_of_foe[sl], T.cpg_of_fo[sl], T.epg_of_foe[sl]
    return (_place(T.C[tc], ("f", "e", "mb", "s", "r")) + _place(T.TPC[tpc], ("f", "o", "e", "mb", "s", "r", "to"))
            + _place(T.CPC[cpg], ("f", "o", "mb", "s")) + _place(T.EPC[epg], ("f", "o", "e", "mb", "s", "r")))


def ep_hidden(T: Tables, sl: slice) -> np.ndarray:
    """Per micro-batch slot, the all-to-all time EP overlap hides: what the kernels' SM share leaves
    of the open all-to-alls, at most the window; 0 with it off."""
    on = _place(np.array(T.space.ep_overlap, np.int64), ("eo",))
    return on * hidden_per_slot(_ops(T), _place(T.EPC[T.epg_of_foe[sl]], ("f", "o", "e", "mb", "s", "r")),
                                _place(T.WE[T.tc_of_fe[sl]], ("f", "e", "mb", "s", "r", "to")))


def _ops(T: Tables) -> IntegerOps:
    """How the tables' integers take the overlap shares (``cost.assembly.IntegerOps``)."""
    return IntegerOps(T.dp_share, T.ep_share, SHARE_PARTS)


def pipeline_term(T: Tables, sl: slice) -> np.ndarray:
    """The pipeline's time over a step (objective units): ``U * X`` less what EP overlap saves; with
    dense and MoE layers both, the slower of the candidate stages' (``stage_pipelines``) plus the
    context-parallel traffic, the same per layer of either kind. A lower bound of the pipeline and
    data-parallel terms together (``score_factorization``)."""
    if T.stages is None:
        return pipeline(_place(T.U[sl], ("f", "mb", "v")) * layer_time(T, sl), _place(T.UG[sl], ("f", "mb", "v")),
                        ep_hidden(T, sl), zero_bubble_saving(T, sl))
    best = None
    for stage in stage_pipelines(T, sl):
        best = stage if best is None else np.maximum(best, stage)
    return best + context_term(T, sl)


def zero_bubble_saving(T: Tables, sl: slice) -> np.ndarray | int:
    """What zero bubble takes off the bubble where the search runs it (``Tables.ZU``): its slots
    times the backward compute of one micro-batch; 0 where no layout runs it."""
    if T.ZU is None:
        return 0
    return _place(T.ZU[sl], ("f", "mb", "v")) * _place(T.BK[T.tc_of_fe[sl]], ("f", "e", "mb", "s", "r"))


def context_term(T: Tables, sl: slice) -> np.ndarray:
    """``U * CPC``: the context-parallel ring over a step, the same per layer of either kind."""
    return _place(T.U[sl], ("f", "mb", "v")) * _place(T.CPC[T.cpg_of_fo[sl]], ("f", "o", "mb", "s"))


def stage_pipelines(T: Tables, sl: slice) -> list[np.ndarray]:
    """Per candidate stage (``Tables.stages``): its slots on the dense layers' time and on the MoE
    layers' (all-to-alls included), less what EP overlap saves on its MoE slots; the context ring
    apart (``context_term``)."""
    tc, tpc = T.tc_of_fe[sl], T.tpc_of_foe[sl]
    dims, tp_dims = ("f", "e", "mb", "s", "r"), ("f", "o", "e", "mb", "s", "r", "to")
    compute, moe_compute = _place(T.C[tc], dims), _place(T.C_M[tc], dims)
    tp, moe_tp = _place(T.TPC[tpc], tp_dims), _place(T.TPC_M[tpc], tp_dims)
    dense = compute - moe_compute + tp - moe_tp
    moe = moe_compute + moe_tp + _place(T.EPC[T.epg_of_foe[sl]], ("f", "o", "e", "mb", "s", "r"))
    hidden = ep_hidden(T, sl)
    fmv, dims = ("f", "mb", "v"), ("f", "e", "mb", "s", "r")
    bk, bk_m = (0, 0) if T.ZU is None else (_place(T.BK[tc], dims), _place(T.BK_M[tc], dims))

    def zero_bubble(c):  # each kind's backward times the stage's slots of it that zero bubble saves
        return 0 if T.ZU is None else mix(_place(c.zd[sl], fmv), bk - bk_m, _place(c.zm[sl], fmv), bk_m)
    return [pipeline(mix(_place(c.ud[sl], fmv), dense, _place(c.um[sl], fmv), moe), _place(c.ugm[sl], fmv), hidden,
                     zero_bubble(c)) for c in T.stages]


def _pipeline_and_dp(T: Tables, sl: slice, dps: np.ndarray, dpm: np.ndarray) -> np.ndarray:
    """The pipeline and the exposed data-parallel traffic over a step (objective units): per step
    ``dps`` beyond what the last micro-batch's backward hides (less its own ZeRO-2/3 traffic), per
    micro-batch ``dpm`` beyond the compute's window. With dense and MoE layers both, the larger over
    the candidate stages of their pipeline with their own windows (each kind's window times the
    stage's share of it), as ``cost.step.time_breakdown`` (both through ``cost.assembly``).

    Summed per DP overlap setting rather than over it: with the overlap off the traffic is the same
    for every stage (the larger of the stages' pipelines plus it), with it on each stage's windows
    hide some (``cost.assembly.slowest_step``); the integers are those of the sum over both settings, in
    a third of the array passes (half the time of a score of DeepSeek-V3 on 576 GB200)."""
    tc = T.tc_of_fe[sl]
    M, FRAC = _place(T.M[sl], ("f", "mb")), _place(T.FRAC[sl], ("f", "v"))
    window_dims = ("f", "e", "mb", "s", "r", "to")
    bwd, fw = _place(T.BWD[tc], window_dims), _place(T.FW[tc], window_dims + ("eo",))
    if T.stages is None:
        stages = [(pipeline_term(T, sl), lambda: (stage_share(FRAC, bwd), stage_share(FRAC, fw)))]
    else:
        bwd_m, fw_m = _place(T.BWD_M[tc], window_dims), _place(T.FW_M[tc], window_dims + ("eo",))

        def windows(c):  # each kind's window is the whole less the MoE layers' part
            fd, fm = _place(c.fd[sl], ("f", "v")), _place(c.fm[sl], ("f", "v"))
            return mix(fd, bwd - bwd_m, fm, bwd_m), mix(fd, fw - fw_m, fm, fw_m)
        stages = [(pipe, lambda c=c: windows(c)) for c, pipe in zip(T.stages, stage_pipelines(T, sl))]
    settings, ops = T.space.dp_overlap, _ops(T)
    on = slowest_step(ops, stages, dps, dpm, M, overlap=True) if True in settings else None
    off = slowest_step(ops, stages, dps, dpm, M, overlap=False) if False in settings else None
    if on is None or off is None:
        out = off if on is None else on
    else:
        out = np.where(_place(np.array(settings), ("do",)), on, off)
    return out if T.stages is None else out + context_term(T, sl)


def score_factorization(T: Tables, i: int | slice, with_objective: bool = True) -> Scored:
    """Objective, rejection code and canonical mask for every layout with factorization ``i`` (or
    the factorizations of a slice, along the first axis)."""
    sl = i if isinstance(i, slice) else slice(i, i + 1)
    tc = T.tc_of_fe[sl]
    code, memory = _codes_and_memory(T, sl, tc)
    canon = _canon(T, sl)
    if not with_objective:
        return Scored(np.zeros(1, np.int64), code, memory, canon)
    if T.memory_only:
        raise ValueError("memory-only tables (build_tables(memory_only=True)) have no time terms to score")
    Q = SLOT_QUANTUM
    M = _place(T.M[sl], ("f", "mb"))
    step, per_mb, busy_step, busy_mb = added_terms(T, sl)
    dims5 = ("f", "o", "v", "e", "z")
    dps, dpm = _place(T.DPS[sl], dims5) * Q, per_microbatch_traffic(T, sl) * Q
    accumulation = Q * grad_accumulation_term(T, sl)
    objective = _pipeline_and_dp(T, sl, dps, dpm) + Q * M * per_mb + Q * step + accumulation
    if T.busy_weight:  # energy: waiting power over the step plus the extra power while computing
        compute = _place(T.C[tc], ("f", "e", "mb", "s", "r"))
        busy = M * _place(T.BF[sl], ("f",)) * compute + Q * M * busy_mb + Q * busy_step + accumulation
        objective = T.time_weight * objective + T.busy_weight * busy
    elif T.time_weight != 1:
        objective = T.time_weight * objective
    return Scored(objective, code, memory, canon)


def term_cells(T: Tables, term: StepTerm, sl: slice) -> np.ndarray:
    """An additive term's table (``cost.assembly.StepTerm``) over the factorizations in ``sl``, placed
    on DIMS; a table over a group key's rows read through its index map (``tpg_of_fo``: over (f, o))."""
    table, dims = getattr(T, term.table), term.dims
    if dims[0] in DIMS:
        return _place(table[sl], dims)
    return _place(table[getattr(T, dims[0])[sl]], tuple(dims[0].split("_of_")[1]) + dims[1:])


def added_terms(T: Tables, sl: slice) -> tuple:
    """The additive terms of the step (``cost.assembly.STEP_TERMS``) over the factorizations in
    ``sl``: those paid once a step, those paid per micro-batch, and the same two of the terms in the
    energy objective's busy time (``StepTerm.busy``; 0 where none, or the objective is not energy)."""
    sums = [0, 0, 0, 0]  # per step, per micro-batch, busy per step, busy per micro-batch
    for term in STEP_TERMS:
        cells = term_cells(T, term, sl)
        for k in (int(term.per_microbatch),) + ((2 + term.per_microbatch,) if term.busy and T.busy_weight else ()):
            sums[k] = cells if isinstance(sums[k], int) else sums[k] + cells
    return tuple(sums)


def _canon(T: Tables, sl: slice) -> np.ndarray:
    """The representative layouts of the factorizations in ``sl`` (``Scored.canon``)."""
    return (_place(T.canon[sl], ("f", "e", "s", "z", "o", "do", "to")) & _place(T.eo_canon, ("e", "eo"))
            & _place(T.eo_ok[sl], ("f", "v", "r", "eo")))


def grad_accumulation_term(T: Tables, sl: slice) -> np.ndarray:
    """The step's gradient accumulation over (f, mb, v, e, z) (``cost.terms.grad_accumulation_adds``):
    one add per micro-batch (``GA``), less the first where it is taken as it comes (``GAW``) and the
    only one where a one-micro-batch step adds nothing (``GA1``)."""
    if not T.GA[sl].any():  # the framework fuses it (Megatron-Core): no array to add
        return 0
    dims, M = ("f", "v", "e", "z"), _place(T.M[sl], ("f", "mb"))
    return M * _place(T.GA[sl], dims) - _place(T.GAW[sl], dims) - (M == 1) * _place(T.GA1[sl], dims)


def _canon_weight(T: Tables, sl: slice) -> np.ndarray:
    """:func:`_canon` summed over the overlap knobs (do, to, eo), keeping them as axes of one: the
    factorization's rules and symmetries over (do, to) times the EP overlap's over eo, neither of
    which reads the other's knobs (the rejection counts of DeepSeek-V3 on 576 GB200 built the
    whole mask 355 times for this)."""
    dp_tp = _place(T.canon[sl], ("f", "e", "s", "z", "o", "do", "to")).sum(axis=(DIMS.index("do"), DIMS.index("to")),
                                                                        keepdims=True)
    ep = (_place(T.eo_canon, ("e", "eo")) & _place(T.eo_ok[sl], ("f", "v", "r", "eo"))).sum(axis=DIMS.index("eo"),
                                                                                        keepdims=True)
    return dp_tp * ep


def per_microbatch_traffic(T: Tables, sl: slice) -> np.ndarray:
    """Per-micro-batch ZeRO-2/3 traffic over (f, o, v, e, z, r): ``DPM``, plus ZeRO-3's third
    gathers (``RG``) where the recompute knob is full."""
    dims5 = ("f", "o", "v", "e", "z")
    return _place(T.DPM[sl], dims5) + _place(T.RG[sl], dims5) * _place(full_recompute(T.space), ("r",))


def overlapped(T: Tables, traffic: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Exposed data-parallel traffic with overlap on, in objective units (``cost.assembly.exposed_traffic``
    with the tables' quanta): the last bucket, the compute slowed by the SMs the NCCL kernels take, or
    what the window cannot hide."""
    return exposed_traffic(_ops(T), traffic, window)


def _codes_and_memory(T: Tables, sl: slice, tc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reason code per layout (the first failing rule in REASON_ORDER, memory last) and peak memory
    (MEMORY_QUANTUM_BYTES) of every layout of the factorizations in ``sl``."""
    peak = peak_memory(T, sl)
    code = np.where(peak > T.capacity, REASON_ORDER.index("memory"), -1)
    for table, dims in ((T.ok_fes[sl], ("f", "e", "s")), (T.ok_fo[sl], ("f", "o")), (T.ok_foe[sl], ("f", "o", "e")),
                        (T.ok_fe[sl], ("f", "e")),
                        (T.ok_fmbv[sl], ("f", "mb", "v")), (T.ok_f[sl], ("f",))):
        placed = _place(table, dims)
        code = np.where(placed >= 0, placed, code)
    return code, peak


def frees_gradients(T: Tables, sl: slice = slice(None)) -> bool:
    """Whether some layout of the factorizations in ``sl`` holds fewer gradients at a one-micro-batch
    step's activation peak than at backward's end (``MemoryRow.static1``), on some rank."""
    return any(row.frees_gradients(sl) for row in T.rows)


def peak_memory(T: Tables, sl: slice = slice(None)) -> np.ndarray:
    """Peak memory (MEMORY_QUANTUM_BYTES) over (f, e, v, mb, s, r, z), placed on DIMS: the highest of
    the memory rows (``planner.search.tables.memory_rows``: each pipeline rank that can bind, at each
    moment of its steady state, with its static memory and its layers in flight by kind; the last
    rank with the logits), backward's end (every gradient, one layer's transient) and the optimizer
    step where the framework copies the gradient partition there (``MemoryRow.step``). A
    one-micro-batch step holds no gradient at its activation peak where the framework frees them
    between steps (``cost.terms.grads_freed_bytes``)."""
    ta = T.ta_of_f[sl]
    trans = _place(T.TRANS[ta], ("f", "mb", "s", "r"))
    acts = [(_place(table[ta], ("f", "mb", "s", "r")), kind) for table, kind in ((T.ACT_D, "ifd"), (T.ACT_M, "ifm"))
            if table.any()]
    one = _place(T.M[sl], ("f", "mb")) == 1
    peaks = []
    for row in T.rows:
        full = _place(row.static[sl], ("f", "v", "e", "z"))
        freed = row.frees_gradients(sl)
        peak = (np.where(one, _place(row.static1[sl], ("f", "v", "e", "z")), full) if freed else full) + trans
        for act, kind in acts:
            peak = peak + act * _place(getattr(row, kind)[sl], ("f", "mb", "v"))
        if row.logits:
            peak = peak + _place(T.LOGITS[ta], ("f", "mb", "s", "r"))
        peak = np.maximum(peak, full + trans) if freed else peak
        # the optimizer step, where it copies the gradient partition (no activation, no transient)
        peaks.append(np.maximum(peak, _place(row.step[sl], ("f", "v", "e", "z"))) if row.copies_gradients(sl) else peak)
    out = peaks[0]
    for peak in peaks[1:]:
        out = np.maximum(out, peak)
    return out


def smallest_memory(T: Tables) -> tuple[int, dict] | None:
    """The structurally valid layout the framework runs (``Scored.canon``: its combination rules
    and the symmetries) that needs the least memory: ``(MiB, indices)``, or None."""
    best = None
    mem_code = REASON_ORDER.index("memory")
    for i in _blocks(T, valid_only=True):  # blocks of factorizations, as solve_exhaustive scores them
        sc = score_factorization(T, i, with_objective=False)
        shape = np.broadcast_shapes(sc.code.shape, sc.memory.shape, sc.canon.shape)
        code, mem = np.broadcast_to(sc.code, shape), np.broadcast_to(sc.memory, shape)
        valid = ((code < 0) | (code == mem_code)) & np.broadcast_to(sc.canon, shape)
        if not valid.any():
            continue
        k = int(np.argmin(np.where(valid, mem, np.iinfo(np.int64).max)))
        value = int(mem.ravel()[k])
        if best is None or value < best[0]:
            idx = np.unravel_index(k, shape)
            best = (value, dict(zip(DIMS[:len(shape)], (i.start + int(idx[0]),) + tuple(int(x) for x in idx[1:]))))
    return best


BLOCK_ELEMENTS = 1 << 18  # layouts scored per numpy block: big enough to amortise Python, small in memory


def _blocks(T: Tables, valid_only: bool = False) -> list[slice]:
    """Slices of factorizations, each scoring about BLOCK_ELEMENTS layouts at once. ``valid_only``:
    only runs of factorizations that some layout can pass the structural rules with (``ok_f``, a
    valid (micro-batch, vp) and expert layout), for questions about valid layouts alone; on large
    device counts most factorizations fail them (27 of 1,114 for DeepSeek-V3 on 960 TPU v5p)."""
    S = T.space
    per_f = max(1, S.size // max(1, len(S.factorizations)))
    step = max(1, BLOCK_ELEMENTS // per_f)
    n = len(S.factorizations)
    if not valid_only:
        return [slice(a, min(n, a + step)) for a in range(0, n, step)]
    keep = valid_factorizations(T)
    out: list[slice] = []
    for f in np.flatnonzero(keep):
        f = int(f)
        if out and f - out[-1].start < step:  # across invalid ones (their layouts all fail the rules)
            out[-1] = slice(out[-1].start, f + 1)
        else:
            out.append(slice(f, f + 1))
    return out


def valid_factorizations(T: Tables) -> np.ndarray:
    """(f,): whether some layout of the factorization can pass the structural rules."""
    return (T.ok_f < 0) & (T.ok_fmbv < 0).any(axis=(1, 2)) & (T.ok_fe < 0).any(axis=1)


def any_feasible(T: Tables) -> bool:
    """Whether some layout passes every rule and fits (``count_rejections``' test, stopping at the
    first block that has one)."""
    for i in _blocks(T, valid_only=True):
        sc = score_factorization(T, i, with_objective=False)
        shape = np.broadcast_shapes(sc.code.shape, sc.canon.shape)
        if (np.broadcast_to(sc.code, shape) < 0)[np.broadcast_to(sc.canon, shape)].any():
            return True
    return False


@fewer_collections()
def count_rejections(T: Tables) -> tuple[dict[str, int], int]:
    """Rejected layouts by first failing reason, and the number of feasible layouts.

    Symmetric duplicates (``planner.search.space.canonical``) are counted once.
    """
    counts = np.zeros(len(REASON_ORDER) + 1, np.int64)
    copies = None
    for i in _blocks(T):
        weight = _canon_weight(T, i)
        if (T.ok_f[i] >= 0).all():  # every layout has the factorization's own code, whatever its memory
            if copies is None:  # the cells of a code row over each of the weight's (as the broadcast below)
                one = (1,) + weight.shape[1:]
                copies = math.prod(np.broadcast_shapes(_codes_and_memory(T, slice(0, 1), T.tc_of_fe[:1])[0].shape,
                                                       one)) // math.prod(one)
            np.add.at(counts, T.ok_f[i] + 1, weight.reshape(weight.shape[0], -1).sum(axis=1) * copies)
            continue
        code = _codes_and_memory(T, i, T.tc_of_fe[i])[0]
        code = np.broadcast_to(code, np.broadcast_shapes(code.shape, weight.shape))
        w = np.broadcast_to(weight, code.shape)
        counts += np.bincount((code + 1).ravel(), weights=w.ravel(), minlength=len(counts)).astype(np.int64)
    return {r: int(counts[k + 1]) for k, r in enumerate(REASON_ORDER) if counts[k + 1]}, int(counts[0])


@fewer_collections()
def solve_exhaustive(T: Tables, top_k: int = 0, floor: np.ndarray | None = None) -> tuple[list[tuple[int, dict]], int]:
    """The ``top_k + 1`` best feasible layouts as ``(objective, indices)``, and layouts scored (those
    of the factorizations that pass the structural rules with some micro-batch, vp and expert layout).

    ``floor`` (f,): no feasible layout of a factorization has a lower objective (the warm starts pass
    ``bounds.objective_lower_bound``'s). The blocks are then scored least floor first and a block
    whose floor is above the ``top_k + 1``-th best found so far is skipped: none of its layouts could
    be among the best, so the answer is the same (the count, of the blocks scored alone)."""
    best: list[tuple[int, tuple]] = []
    considered, valid = 0, valid_factorizations(T)
    blocks = _blocks(T, valid_only=True)  # a factorization no layout of which passes the rules holds none
    if floor is not None:
        blocks.sort(key=lambda i: floor[i].min())
    for i in blocks:
        if floor is not None and len(best) > top_k and floor[i].min() > sorted(best)[top_k][0]:
            continue
        sc = score_factorization(T, i)
        shape = np.broadcast_shapes(sc.objective.shape, sc.code.shape, sc.canon.shape, sc.memory.shape)
        obj = np.broadcast_to(sc.objective, shape)
        mem = np.broadcast_to(sc.memory, shape)
        ok = np.broadcast_to(sc.code, shape) < 0
        ok &= np.broadcast_to(sc.canon, shape)
        # the mask's layouts times the cells each stands for along the axes it lacks (micro-batch)
        considered += int(sc.canon[valid[i]].sum()) * (math.prod(shape[1:]) // math.prod(sc.canon.shape[1:]))
        flat = np.flatnonzero(ok)
        if flat.size == 0:
            continue
        # the feasible layouts' figures read once (the ravel of a broadcast copies the whole block)
        obj_ok, mem_ok = obj.ravel()[flat], mem.ravel()[flat]
        for j in np.lexsort((mem_ok, obj_ok))[: top_k + 1]:
            idx = np.unravel_index(flat[j], shape)
            best.append((int(obj_ok[j]), int(mem_ok[j]), (i.start + int(idx[0]),) + tuple(int(x) for x in idx[1:])))
    best.sort()
    return [(o, dict(zip(DIMS, idx))) for o, _, idx in best[: top_k + 1]], considered


def _cut(arr: np.ndarray, dims: tuple, keep: dict) -> np.ndarray:
    """``arr`` with its knob axes ``dims`` cut to the indices in ``keep``: a view where they run in
    steps of one (a warm start's descent cuts every table to one index per knob, 8,600 times in a
    200-point batch sweep), else a copy."""
    return _cutter(keep)(arr, dims)


def _cutter(keep: dict):
    """:func:`_cut` for one ``keep``, the index for each tuple of knob axes worked out once (a
    restriction cuts about 45 tables over about 20 such tuples)."""
    plans: dict = {}

    def cut(arr: np.ndarray, dims: tuple) -> np.ndarray:
        if dims not in plans:
            index, taken = [], []
            for ax, d in enumerate(dims):
                at = keep.get(d)
                if at is not None and len(at) and (len(at) == 1 or list(at) == list(range(at[0], at[0] + len(at)))):
                    index.append(slice(at[0], at[0] + len(at)))
                else:
                    index.append(slice(None))
                    if at is not None:
                        taken.append((ax, at))
            plans[dims] = (tuple(index), taken)
        index, taken = plans[dims]
        arr = arr[index]
        for ax, at in taken:
            arr = np.take(arr, at, axis=ax)
        return arr
    return cut


@dataclass
class RestrictedTables:
    """A view of :class:`Tables` with some knob axes cut to chosen indices (for warm starts)."""

    tables: Tables
    keep: dict

    def unrestrict(self, idx: dict) -> dict:
        return {k: (self.keep[k][v] if k in self.keep else v) for k, v in idx.items()}


def restrict(T: Tables, keep: dict) -> Tables:
    """A copy of ``T`` whose knob axes in ``keep`` (e.g. ``{"o": [0]}``) hold only those indices.

    Returns a Tables-like object with ``unrestrict`` mapping its indices back to ``T``'s.
    """
    import copy

    axes = {  # table attribute -> its knob axes (only knob axes that can be cut are listed)
        "tc_of_fe": ("f", "e"), "TPC": (None, "mb", "s", "r", "to"), "CPC": (None, "mb", "s"),
        "EPC": (None, "mb", "s", "r"), "WE": (None, "mb", "s", "r", "to"), "UG": ("f", "mb", "v"),
        "C": (None, "mb", "s", "r"), "BWD": (None, "mb", "s", "r", "to"), "FW": (None, "mb", "s", "r", "to", "eo"),
        "DPS": ("f", "o", "v", "e", "z"), "DPM": ("f", "o", "v", "e", "z"), "RG": ("f", "o", "v", "e", "z"),
        "tpc_of_foe": ("f", "o", "e"), "GA": ("f", "v", "e", "z"), "GAW": ("f", "v", "e", "z"), "GA1": ("f", "v", "e", "z"),
        "ACT_D": (None, "mb", "s", "r"), "ACT_M": (None, "mb", "s", "r"), "TRANS": (None, "mb", "s", "r"),
        "LOGITS": (None, "mb", "s", "r"), "U": ("f", "mb", "v"), "FRAC": ("f", "v"), "BF": ("f",), "M": ("f", "mb"),
        "tpg_of_fo": ("f", "o"), "cpg_of_fo": ("f", "o"), "epg_of_foe": ("f", "o", "e"), "ok_fmbv": ("f", "mb", "v"),
        "ok_fe": ("f", "e"), "ok_foe": ("f", "o", "e"), "ok_fes": ("f", "e", "s"), "ok_fo": ("f", "o"),
        "canon": ("f", "e", "s", "z", "o", "do", "to"), "eo_canon": ("e", "eo"), "eo_ok": ("f", "v", "r", "eo"),
        # the additive terms' tables (a group key's rows are not cut: None)
        **{t.table: tuple(d if d in DIMS else None for d in t.dims) for t in STEP_TERMS},
    }
    space_attr = {"o": "order", "e": "ep", "v": "vp", "mb": "micro_batch_size", "s": "sequence_parallel",
                  "r": "recompute", "z": "zero_stage", "do": "dp_overlap", "to": "tp_overlap", "eo": "ep_overlap"}
    sub, cut = copy.copy(T), _cutter(keep)
    sub.__dict__.pop("_derived", None)  # values derived from T's full axes (planner.search.bounds.once)
    for name, dims in axes.items():
        setattr(sub, name, cut(getattr(T, name), dims))
    row_axes = {"static": ("f", "v", "e", "z"), "static1": ("f", "v", "e", "z"), "step": ("f", "v", "e", "z"),
                "ifd": ("f", "mb", "v"), "ifm": ("f", "mb", "v")}
    sub.rows = tuple(replace(row, **{name: cut(getattr(row, name), dims) for name, dims in row_axes.items()})
                     for row in T.rows)
    for name, dims in (("C_M", (None, "mb", "s", "r")), ("TPC_M", (None, "mb", "s", "r", "to")),
                       ("BWD_M", (None, "mb", "s", "r", "to")), ("FW_M", (None, "mb", "s", "r", "to", "eo")),
                       ("PG", ("f", "o", "v", "e", "z"))):
        if getattr(T, name) is not None:
            setattr(sub, name, cut(getattr(T, name), dims))
    for name, dims in (("BK", (None, "mb", "s", "r")), ("BK_M", (None, "mb", "s", "r")), ("ZU", ("f", "mb", "v"))):
        if getattr(T, name) is not None:
            setattr(sub, name, cut(getattr(T, name), dims))
    if T.stages is not None:
        zero = (("zd", ("f", "mb", "v")), ("zm", ("f", "mb", "v"))) if T.ZU is not None else ()
        sub.stages = tuple(replace(c, **{k: cut(getattr(c, k), dims) for k, dims in (
            ("ud", ("f", "mb", "v")), ("um", ("f", "mb", "v")), ("ugm", ("f", "mb", "v")), ("fd", ("f", "v")),
            ("fm", ("f", "v")), *zero)}) for c in T.stages)
    changes = {space_attr[k]: tuple(getattr(T.space, space_attr[k])[i] for i in v) for k, v in keep.items()}
    for k, paired in (("e", "expert_tp"), ("z", "zero_shard")):  # axes of pairs: (ep, expert_tp), (stage, shard group)
        changes.update({paired: tuple(getattr(T.space, paired)[i] for i in keep[k])} if k in keep and getattr(T.space, paired) else {})
    sub.space = replace(T.space, **changes)
    sub.unrestrict = RestrictedTables(T, keep).unrestrict
    return sub
