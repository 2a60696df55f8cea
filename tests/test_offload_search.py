"""Host offload of the layer inputs (``offload=activations``, MaxText's custom remat policy) as a
knob ``plan`` searches and ``fit`` counts: offered where the framework and the device have it, chosen
where a layout does not fit without it, and priced alike by both engines."""

from __future__ import annotations

import pytest

from clusterplan.cost.layout import Job
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import InfeasibleError, SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, objective_seconds, plan
from clusterplan.planner.search.space import Bounds, build_space, parse_bounds, split_spaces
from clusterplan.topologies.library import build_cluster
from tests.test_search import _check_engines_agree

RECIPE = Job(global_batch_size=32, seq_len=8192, framework="maxtext")  # 4 sequences per v6e chip


def _v6e8():
    return build_cluster("tpu-v6e-pod", num_devices=8)


def test_search_offloads_where_the_layout_does_not_fit_without_it():
    """fsdp over 8 v6e chips at 4 sequences each: 34 GiB with the layer inputs on the chip, so the
    search offloads them; the searched step is what evaluate prices (no exposed transfer)."""
    model, cluster = get_model("llama3-8b"), _v6e8()
    bounds = parse_bounds(("dp=8,mbs=4",))
    res = plan(model, RECIPE, cluster, SearchOptions(bounds=bounds))
    assert res.best.layout.offload == "activations" and res.best.layout.recompute == "full"
    assert "offload=activations" in res.best.layout.short()
    assert res.best.time.offload_s == 0.0
    assert objective_seconds(res.objective_units[0]) == pytest.approx(res.best.step_time_s, rel=1e-3)
    on_device = evaluate(model, RECIPE, cluster, res.best.layout.with_(offload="none"))
    assert not on_device.fits
    with pytest.raises(InfeasibleError):  # without offload nothing fits at that layout
        plan(model, RECIPE, cluster, SearchOptions(bounds=parse_bounds(("dp=8,mbs=4,offload=none",))))


def test_search_does_not_offload_where_it_is_not_needed():
    """Where a layout fits on the chip at the same step time, no offload (a tie goes to none)."""
    res = plan(get_model("llama3-8b"), Job(global_batch_size=24, seq_len=8192, framework="maxtext"), _v6e8(),
               SearchOptions(bounds=parse_bounds(("dp=8,mbs=3",))))
    assert res.best.layout.offload == "none"


@pytest.mark.parametrize("framework,cluster", [("maxtext", "dgx-h100-superpod"), ("megatron", "tpu-v6e-pod"),
                                               ("megatron", "dgx-h100-superpod")])
def test_offload_is_not_offered_without_the_framework_or_a_host_tier(framework, cluster):
    job = Job(global_batch_size=32, seq_len=4096, framework=framework)
    try:
        space = build_space(get_model("llama3-8b"), job, build_cluster(cluster, num_devices=8))
    except SpecError:  # the framework does not run on that device at all
        return
    assert space.offload == ("none",)
    with pytest.raises(SpecError, match="offload"):
        build_space(get_model("llama3-8b"), job, build_cluster(cluster, num_devices=8),
                    parse_bounds(("offload=activations",)))


def test_offloaded_spaces_recompute_fully_and_keep_only_hidden_transfers():
    model, cluster = get_model("llama3-8b"), _v6e8()
    space = build_space(model, RECIPE, cluster)
    assert space.offload == ("none", "activations")
    subs = split_spaces(space, model, RECIPE, cluster)
    off = [s for s in subs if s.offload == ("activations",)]
    assert off and all(s.recompute == ("full",) for s in off)
    assert {s.offload for s in subs} == {("none",), ("activations",)}


def test_engines_agree_with_offload_on_v6e():
    """CP-SAT equals the exhaustive search on a v6e job where offload decides what fits."""
    model = get_model("llama3-8b").model_copy(update={"num_layers": 8})
    job = Job(global_batch_size=32, seq_len=8192, framework="maxtext")
    bounds = Bounds(fixed={"pp": 1, "micro_batch_size": 4, "order": "tp-cp-dp-pp"})
    _check_engines_agree(model, job, _v6e8(), bounds)
    _check_engines_agree(get_model("llama3-8b"), job, _v6e8(), bounds)
