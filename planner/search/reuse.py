"""Tables kept for the next search of the same problem at another global batch (a sweep's points).

The data-parallel and static-memory tables and the time tables do not depend on the global batch:
the batch only decides which of their rows or cells some layout can take (``valid`` over f, ``use``
over (f, mb): the batch rules of ``masks.masks``), and the others stay 0. So each is kept per
problem, keyed by what its values depend on: the :class:`~cost.terms.Context` (equal for jobs that
differ only in the batch; it holds its cluster, so the key's cluster identity stays its own while
kept) and the :class:`~planner.search.space.Space`. A later search prices only the rows or cells no
earlier one did and reads the rest; what it is handed equals what a fresh build would give: the
kept values where it takes them, 0 elsewhere. The compute and communication rows of the time tables
are kept per group too (:func:`kept_keys`): the pipeline splits of one search ask the same groups.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import fields, is_dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np

from clusterplan.cost.assembly import STEP_TERMS

KEPT_TABLES = 64
"""Tables kept (the oldest goes first): a batch sweep has one problem, ten of them (five per pipeline
split); a sweep over sizes a new problem per point, which this bounds."""
_KEPT: dict = {}


def _keep(key: Any, entry: tuple) -> tuple:
    _KEPT.pop(key, None)
    while len(_KEPT) >= KEPT_TABLES:
        _KEPT.pop(next(iter(_KEPT)))
    _KEPT[key] = entry
    return entry


def kept(key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` for a computation that does not depend on the global batch at all (arrays, in
    tuples and dicts): computed once per ``key``, each caller handed its own copy."""
    if key not in _KEPT:
        _keep(key, (compute(),))
    return _tree(np.copy, _KEPT[key][0])


def kept_rows(key: Any, need: np.ndarray, compute: Callable[[np.ndarray], Any]) -> Any:
    """``compute(need)`` for a computation whose rows (the first axis of every array it returns,
    in tuples and dicts; None passes) are priced where ``need`` (over that axis) holds and are 0 (or
    False) elsewhere, each row on its own: the rows kept for ``key`` are read, the missing ones
    priced and kept."""
    done, value = _KEPT.get(key, (np.zeros_like(need), None))
    missing = need & ~done
    if value is None or missing.any():
        fresh = compute(missing)
        value = fresh if value is None else _tree(lambda a, b: a | b if a.dtype == bool else a + b, value, fresh)
        _keep(key, (done | missing, value))
    return _tree(lambda a: np.where(need.reshape(need.shape + (1,) * (a.ndim - 1)), a, np.zeros_like(a)), value)


def kept_cells(key: Any, use: np.ndarray, compute: Callable[[np.ndarray], dict],
               in_use: Callable[[dict, np.ndarray], dict]) -> dict:
    """``compute(use)`` for a computation over cells ``use`` marks (0 elsewhere) whose tables are
    not indexed by the mask's own axes: priced over every cell some search of ``key`` used (again
    where this one uses more), then cut to ``use`` by ``in_use(tables, use)`` (a copy)."""
    done, value = _KEPT.get(key, (None, None))
    if done is None or (use & ~done).any():
        done = use if done is None else done | use
        done, value = _keep(key, (done, compute(done)))
    return in_use(value, use)


def kept_keys(name: Any, keys: list, use: np.ndarray, compute: Callable[[list, np.ndarray], tuple]) -> tuple:
    """``compute(keys, use)`` for a computation whose arrays (a tuple; None passes) are indexed by
    ``keys`` and then by micro-batch size, each entry priced from its key and size alone where
    ``use`` (key, mb) holds and 0 elsewhere: each key's row is kept per ``name`` (the problem and
    the knob domains a row spans) at the sizes some search asked, so a later search with those keys
    (the next pipeline split: the same groups over fewer factorizations; the next batch) prices only
    the keys or sizes no earlier one did."""
    if not keys:
        return compute([], use)
    rows = _KEPT[name][0] if name in _KEPT else {}
    missing = [k for k, key in enumerate(keys) if key not in rows or (use[k] & ~rows[key][0]).any()]
    if missing:
        want = np.array([use[k] | rows[keys[k]][0] if keys[k] in rows else use[k] for k in missing], bool)
        fresh = compute([keys[k] for k in missing], want)
        for j, k in enumerate(missing):
            rows[keys[k]] = (want[j], tuple(None if a is None else a[j] for a in fresh))
    _keep(name, (rows,))
    return tuple(None if parts[0] is None else np.where(use.reshape(use.shape + (1,) * (parts[0].ndim - 1)),
                                                        np.stack(parts), 0)
                 for parts in zip(*(rows[key][1] for key in keys)))


def key_use(index: np.ndarray, count: int, use: np.ndarray) -> np.ndarray:
    """(key, mb): whether some factorization whose ``index`` (over (f, ...)) names the key takes
    the micro-batch size (``use`` over (f, mb))."""
    rows = np.broadcast_to(use.reshape((use.shape[0],) + (1,) * (index.ndim - 1) + (use.shape[1],)),
                           index.shape + (use.shape[1],)).reshape(-1, use.shape[1])
    out = np.zeros((count, use.shape[1]), bool)
    np.logical_or.at(out, index.ravel(), rows)
    return out


def per_pp_dp(S: Any, compute: Callable[[Any], Any]) -> Any:
    """``compute(S)`` for a computation whose rows (the first axis of every array it returns, in
    tuples and dataclasses; None passes) over ``S.factorizations`` depend on pp and dp alone (slots,
    micro-batches and stage shares: ``tables._count_tables``): priced on the first factorization of
    each (pp, dp) and spread to the others (a batch sweep prices them at every point)."""
    firsts: dict = {}
    for f in S.factorizations:
        firsts.setdefault(f[1:3], f)
    at = {key: k for k, key in enumerate(firsts)}
    index = np.array([at[f[1:3]] for f in S.factorizations], np.int64)
    return _tree(lambda a: a[index], compute(replace(S, factorizations=tuple(firsts.values()))))


# the time tables of ``tables._time_tables`` by the index map their first axis is read through
_TIME_GROUPS = {"tc": ("C", "BWD", "FW", "WE", "BK", "C_M", "BWD_M", "FW_M", "BK_M"), "tpc_of_foe": ("TPC", "TPC_M"),
                "cpg_of_fo": ("CPC",), "epg_of_foe": ("EPC",), "tpg_of_fo": ("H",)}


def time_in_use(t: dict, use: np.ndarray, tc_of_fe: np.ndarray) -> dict:
    """The time tables ``t`` (``tables._time_tables``) with every cell no factorization takes at
    its micro-batch size (``use`` over (f, mb)) set to 0, as pricing them at ``use`` alone leaves
    them; ``tc_of_fe`` indexes the compute tables."""
    out = {name: table.copy() if isinstance(table, np.ndarray) else table for name, table in t.items()}
    for index, names in _TIME_GROUPS.items():
        for name in names:
            table = out[name]
            if table is None or not table.size:
                continue
            rows = key_use(tc_of_fe if index == "tc" else out[index], table.shape[0], use)
            table[~rows] = 0
    for term in STEP_TERMS:  # the tables planner.search.cells prices, over (f, ...) at (f, mb) in use
        if not term.priced_by:
            taken = use if "mb" in term.dims else use.any(axis=1)
            shape = [len(use)] + [use.shape[1] if d == "mb" else 1 for d in term.dims[1:]]
            out[term.table] = np.where(taken.reshape(shape), out[term.table], 0)
    return out


def _tree(fn: Callable, *values: Any) -> Any:
    """``fn`` over the arrays of ``values`` (alike tuples, dicts, dataclasses and None)."""
    head = values[0]
    if head is None:
        return None
    if isinstance(head, dict):
        return {k: _tree(fn, *(v[k] for v in values)) for k in head}
    if isinstance(head, tuple):
        return tuple(_tree(fn, *parts) for parts in zip(*values))
    if is_dataclass(head):
        return replace(head, **{f.name: _tree(fn, *(getattr(v, f.name) for v in values)) for f in fields(head)})
    return fn(*values)


GC_FIRST_GENERATION = 100_000
"""Allocations between two collections of the garbage collector's first generation inside
:func:`fewer_collections` (Python's default: 700)."""


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Within the block (or the function it decorates), the cyclic garbage collector runs after
    :data:`GC_FIRST_GENERATION` allocations instead of Python's 700. Tabulating a search's terms and
    solving over them allocate millions of short-lived tuples, lists and floats, freed as they go, and
    every third-generation collection they trigger walks each object alive, the cluster's graph
    included: 0.4 s of the 4.4 s DeepSeek-V3 on 576 GB200 took. The thresholds are restored after;
    what cycles the block leaves are collected then."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_FIRST_GENERATION), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def clear() -> None:
    """Forget every kept table (tests that price one problem twice, from scratch)."""
    _KEPT.clear()
