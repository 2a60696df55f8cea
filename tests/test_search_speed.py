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


def test_memoized_collectives_time_each_size_and_group_once_and_alike(monkeypatch):
    """Inside ``collectives.memoized`` a collective asked again with the same sizes and group profile
    is not timed again (the data-parallel tables ask the gradients' reduce-scatter once per ZeRO
    stage) and gives the same seconds; outside it, nothing is kept."""
    from clusterplan.cost import collectives as coll
    from clusterplan.cost.terms import dp_profiles, dp_terms_of, param_counts

    ctx, spaces = _spaces("mixtral-8x7b", "gb200-nvl72", 576, "megatron", "")
    order = spaces[0].order[0]
    profiles = dp_profiles(ctx, 2, 4, 36, 2, 8, order, True)
    pc = param_counts(ctx.model, 2, 4, 1, 8, True)
    asked = [0]
    real = coll._ring_bandwidth
    monkeypatch.setattr(coll, "_ring_bandwidth", lambda p: (asked.__setitem__(0, asked[0] + 1), real(p))[1])

    def terms():
        return [dp_terms_of(ctx, pc, 2, 4, 36, 2, 8, order, True, 1, z, profiles) for z in (1, 2, 3)]
    plain = terms()
    plain_asked, asked[0] = asked[0], 0
    with coll.memoized():
        assert terms() == plain
        assert 0 < asked[0] < plain_asked
        asked[0] = 0
        assert terms() == plain and asked[0] == 0
    assert coll._MEMO is None
    assert terms() == plain and asked[0] == plain_asked


def test_kind_windows_over_the_overlaps_asks_the_compute_once_and_answers_as_each(monkeypatch):
    """The search's compute tables ask the data-parallel windows at every TP and EP overlap of a cell:
    ``kind_windows_over`` looks the compute terms up once for all of them and gives what
    ``kind_windows`` gives for each."""
    from clusterplan.cost.terms import pipeline

    ctx, _ = _spaces("mixtral-8x7b", "gb200-nvl72", 72, "megatron", "")
    asked = [0]
    real = pipeline.compute_terms
    monkeypatch.setattr(pipeline, "compute_terms", lambda *a, **k: (asked.__setitem__(0, asked[0] + 1), real(*a, **k))[1])
    for kind in (None, False, True):
        for recompute in ("none", "selective", "full"):
            asked[0] = 0
            grid = pipeline.kind_windows_over(ctx, 2, 2, 1, True, recompute, 4, True, (False, True), (False, True), kind)
            assert asked[0] == 1
            assert grid == [[pipeline.kind_windows(ctx, 2, 2, 1, True, recompute, 4, True, to, eo, kind)
                             for eo in (False, True)] for to in (False, True)]


def test_the_next_pipeline_split_prices_no_group_again_and_builds_what_a_fresh_build_gives(monkeypatch):
    """The pipeline splits of one search share their compute and communication groups (the second
    split's factorizations are some of the first's): the second prices none of the rows the first
    priced (``reuse.kept_keys``), and each split's tables equal those built from scratch."""
    from test_reuse import _same

    from clusterplan.planner.search import reuse, tables

    ctx, spaces = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "", batch=15360)
    assert len(spaces) == 2
    priced = []
    for name in ("_compute_tables", "_comm_part"):
        real = getattr(tables, name)
        monkeypatch.setattr(tables, name, lambda *a, _r=real, _n=name, **k: (
            priced.append((_n, len(a[2]))), _r(*a, **k))[1])
    reuse.clear()
    built = [tables.build_tables(ctx, S, 0.05) for S in spaces]
    first = sum(n for _, n in priced[:5])
    assert len(priced) == 5 and first > 100  # the first split prices its compute rows and four kinds of group
    assert sum(n for _, n in priced[5:]) < first / 20
    for S, kept in zip(spaces, built):
        reuse.clear()
        assert _same(kept, tables.build_tables(ctx, S, 0.05))
    reuse.clear()


def test_restrict_cuts_runs_of_indices_as_views_with_the_values_a_copy_has():
    """A warm start's descent restricts every table to one index per knob thousands of times: runs of
    consecutive indices are cut as views of the tables (no copy), others by copying, and either way
    each restricted table holds what ``np.take`` gives."""
    from clusterplan.planner.search import reuse, tables
    from clusterplan.planner.search.exhaustive import _cut, restrict

    ctx, spaces = _spaces("mixtral-8x7b", "gb200-nvl72", 72, "megatron", "")
    reuse.clear()
    T = tables.build_tables(ctx, spaces[0], 0.05)
    dims = ("f", "o", "v", "e", "z")
    for keep in ({"o": [1]}, {"v": [0], "z": [1, 2]}, {"z": [0, 2]}, {"f": [3, 4, 5], "e": [1]}):
        cut = _cut(T.DPS, dims, keep)
        plain = T.DPS
        for ax, d in enumerate(dims):
            plain = np.take(plain, keep[d], axis=ax) if d in keep else plain
        assert np.array_equal(cut, plain) and cut.dtype == plain.dtype
        runs = all(list(v) == list(range(v[0], v[0] + len(v))) for v in keep.values())
        assert np.shares_memory(cut, T.DPS) == runs
    sub = restrict(T, {"o": [0], "z": [1]})
    assert np.shares_memory(sub.DPS, T.DPS) and sub.DPS.shape[1] == 1 and sub.DPS.shape[4] == 1
    reuse.clear()


@pytest.mark.parametrize("batch", [64, 1024, 1536])
def test_rows_that_depend_on_pp_and_dp_alone_are_priced_once_per_pair(batch):
    """Slots, micro-batches, stage shares (``tables._count_tables``) and the batch rules
    (``masks.masks``' ok_fmbv) read a factorization's pp and dp alone: priced on one factorization
    of each (pp, dp) (``reuse.per_pp_dp``) they equal pricing every factorization."""
    from test_reuse import _same

    from clusterplan.cost.checks import head_slot_problem
    from clusterplan.planner.search import tables
    from clusterplan.planner.search.reuse import per_pp_dp
    from clusterplan.planner.search.space import batch_ok, cell_schedule

    ctx, spaces = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "", batch=batch)
    for S in spaces:
        priced = []
        got = per_pp_dp(S, lambda sub: (priced.append(len(sub.factorizations)), tables._count_tables(ctx, sub))[1])
        assert _same(got, tables._count_tables(ctx, S))
        assert priced[0] == len({f[1:3] for f in S.factorizations}) < len(S.factorizations) / 2
        ok_fmbv = masks.masks(ctx, S)[1]
        for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
            for j, mb in enumerate(S.micro_batch_size):
                for vi, v in enumerate(S.vp):
                    slots = S.head_slots[0]
                    failing = [r for r in (batch_ok(ctx.model, ctx.job, pp, dp, mb, v, slots),
                                           "layers" if slots and head_slot_problem(ctx.model, ctx.job, pp, v) else None,
                                           "interleave" if "" not in S.schedule and not cell_schedule(S, pp, v) else None)
                               if r]  # the first failing rule in REASON_ORDER
                    code = min(masks.REASON_ORDER.index(r) for r in failing) if failing else -1
                    assert ok_fmbv[i, j, vi] == code


def test_place_transposes_only_axes_out_of_order():
    """``exhaustive._place`` puts a table's axes where DIMS has them: tables whose axes are in DIMS
    order already (most) are only reshaped, the others transposed first, with the same result."""
    from clusterplan.planner.search.exhaustive import DIMS, _place, _placement

    rng = np.random.default_rng(0)
    for dims in (("f", "o"), ("f", "mb", "v"), ("e", "o"), ("f", "o", "v", "e", "z"), ("eo", "e", "f")):
        arr = rng.integers(0, 100, size=tuple(range(2, 2 + len(dims))))
        sorted_dims = tuple(sorted(dims, key=DIMS.index))
        assert (_placement(dims)[0] is None) == (dims == sorted_dims)
        plain = np.transpose(arr, [dims.index(d) for d in sorted_dims])
        shape = [plain.shape[sorted_dims.index(d)] if d in dims else 1 for d in DIMS]
        assert np.array_equal(_place(arr, dims), plain.reshape(shape))


def test_expert_groups_list_the_data_block_at_once_as_position_by_position():
    """``Layout.group`` of ``ep`` and ``edp`` read the context x data block's rank offsets listed at
    once: the same ranks as walking each position's digits in the order's own sequence of cp and dp
    (the expert rank generator), including ep that does not divide the block."""
    from clusterplan.cost.layout import Layout, order_axes

    def position(lay: Layout, index: int) -> int:
        offset = 0
        for name in (a for a in order_axes(lay.order) if a in ("cp", "dp")):
            offset += (index % lay.degree(name)) * lay.stride(name)
            index //= lay.degree(name)
        return offset

    for order in ("tp-cp-dp-pp", "tp-dp-cp-pp", "tp-pp-cp-dp", "cp-tp-dp-pp"):
        for tp, pp, dp, cp, ep in ((2, 2, 8, 2, 4), (1, 3, 6, 1, 4), (4, 1, 6, 4, 8), (2, 1, 3, 1, 3)):
            lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order)
            for base in (0, 5):
                assert lay.group("ep", base) == tuple(sorted(base + position(lay, k) for k in range(ep)))
                assert lay.group("edp", base) == tuple(base + position(lay, j * ep) for j in range(cp * dp // ep))


def test_exhaustive_blocks_span_invalid_factorizations_and_find_what_each_alone_finds():
    """``solve_exhaustive`` scores runs of factorizations across the invalid ones between valid ones
    (their layouts all fail the rules; a warm start's descent otherwise scores 34 blocks per question
    on DeepSeek-V3 on 576 GB200): its best layouts and its count of layouts considered equal scoring
    each valid factorization alone."""
    from clusterplan.planner.search import reuse, tables
    from clusterplan.planner.search.exhaustive import (
        _blocks, restrict, score_factorization, solve_exhaustive, valid_factorizations)

    ctx, spaces = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "", batch=15360)
    reuse.clear()
    T = tables.build_tables(ctx, spaces[0], 0.05)
    sub = restrict(T, {"o": [0], "v": [0], "mb": [0], "s": [0], "r": [0], "z": [1], "do": [0], "to": [0], "eo": [0]})
    valid = valid_factorizations(sub)
    runs = sum(1 for f in range(len(valid)) if valid[f] and (f == 0 or not valid[f - 1]))
    assert len(_blocks(sub, valid_only=True)) < runs / 4
    for top_k in (0, 3):
        best, considered = [], 0
        for f in np.flatnonzero(valid):
            sc = score_factorization(sub, int(f))
            shape = np.broadcast_shapes(sc.objective.shape, sc.code.shape, sc.canon.shape, sc.memory.shape)
            obj, mem = np.broadcast_to(sc.objective, shape).ravel(), np.broadcast_to(sc.memory, shape).ravel()
            ok = ((np.broadcast_to(sc.code, shape) < 0) & np.broadcast_to(sc.canon, shape)).ravel()
            considered += int(np.broadcast_to(sc.canon, shape).sum())
            for k in np.flatnonzero(ok):
                idx = np.unravel_index(k, shape)
                best.append((int(obj[k]), int(mem[k]), (int(f),) + tuple(int(x) for x in idx[1:])))
        best.sort()
        found, counted = solve_exhaustive(sub, top_k)
        assert counted == considered
        assert [(o, tuple(idx.values())) for o, idx in found] == [(o, idx) for o, _, idx in best[:top_k + 1]]
    reuse.clear()


def test_tables_and_solve_run_with_fewer_garbage_collections(monkeypatch):
    """Building the tables and solving over them run with the collector's first generation at
    ``reuse.GC_FIRST_GENERATION`` allocations (each third-generation collection walks the cluster's
    whole graph); the thresholds are restored after, an error included."""
    import gc

    from clusterplan.planner.search import cpsat, reuse, tables

    before = gc.get_threshold()
    with reuse.fewer_collections():
        assert gc.get_threshold() == (max(before[0], reuse.GC_FIRST_GENERATION), *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(ZeroDivisionError), reuse.fewer_collections():
        1 / 0
    assert gc.get_threshold() == before
    seen = []
    real = tables._count_tables
    monkeypatch.setattr(tables, "_count_tables", lambda *a: (seen.append(gc.get_threshold()[0]), real(*a))[1])
    ctx, spaces = _spaces("mixtral-8x7b", "gb200-nvl72", 72, "megatron", "")
    reuse.clear()
    T = tables.build_tables(ctx, spaces[0], 0.05)
    monkeypatch.setattr(cpsat, "warm_start", lambda *a, _r=cpsat.warm_start: (seen.append(gc.get_threshold()[0]), _r(*a))[1])
    cpsat.solve_cpsat(T, 1)
    assert seen == [reuse.GC_FIRST_GENERATION] * 2 and gc.get_threshold() == before
    reuse.clear()


@pytest.mark.parametrize("model, devices, fw", [("deepseek-v3", 576, "megatron"), ("mixtral-8x7b", 72, "torchtitan")])
def test_the_lower_bound_prices_only_the_factorizations_the_model_reads(model, devices, fw):
    """CP-SAT reads the objective's lower bound at its (f, mb, v) triples alone, so only their
    factorizations are priced (the others keep UNREACHABLE), in blocks of indices: at every triple
    the bound equals pricing every factorization in slices."""
    from clusterplan.planner.search import reuse, tables
    from clusterplan.planner.search.bounds import UNREACHABLE, _lower_bound_block, objective_lower_bound
    from clusterplan.planner.search.cpsat import _valid_triples

    ctx, spaces = _spaces(model, "gb200-nvl72", devices, fw, "", batch=15360 if devices == 576 else 1024)
    reuse.clear()
    for S in spaces:
        T = tables.build_tables(ctx, S, 0.05)
        got = objective_lower_bound(T)
        plain = np.transpose(np.concatenate([_lower_bound_block(T, slice(a, a + 7))
                                             for a in range(0, len(S.factorizations), 7)]), (0, 3, 2, 1))
        plain = np.where(plain < UNREACHABLE, T.time_weight * plain, UNREACHABLE)
        f, mb, v = _valid_triples(T).T
        assert len(f) and np.array_equal(got[f, mb, v], plain[f, mb, v])
        unread = np.setdiff1d(np.arange(len(S.factorizations)), f)
        assert (got[unread] == UNREACHABLE).all()
    reuse.clear()


@pytest.mark.parametrize("model, devices, fw", [("deepseek-v3", 576, "megatron"), ("mixtral-8x7b", 576, "torchtitan"),
                                                ("mixtral-8x7b", 72, "deepspeed")])
def test_rejections_of_factorizations_their_own_rule_refuses_are_counted_without_scoring(monkeypatch, model, devices,
                                                                                           fw):
    """A factorization its own rule refuses (``ok_f``) gives every layout that code, whatever its
    memory: ``count_rejections`` counts those blocks from the representative layouts alone and scores
    only the others, with the counts scoring every block gives."""
    from clusterplan.planner.search import exhaustive, reuse, tables

    ctx, spaces = _spaces(model, "gb200-nvl72", devices, fw, "", batch=15360 if model == "deepseek-v3" else 1024)
    reuse.clear()
    for S in spaces:
        T = tables.build_tables(ctx, S, 0.05)
        counts = np.zeros(len(masks.REASON_ORDER) + 1, np.int64)
        for i in exhaustive._blocks(T):
            sc = exhaustive.score_factorization(T, i, with_objective=False)
            weight = sc.canon.sum(axis=(8, 9, 10), keepdims=True)
            code = np.broadcast_to(sc.code, np.broadcast_shapes(sc.code.shape, weight.shape))
            counts += np.bincount((code + 1).ravel(), weights=np.broadcast_to(weight, code.shape).ravel(),
                                  minlength=len(counts)).astype(np.int64)
        scored = []
        real = exhaustive.score_factorization
        monkeypatch.setattr(exhaustive, "score_factorization", lambda T, i, **k: (scored.append(i), real(T, i, **k))[1])
        got = exhaustive.count_rejections(T)
        monkeypatch.setattr(exhaustive, "score_factorization", real)
        assert got == ({r: int(counts[k + 1]) for k, r in enumerate(masks.REASON_ORDER) if counts[k + 1]},
                       int(counts[0]))
        assert all((T.ok_f[i] < 0).any() for i in scored)
        if model == "deepseek-v3":  # small blocks, most of them refused by their own rule
            assert len(scored) < len(exhaustive._blocks(T))
    reuse.clear()


def test_bundled_yaml_is_read_by_libyaml_and_gives_what_the_python_parser_gives(monkeypatch):
    """The catalogue a plan reads is parsed by libyaml's scanner where PyYAML has it (0.16 s of a
    4.2 s plan of DeepSeek-V3 on 576 GB200 in pure Python), into the very objects the pure-Python
    safe loader gives, for every bundled data file."""
    from pathlib import Path

    import yaml

    import clusterplan
    from clusterplan.models import files
    root = Path(clusterplan.__file__).parent
    paths = sorted(p for p in root.glob("*/data/**/*.yaml"))
    assert len(paths) >= 10
    for path in paths:
        parts = path.relative_to(root).parts
        got = files._bundled.__wrapped__(f"clusterplan.{parts[0]}", parts[1:])
        assert got == yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader), path
    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML built without libyaml: the pure-Python loader is the only one")
    used = []
    real = files.yaml.load
    monkeypatch.setattr(files.yaml, "load", lambda text, Loader: used.append(Loader) or real(text, Loader=Loader))
    files._bundled.__wrapped__("clusterplan.models", ("data", "models.yaml"))
    assert used == [yaml.CSafeLoader]


def _pipeline_and_dp_plainly(T, sl, dps, dpm):
    """``exhaustive._pipeline_and_dp`` as its docstring says: per stage, the pipeline plus the exposed
    traffic over both DP overlap settings at once, the larger over the stages, the context ring."""
    from clusterplan.planner.search.exhaustive import _place, context_term, overlapped, pipeline_term, stage_pipelines
    tc = T.tc_of_fe[sl]
    M, FRAC = _place(T.M[sl], ("f", "mb")), _place(T.FRAC[sl], ("f", "v"))
    do = _place(np.array(T.space.dp_overlap), ("do",))
    dims = ("f", "e", "mb", "s", "r", "to")
    bwd, fw = _place(T.BWD[tc], dims), _place(T.FW[tc], dims + ("eo",))

    def exposed(step_window, mb_window):
        step = np.where(do, overlapped(T, dps, np.maximum(0, step_window - dpm)), dps)
        return step + M * np.where(do, overlapped(T, dpm, mb_window), dpm)
    if T.stages is None:
        return pipeline_term(T, sl) + exposed(FRAC * bwd, FRAC * fw)
    bwd_m, fw_m = _place(T.BWD_M[tc], dims), _place(T.FW_M[tc], dims + ("eo",))
    best = None
    for c, pipe in zip(T.stages, stage_pipelines(T, sl)):
        fd, fm = _place(c.fd[sl], ("f", "v")), _place(c.fm[sl], ("f", "v"))
        total = pipe + exposed(fd * (bwd - bwd_m) + fm * bwd_m, fd * (fw - fw_m) + fm * fw_m)
        best = total if best is None else np.maximum(best, total)
    return best + context_term(T, sl)


@pytest.mark.parametrize("model, devices", [("deepseek-v3", 256), ("llama3-8b", 64)])
def test_pipeline_and_dp_gives_the_plain_sum_and_prices_no_overlap_where_it_is_off(monkeypatch, model, devices):
    """The exhaustive engine's pipeline and data-parallel term, summed per DP overlap setting (half
    a score's time on DeepSeek-V3 / 576 GB200), equals the plain sum over both settings on every
    block, with dense and MoE stages and without; where the overlap is off it prices no overlap."""
    from clusterplan.planner.search import exhaustive
    from clusterplan.planner.search.tables import SLOT_QUANTUM, build_tables
    ctx, spaces = _spaces(model, "hgx-h800", devices, "megatron", "")
    T = build_tables(ctx, spaces[0])
    assert (T.stages is not None) == (model == "deepseek-v3")
    dims5 = ("f", "o", "v", "e", "z")
    for sub in (T, exhaustive.restrict(T, {"do": [0]}), exhaustive.restrict(T, {"do": [1]})):
        for sl in exhaustive._blocks(sub, valid_only=True):
            dps = exhaustive._place(sub.DPS[sl], dims5) * SLOT_QUANTUM
            dpm = exhaustive.per_microbatch_traffic(sub, sl) * SLOT_QUANTUM
            got, want = exhaustive._pipeline_and_dp(sub, sl, dps, dpm), _pipeline_and_dp_plainly(sub, sl, dps, dpm)
            shape = np.broadcast_shapes(got.shape, want.shape)
            assert np.array_equal(np.broadcast_to(got, shape), np.broadcast_to(want, shape))
    off = exhaustive.restrict(T, {"do": [T.space.dp_overlap.index(False)]})
    monkeypatch.setattr(exhaustive, "overlapped", lambda *a: pytest.fail("overlap priced with DP overlap off"))
    sl = exhaustive._blocks(off, valid_only=True)[0]
    exhaustive._pipeline_and_dp(off, sl, exhaustive._place(off.DPS[sl], dims5), exhaustive.per_microbatch_traffic(off, sl))


def test_tp_comm_over_both_overlap_settings_asks_the_traffic_once(monkeypatch):
    """The tables price TP traffic with the overlap off and on from one ask of the traffic (22,000
    cells on DeepSeek-V3 / 576 GB200), each setting what ``tp_comm_terms`` gives alone."""
    from clusterplan.cost.terms import comm
    ctx, _ = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "")
    for tp, mb, sp, rc, kind in itertools.product((1, 4, 8), (1, 2), (False, True), ("none", "full"), (None, True, False)):
        want = [comm.tp_comm_terms(ctx, tp, 2, mb, sp, rc, 1, to, True, 8, True, kind) for to in (False, True)]
        calls = []
        real = comm._tp_comm_total_s
        monkeypatch.setattr(comm, "_tp_comm_total_s", lambda *a: calls.append(a) or real(*a))
        assert comm.tp_comm_over(ctx, tp, 2, mb, sp, rc, 1, (False, True), True, 8, True, kind) == want
        assert len(calls) == (tp > 1)
        monkeypatch.setattr(comm, "_tp_comm_total_s", real)
        assert want[1] >= want[0] * comm.overlap_share(ctx, "tp")  # the overlap's floor: its share of the traffic


def test_model_spec_hashes_its_fields_once_and_stays_pydantics_hash(monkeypatch):
    """Every cost term cached on the model hashes it (70,000 times a plan of DeepSeek-V3 on 576
    GB200): the hash of the fields, nested specs included, is taken once and is pydantic's own; a
    copy with changes and a pickle hash their own fields; equality is the fields' alone."""
    import copy
    import pickle

    from pydantic._internal._model_construction import make_hash_func

    from clusterplan.models.spec import ModelSpec, MoESpec
    m = ModelSpec(**get_model("deepseek-v3").model_dump())
    assert hash(m) == make_hash_func(ModelSpec)(m)
    asked = []
    real = MoESpec.__hash__
    monkeypatch.setattr(MoESpec, "__hash__", lambda self: asked.append(self) or real(self))
    assert hash(m) == hash(m) and not asked  # the nested spec is not hashed again
    monkeypatch.setattr(MoESpec, "__hash__", real)
    other = m.model_copy(update={"hidden_size": 1024})
    assert hash(other) == make_hash_func(ModelSpec)(other) != hash(m)
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m), ModelSpec(**m.model_dump())):
        assert twin == m and hash(twin) == hash(m)
    assert "_field_hash" not in m.model_dump() and ModelSpec(**m.model_dump()) == m


def test_job_keeps_its_profile_outside_its_fields(monkeypatch):
    """A job asks its framework profile once (the cost terms ask ``Job.profile`` about 300,000
    times a plan of DeepSeek-V3 on 576 GB200); equality, ``asdict``, ``replace`` and pickling see
    the fields alone, and a job replaced onto another framework asks its own."""
    import dataclasses
    import pickle

    from clusterplan.cost import layout
    asked = []
    real = layout._profile_at
    monkeypatch.setattr(layout, "_profile_at", lambda *a: asked.append(a) or real(*a))
    job = Job(global_batch_size=1024, seq_len=4096, framework="torchtitan")
    assert job.profile is job.profile is job.profile and len(asked) == 1
    assert list(dataclasses.asdict(job)) == [f.name for f in dataclasses.fields(Job)]
    twin = pickle.loads(pickle.dumps(job))
    assert twin == job and hash(twin) == hash(job) and twin.profile is job.profile
    other = dataclasses.replace(job, framework="megatron")
    assert other.profile is real("megatron", None, False) and job.profile is real("torchtitan", None, False)


@pytest.mark.parametrize("model, cluster, devices, fw", [("deepseek-v3", "hgx-h800", 256, "megatron"),
                                                         ("mixtral-8x7b", "gb200-nvl72", 128, "torchtitan")])
def test_rejection_counts_weigh_the_overlap_knobs_without_the_whole_mask(monkeypatch, model, cluster, devices, fw):
    """The rejection counts weigh each layout row by its representatives over (do, to, eo) as the
    product of the (do, to) and the eo parts (equal to the whole mask summed, on every block), and
    never build the whole mask (355 times on DeepSeek-V3 / 576 GB200)."""
    from clusterplan.planner.search import exhaustive
    from clusterplan.planner.search.tables import build_tables
    ctx, spaces = _spaces(model, cluster, devices, fw, "")
    overlaps = tuple(exhaustive.DIMS.index(k) for k in ("do", "to", "eo"))
    for S in spaces:
        T = build_tables(ctx, S)
        for sl in exhaustive._blocks(T):
            want = exhaustive._canon(T, sl).sum(axis=overlaps, keepdims=True)
            assert np.array_equal(exhaustive._canon_weight(T, sl), want)
        real = exhaustive._canon(T, slice(None))
        monkeypatch.setattr(exhaustive, "_canon", lambda *a: pytest.fail("the whole mask built"))
        counts, feasible = exhaustive.count_rejections(T)
        monkeypatch.undo()
        assert feasible + sum(counts.values()) == int(real.sum() * np.prod([len(S.micro_batch_size)]))


def test_solve_exhaustive_reads_each_blocks_figures_once_and_counts_as_the_whole_mask(monkeypatch):
    """The exhaustive engine flattens a block's objective and memory (broadcast views: each
    flattening copies the block) once, not once more per answer kept, and counts the layouts it
    scores from the symmetry mask without broadcasting it; the answers and counts are those of
    the plain reading."""
    import types

    from clusterplan.planner.search import exhaustive
    from clusterplan.planner.search.tables import build_tables
    ctx, spaces = _spaces("deepseek-v3", "hgx-h800", 256, "megatron", "")
    T = build_tables(ctx, spaces[0])
    flattened = []

    class Counted(np.ndarray):
        def ravel(self, *args, **kwargs):
            flattened.append(self.shape)
            return np.asarray(self).ravel(*args, **kwargs)
    proxy = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    proxy.broadcast_to = lambda a, shape: np.broadcast_to(a, shape).view(Counted)
    monkeypatch.setattr(exhaustive, "np", proxy)
    found, considered = exhaustive.solve_exhaustive(T, 3)
    monkeypatch.undo()
    blocks = exhaustive._blocks(T, valid_only=True)
    assert found and len(flattened) <= 3 * len(blocks)  # objective, memory, and the mask (np.flatnonzero)
    # the plain reading: every block's feasible representatives sorted by (objective, memory)
    rows, total, valid = [], 0, exhaustive.valid_factorizations(T)
    for sl in blocks:
        sc = exhaustive.score_factorization(T, sl)
        shape = np.broadcast_shapes(sc.objective.shape, sc.code.shape, sc.canon.shape, sc.memory.shape)
        canon = np.broadcast_to(sc.canon, shape)
        total += int(canon[valid[sl]].sum())
        for k in np.flatnonzero((np.broadcast_to(sc.code, shape) < 0) & canon):
            idx = np.unravel_index(k, shape)
            rows.append((int(np.broadcast_to(sc.objective, shape)[idx]), int(np.broadcast_to(sc.memory, shape)[idx]),
                         (sl.start + int(idx[0]),) + tuple(int(x) for x in idx[1:])))
    assert considered == total
    assert found == [(o, dict(zip(exhaustive.DIMS, idx))) for o, _, idx in sorted(rows)[:4]]


def test_ep_all_to_alls_are_priced_once_per_token_count_and_give_the_plain_product(monkeypatch):
    """The MoE all-to-alls of one micro-batch (``comm._ep_open_s``) are priced once per group and
    tokens a rank, not again per recompute mode and (cp, mbs) of the same tokens (the EP tables ask
    each: 25,000 asks on DeepSeek-V3 / 576 GB200), and each is the plain product of the MoE layers,
    one layer's all-to-alls and the recomputation's multiplier."""
    from clusterplan.cost.terms import comm
    from clusterplan.cost.terms.context import _comm_multiplier, _tokens
    ctx, _ = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "")
    ranks = tuple(range(0, 128, 2))  # an expert group across two NVL72 domains
    comm._ep_open_s.cache_clear()
    comm._ep_layers_s.cache_clear()
    calls = []
    real = comm._ep_comm_s
    monkeypatch.setattr(comm, "_ep_comm_s", lambda *a: calls.append(a) or real(*a))
    for dispatcher in ("alltoall", "deepep"):
        for (cp, mb), rc, sp in itertools.product(((1, 2), (2, 4), (1, 1)), ("none", "selective", "full"), (False, True)):
            got = comm._ep_open_s(ctx, 2, cp, 64, mb, sp, rc, ranks, dispatcher)
            plain = ctx.model.num_moe_layers * real(ctx, _tokens(ctx, cp, mb), 2, ctx.cluster.axis_profile(ranks), sp,
                                                    dispatcher) * _comm_multiplier(rc)
            assert got == plain > 0
    assert len(calls) == 2 * 2 * 2  # dispatchers x token counts (cp 1 x mb 2 and cp 2 x mb 4 share theirs) x sp


@pytest.mark.parametrize("batch", [512, 4096])
def test_coordinate_descent_asks_no_sub_space_twice_and_ends_where_the_plain_descent_does(monkeypatch, batch):
    """The warm start's coordinate descent (``bounds._descend``) skips a knob whose sub-space (the
    others where they were) it solved already, which cannot improve on the value that solve left (a
    batch sweep's points spent a fifth of their search there): it ends at the value and layout the
    plain descent, every knob solved every round, ends at, with fewer solves."""
    from clusterplan.planner.search import bounds, reuse, tables
    from clusterplan.planner.search.exhaustive import DIMS, restrict, solve_exhaustive

    def plain(T, value, idx, rounds=4):
        knobs, solves = [k for k in DIMS if k != "f"], 0
        for _ in range(rounds):
            improved = False
            for knob in knobs:
                sub = restrict(T, {k: [idx[k]] for k in knobs if k != knob})
                found, _ = solve_exhaustive(sub, 0)
                solves += 1
                if found and found[0][0] < value:
                    value, idx, improved = found[0][0], sub.unrestrict(found[0][1]), True
            if not improved:
                break
        return (value, idx), solves

    ctx, spaces = _spaces("llama3-8b", "dgx-h100-superpod", 64, "megatron", "", batch=batch)
    reuse.clear()
    for S in spaces:
        T = tables.build_tables(ctx, S, 0.05)
        poor = restrict(T, {"z": [S.zero_stage.index(0)], "r": [S.recompute.index("full")]})  # work for the descent
        value, idx = solve_exhaustive(poor, 0)[0][0]
        asked = []
        monkeypatch.setattr(bounds, "restrict", lambda T, keep: asked.append(repr(sorted(keep.items()))) or restrict(T, keep))
        got = bounds._descend(T, value, poor.unrestrict(idx))
        monkeypatch.setattr(bounds, "restrict", restrict)
        want, solves = plain(T, value, poor.unrestrict(idx))
        assert got == want and got[0] < value
        assert len(asked) == len(set(asked)) < solves
    reuse.clear()


def test_layer_kinds_price_each_distinct_op_once_per_context_and_alike(monkeypatch):
    """``_kind_times`` prices an op its context priced already from the context's own record (an MoE
    layer's attention is the same op at every ep: 49,656 op times asked on DeepSeek-V3 / 576 GB200,
    3,680 distinct), with the sums the plain pricing of every op gives."""
    from clusterplan.cost.compute import op_time_s
    from clusterplan.cost.terms import compute
    from clusterplan.cost.terms.compute import _compute_context, layer_kernels
    from clusterplan.models.ops import layer_ops

    ctx, _ = _spaces("deepseek-v3", "gb200-nvl72", 576, "megatron", "")
    cctx = _compute_context(ctx)
    compute._kind_times.cache_clear()
    compute._op_times.cache_clear()
    asked = []
    monkeypatch.setattr(compute, "op_time_s", lambda op, dev, prec, backward=False: asked.append((op, backward))
                        or op_time_s(op, dev, prec, backward))
    distinct = set()
    dev, prec = cctx.cluster.device, cctx.job.gemm_format
    for local_experts in (256, 64, 32, 8):
        got = compute._kind_times(cctx, 4, 8192.0, True, True, local_experts, True)
        ops = layer_ops(cctx.model, 8192.0, cctx.job.seq_len, 4, True, True, local_experts, cctx.job.attention, True,
                        layer_kernels(cctx))
        distinct |= {(op, b) for op in ops for b in (False, True)}
        assert got[0] == sum(op_time_s(op, dev, prec) for op in ops)
        assert got[1] == sum(op_time_s(op, dev, prec, True) for op in ops)
    assert len(asked) == len(distinct) < 4 * 2 * len(ops)
    compute._kind_times.cache_clear()
    compute._op_times.cache_clear()


@pytest.mark.parametrize("model, devices, fw", [("deepseek-v3", 576, "megatron"), ("mixtral-8x7b", 576, "torchtitan")])
def test_warm_starts_skip_blocks_above_their_floor_and_find_what_scoring_every_block_finds(monkeypatch, model, devices,
                                                                                           fw):
    """Given each factorization's floor (the lower bound CP-SAT cuts with), ``solve_exhaustive`` scores
    the blocks least floor first and skips those above the best found so far: the warm start's
    sub-space and the neighbourhood of its best give the layouts every block gives, from a fraction of
    the blocks (5 of 28 on DeepSeek-V3 / 576 GB200)."""
    from clusterplan.planner.search import bounds, exhaustive, reuse, tables

    ctx, spaces = _spaces(model, "gb200-nvl72", devices, fw, "", batch=15360 if model == "deepseek-v3" else 1024)
    reuse.clear()
    T = tables.build_tables(ctx, spaces[0], 0.05)
    S = T.space
    scored = []
    real = exhaustive.score_factorization
    monkeypatch.setattr(exhaustive, "score_factorization", lambda *a: scored.append(a[1]) or real(*a))
    for keep in ({"r": [i for i, r in enumerate(S.recompute) if r != "none"], "z": [0, 1]},
                 {"mb": [0], "eo": [len(S.ep_overlap) - 1]}):
        sub = exhaustive.restrict(T, keep)
        want = exhaustive.solve_exhaustive(sub, 3)[0]
        every = len(scored)
        got = exhaustive.solve_exhaustive(sub, 3, bounds.floors(T, keep))[0]
        assert got == want and len(want) == 4
        assert 0 < len(scored) - every < every
        scored.clear()
    reuse.clear()


@pytest.mark.parametrize("batch", [512, 4096])
def test_a_space_of_one_block_is_scored_once_and_each_warm_start_question_read_from_it(monkeypatch, batch):
    """Where the whole space is one block (Llama 3 8B on 64 H100: a batch sweep's points), the warm
    start's sub-space, its descent's and the neighbourhood's questions (``bounds.best_of``) are read
    from one scoring of every layout, with the layouts and order ``solve_exhaustive`` gives on the cut
    tables (ties to the least memory, then the first index); a larger space is solved cut."""
    from clusterplan.planner.search import bounds, exhaustive, reuse, tables

    ctx, spaces = _spaces("llama3-8b", "dgx-h100-superpod", 64, "megatron", "", batch=batch)
    reuse.clear()
    monkeypatch.setattr(bounds, "solve_exhaustive", lambda *a: pytest.fail("a sub-space solved"))
    for S in spaces:
        T = tables.build_tables(ctx, S, 0.05)
        scored = []
        monkeypatch.setattr(bounds, "score_factorization", lambda *a: scored.append(1)
                            or exhaustive.score_factorization(*a))
        keeps = [{"do": [1], "r": [1, 2], "z": [0, 1, 3]}, {"mb": [1], "eo": [0]}, {"z": [2, 3], "o": [1], "s": [0]}]
        keeps += [{k: [0] for k in exhaustive.DIMS if k not in ("f", free)} for free in ("r", "z", "mb", "to")]
        answered = 0
        for keep in keeps:
            got = bounds.best_of(T, keep, 4)
            sub = exhaustive.restrict(T, keep)
            want = [(v, sub.unrestrict(i)) for v, i in exhaustive.solve_exhaustive(sub, 3)[0]]
            assert got == want
            answered += bool(got)
        assert scored == [1] and answered >= 3
    ctx, spaces = _spaces("mixtral-8x7b", "gb200-nvl72", 576, "torchtitan", "")
    T = tables.build_tables(ctx, spaces[0], 0.05)
    monkeypatch.setattr(bounds, "solve_exhaustive", exhaustive.solve_exhaustive)
    assert bounds._scored(T) is None and bounds.best_of(T, {"mb": [0]}, 2)
    reuse.clear()


def test_a_sweep_row_is_built_without_the_explanation_it_never_reads(monkeypatch):
    """A sweep's or comparison's row (``whatif.point_row``) reads the winner's figures, never the
    explanation, so its plan is written without one (each explanation evaluates a dozen neighbours of
    the winner: a tenth of a batch sweep's point): the row is the one the explained document gives."""
    from clusterplan.planner import results
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies import whatif

    ctx, _ = _spaces("llama3-8b", "dgx-h100-superpod", 64, "megatron", "", batch=512)
    build = lambda: (ctx.cluster, ctx.job)  # noqa: E731

    def row() -> dict:  # without the search's own wall time
        out = whatif.point_row(ctx.model, build, SearchOptions())
        return {**out, "search": {k: v for k, v in out["search"].items() if k != "wall_s"}}
    got = (monkeypatch.setattr(results, "explain", lambda *a: pytest.fail("a row's plan explained")), row())[1]
    monkeypatch.undo()
    real, asked = results.explain, []
    monkeypatch.setattr(results, "explain", lambda *a: asked.append(1) or real(*a))
    monkeypatch.setattr(whatif, "plan_results", lambda r, explained=True: results.plan_results(r))  # explained
    assert row() == got and got["layout"] and asked == [1]


@pytest.mark.parametrize("fw", ["megatron", "deepspeed", "torchtitan"])
def test_a_cells_static_memory_asks_the_rank_free_part_once_and_gives_each_ranks(monkeypatch, fw):
    """The data-parallel tables' static memory of a cell (``gathers._static_cell``) is asked for its
    three ranks at once: the rank-free part (ZeRO stage, shard copies, kept bytes a weight) once, not
    once a rank (17,000 cells on DeepSeek-V3 / 576 GB200), each rank's what ``memory_static_bytes``
    gives it alone."""
    from clusterplan.cost import step
    from clusterplan.cost.layout import Layout
    from clusterplan.cost.stages import RANKS
    from clusterplan.cost.terms import memory
    from clusterplan.planner.search import gathers

    ctx, _ = _spaces("mixtral-8x7b", "gb200-nvl72", 72, fw, "")
    for z, pp, offload in ((0, 1, "none"), (1, 4, "none"), (3, 1, "none"), (1, 2, "optimizer")):
        layout = Layout(tp=2, pp=pp, dp=36 // pp, cp=1, ep=4 if pp < 4 else 1, zero_stage=z, offload=offload)
        frees = bool(memory.grads_freed_bytes(ctx, layout, "first"))  # FSDP2's freed gradients, asked per rank apart
        asked = []
        real = memory.kept_param_bytes
        monkeypatch.setattr(memory, "kept_param_bytes", lambda *a: asked.append(a) or real(*a))
        cell = gathers._static_cell(ctx, layout, 1e9)
        monkeypatch.setattr(memory, "kept_param_bytes", real)
        assert len(asked) == 1 + frees * len(RANKS)
        for rank in RANKS:
            held = rank if step.rank_index(pp, rank) is not None else "first"
            assert cell[rank][0] == step.memory_static_bytes(ctx, layout, held) + 1e9
