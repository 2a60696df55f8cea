"""The dtype of the parameter all-gathers per cell of the data-parallel tables (``Layout.param_gather``).

Not a search dimension: where the space offers bf16 and fp8 (``Space.param_gather``), each (f, o, v,
e, z) cell of ``planner.search.tables._dp_tables`` is priced at the dtype :func:`gather_pick` takes,
fp8 only where it is no slower and needs no more memory, so the choice is exact; the tables record it
(``Tables.PG``) for the decoded layout.
"""

from __future__ import annotations

from clusterplan.cost.layout import Layout
from clusterplan.cost.stages import RANKS, rank_index
from clusterplan.cost.step import optimizer_step_bytes, static_parts_of
from clusterplan.cost.terms import (Context, dp_terms_of, fp8_gathers_no_slower, grad_accumulation_parts, grads_freed_bytes,
                                    kept_param_bytes, optimizer_s, zero_replicas)
from clusterplan.planner.search.space import Space


def compared_gathers(ctx: Context, S: Space) -> tuple[str, ...]:
    """The dtypes a cell with zero >= 1 is priced at (:func:`gather_pick`): the space's one, or of
    bf16 and fp8 offered, bf16 alone where fp8 keeps more bytes per weight (Megatron's two MXFP8
    copies: more static memory on every rank), fp8 alone where it keeps as many and is never slower
    (``cost.terms.fp8_gathers_no_slower``: Megatron's FP8 with delayed scaling), else both, compared
    cell by cell (torchtitan's float8 gathers: fewer bytes kept, an amax all-reduce a step)."""
    if len(S.param_gather) == 1:
        return S.param_gather
    fp8, bf16 = kept_param_bytes(ctx.job, "fp8"), kept_param_bytes(ctx.job, "bf16")
    if fp8 > bf16:
        return ("bf16",)
    return ("fp8",) if fp8 == bf16 and fp8_gathers_no_slower(ctx.job) else ("bf16", "fp8")


def dp_cell(ctx: Context, S: Space, pc, base: Layout, compared: tuple[str, ...], groups: tuple, times: bool) -> tuple:
    """One (f, v, e, z) cell of ``tables._dp_tables`` at ``base``: its optimizer step and gradient
    accumulation parts (0 without ``times``), and :func:`gather_pick`'s dtypes,
    static memory and traffic per order over ``groups`` (the orders' profiles, first orders, runtime)."""
    gathers = compared if base.zero_stage >= 1 else S.param_gather[:1]
    return (optimizer_s(ctx, base) if times else 0.0,  # the same for either dtype
            grad_accumulation_parts(ctx, base) if times else 0.0, gather_pick(ctx, S, pc, base, gathers, *groups))


def gather_pick(ctx: Context, S: Space, pc, base: Layout, gathers: tuple[str, ...], profiles: list, first: list,
                 runtime: float) -> tuple[list[str], dict, list]:
    """The parameter-gather dtype of one (f, v, e, z) cell per order of ``S.order`` among ``gathers``
    (:func:`compared_gathers`), with the cell's static memory and freed gradients per rank
    (``RANKS``: (static, freed, step)) and its data-parallel terms per order at those dtypes
    (:func:`_dp_order_terms`).

    Of bf16 and fp8, fp8 is taken where it needs no more static memory on any rank (at backward's
    end, at the activation peak and at the optimizer step) and none of the four data-parallel terms is longer: each enters
    the objective through a non-decreasing term (``build_tables``), so the choice is exact for the
    step time, the energy and the fit. The static memory has no order axis: where fp8 needs less
    memory, it is taken in every order or in none (in every one only if it is no slower in each);
    where it needs the same, order by order."""
    lays = {g: base if g == base.param_gather else base.with_(param_gather=g) for g in gathers}
    cells = {g: _static_cell(ctx, lays[g], runtime) for g in gathers}
    if len(gathers) == 1:
        return [gathers[0]] * len(S.order), cells[gathers[0]], _dp_order_terms(ctx, S, pc, lays[gathers[0]],
                                                                                profiles, first)
    (low, high) = (cells["fp8"], cells["bf16"])
    pairs = [(low[r][0], high[r][0]) for r in RANKS] + [(low[r][0] - low[r][1], high[r][0] - high[r][1]) for r in RANKS]
    pairs += [(low[r][2], high[r][2]) for r in RANKS]  # the optimizer step's peak
    t16 = _dp_order_terms(ctx, S, pc, lays["bf16"], profiles, first)
    if any(a > b for a, b in pairs):
        return ["bf16"] * len(S.order), high, t16
    t8 = _dp_order_terms(ctx, S, pc, lays["fp8"], profiles, first)
    faster = [a is None or all(x <= y for x, y in zip(a, b)) for a, b in zip(t8, t16)]
    if any(a < b for a, b in pairs):
        faster = [all(faster)] * len(faster)
    picks = ["fp8" if ok else "bf16" for ok in faster]
    return picks, (low if all(faster) else high), [a if ok else b for ok, a, b in zip(faster, t8, t16)]


def _static_cell(ctx: Context, layout: Layout, runtime: float) -> dict:
    """Per rank of ``RANKS``: ``layout``'s static memory with the runtime, the gradients absent at
    a one-micro-batch step's activation peak, and the optimizer step's peak with the runtime where
    the framework copies the gradient partition there, else 0 (``cost.step.optimizer_step_bytes``; a
    rank the pipeline lacks, rank 1 of two, repeats the first's)."""
    out = {}
    held = tuple(rank if rank_index(layout.pp, rank) is not None else "first" for rank in RANKS)
    for rank, h, parts in zip(RANKS, held, static_parts_of(ctx, layout, held)):  # memory_static_bytes of each
        step = optimizer_step_bytes(ctx, layout, h)
        out[rank] = (sum(parts) + runtime, grads_freed_bytes(ctx, layout, h), step + runtime if step else 0.0)
    return out


def _dp_order_terms(ctx: Context, S: Space, pc, layout: Layout, profiles: list, first: list) -> list:
    """Per order of ``S.order``: ``layout``'s data-parallel terms (per step, per micro-batch, the
    third gathers, blocking, FSDP copies per micro-batch) over the order's groups ``profiles``, or None where it has none; an
    order with the profiles of an earlier one (``first``) and one copy of each shard shares its
    terms."""
    tp, pp, dp, cp, e, z = layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.zero_stage
    out: list = []
    for oi, (dense, expert) in enumerate(profiles):
        if dense is None:
            out.append(None)
        elif first[oi] != oi and zero_replicas(ctx, dp, pp, cp, e, z, False, layout.dp_shard) == 1:
            out.append(out[first[oi]])
        else:
            t = dp_terms_of(ctx, pc, tp, pp, dp, cp, e, S.order[oi], layout.expert_tp, layout.vp, z, (dense, expert),
                            param_gather=layout.param_gather, dp_shard=layout.dp_shard)
            out.append((t.per_step_s, t.per_microbatch_s, t.regather_s, t.blocking_s, t.copy_s))
    return out
