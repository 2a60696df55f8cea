"""CUDA graph scope (``Layout.cuda_graph``, issue 38 item 5): parsed and printed only where set,
priced as the graph-node share of the per-kernel launch cost, refused where the framework (at the
job's release) or the device has no such graphs."""

import dataclasses

import pytest

from clusterplan.cost.compute import GRAPH_NODE_SHARE
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.topologies.library import build_cluster

MODEL = get_model("llama3-8b")
CLUSTER = build_cluster("dgx-h100-superpod", num_devices=8)
JOB = Job(global_batch_size=8, seq_len=2048, framework="megatron")


def test_parse_print_and_default_unwritten():
    layout = parse_layout("dp=8,cuda_graph=layer")
    assert layout.cuda_graph == "layer" and "cuda_graph=layer" in layout.short()
    assert "cuda_graph" not in Layout(dp=8).short() and "cuda_graph" not in Layout(dp=8).as_dict()
    assert Layout.from_dict(layout.as_dict()) == layout
    with pytest.raises(SpecError, match="layout.cuda_graph: got 'iteration'; allowed: none, layer, full"):
        parse_layout("cuda_graph=iteration")


def test_graphs_save_the_node_share_of_every_kernel_launch():
    """Compute time is linear in the per-kernel cost: a graph keeps GRAPH_NODE_SHARE of what the
    launches cost, measured against the same device with no launch cost at all."""
    layout = Layout(dp=8, micro_batch_size=1)
    free = dataclasses.replace(CLUSTER, device=CLUSTER.device.model_copy(update={"kernel_overhead_s": 0.0}))
    eager = evaluate(MODEL, JOB, CLUSTER, layout).time.compute_s
    graphed = evaluate(MODEL, JOB, CLUSTER, layout.with_(cuda_graph="layer")).time.compute_s
    bare = evaluate(MODEL, JOB, free, layout).time.compute_s
    assert eager > graphed > bare
    assert graphed - bare == pytest.approx(GRAPH_NODE_SHARE * (eager - bare), rel=1e-9)
    assert evaluate(MODEL, JOB, CLUSTER, layout.with_(cuda_graph="full")).step_time_s < evaluate(
        MODEL, JOB, CLUSTER, layout).step_time_s


@pytest.mark.parametrize("framework, date, text, needle", [
    ("megatron", "", "dp=8,recompute=full,cuda_graph=layer", "per-layer CUDA graphs refuse full recomputation"),
    ("megatron", "2024-06", "dp=8,cuda_graph=layer", "it does from 2024-09 on"),
    ("megatron", "2025-06", "dp=8,cuda_graph=full", "it does from 2025-08 on"),
    ("torchtitan", "", "dp=8,cuda_graph=layer", "it does in no release"),
    ("torchtitan", "", "dp=4,pp=2,cuda_graph=full", "CUDA graphs refuse pipeline parallelism"),
    ("deepspeed", "", "dp=8,cuda_graph=full", "deepspeed"),
])
def test_refused_where_the_framework_lacks_it(framework, date, text, needle):
    job = Job(global_batch_size=8, seq_len=2048, framework=framework, framework_date=date)
    messages = [m for _, m in layout_problems(MODEL, job, CLUSTER, parse_layout(text, 8))]
    assert any(needle in m for m in messages), messages


def test_allowed_where_the_framework_has_it():
    for framework, text in (("megatron", "dp=8,recompute=full,cuda_graph=full"), ("megatron", "dp=8,cuda_graph=layer"),
                            ("torchtitan", "dp=8,zero=3,cuda_graph=full")):
        job = Job(global_batch_size=8, seq_len=2048, framework=framework)
        assert layout_problems(MODEL, job, CLUSTER, parse_layout(text, 8)) == []


def test_refused_off_cuda():
    amd = build_cluster("mi300x-cluster", num_devices=8)
    messages = [m for _, m in layout_problems(MODEL, JOB, amd, parse_layout("dp=8,cuda_graph=full", 8))]
    assert any("CUDA graphs run on NVIDIA GPUs only" in m for m in messages), messages


def _doc(case: str, fmt: str) -> dict:
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "launchers"))
    import launcher_cases
    return launcher_cases.plan_doc(launcher_cases.CASES[case][0], fmt)


def test_exports_write_the_frameworks_own_settings():
    from clusterplan.planner.report.export import export
    full = _doc("llama3-8b-cuda-graph-full", "megatron")
    assert full["layout"]["cuda_graph"] == "full"
    text = export(full, "megatron")
    assert "--cuda-graph-impl full_iteration" in text and "--no-check-for-nan-in-loss-and-grad" in text
    layer = export(_doc("llama3-8b-cuda-graph-layer", "megatron"), "megatron")
    assert "--cuda-graph-impl transformer_engine" in layer and "--no-check-for-nan" not in layer
    plain = _doc("llama3-8b-h100x64", "megatron")  # the search graphs each layer where Megatron-Core can
    assert plain["layout"]["cuda_graph"] == "layer" and "--cuda-graph-impl transformer_engine" in export(plain, "megatron")
    del plain["layout"]["cuda_graph"]
    assert "--cuda-graph-impl" not in export(plain, "megatron")
    assert "disable_cuda_graphs = False" in export(_doc("llama3-8b-cuda-graph-full", "torchtitan"), "torchtitan")
    titan = _doc("llama3-8b-h100x64", "torchtitan")  # torchtitan 0.3 graphs by default; the search keeps it
    assert titan["layout"]["cuda_graph"] == "full" and "disable_cuda_graphs = False" in export(titan, "torchtitan")
    # a plan priced without graphs launches without them (torchtitan 0.3 would capture them by default)
    del titan["layout"]["cuda_graph"]
    assert "disable_cuda_graphs = True" in export(titan, "torchtitan")
    deepspeed = _doc("llama3-8b-h100x64", "deepspeed")
    deepspeed["layout"]["cuda_graph"] = "full"
    with pytest.raises(SpecError, match="cuda_graph=full"):
        export(deepspeed, "deepspeed")


def test_each_job_keeps_its_own_batch():
    """Contexts that differ only in the global batch compare equal (they share every term): the graphed
    problem must still be the caller's job, not the first one graphed (validate's sweeps caught it)."""
    layout = Layout(dp=8, cuda_graph="layer")
    for gbs in (8, 64, 16):
        job = Job(global_batch_size=gbs, seq_len=2048, framework="megatron")
        graphed, eager = evaluate(MODEL, job, CLUSTER, layout), evaluate(MODEL, job, CLUSTER, layout.with_(cuda_graph="none"))
        assert graphed.num_microbatches == eager.num_microbatches == gbs // 8
        assert graphed.step_time_s < eager.step_time_s


def test_explain_prices_the_graphs_where_set():
    from clusterplan.planner.explain import sensitivities
    layout = Layout(dp=8, cuda_graph="full")
    best = evaluate(MODEL, JOB, CLUSTER, layout)
    rows = {r["move"]: r for r in sensitivities(MODEL, JOB, CLUSTER, best)}
    eager = evaluate(MODEL, JOB, CLUSTER, layout.with_(cuda_graph="none"))
    assert rows["cuda_graph none"]["step_time_s"] == eager.step_time_s and rows["cuda_graph none"]["delta"] > 0
    assert "cuda_graph none" not in {r["move"] for r in sensitivities(MODEL, JOB, CLUSTER, eager)}


def _plan(job, cluster=CLUSTER, fixed=None, engine="cpsat"):
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds
    return plan(MODEL, job, cluster, SearchOptions(engine=engine, top_k=1, bounds=Bounds(fixed or {}, {}, {}, 0.1)))


@pytest.mark.parametrize("framework,date,fixed,scope", [
    ("megatron", "", {}, "layer"),  # per-layer first: full iteration drops the NaN check
    ("megatron", "", {"recompute": "full"}, "full"),  # per-layer graphs refuse full recompute
    ("megatron", "2025-06", {"recompute": "full"}, "none"),  # before full-iteration graphs
    ("megatron", "2024-06", {}, "none"),  # before per-layer graphs
    ("torchtitan", "", {}, "full"),  # 0.3's trainer graphs each micro-batch by default
    ("torchtitan", "", {"pp": 2}, "none"),  # and refuses pipeline parallelism
    ("megatron", "", {"cuda_graph": "none"}, "none"),
])
def test_the_search_graphs_what_the_framework_graphs_at_its_date(framework, date, fixed, scope):
    """The search gives each layout the graph scope its framework runs (the profile's features and
    rules at the job's release), prices it as evaluate does, and CP-SAT agrees with the enumerator."""
    from clusterplan.planner.search.space import Bounds
    from tests.test_search import _check_engines_agree
    job = dataclasses.replace(JOB, framework=framework, **({"framework_date": date} if date else {}))
    res = _plan(job, fixed=fixed)
    assert res.best.layout.cuda_graph == scope and all(r.layout.cuda_graph == scope for r in res.runners_up)
    assert res.best.step_time_s == evaluate(MODEL, job, CLUSTER, res.best.layout).step_time_s
    _check_engines_agree(MODEL, job, CLUSTER, Bounds(fixed, {}, {"pp": 2}, 0.1))


def test_a_graphed_plan_is_faster_than_the_best_eager_one_and_amd_plans_stay_eager():
    graphed, eager = _plan(JOB), _plan(JOB, fixed={"cuda_graph": "none"})
    assert graphed.best.step_time_s < eager.best.step_time_s
    amd = build_cluster("mi300x-cluster", num_devices=8)
    assert _plan(JOB, amd).best.layout.cuda_graph == "none"
    with pytest.raises(SpecError, match="--fix cuda_graph=full: CUDA graphs run on NVIDIA GPUs only"):
        _plan(JOB, amd, {"cuda_graph": "full"})


def test_graph_spaces_cut_the_space_by_the_rules_without_overlap():
    """torchtitan 0.3 graphs pp = 1 and ep = 1 only: the graphed part holds those, the eager parts
    the rest, and together they hold every factorization and expert degree once."""
    from clusterplan.planner.search.graphs import graph_spaces
    from clusterplan.planner.search.space import Bounds, build_space
    moe = get_model("mixtral-8x7b")
    job = dataclasses.replace(JOB, framework="torchtitan", global_batch_size=64)
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    space = build_space(moe, job, cluster, Bounds())
    parts = graph_spaces(space, job.profile)
    cells = [(s.cuda_graph, f, e) for s in parts for f in s.factorizations for e in s.ep]
    assert sorted((f, e) for _, f, e in cells) == sorted((f, e) for f in space.factorizations for e in set(space.ep))
    assert all((g == ("full",)) == (f[1] == 1 and e == 1) for g, f, e in cells)


@pytest.mark.parametrize("text", ["tp=2,pp=2,dp=2,vp=2,mbs=1,sp=on,tp_overlap=on,zero=1",
                                  "tp=1,pp=1,dp=8,mbs=2,zero=3", "tp=4,pp=2,dp=1,mbs=1,sp=on,recompute=selective",
                                  "tp=1,pp=1,dp=4,cp=2,mbs=1,zero=1"])
def test_graphs_are_never_slower_and_hold_no_more_memory(text):
    """What lets the search price a layout the framework may graph as graphed, without an eager
    twin: the scope lowers the per-kernel cost and every term is monotone in it."""
    layout = parse_layout(text, 8)
    eager = evaluate(MODEL, JOB, CLUSTER, layout)
    for scope in ("layer", "full"):
        graphed = evaluate(MODEL, JOB, CLUSTER, layout.with_(cuda_graph=scope))
        assert graphed.step_time_s < eager.step_time_s
        assert graphed.peak_memory_bytes == eager.peak_memory_bytes


def test_validate_prices_runs_eager_with_the_implicit_dispatcher_unless_published():
    """A published run is priced as it ran: the search's graphs and fused dispatchers are not
    assumed for a run that does not name them (a published dispatcher is held)."""
    from clusterplan.planner.studies.runs import _bounds
    plain = _bounds({"layout": {"tp": 1}}, JOB.profile)
    assert plain.fixed["cuda_graph"] == "none" and plain.fixed["moe_dispatcher"] == "auto"
    assert _bounds({"layout": {"moe_dispatcher": "deepep"}}, JOB.profile).fixed["moe_dispatcher"] == "deepep"


def test_a_fixed_scope_its_rules_refuse_with_every_layout_left_names_the_rule():
    with pytest.raises(SpecError, match="no layout left runs cuda_graph=layer: Megatron: per-layer CUDA graphs refuse "
                                        "full recomputation"):
        _plan(JOB, fixed={"cuda_graph": "layer", "recompute": "full"})


def test_explain_says_what_graphs_save_and_why_a_plan_runs_eager():
    from clusterplan.planner.explain import sensitivities
    graphed = _plan(JOB).best  # Megatron: per-layer graphs
    rows = {r["move"]: r for r in sensitivities(MODEL, JOB, CLUSTER, graphed)}
    assert rows["cuda_graph none"]["delta"] > 0 and rows["cuda_graph full"]["step_time_s"] == graphed.step_time_s
    titan = dataclasses.replace(JOB, framework="torchtitan")
    eager = _plan(titan, fixed={"pp": 2}).best
    rows = {r["move"]: r for r in sensitivities(MODEL, titan, CLUSTER, eager)}
    assert not rows["cuda_graph full"]["allowed"] and "refuse pipeline parallelism" in rows["cuda_graph full"]["reason"]
    pp1 = {r["move"]: r for r in sensitivities(MODEL, titan, CLUSTER, _plan(titan, fixed={"pp": 1}).best)}
    assert "cuda_graph full" not in pp1 and pp1["cuda_graph none"]["delta"] > 0


def test_megatron_graphs_only_the_attention_of_a_dropless_moe_model():
    """Megatron's per-layer graphs capture only the attention of a dropless MoE model (its experts'
    shapes change every step: MoE README, "CUDA Graph", --cuda-graph-modules attn): the MLP blocks keep
    the eager launch cost, so of what graphs save on a dense-shaped layer only the attention's share
    is saved; the search leaves the scope to --fix (planner.search.graphs.searched_scopes). With a
    capacity factor (static shapes) the whole layer is graphed. A full-iteration graph does not capture
    the dropless blocks: refused."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds

    mixtral = get_model("mixtral-8x7b")
    capped = mixtral.model_copy(update={"moe": mixtral.moe.model_copy(update={"capacity_factor": 1.0})})
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    job = Job(global_batch_size=16, seq_len=4096, framework="megatron")
    free = dataclasses.replace(cluster, device=cluster.device.model_copy(update={"kernel_overhead_s": 0.0}))
    layout = parse_layout("tp=2,pp=1,dp=8,ep=8,mbs=1,sp=on", 16)

    def saved(model) -> tuple[float, float]:  # what the graph saves, and all the launches cost
        eager = evaluate(model, job, cluster, layout).time.compute_s
        graphed = evaluate(model, job, cluster, layout.with_(cuda_graph="layer")).time.compute_s
        return eager - graphed, eager - evaluate(model, job, free, layout).time.compute_s
    dropless_saved, launches = saved(mixtral)
    capped_saved, capped_launches = saved(capped)
    assert capped_saved == pytest.approx((1 - GRAPH_NODE_SHARE) * capped_launches, rel=1e-9)
    assert 0 < dropless_saved < 0.6 * (1 - GRAPH_NODE_SHARE) * launches  # the attention's kernels only

    def best(model, fixed=None):
        opts = SearchOptions(top_k=0, bounds=Bounds(fixed or {}, {}, {}, 0.1))
        return plan(model, job, cluster, opts).best.layout.cuda_graph
    assert best(mixtral) == "none" and best(mixtral, {"cuda_graph": "layer"}) == "layer"
    assert best(capped) != "none"
    with pytest.raises(SpecError, match="cuda_graph=full: .* cannot capture a dropless MoE layer"):
        best(mixtral, {"cuda_graph": "full"})
    assert any(key == "cuda_graph" and "dropless" in msg for key, msg in
               layout_problems(mixtral, job, cluster, layout.with_(cuda_graph="full")))
    assert not layout_problems(capped, job, cluster, layout.with_(cuda_graph="full"))
