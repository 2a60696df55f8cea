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
