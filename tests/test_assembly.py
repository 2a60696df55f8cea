"""The step's assembly (``cost.assembly``) is written once: ``evaluate`` runs it on one layout's floats,
the exhaustive engine on the search's integer tables, and the integers it gives are never cheaper than
the floats."""

from __future__ import annotations

import random

import numpy as np
import pytest

from clusterplan.cost import assembly
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import Context
from clusterplan.models.library import get_model
from clusterplan.planner.search import cpsat, exhaustive
from clusterplan.planner.search.space import build_space, split_spaces
from clusterplan.planner.search.tables import SHARE_PARTS, SLOT_QUANTUM, build_tables
from clusterplan.topologies.library import build_cluster


def test_integer_exposed_traffic_is_the_float_rule_rounded_against_the_plan():
    """Over a seeded sample of traffic, windows and shares, the integer form of each rule is the float
    form in quanta, rounded up where it costs and down where it saves, by less than a quantum."""
    rng = random.Random(39)
    for _ in range(2000):
        dp_parts, ep_parts = rng.randint(0, 300), rng.randint(0, 300)  # shares as the tables hold them
        floats, ints = assembly.ScalarOps(dp_parts / SHARE_PARTS, ep_parts / SHARE_PARTS), assembly.IntegerOps(
            dp_parts, ep_parts, SHARE_PARTS)
        m = rng.randint(1, 64)
        traffic, window, per_mb = (rng.randint(0, 2 * 10**7) * SLOT_QUANTUM for _ in range(3))
        want = assembly.dp_exposed(floats, float(traffic), float(per_mb), float(window), float(window), m)
        got = int(assembly.dp_exposed(ints, *(np.array([x]) for x in (traffic, per_mb, window, window)), m)[0])
        assert want * (1 - 1e-12) <= got <= want * (1 + 1e-12) + m + 2  # each rounding up by less than one unit
        hidden_f = assembly.ep_hidden(floats, float(traffic), float(window))
        hidden_i = int(assembly.ep_hidden(ints, np.array([traffic]), np.array([window]))[0])
        assert hidden_f * (1 - 1e-12) - 1 <= hidden_i <= hidden_f * (1 + 1e-12)  # a saving rounds down
        off = assembly.dp_exposed(floats, 1.0 * traffic, 1.0 * per_mb, 0.0, 0.0, m, overlap=False)
        assert off == m * per_mb + traffic  # without DP overlap all of it


@pytest.fixture(scope="module")
def small_problem():
    model, cluster = get_model("llama3-8b"), build_cluster("hgx-h800", num_devices=64)
    job = Job(global_batch_size=512, seq_len=4096)
    return model, job, cluster


def test_evaluate_and_the_exhaustive_engine_run_the_one_assembly(monkeypatch, small_problem):
    """The exposed data-parallel traffic of every engine comes from ``cost.assembly.exposed_traffic``:
    a change there moves ``evaluate``'s breakdown, the exhaustive engine's objective and the CP-SAT
    model alike."""
    model, job, cluster = small_problem
    seen: list[str] = []
    real = assembly.exposed_traffic

    def spy(ops, traffic, window):
        seen.append(type(ops).__name__)
        return real(ops, traffic, window)
    monkeypatch.setattr(assembly, "exposed_traffic", spy)
    layout = Layout(tp=2, pp=2, dp=16, micro_batch_size=1, dp_overlap=True)
    ev = evaluate(model, job, cluster, layout)
    assert "ScalarOps" in seen and ev.time.dp_comm_s > 0
    ctx = Context(model, job, cluster)
    T = build_tables(ctx, split_spaces(build_space(model, job, cluster), model, job, cluster)[0])
    seen.clear()
    exhaustive.score_factorization(T, slice(0, len(T.space.factorizations)))
    assert seen and set(seen) == {"IntegerOps"}
    seen.clear()
    cpsat._Model(T)  # CP-SAT posts each of the rule's terms as a lower bound of the exposure
    assert seen and set(seen) == {"_LowerBounds"}
