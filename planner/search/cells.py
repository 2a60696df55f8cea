"""The search's table of an additive term of the step, priced cell by cell from the term's function.

``cost.assembly.STEP_TERMS`` declares each additive term once: the function of ``cost.terms`` giving
its seconds for a layout, and the knobs its table runs over (``StepTerm.dims``, the factorization
first). A term that no builder of ``planner.search.tables`` prices with shared work
(``StepTerm.priced_by`` empty) is tabulated here, one layout per cell: the factorization's and
order's layout of ``tables._time_tables`` (the knobs outside the dims at theirs) with the cell's
knobs and the space's fixed ones. A cell is priced only where some layout can take it (its
factorization at that micro-batch size, a valid expert layout, chunks that fit the layers): the
others stay 0 and every layout with them is refused by the masks.
"""

from __future__ import annotations

from itertools import product

import numpy as np

from clusterplan.cost.assembly import STEP_TERMS, StepTerm
from clusterplan.cost.terms import Context, chunks_fit
from clusterplan.cost.layout import Layout
from clusterplan.planner.search.space import Space, expert_ok

KNOB_FIELDS = {"v": "vp", "mb": "micro_batch_size", "s": "sequence_parallel", "r": "recompute", "z": "zero_stage",
               "do": "dp_overlap", "to": "tp_overlap", "eo": "ep_overlap"}
"""A knob of ``exhaustive.DIMS`` (but the factorization, the order and the expert layout): the
``Space`` attribute of its choices, and the ``Layout`` field it sets (the same name)."""


def cell_table(ctx: Context, S: Space, term: StepTerm, use: np.ndarray, probe: list[list[Layout]]) -> np.ndarray:
    """``term``'s seconds over its dims (floats: ``tables`` quantizes them); ``use`` (f, mb): the
    micro-batch sizes some layout of each factorization can take; ``probe`` (f, o): a layout per
    factorization and order."""
    dims = term.dims
    if dims[0] != "f" or len(set(dims)) != len(dims):
        raise ValueError(f"StepTerm {term.name}: dims {dims} must start with 'f' and name each knob once")
    out = np.zeros([len(S.factorizations)] + [len(_choices(ctx, S, d, (1, 1, 1, 1))) for d in dims[1:]])
    rest = [d for d in dims[1:] if d != "o"]
    at = dims.index("o") - 1 if "o" in dims else len(rest)  # the order's place among the other knobs
    for f, (tp, pp, dp, cp) in enumerate(S.factorizations):
        if not use[f].any():
            continue
        cells = []  # (the knobs' indices, the layout fields they set) of the cells some layout takes
        for cell in product(*(_choices(ctx, S, d, (tp, pp, dp, cp)) for d in rest)):
            knobs = dict(zip(rest, (k for k, _ in cell)))
            if None not in knobs.values() and ("mb" not in knobs or use[f, knobs["mb"]]):
                cells.append((tuple(knobs.values()), {k: v for _, change in cell for k, v in change.items()}))
        fixed = dict(head_slots=S.head_slots[0] and pp > 1, offload=S.offload[0], moe_dispatcher=S.moe_dispatcher[0],
                     param_gather=S.param_gather[0], dp_shard=S.dp_shard[0])  # the space's fixed knobs
        for o in range(len(S.order)) if "o" in dims else (0,):
            base = probe[f][o]
            differs = {k: v for k, v in fixed.items() if getattr(base, k) != v}
            base = base.with_(**differs) if differs else base
            for index, changes in cells:
                place = (f, *index[:at], o, *index[at:]) if "o" in dims else (f, *index)
                out[place] = term.seconds(ctx, base.with_(**changes) if changes else base)
    return out


def _choices(ctx: Context, S: Space, dim: str, f: tuple[int, int, int, int]) -> list[tuple[int | None, dict]]:
    """Per index of knob ``dim``: (the index, or None where factorization ``f`` cannot take it; the
    layout fields it sets)."""
    tp, pp, dp, cp = f
    if dim == "o":
        return [(k, {}) for k in range(len(S.order))]
    if dim == "e":
        return [(k if expert_ok(ctx.model, tp, dp, cp, e, et, ctx.job.profile) is None else None,
                 dict(ep=e, expert_tp=et)) for k, (e, et) in enumerate(zip(S.ep, S.expert_tp))]
    if dim == "v":
        return [(k if chunks_fit(ctx.model.num_layers, pp, v, S.head_slots[0] and pp > 1) else None, dict(vp=v))
                for k, v in enumerate(S.vp)]
    return [(k, {KNOB_FIELDS[dim]: value}) for k, value in enumerate(getattr(S, KNOB_FIELDS[dim]))]


class AddedTables:
    """What ``tables.Tables`` reads its ``added`` tables through: as attributes, ``T.P2P`` as ``T.H``."""

    def __getattr__(self, name: str):
        if name in self.__dict__.get("added", ()):
            return self.__dict__["added"][name]
        raise AttributeError(name)


def cell_rows(t: dict, i: int, j: int) -> tuple[bytes, ...]:
    """The rows at factorization ``i`` and order ``j`` of the tables priced here that run over the
    order (``tables._traversal_representatives``: a traversal whose every row equals another's counts
    once); a cell its factorization does not take is 0 on every order."""
    return tuple(t[x.table][i][(slice(None),) * (x.dims.index("o") - 1) + (j,)].tobytes() for x in STEP_TERMS
                 if not x.priced_by and "o" in x.dims)
