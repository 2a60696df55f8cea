"""What the CP-SAT model starts from, computed on the same tables with numpy: a memory-aware lower
bound of the objective per (f, mb, v) triple and expert degree (each term minimised separately over
the placement and overlap knobs, over only the (sp, recompute, ZeRO) choices whose memory fits),
the least per-micro-batch times per factorization, and warm starts: the best layouts of a small
sub-space of common defaults, improved knob by knob, and the optimum's neighbourhood (its
micro-batch size) for tight runner-up bounds (``planner.search.cpsat``).
"""

from __future__ import annotations

import numpy as np

from clusterplan.cost.assembly import STEP_TERMS, pipeline
from clusterplan.planner.search.exhaustive import (
    BLOCK_ELEMENTS, DIMS, _place, ep_hidden, grad_accumulation_term, layer_time, overlapped, peak_memory, per_microbatch_traffic,
    pipeline_term, restrict, score_factorization, solve_exhaustive, term_cells, zero_bubble_saving,
)
from clusterplan.planner.search.tables import SLOT_QUANTUM, Tables

UNREACHABLE = np.iinfo(np.int64).max // 4  # lower bound of a (triple, ep) with no layout that fits


def once(T: Tables, fn):
    """``fn(T)``, computed once per tables: the model is built twice (optimum, then runners-up)."""
    cache = T.__dict__.setdefault("_derived", {})
    if fn.__name__ not in cache:
        cache[fn.__name__] = fn(T)
    return cache[fn.__name__]


def objective_lower_bound(T: Tables) -> np.ndarray:
    """A lower bound of the objective per (f, mb, v, e); UNREACHABLE where no layout fits.

    Over the knobs left free (sequence parallelism, recomputation, ZeRO stage) only the
    combinations whose memory fits are kept; the order, DP overlap and TP overlap are minimised
    term by term. The minimum of a sum is at least the sum of the minima, so this is a valid cut,
    and it is tight enough that CP-SAT's proof mostly happens at the root (memory is what rules out
    the fastest layouts). Exposed data-parallel traffic is at least its last bucket (ZeRO 0-2, per
    step) or the micro-batch count times its last bucket (ZeRO 3), whatever the overlap window.
    For the energy objective the busy part is bounded by its plain minima.
    """
    S = T.space
    lb = np.full((len(S.factorizations), len(S.ep), len(S.vp), len(S.micro_batch_size)), UNREACHABLE)  # (F, E, V, MB)
    # the model reads the bound at its (f, mb, v) triples alone (cpsat._valid_triples): the other
    # factorizations (two thirds of them on DeepSeek-V3 on 576 GB200) keep UNREACHABLE, unpriced
    need = np.flatnonzero((T.ok_f < 0) & (T.ok_fmbv < 0).any(axis=(1, 2)))
    for rows in _f_blocks(T, need):
        lb[rows] = _lower_bound_block(T, rows)
    lb = np.transpose(lb, (0, 3, 2, 1))  # (F, MB, V, E)
    if T.busy_weight:
        Q = SLOT_QUANTUM
        cmin = _place(T.C[T.tc_of_fe], ("f", "e", "mb", "s", "r")).min(axis=(1, 2, 3, 5, 6, 7, 8, 9, 10))  # (F, MB)
        busy = (T.M * cmin * T.BF[:, None])[:, :, None].repeat(T.U.shape[2], 2)
        for term, cells in _bounded_terms(T, slice(None), busy=True):  # each at its least over the other knobs
            least = np.swapaxes(cells.min(axis=tuple(k for k, d in enumerate(DIMS) if d not in ("f", "mb", "v"))), 1, 2)
            busy = busy + Q * (T.M[:, :, None] * least if term.per_microbatch else least)
        return np.where(lb < UNREACHABLE, T.time_weight * lb + T.busy_weight * busy[:, :, :, None], UNREACHABLE)
    return np.where(lb < UNREACHABLE, T.time_weight * lb, UNREACHABLE)


LB_BLOCK_ELEMENTS = 1 << 19  # (f, e, v, mb, s, r, z) cells per block (o, to, eo instead of z with EP overlap)


def _f_blocks(T: Tables, need: np.ndarray) -> list[np.ndarray]:
    """The factorizations ``need`` (indices) in blocks of about LB_BLOCK_ELEMENTS cells."""
    S = T.space
    per_f = len(S.ep) * len(S.vp) * len(S.micro_batch_size) * len(S.sequence_parallel) * len(S.recompute) * len(S.zero_stage)
    if True in S.ep_overlap:  # the pipeline term is then bounded over orders and overlaps at once
        per_f = len(S.ep) * len(S.vp) * len(S.micro_batch_size) * len(S.sequence_parallel) * len(S.recompute) * max(
            len(S.zero_stage), len(S.order) * len(S.tp_overlap) * len(S.ep_overlap))
    step = max(1, LB_BLOCK_ELEMENTS // max(1, per_f))
    return [need[a:a + step] for a in range(0, len(need), step)]


def _lower_bound_block(T: Tables, sl: slice) -> np.ndarray:
    """:func:`objective_lower_bound`'s time part for the factorizations in ``sl``: (f, e, v, mb)."""
    Q = SLOT_QUANTUM
    axis = {d: k for k, d in enumerate(DIMS)}
    placed = (_place(T.ok_fo[sl], ("f", "o")) < 0) & (_place(T.ok_foe[sl], ("f", "o", "e")) < 0)  # orders allowed

    def min_over_orders(arr: np.ndarray, *more: str) -> np.ndarray:
        arr = np.where(placed, arr, UNREACHABLE)
        return arr.min(axis=(axis["o"], *(axis[d] for d in more)), keepdims=True)

    U, M = _place(T.U[sl], ("f", "mb", "v")), _place(T.M[sl], ("f", "mb"))
    if T.stages is not None:  # the slower of the candidate stages: one order and overlap setting at a time
        pipe = min_over_orders(pipeline_term(T, sl), "to", "eo")
    elif True in T.space.ep_overlap:  # EP overlap's saving belongs to one order and TP overlap: minimise them together
        pipe = min_over_orders(pipeline(U * layer_time(T, sl), _place(T.UG[sl], ("f", "mb", "v")), ep_hidden(T, sl),
                                        zero_bubble_saving(T, sl)), "to", "eo")
    else:
        X = min_over_orders(layer_time(T, sl), "to")
        # zero bubble's saving depends on none of the knobs minimised over: exact beside U * min X
        pipe = np.where(X < UNREACHABLE, pipeline(U * X, 0, 0, zero_bubble_saving(T, sl)), UNREACHABLE)
    added = _bounded_terms(T, sl)
    H = min_over_orders(_total(cells for term, cells in added if term.per_microbatch))
    dims5 = ("f", "o", "v", "e", "z")
    # Exposed traffic with overlap on (never more than with it off): the last bucket, or what the
    # window (this stage's backward, or whole compute for ZeRO-3 gathers) cannot hide.
    # a stage of dense and MoE layers both hides behind its share of each kind's window, at most the
    # whole of both (Tables.stages): the bound takes the whole
    frac = SLOT_QUANTUM if T.stages is not None else _place(T.FRAC[sl], ("f", "v"))
    tc = T.tc_of_fe[sl]
    window_dims = ("f", "e", "mb", "s", "r", "to")
    bwd = _place(T.BWD[tc], window_dims).max(axis=axis["to"], keepdims=True)
    comp = _place(T.FW[tc], window_dims + ("eo",)).max(axis=(axis["to"], axis["eo"]), keepdims=True)
    step_tr = Q * min_over_orders(_place(T.DPS[sl], dims5))
    mb_tr = Q * min_over_orders(per_microbatch_traffic(T, sl))
    dp = overlapped(T, step_tr, frac * bwd) + M * overlapped(T, mb_tr, frac * comp)
    # each at its least over the orders where it runs over them (exact otherwise: no knob minimised)
    opt = Q * _total(min_over_orders(cells) if cells.shape[axis["o"]] > 1 else cells
                     for term, cells in added if not term.per_microbatch)
    opt = opt + Q * grad_accumulation_term(T, sl)
    total = pipe + Q * M * H + dp + opt  # (F, 1, E, V, MB, S, R, Z, 1, 1, 1)
    ok = _memory_fits(T, sl) & (_place(T.ok_fes[sl], ("f", "e", "s")) < 0) & (_place(T.ok_fe[sl], ("f", "e")) < 0)
    ok &= (pipe < UNREACHABLE) & (H < UNREACHABLE)
    total = np.where(ok, total, UNREACHABLE).min(axis=(axis["s"], axis["r"], axis["z"]))
    return total.reshape(total.shape[0], total.shape[2], total.shape[3], total.shape[4])


def _bounded_terms(T: Tables, sl: slice, busy: bool = False) -> list:
    """The additive terms of the step the bounds take (``cost.assembly.STEP_TERMS`` but the sparse
    ones: a bound without a term stays a bound), each with its cells over the factorizations in ``sl``
    placed on DIMS; ``busy``: those in the energy objective's busy time alone."""
    return [(term, term_cells(T, term, sl)) for term in STEP_TERMS if not term.sparse and (term.busy or not busy)]


def _total(arrays) -> np.ndarray | int:
    """The sum of ``arrays`` (0 where none)."""
    out = 0
    for arr in arrays:
        out = arr if isinstance(out, int) else out + arr
    return out


def _memory_fits(T: Tables, sl: slice = slice(None)) -> np.ndarray:
    """Whether the peak memory fits, over (f, e, v, mb, s, r, z) (placed on DIMS)."""
    return peak_memory(T, sl) <= T.capacity


def factor_minima(T: Tables) -> tuple[np.ndarray, np.ndarray]:
    """Per (f, mb): the least layer time X and the least time the additive terms add per micro-batch
    (``_bounded_terms``: the head and the sends) over the other knobs."""
    X = layer_time(T, slice(None))
    H = _total(cells for term, cells in _bounded_terms(T, slice(None)) if term.per_microbatch)
    f_ax, mb_ax = DIMS.index("f"), DIMS.index("mb")

    def reduce(arr: np.ndarray) -> np.ndarray:
        other = tuple(a for a in range(arr.ndim) if a not in (f_ax, mb_ax))
        return arr.min(axis=other).reshape(arr.shape[f_ax], arr.shape[mb_ax])

    return reduce(X), reduce(H)


def floors(T: Tables, keep: dict) -> np.ndarray:
    """(f,): the least objective a feasible layout of each factorization can take with the knobs cut
    to ``keep`` (:func:`restrict`'s): :func:`objective_lower_bound` (what CP-SAT takes as a cut) at
    the micro-batch sizes, vp and expert layouts left, for :func:`solve_exhaustive` to skip blocks by."""
    lb = once(T, objective_lower_bound)  # (F, MB, V, E)
    for axis, knob in ((1, "mb"), (2, "v"), (3, "e")):
        if knob in keep:
            lb = np.take(lb, keep[knob], axis=axis)
    return lb.min(axis=(1, 2, 3))


def warm_start(T: Tables, count: int = 1) -> list[tuple[int, dict]]:
    """Feasible layouts to start from: the best of a small sub-space of common defaults, then the
    best of them improved by coordinate descent.

    The sub-space fixes the knobs practitioners start with (DP overlap on, selective or full
    recomputation, ZeRO-0, 1 or 3); its ``count`` best are upper bounds on the ``count`` best of the
    whole space. The descent then frees one knob at a time (with the factorization) while the
    others stay where they are, as long as that improves the objective. Everything is scored on
    the same integer tables; the result only gives CP-SAT an incumbent and cutoffs.
    """

    S = T.space
    keep = {"do": [S.dp_overlap.index(True)] if True in S.dp_overlap else None,
            "r": [i for i, r in enumerate(S.recompute) if r in ("selective", "full")] or None,
            "z": [i for i, z in enumerate(S.zero_stage) if z in (0, 1, 3)] or None}
    bounds = best_of(T, {k: v for k, v in keep.items() if v}, count)
    if bounds:
        bounds[0] = _descend(T, *bounds[0])
    return bounds


def _descend(T: Tables, value: int, idx: dict, rounds: int = 4) -> tuple[int, dict]:
    """Coordinate descent: free one knob (and the factorization) at a time, keep improvements."""

    knobs = [k for k in DIMS if k != "f"]
    # A sub-space asked before (the same knob freed, the others where they were) gives what it gave
    # then, which ``value`` is no longer above: the next round skips each knob no later one moved.
    asked = set()
    for _ in range(rounds):
        improved = False
        for knob in knobs:
            fixed = {k: [idx[k]] for k in knobs if k != knob}
            if (key := (knob, tuple(v for (v,) in fixed.values()))) in asked:
                continue
            asked.add(key)
            found = best_of(T, fixed, 1, floor=False)  # one value a knob: few blocks, no floor to skip them by
            if found and found[0][0] < value:
                value, idx, improved = found[0][0], found[0][1], True
        if not improved:
            break
    return value, idx


def neighbourhood(T: Tables, idx: dict, count: int) -> list[tuple[int, dict]]:
    """The ``count`` best layouts sharing ``idx``'s micro-batch size and EP overlap.

    Scored on the same tables. Used twice: among layouts tied with the proven optimum, the least
    memory wins (ties come from knobs that change memory but not time: ZeRO 1 against 2, a rank
    order giving the same groups, ...); and the j-th best here bounds the j-th runner-up.
    """

    # a fifth of the space or less: tight runner-up bounds, cheaply (EP overlap changes no memory,
    # so the optimum's own setting keeps its ties)
    return best_of(T, {"mb": [idx["mb"]], "eo": [idx["eo"]]}, count)


def best_of(T: Tables, keep: dict, count: int, floor: bool = True) -> list[tuple[int, dict]]:
    """The ``count`` best feasible layouts of the sub-space ``keep`` leaves (:func:`restrict`'s) as
    ``(objective, indices into T)``, those :func:`solve_exhaustive` finds there. Where the whole space
    is one block (a batch sweep's points: 221,184 layouts) its layouts are scored once per tables
    (:func:`_scored`) and every sub-space the warm starts ask is read from that; else the sub-space is
    solved, its blocks skipped by their :func:`floors` with ``floor``."""
    scored = once(T, _scored)
    if scored is None:
        sub = restrict(T, keep)
        found, _ = solve_exhaustive(sub, count - 1, floors(T, keep) if floor else None)
        return [(value, sub.unrestrict(i)) for value, i in found]
    runs = {d: list(v) == list(range(v[0], v[0] + len(v))) for d, v in keep.items()}  # a run: a view, else a copy
    index = tuple(slice(keep[d][0], keep[d][0] + len(keep[d])) if runs.get(d) else slice(None) for d in DIMS)
    obj, mem, ok = (a[index] for a in scored)
    for axis, d in enumerate(DIMS):
        if d in keep and not runs[d]:
            obj, mem, ok = (np.take(a, keep[d], axis=axis) for a in (obj, mem, ok))
    flat = np.flatnonzero(ok)
    obj_ok, mem_ok = obj.ravel()[flat], mem.ravel()[flat]
    # the count least by (objective, memory, index), as solve_exhaustive ranks them, sorted among
    # the layouts at or below the count-th least objective alone
    near = np.arange(len(flat)) if len(flat) <= count else np.flatnonzero(
        obj_ok <= np.partition(obj_ok, count - 1)[count - 1])
    best = []
    for j in near[np.lexsort((mem_ok[near], obj_ok[near]))][:count]:
        at = np.unravel_index(flat[j], ok.shape)
        best.append((int(obj_ok[j]), {d: int(keep[d][at[a]] if d in keep else at[a]) for a, d in enumerate(DIMS)}))
    return best


SCORED_ELEMENTS = 2 * BLOCK_ELEMENTS
"""The largest space :func:`_scored` scores in one piece: a batch sweep's point of Llama 3 8B on 64 H100
has 331,776 layouts once the ZeRO axis holds the hybrid sharding groups (six entries, not four), and a
few arrays of that many floats are a few MiB."""


def _scored(T: Tables) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every layout's objective, peak memory and whether it is feasible and representative (what
    :func:`solve_exhaustive` ranks), over DIMS, where the space has at most SCORED_ELEMENTS layouts; else None."""
    S = T.space
    shape = (len(S.factorizations), len(S.order), len(S.ep), len(S.vp), len(S.micro_batch_size), len(S.sequence_parallel),
             len(S.recompute), len(S.zero_stage), len(S.dp_overlap), len(S.tp_overlap), len(S.ep_overlap))
    if np.prod(shape) > SCORED_ELEMENTS:
        return None
    sc = score_factorization(T, slice(0, len(S.factorizations)))
    ok = (np.broadcast_to(sc.code, shape) < 0) & np.broadcast_to(sc.canon, shape)
    return np.broadcast_to(sc.objective, shape), np.broadcast_to(sc.memory, shape), ok
