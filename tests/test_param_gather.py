"""Low-precision parameter gathers (``Layout.param_gather``, issue 38 item 4): Megatron-LM's
``--fp8-param-gather`` and torchtitan's FSDP2 float8 all-gather."""

from __future__ import annotations

import pytest

from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import Context, dp_terms, gather_bytes, static_memory
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.topologies.library import build_cluster

M = get_model("llama3-8b")


def _job(precision="fp8", framework="megatron", date=""):
    return Job(global_batch_size=64, seq_len=4096, precision=precision, framework=framework, framework_date=date)


def test_layout_text_round_trips_and_default_stays_silent():
    layout = parse_layout("tp=1,pp=1,dp=64,zero=1,param_gather=fp8")
    assert layout.param_gather == "fp8"
    assert "param_gather=fp8" in layout.short()
    assert parse_layout(layout.short().replace(" ", ",")) == layout
    assert "param_gather" not in Layout(dp=64).short()
    with pytest.raises(SpecError, match=r"layout.param_gather: got 'fp4'; allowed: bf16, fp8"):
        parse_layout("dp=64,param_gather=fp4")


@pytest.mark.parametrize("framework, date, kept", [("megatron", "", 1.0), ("torchtitan", "2025-09", 0.5)])
def test_fp8_gather_moves_fewer_bytes(framework, date, kept):
    """One byte per weight gathered instead of two. The gathered copy is kept in FP8: torchtitan's
    float8 all-gather unshards one float8 weight (half the bytes), Megatron's FP8 params keep Transformer
    Engine's row- and column-wise copies (as many bytes as the bf16 params they replace)."""
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    zero = 1 if framework == "megatron" else 3
    ctx = Context(M, _job(framework=framework, date=date), cluster).placed("tp-cp-dp-pp")
    bf16, fp8 = Layout(dp=64, zero_stage=zero), Layout(dp=64, zero_stage=zero, param_gather="fp8")
    t16, t8 = dp_terms(ctx, bf16), dp_terms(ctx, fp8)
    assert t8.per_step_s + t8.per_microbatch_s < t16.per_step_s + t16.per_microbatch_s
    assert static_memory(ctx, fp8).weights_bytes == pytest.approx(static_memory(ctx, bf16).weights_bytes * kept)
    assert evaluate(M, ctx.job, cluster, fp8).step_time_s < evaluate(M, ctx.job, cluster, bf16).step_time_s


def test_mxfp8_gathers_its_scales_too():
    """MXFP8 gathers 1 + 1/32 B per weight; Megatron keeps its row- and column-wise copies, more than
    the bf16 params (Megatron-LM issue #2063)."""
    cluster = build_cluster("gb200-nvl72", num_devices=72)
    ctx = Context(M, _job(precision="mxfp8"), cluster)
    assert gather_bytes(ctx.job, "fp8") == pytest.approx(1 + 1 / 32)
    bf16, fp8 = Layout(dp=72, zero_stage=1), Layout(dp=72, zero_stage=1, param_gather="fp8")
    ratio = static_memory(ctx, fp8).weights_bytes / static_memory(ctx, bf16).weights_bytes
    assert ratio == pytest.approx(2 * (1 + 1 / 32) / 2)


@pytest.mark.parametrize("precision, framework, date, zero, words", [
    ("bf16", "megatron", "", 1, "needs precision fp8 or mxfp8 (got bf16)"),
    ("fp8", "megatron", "", 0, "needs a sharded parameter all-gather"),
    ("fp8", "megatron", "2024-06", 1, "offered from 2024-09"),
    ("fp8", "torchtitan", "", 3, "offered from 2024-07 until 2026-04"),
    ("fp8", "deepspeed", "", 3, "never offered"),
])
def test_refused_where_it_cannot_run(precision, framework, date, zero, words):
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    layout = Layout(dp=64, zero_stage=zero, param_gather="fp8")
    problems = layout_problems(M, _job(precision, framework, date), cluster, layout)
    assert any(words in message for _, message in problems), problems


def test_refused_on_a_device_without_fp8():
    cluster = build_cluster("dgx-a100-superpod", num_devices=64)
    problems = layout_problems(M, _job(), cluster, Layout(dp=64, param_gather="fp8"))
    assert any("needs a device that runs fp8" in message for _, message in problems), problems


def test_current_scaling_pays_one_amax_all_reduce_a_step():
    """A sharded per-tensor cast under current scaling needs the whole tensor's amax: one all-reduce a
    step (torchtitan's precompute_float8_dynamic_scale_for_fsdp); delayed scaling takes it from history."""
    from clusterplan.cost.terms.dp import amax_all_reduce_s
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    titan = Context(M, _job(framework="torchtitan", date="2025-09"), cluster).placed("tp-cp-dp-pp")
    megatron = Context(M, _job(), cluster).placed("tp-cp-dp-pp")
    profile = cluster.strided_profile(64, 1)
    assert amax_all_reduce_s(titan, 1, 1, 3, profile, "fp8") > 0
    assert amax_all_reduce_s(titan, 1, 1, 3, profile, "bf16") == 0
    assert amax_all_reduce_s(megatron, 1, 1, 1, profile, "fp8") == 0  # delayed scaling, Megatron's default


@pytest.mark.parametrize("seed", range(6))
def test_search_holds_a_fixed_fp8_gather_with_engines_agreeing(seed):
    """``--fix param_gather=fp8``: CP-SAT equals the exhaustive enumerator, the winner carries the
    knob with a ZeRO stage that gathers parameters, and its step time is what evaluate prices."""
    from test_search import _check_engines_agree, random_instance
    from clusterplan.models.errors import InfeasibleError
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    model, job, cluster, bounds = random_instance(7000 + seed)
    if not cluster.device.supports("fp8"):
        cluster = build_cluster("dgx-h100-superpod", num_devices=cluster.num_devices)
    job = Job(global_batch_size=job.global_batch_size, seq_len=job.seq_len, precision="fp8")
    fixed = {**{k: v for k, v in bounds.fixed.items() if k != "zero_stage"}, "param_gather": "fp8"}
    bounds = type(bounds)(fixed, bounds.minimum, bounds.maximum, bounds.memory_headroom)
    _check_engines_agree(model, job, cluster, bounds)
    try:
        res = plan(model, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=bounds))
    except (InfeasibleError, SpecError):  # the draw's other bounds leave nothing, as in test_search
        return
    assert res.best.layout.param_gather == "fp8" and res.best.layout.zero_stage >= 1
    assert objective_seconds(res.objective_units[0]) == pytest.approx(res.best.step_time_s, rel=1e-3)


def test_fix_refuses_what_the_job_cannot_run():
    from clusterplan.planner.search.space import build_space, parse_bounds
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    with pytest.raises(SpecError, match=r"--fix param_gather=fp8: .*needs precision fp8 or mxfp8 \(got bf16\)"):
        build_space(M, _job("bf16"), cluster, parse_bounds(("param_gather=fp8",)))
    with pytest.raises(SpecError, match=r"--fix param_gather=fp8 needs a parameter all-gather"):
        build_space(M, _job(), cluster, parse_bounds(("param_gather=fp8,zero=0",)))
    space = build_space(M, _job(), cluster, parse_bounds(("param_gather=fp8",)))
    assert space.param_gather == ("fp8",) and 0 not in space.zero_stage


def test_explain_prices_going_back_to_bf16_gathers():
    """explain's sensitivities show what the knob buys: the same layout with 16-bit gathers is slower."""
    from clusterplan.planner.explain import sensitivities
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    job, layout = _job(), Layout(dp=64, zero_stage=1, param_gather="fp8")
    rows = {r["move"]: r for r in sensitivities(M, job, cluster, evaluate(M, job, cluster, layout))}
    assert rows["param_gather bf16"]["allowed"] and rows["param_gather bf16"]["delta"] > 0
    assert "param_gather bf16" not in {r["move"] for r in sensitivities(M, job, cluster, evaluate(M, job, cluster,
                                                                                                   Layout(dp=64)))}


def test_a_published_run_prices_its_param_gather():
    """A run's ``layout.param_gather`` (RUNS_FORMAT.md) is priced on the searched layout; a value the
    knob lacks, or one the job cannot run, is the run's bad input."""
    from clusterplan.planner.studies.runs import _with_partial_recompute
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    base = evaluate(M, _job(), cluster, Layout(dp=64, zero_stage=1))
    ev = _with_partial_recompute({"layout": {"param_gather": "fp8"}}, M, _job(), cluster, base)
    assert ev.layout.param_gather == "fp8" and ev.step_time_s < base.step_time_s
    with pytest.raises(SpecError, match="layout.param_gather: got 'fp4'"):
        _with_partial_recompute({"layout": {"param_gather": "fp4"}}, M, _job(), cluster, base)
    bf16 = evaluate(M, _job("bf16"), cluster, Layout(dp=64, zero_stage=1))
    with pytest.raises(SpecError, match="needs precision fp8 or mxfp8"):
        _with_partial_recompute({"layout": {"param_gather": "fp8"}}, M, _job("bf16"), cluster, bf16)


def _space_and_tables(job, cluster, fix=(), model=M, memory_only=False):
    from clusterplan.planner.search.space import build_space, parse_bounds
    from clusterplan.planner.search.tables import build_tables
    bounds = parse_bounds(fix)
    space = build_space(model, job, cluster, bounds)
    ctx = Context(model, job, cluster)
    return space, build_tables(ctx, space, bounds.headroom(job, cluster), memory_only=memory_only)


@pytest.mark.parametrize("precision, framework, date, fix, offered", [
    ("fp8", "megatron", "", (), ("bf16", "fp8")),
    ("mxfp8", "megatron", "", (), ("bf16", "fp8")),
    ("fp8", "torchtitan", "2025-06", (), ("bf16", "fp8")),
    ("fp8", "torchtitan", "2026-05", (), ("bf16",)),  # the float8 all-gather left torchtitan in 2026-04
    ("fp8", "megatron", "2024-06", (), ("bf16",)),
    ("bf16", "megatron", "", (), ("bf16",)),
    ("fp8", "megatron", "", ("param_gather=bf16",), ("bf16",)),
    ("fp8", "megatron", "", ("param_gather=fp8",), ("fp8",)),
    ("fp8", "megatron", "", ("zero=0",), ("bf16",)),
])
def test_the_search_offers_fp8_gathers_where_the_job_runs_them(precision, framework, date, fix, offered):
    """fp8 is offered to the tables where the job could gather in it (an FP8/MXFP8 precision the
    device runs, the framework's gather at its date, a ZeRO stage that gathers); --fix holds one."""
    from clusterplan.planner.search.space import build_space, parse_bounds
    cluster = build_cluster("gb200-nvl72" if precision == "mxfp8" else "dgx-h100-superpod", num_devices=64)
    assert build_space(M, _job(precision, framework, date), cluster, parse_bounds(fix)).param_gather == offered


def test_validation_searches_hold_bf16_gathers():
    """A published run's search holds 16-bit gathers; the run's own dtype is applied after it."""
    from clusterplan.planner.search.space import Bounds, build_space
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    space = build_space(M, _job(), cluster, Bounds(fixed={"tp": 1}, allow_unavailable=True))
    assert space.param_gather == ("bf16",)


@pytest.mark.parametrize("precision, framework, date, devices", [
    ("fp8", "megatron", "", ("dgx-h100-superpod", 64)),
    ("fp8", "torchtitan", "2025-06", ("dgx-h100-superpod", 64)),
    ("mxfp8", "megatron", "", ("gb200-nvl72", 72)),
])
def test_a_cell_takes_fp8_only_where_it_is_no_slower_and_no_larger(precision, framework, date, devices):
    """Against the same space with bf16 held, the offered tables are no larger in any data-parallel
    term and in no memory row, and equal to them wherever they kept bf16; where they took fp8 they
    equal the tables with fp8 held. The memory-only tables (``clusterplan fit``) choose the same."""
    cluster = build_cluster(devices[0], num_devices=devices[1])
    job = _job(precision, framework, date)
    space, T = _space_and_tables(job, cluster)
    _, B = _space_and_tables(job, cluster, ("param_gather=bf16",))
    fspace, F8 = _space_and_tables(job, cluster, ("param_gather=fp8",))
    assert space.param_gather == ("bf16", "fp8") and B.PG is None and F8.PG is None
    def entries(S):  # the ZeRO axis's (stage, shard group) pairs (planner.search.hsdp)
        return list(zip(S.zero_stage, S.zero_shard or (0,) * len(S.zero_stage)))
    z = [entries(space).index(p) for p in entries(fspace)]  # the fixed-fp8 space has zero 1-3
    for name in ("DPS", "DPM", "RG", "DPX"):
        ours, bf16, fp8 = getattr(T, name), getattr(B, name), getattr(F8, name)
        assert (ours <= bf16).all()
        assert (ours[~T.PG] == bf16[~T.PG]).all()
        assert (ours[:, :, :, :, z][T.PG[:, :, :, :, z]] == fp8[T.PG[:, :, :, :, z]]).all()
    for row, base in zip(T.rows, B.rows):
        assert (row.static <= base.static).all() and (row.static1 <= base.static1).all()
    chosen = T.PG.any(axis=1)[:, :, :, z]  # (f, v, e, z) cells priced with fp8 in some order
    held = {row.name: row for row in F8.rows}
    for row in (r for r in T.rows if r.name in held):
        assert (row.static[:, :, :, z][chosen] == held[row.name].static[chosen]).all()
    assert (_space_and_tables(job, cluster, memory_only=True)[1].PG == T.PG).all()
    assert not T.PG[:, :, :, :, space.zero_stage.index(0)].any()  # zero=0 gathers no parameters
    if precision == "mxfp8":  # Megatron keeps two MXFP8 copies of each weight: more than bf16's one
        assert not T.PG.any()
    else:
        assert T.PG.any()


def test_torchtitan_fp8_job_gathers_in_fp8_where_it_is_better():
    """torchtitan's FSDP2 float8 all-gather (2025-06): with pipeline parallelism FSDP keeps the
    gathered weights over the micro-batches (one gather a step), and gathering them in float8 (half the
    bytes, the amax all-reduce besides) wins; the search takes it and prices it as evaluate does."""
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    from clusterplan.planner.search.space import parse_bounds
    model = get_model("llama3-70b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    job = _job(framework="torchtitan", date="2025-06")
    found = {fix: plan(model, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=parse_bounds(fix)))
             for fix in (("pp=4",), ("pp=4", "param_gather=bf16"), ("pp=4", "param_gather=fp8"))}
    best = found[("pp=4",)].best
    assert best.layout.param_gather == "fp8"
    assert best.step_time_s < found[("pp=4", "param_gather=bf16")].best.step_time_s
    assert best.step_time_s == pytest.approx(found[("pp=4", "param_gather=fp8")].best.step_time_s)
    assert evaluate(model, job, cluster, best.layout).step_time_s == pytest.approx(best.step_time_s)
    assert objective_seconds(found[("pp=4",)].objective_units[0]) == pytest.approx(best.step_time_s, rel=1e-3)


def test_megatron_mxfp8_job_keeps_bf16_gathers_that_cost_memory():
    """Megatron's MXFP8 params keep a row- and a column-wise copy (2 x 1.03 B a weight): faster to
    gather, more memory than the bf16 params; the search does not take them, and plans as with bf16 held."""
    from clusterplan.planner.search import SearchOptions, plan
    from clusterplan.planner.search.space import parse_bounds
    cluster = build_cluster("gb200-nvl72", num_devices=72)
    job = _job(precision="mxfp8")
    offered, held = (plan(M, job, cluster, SearchOptions(engine="cpsat", top_k=2, bounds=parse_bounds(fix)))
                     for fix in ((), ("param_gather=bf16",)))
    assert [e.layout for e in [offered.best, *offered.runners_up]] == [e.layout for e in [held.best, *held.runners_up]]
    assert offered.objective_units == held.objective_units
    layout = offered.best.layout
    if layout.zero_stage >= 1 and layout.dp > 1:
        fp8 = evaluate(M, job, cluster, layout.with_(param_gather="fp8"))
        assert fp8.memory.fit_bytes > offered.best.memory.fit_bytes


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_with_fp8_gathers_offered(seed):
    """Unfixed, an FP8 job's search (the gathers' dtype chosen in the tables): CP-SAT equals the
    exhaustive enumerator, and the winner's step time is what evaluate prices for the decoded layout."""
    from test_search import _check_engines_agree, random_instance
    from clusterplan.models.errors import InfeasibleError
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    model, job, cluster, bounds = random_instance(7100 + seed)
    if not cluster.device.supports("fp8"):
        cluster = build_cluster("dgx-h100-superpod", num_devices=cluster.num_devices)
    job = Job(global_batch_size=job.global_batch_size, seq_len=job.seq_len, precision="fp8")
    _check_engines_agree(model, job, cluster, bounds)
    try:
        res = plan(model, job, cluster, SearchOptions(engine="cpsat", top_k=2, bounds=bounds))
    except (InfeasibleError, SpecError):
        return
    for units, ev in zip(res.objective_units, [res.best, *res.runners_up]):
        assert objective_seconds(units) == pytest.approx(ev.step_time_s, rel=1e-3)
        assert evaluate(model, job, cluster, ev.layout).step_time_s == pytest.approx(ev.step_time_s)
