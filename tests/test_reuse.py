"""The tables a sweep over the global batch shares between its points (planner.search.reuse, issue
39): priced once, and handed to each point exactly as a fresh build gives them."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context
from clusterplan.models.library import get_model
from clusterplan.planner.search import reuse, tables
from clusterplan.planner.search.space import build_space, split_spaces
from clusterplan.topologies.library import build_cluster


def _same(a, b) -> bool:
    """Equal values, arrays element by element (with dtype), dataclasses field by field."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):  # Tables.added: the tables priced cell by cell, by name
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("batches", [(512, 1024, 1536, 2048), (64, 192, 320, 512, 128)])
def test_a_batch_sweep_prices_the_batch_free_tables_once_and_alike(monkeypatch, batches):
    """Points that differ only in the batch: the data-parallel and time tables are priced again only
    where a point takes rows or cells no earlier point took (every dp * mbs divides 512: none after
    it), and every table a point is handed equals the one built from scratch."""
    model, cluster = get_model("llama3-8b"), build_cluster("dgx-h100-superpod", num_devices=64)
    priced = Counter()
    for name in ("_dp_tables", "_time_tables"):
        real = getattr(tables, name)
        monkeypatch.setattr(tables, name, lambda *a, _r=real, _n=name, **k: (priced.update([_n]), _r(*a, **k))[1])
    reuse.clear()
    built = []
    for batch in batches:
        job = Job(global_batch_size=batch, seq_len=8192)
        ctx = Context(model, job, cluster)
        for space in split_spaces(build_space(model, job, cluster), model, job, cluster):
            built.append((ctx, space, tables.build_tables(ctx, space, 0.05)))
        if batch == 512:
            priced_at_512 = dict(priced)
        if batch == batches[0]:
            first = len(built)  # one pricing of each per pipeline split
    assert dict(priced) == priced_at_512
    assert batches[0] != 512 or priced_at_512 == {"_dp_tables": first, "_time_tables": first}
    for ctx, space, kept in built:
        reuse.clear()
        assert _same(kept, tables.build_tables(ctx, space, 0.05))
    reuse.clear()


def test_releasing_a_size_search_drops_the_kept_tables():
    """fit walks many sizes and frees each size's terms between them (issue 41's memory); the
    tables kept for batch sweeps hold their Context, hence the whole cluster graph, so they go too."""
    from clusterplan.planner.search import reuse
    from clusterplan.planner.studies.fit import release_size_caches
    reuse.kept(("probe", 1), lambda: (np.zeros(3),))
    assert reuse._KEPT
    release_size_caches()
    assert not reuse._KEPT
