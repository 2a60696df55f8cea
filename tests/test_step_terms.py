"""The step's additive terms are declared once (``cost.assembly.STEP_TERMS``): a new entry, with
nothing else changed, is tabulated over its dims (``planner.search.cells``), added by the exhaustive
engine and by CP-SAT to the objective and by ``evaluate`` to its breakdown (issue 39 item 1)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from clusterplan.cost import assembly
from clusterplan.cost.layout import Job, num_microbatches
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import Context
from clusterplan.models.library import get_model
from clusterplan.planner.search import cpsat, exhaustive, reuse
from clusterplan.planner.search.space import build_space, split_spaces
from clusterplan.planner.search.tables import SLOT_QUANTUM, TIME_QUANTUM_S, build_tables, layout_from_indices
from clusterplan.topologies.library import build_cluster


def _per_mb_s(ctx, layout) -> float:  # depends on the micro-batch size and the ZeRO stage: (f, mb, z)
    return 1e-3 * layout.micro_batch_size + 2e-4 * layout.zero_stage


def _per_step_s(ctx, layout) -> float:  # (f, v, r): the (f, v) pair CP-SAT reads through one variable
    return 3e-3 * layout.vp + (7e-4 if layout.recompute == "full" else 0.0)


EXTRA = (assembly.StepTerm("test_mb", "TEST_MB", "pp_p2p_s", True, ("f", "mb", "z"), _per_mb_s),
         assembly.StepTerm("test_step", "TEST_STEP", "optimizer_s", False, ("f", "v", "r"), _per_step_s, busy=True))


def _problem():
    model, cluster = get_model("llama3-8b"), build_cluster("hgx-h800", num_devices=64)
    job = Job(global_batch_size=512, seq_len=4096, framework="megatron")
    ctx = Context(model, job, cluster)
    space = max(split_spaces(build_space(model, job, cluster), model, job, cluster), key=lambda S: len(S.vp))
    return model, job, cluster, ctx, space


def _with_extra(monkeypatch):
    """Every module's STEP_TERMS with the two test terms appended, and no kept tables (built afresh)."""
    declared = assembly.STEP_TERMS
    for module in list(sys.modules.values()):
        if getattr(module, "STEP_TERMS", None) is declared:
            monkeypatch.setattr(module, "STEP_TERMS", declared + EXTRA)
    monkeypatch.setattr(reuse, "_KEPT", {})


@pytest.fixture(scope="module")
def plain():
    model, job, cluster, ctx, space = _problem()
    reuse._KEPT.clear()
    tables = build_tables(ctx, space), build_tables(ctx, space, weights=(3, 2))
    whole = slice(0, len(space.factorizations))  # the objectives as the declared terms give them
    return (*tables, *(exhaustive.score_factorization(T, whole).objective for T in tables))


def test_a_new_entry_is_tabulated_and_added_by_both_engines(monkeypatch, plain):
    model, job, cluster, ctx, S = _problem()
    _with_extra(monkeypatch)
    T, energy = build_tables(ctx, S), build_tables(ctx, S, weights=(3, 2))
    assert T.TEST_MB.shape == (len(S.factorizations), len(S.micro_batch_size), len(S.zero_stage))
    assert T.TEST_STEP.shape == (len(S.factorizations), len(S.vp), len(S.recompute))
    f = int(np.flatnonzero(exhaustive.valid_factorizations(T))[0])
    mb = int(np.flatnonzero(T.ok_fmbv[f].min(axis=1) < 0)[0])
    assert T.TEST_MB[f, mb, -1] == round(_per_mb_s(ctx, layout_from_indices(
        S, dict(f=f, o=0, e=0, v=0, mb=mb, s=0, r=0, z=len(S.zero_stage) - 1, do=0, to=0, eo=0))) / TIME_QUANTUM_S)
    Q, sl = SLOT_QUANTUM, slice(0, len(S.factorizations))
    M = exhaustive._place(T.M[sl], ("f", "mb"))
    mb_cells = exhaustive._place(T.TEST_MB, ("f", "mb", "z"))
    step_cells = exhaustive._place(T.TEST_STEP, ("f", "v", "r"))
    for new, old, busy in ((T, plain[2], 0), (energy, plain[3], 1)):
        got = exhaustive.score_factorization(new, sl).objective - old
        added = Q * M * mb_cells + Q * step_cells
        want = added if not busy else 3 * added + 2 * Q * step_cells  # only the step term is busy
        assert np.array_equal(*np.broadcast_arrays(got, want))
    best, _ = exhaustive.solve_exhaustive(T)
    assert cpsat.solve_cpsat(T).solutions[0][0] == best[0][0]
    assert cpsat.solve_cpsat(energy).solutions[0][0] == exhaustive.solve_exhaustive(energy)[0][0][0]


def test_a_new_entry_is_added_to_evaluate_breakdown(monkeypatch, plain):
    model, job, cluster, ctx, S = _problem()
    best, _ = exhaustive.solve_exhaustive(plain[0])
    layout = layout_from_indices(S, best[0][1], ctx, plain[0].PG)
    before = evaluate(model, job, cluster, layout)
    _with_extra(monkeypatch)
    after = evaluate(model, job, cluster, layout)
    m = num_microbatches(job, layout)
    assert math.isclose(after.time.pp_p2p_s - before.time.pp_p2p_s, m * _per_mb_s(ctx, layout), rel_tol=1e-9)
    assert math.isclose(after.time.optimizer_s - before.time.optimizer_s, _per_step_s(ctx, layout), rel_tol=1e-9)
    assert after.time.compute_s == before.time.compute_s and after.time.dp_comm_s == before.time.dp_comm_s
