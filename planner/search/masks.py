"""Which layouts the rules allow, as arrays over the search space's axes: each rule's rejection
code per (f, ...) cell (``REASON_ORDER``, -1 where it passes), the canonical representatives of
symmetric layouts, and the combinations a framework refuses (outside the space, not counted as
rejected). ``planner.search.tables`` builds them once per search; both engines read them.
"""

from __future__ import annotations

import numpy as np

from clusterplan.cost.framework import framework_refusal, refuses_overlap
from clusterplan.cost.checks import dispatcher_etp_problem, head_slot_problem
from clusterplan.cost.layout import Layout
from clusterplan.cost.terms import Context, cp_a2a_size, cp_heads_split
from clusterplan.planner.search.space import (
    Space, _representative, batch_ok, canonical, cell_schedule, expert_ok, factor_ok, folding_ok, placement_ok,
    sequence_parallel_ok,
)

REASON_ORDER = ("heads", "context", "cp_comm", "batch", "layers", "interleave", "experts", "placement",
                "sequence_parallel", "memory")


def masks(ctx: Context, S: Space) -> tuple[np.ndarray, ...]:
    model, job = ctx.model, ctx.job
    code = {r: k for k, r in enumerate(REASON_ORDER)}
    F = len(S.factorizations)
    ok_f = np.full(F, -1)
    ok_fmbv = np.full((F, len(S.micro_batch_size), len(S.vp)), -1)
    ok_fe = np.full((F, len(S.ep)), -1)
    by_pp_dp: dict = {}  # the batch, layer and interleaving rules read pp and dp alone
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        reason = factor_ok(model, job, tp, pp, dp, cp)
        ok_f[i] = -1 if reason is None else code[reason]
        if (pp, dp) in by_pp_dp:
            ok_fmbv[i] = ok_fmbv[by_pp_dp[pp, dp]]
        for j, mb in enumerate(S.micro_batch_size if by_pp_dp.setdefault((pp, dp), i) == i else ()):
            for vi, v in enumerate(S.vp):
                slots = S.head_slots[0]
                reason = batch_ok(model, job, pp, dp, mb, v, slots)
                if reason in (None, "interleave") and slots and head_slot_problem(model, job, pp, v):
                    reason = "layers"  # the split's rule comes before interleaving's (REASON_ORDER)
                reason = reason or ("interleave" if "" not in S.schedule and not cell_schedule(S, pp, v) else None)  # --fix schedule
                ok_fmbv[i, j, vi] = -1 if reason is None else code[reason]
        for ei, (e, et) in enumerate(zip(S.ep, S.expert_tp)):
            reason = expert_ok(model, tp, dp, cp, e, et, ctx.job.profile) or (
                "experts" if e > 1 and all(dispatcher_etp_problem(job, d, tp, et) for d in S.moe_dispatcher) else None)
            ok_fe[i, ei] = -1 if reason is None else code[reason]
    dense = ctx.job.profile.checks_dense_placement()
    ok_foe = np.array([[[-1 if placement_ok(tp, pp, cp, e, et, o, dense) is None else code["placement"]
                         for e, et in zip(S.ep, S.expert_tp)] for o in S.order]
                       for tp, pp, dp, cp in S.factorizations]).reshape(F, len(S.order), len(S.ep))
    ok_fes = np.array([[[_sp_code(code, f, e, et, sp, job.seq_len) for sp in S.sequence_parallel]
                        for e, et in zip(S.ep, S.expert_tp)] for f in S.factorizations]).reshape(
        len(S.factorizations), len(S.ep), len(S.sequence_parallel))
    # (f, o): no rule refuses an order alone. Groups that straddle the scale-up domains unevenly are
    # priced at their slowest group (``topologies.cluster.Cluster.axis_profile``), not refused: on
    # 72-GPU racks they can win (DeepSeek-V3 on 576 GB200: cp=2, dp=32, pp=9, 18% faster than any
    # aligned layout), and where the devices do not fill whole domains no layout is aligned.
    ok_fo = np.full((len(S.factorizations), len(S.order)), -1)
    if S.cp_comm != ("p2p",):  # context parallelism with no kind of the space that splits the heads
        for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
            for j, o in enumerate(S.order if cp > 1 else ()):
                stride = Layout(tp=tp, pp=pp, dp=dp, cp=cp, order=o).stride("cp")
                if not any(cp_heads_split(model, tp, cp_a2a_size(k, cp, stride, ctx.cluster.domain_size))
                           for k in S.cp_comm):
                    ok_fo[i, j] = code["cp_comm"]
    return ok_f, ok_fmbv, ok_fe, ok_foe, ok_fes, ok_fo


def _sp_code(code: dict, f: tuple[int, int, int, int], ep: int, expert_tp: bool, sp: bool, seq_len: int) -> int:
    tp, cp = f[0], f[3]
    reason = sequence_parallel_ok(tp, sp, seq_len, cp) or folding_ok(tp, ep, expert_tp, sp)
    return -1 if reason is None else code[reason]


def order_representatives(S: Space) -> np.ndarray:
    """The order part of ``planner.search.space.canonical`` per (f, o)."""
    return np.array([[_only_order_differs(tp, pp, dp, cp, o, S) for o in S.order]
                     for tp, pp, dp, cp in S.factorizations], dtype=bool).reshape(len(S.factorizations), len(S.order))


def canonical_mask(S: Space, order_ok: np.ndarray, ok_fe: np.ndarray | None = None,
                   allowed: np.ndarray | None = None) -> np.ndarray:
    """``planner.search.space.canonical`` over (f, e, s, z, o, do, to), vectorized (EP overlap's
    part is ``Tables.eo_canon``), within ``allowed`` (the framework's mask, same shape but for o).

    The order part ``order_ok`` is evaluated per (f, o) (``canonical``, then
    ``traversal_duplicates``); the rest are the same rules as ``canonical``, with the
    representatives taken from the space's own domains (a folded layout on a one-rank tp x cp block is
    left out only where the space holds the same ep unfolded: torchtitan 0.3 and ``--fix etp=1`` have
    whole experts alone). With the expert rule's codes ``ok_fe``: on a
    factorization with tp = 1, folded experts (etp=1) and the same ep split over the one-rank tp group
    (etp=tp) carve the expert group from the same cp x dp ranks in the same order (Megatron-Core's
    expert rank generator, torchtitan's expert mesh), so where both pass the expert rule and the
    framework keeps the unfolded one, it stands for both and the folded one is left out.
    """
    facts = np.array(S.factorizations)
    tp1 = facts[:, 0] == 1
    dp1 = facts[:, 2] * facts[:, 3] == 1
    to = np.array(S.tp_overlap, bool) != _representative(S.tp_overlap, False)
    zero = np.array(S.zero_stage) != _representative(S.zero_stage, 0)
    do = np.array(S.dp_overlap, bool) != _representative(S.dp_overlap, True)
    tp_bad = tp1[:, None, None, None, None, None, None] & to[None, None, None, None, None, None, :]
    dp_bad = dp1[:, None, None, None, None, None, None] & (zero[None, None, None, :, None, None, None]
                                                          | do[None, None, None, None, None, :, None])
    block1 = facts[:, 0] * facts[:, 3] == 1  # folding over a one-rank tp x cp block changes nothing
    kept = {e for e, et in zip(S.ep, S.expert_tp) if et}  # where the space holds the unfolded layout
    folded = np.array([not et and e in kept for e, et in zip(S.ep, S.expert_tp)], bool)
    fold_bad = block1[:, None, None, None, None, None, None] & folded[None, :, None, None, None, None, None]
    shape = (len(facts), len(S.ep), len(S.sequence_parallel), len(zero), len(S.order), len(do), len(to))
    canon = np.broadcast_to(order_ok[:, None, None, None, :, None, None], shape) & ~tp_bad & ~dp_bad & ~fold_bad
    if allowed is not None:
        canon = canon & allowed[:, :, :, :, None, :, :]
    if ok_fe is None:
        return canon
    unfolded = {e: j for j, (e, et) in enumerate(zip(S.ep, S.expert_tp)) if et}
    for j, (e, et) in enumerate(zip(S.ep, S.expert_tp)):
        if not et and e > 1 and e in unfolded:
            both = tp1 & (ok_fe[:, j] < 0) & (ok_fe[:, unfolded[e]] < 0)
            canon[both, j] &= ~canon[both, unfolded[e]]
    return canon


def ep_overlap_mask(ctx: Context, S: Space) -> np.ndarray:
    """(f, v, r, eo): False where the framework's rules refuse EP overlap (Megatron: with full
    recomputation, and with pp > 1 without virtual stages; ``ep_overlap_steady_share`` prices those
    as off). Like ``framework_mask``: outside the space, not counted as rejected. Applied in
    validation too: a published run that overlapped its all-to-alls did not recompute everything."""
    prof = ctx.job.profile

    def refused(pp: int, v: int, r: str) -> bool:  # by a rule on EP overlap, the other knobs neutral
        return refuses_overlap(prof, "ep_overlap", 1, pp, 1, 2, v, 1, r, False)
    by_pp = {pp: np.array([[refused(pp, v, r) for r in S.recompute] for v in S.vp], bool).reshape(len(S.vp), -1)
             for pp in {f[1] for f in S.factorizations}}
    no = np.stack([by_pp[f[1]] for f in S.factorizations])  # (F, V, R)
    eo = np.array(S.ep_overlap, bool)
    return ~(no[:, :, :, None] & eo[None, None, None, :])


def framework_mask(ctx: Context, S: Space) -> np.ndarray:
    """(f, e, s, z, do, to): combinations the job's framework can run (``cost.framework.framework_refusal``).
    Layouts it cannot run are outside the space, like knobs it does not have: not counted as rejected.
    EP overlap's rules concern recompute and vp: ``ep_overlap_mask``."""
    shape = (len(S.factorizations), len(S.ep), len(S.sequence_parallel), len(S.zero_stage), len(S.dp_overlap),
             len(S.tp_overlap))
    if not S.framework_rules:
        return np.ones(shape, bool)
    prof = ctx.job.profile
    asked = {key for rule in prof.profile.rules for key, _ in rule.when}
    # an overlap no rule asks about is evaluated once and broadcast (302,080 calls on DeepSeek-V3 otherwise)
    DO = S.dp_overlap if "dp_overlap" in asked else S.dp_overlap[:1]
    TO = S.tp_overlap if "tp_overlap" in asked else S.tp_overlap[:1]
    out = np.empty(shape[:4] + (len(DO), len(TO)), bool)
    # a factorization's answers depend on its degrees only through the rules' thresholds: those
    # alike share one row (1.09 M rule checks on DeepSeek-V3 on 576 GB200 otherwise)
    seen: dict = {}
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        key = _refusal_class(prof, tp, pp, dp, cp)
        if key in seen:
            out[i] = out[seen[key]]
            continue
        seen[key] = i
        for ei, e in enumerate(S.ep):
            for si, sp in enumerate(S.sequence_parallel):
                for zi, z in enumerate(S.zero_stage):
                    for di, do in enumerate(DO):
                        for ti, to in enumerate(TO):
                            out[i, ei, si, zi, di, ti] = framework_refusal(
                                prof, tp, pp, cp, e, 1, z, "none", sp, to, do and dp * cp > 1,
                                data_parallel=dp * cp > 1) is None
    return np.broadcast_to(out, shape)


def _refusal_class(prof, tp: int, pp: int, dp: int, cp: int) -> tuple:
    """What ``framework_refusal`` reads of a factorization's degrees: each against the thresholds
    the profile's rules hold it to (``Rule.refuses``: ``tp_min``, ``pp_min``, ``cp_min``), whether
    tp > 1 (overlap, sequence sharding) and whether there is data parallelism (dp x cp > 1)."""
    degrees = {"tp_min": tp, "pp_min": pp, "cp_min": cp}
    held = tuple((key, degrees[key] >= want) for rule in prof.profile.rules for key, want in rule.when
                 if key in degrees)
    return held, tp > 1, dp * cp > 1


def _only_order_differs(tp: int, pp: int, dp: int, cp: int, order: str, S: Space) -> bool:
    """The order part of ``canonical`` alone (the other knobs at their representatives)."""
    return canonical(tp, pp, dp, cp, 1, False, _representative(S.zero_stage, 0), order,
                     _representative(S.dp_overlap, True), _representative(S.tp_overlap, False), S,
                     ep_overlap=_representative(S.ep_overlap, False))
