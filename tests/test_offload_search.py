"""Host offload of the layer inputs (``offload=activations``, MaxText's custom remat policy) as a
knob ``plan`` searches and ``fit`` counts: offered where the framework and the device have it, chosen
where a layout does not fit without it, and priced alike by both engines."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from clusterplan.cli import main

from clusterplan.cost.layout import Job
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import InfeasibleError, SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, objective_seconds, plan
from clusterplan.planner.search.space import Bounds, build_space, parse_bounds, split_spaces
from clusterplan.topologies.library import build_cluster
from clusterplan.planner.studies.fit import layouts_fit
from test_search import _check_engines_agree  # tests/ is on the path, as for grids (test_ceilings.py)

RUN = CliRunner()

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


@pytest.mark.parametrize("framework,cluster", [("maxtext", "dgx-a100-superpod"), ("nanotron", "tpu-v6e-pod"),
                                               ("megatron", "dgx-a100-superpod"), ("torchtitan", "dgx-h100-superpod")])
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


def test_fit_prints_the_fewest_devices_with_and_without_offload():
    """Llama 3 8B at 64 sequences on v6e, no memory held free: offloading the layer inputs lowers the
    fewest chips; the answer without offload is the one planned (num_devices), the other is beside it.
    (MaxText's default headroom, 4.5%, leaves 4 chips out with offload too.)"""
    args = ["fit", "--model", "llama3-8b", "--cluster", "tpu-v6e-pod", "--global-batch", "64", "--memory-headroom", "0"]
    out = RUN.invoke(main, [*args, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["num_devices_with_offload"] < doc["num_devices"]
    text = RUN.invoke(main, args)
    assert (f"fewest devices: {doc['num_devices']}; with host offload: {doc['num_devices_with_offload']}"
            in text.output)
    # with offload held off, no layout fits on the smaller count
    cluster = build_cluster("tpu-v6e-pod", num_devices=doc["num_devices_with_offload"])
    job = Job(global_batch_size=64, seq_len=8192, framework="maxtext")
    assert layouts_fit(get_model("llama3-8b"), job, cluster, Bounds(memory_headroom=0.0))
    assert not layouts_fit(get_model("llama3-8b"), job, cluster, Bounds(fixed={"offload": "none"}, memory_headroom=0.0))


def test_fit_of_llama3_405b_on_v6e_names_both_answers():
    out = RUN.invoke(main, ["fit", "--model", "llama3-405b", "--cluster", "tpu-v6e-pod"])
    assert out.exit_code == 0, out.output
    assert re.search(r"fewest devices: [\d,]+; with host offload: [\d,]+", out.output)


def test_fit_says_why_offload_is_not_offered_on_gpu():
    out = RUN.invoke(main, ["fit", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--framework",
                            "torchtitan", "--json"])
    doc = json.loads(out.output)
    assert doc["num_devices_with_offload"] is None and "not offered" in doc["offload_note"]


def test_maxtext_export_writes_the_custom_policy_that_offloads_the_layer_input():
    """base.yml (MaxText 0.2.5): remat_policy 'custom', decoder_layer_input 'offload'; the other
    named tensors default to 'remat' (full recomputation from the offloaded input)."""
    args = ["export", "--format", "maxtext", "--model", "llama3-8b", "--cluster", "tpu-v6e-pod", "--devices", "8",
            "--global-batch", "32", "--seq-len", "8192", "--fix"]
    lines = RUN.invoke(main, [*args, "dp=8,mbs=4"]).output.splitlines()
    assert "remat_policy=custom" in lines and "decoder_layer_input=offload" in lines
    plain = RUN.invoke(main, [*args, "dp=8,mbs=1"]).output.splitlines()
    assert "remat_policy=full" in plain and not any(line.startswith("decoder_layer_input") for line in plain)


def test_fixed_offload_with_another_recompute_is_refused_by_name():
    out = RUN.invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "tpu-v6e-pod", "--devices", "8",
                            "--fix", "offload=activations,recompute=selective"])
    assert out.exit_code == 2 and "needs recompute=full" in out.output and "Traceback" not in out.output
    out = RUN.invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "tpu-v6e-pod", "--devices", "8",
                            "--min", "offload=none"])
    assert out.exit_code == 2 and "use --fix" in out.output
