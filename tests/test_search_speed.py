"""The shortcuts that make the search's tables cheap (issue 39's speed targets): each must give
what the plain computation gives, and must actually take the short way."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from clusterplan.cost import framework
from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context
from clusterplan.models.library import get_model
from clusterplan.planner.search import masks
from clusterplan.planner.search.space import build_space, split_spaces
from clusterplan.topologies.library import build_cluster

FRAMEWORK_CASES = [("megatron", ""), ("megatron", "2024-06"), ("torchtitan", ""), ("deepspeed", ""),
                   ("deepspeed", "2021-06"), ("nanotron", "")]


def _spaces(model: str, cluster: str, devices: int, fw: str, date: str, batch: int = 1024, seq: int = 4096):
    m, c = get_model(model), build_cluster(cluster, num_devices=devices)
    job = Job(global_batch_size=batch, seq_len=seq, framework=fw, framework_date=date)
    ctx = Context(m, job, c)
    return ctx, split_spaces(build_space(m, job, c), m, job, c)


def _framework_mask_plainly(ctx: Context, S) -> np.ndarray:
    """``masks.framework_mask`` as its docstring says: every combination asked of the framework."""
    shape = (len(S.factorizations), len(S.ep), len(S.sequence_parallel), len(S.zero_stage), len(S.dp_overlap),
             len(S.tp_overlap))
    out = np.ones(shape, bool)
    if not S.framework_rules:
        return out
    for (i, (tp, pp, dp, cp)), (ei, e), (si, sp), (zi, z), (di, do), (ti, to) in itertools.product(
            enumerate(S.factorizations), enumerate(S.ep), enumerate(S.sequence_parallel), enumerate(S.zero_stage),
            enumerate(S.dp_overlap), enumerate(S.tp_overlap)):
        out[i, ei, si, zi, di, ti] = framework.framework_refusal(
            ctx.job.profile, tp, pp, cp, e, 1, z, "none", sp, to, do and dp * cp > 1, data_parallel=dp * cp > 1) is None
    return out


@pytest.mark.parametrize("fw, date", FRAMEWORK_CASES)
def test_framework_mask_asks_each_class_of_degrees_once_and_answers_as_every_combination(monkeypatch, fw, date):
    """Factorizations whose degrees meet the profile's rule thresholds alike share their answers, so
    the framework is asked far fewer times than there are factorizations x knobs (DeepSeek-V3 on 576
    GB200: 220,334 refusals asked), and the mask equals asking every combination."""
    ctx, spaces = _spaces("mixtral-8x7b", "gb200-nvl72", 576, fw, date)
    calls = [0]
    real = masks.framework_refusal

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)
    for S in spaces:
        monkeypatch.setattr(masks, "framework_refusal", counted)
        calls[0] = 0
        got = masks.framework_mask(ctx, S)
        monkeypatch.setattr(masks, "framework_refusal", real)
        assert np.array_equal(got, _framework_mask_plainly(ctx, S))
        if S.framework_rules:
            per_factorization = len(S.ep) * len(S.sequence_parallel) * len(S.zero_stage) * len(S.dp_overlap) * len(
                S.tp_overlap)
            assert len(S.factorizations) > 40
            assert calls[0] <= 20 * per_factorization < len(S.factorizations) * per_factorization
