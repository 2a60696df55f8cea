"""Optimizer offload (``offload=optimizer``, ``activations+optimizer``) as a knob the search prices:
a space per mode (``planner.search.offload``) whose tables lack the optimizer states and hold the host
copies and the CPU Adam step, refuse what host memory cannot hold, and agree with ``evaluate`` and
between the engines."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from clusterplan.cli import main

from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate, host_offload_problem
from clusterplan.cost.terms import Context, host_optimizer_terms, optimizer_s, stage_slots
from clusterplan.models.errors import InfeasibleError, SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.inputs import Request
from clusterplan.planner.search import SearchOptions, objective_seconds, plan
from clusterplan.planner.search.offload import host_overflow
from clusterplan.planner.search.space import Bounds, build_space, expert_ok, split_spaces
from clusterplan.planner.search.tables import build_tables
from clusterplan.planner.studies.fit import layouts_fit, least_devices
from clusterplan.topologies.library import build_cluster
from test_search import _check_engines_agree  # tests/ is on the path, as for grids (test_ceilings.py)

RUN = CliRunner()
MODEL = get_model("llama3-8b")
HELD = Bounds(fixed={"offload": "optimizer"})


def _job(framework: str = "megatron", batch: int = 64) -> Job:
    return Job(global_batch_size=batch, seq_len=8192, framework=framework)


def _h100(n: int = 8):
    return build_cluster("dgx-h100-superpod", num_devices=n)


def _tight():
    """Llama 3 405B cut to 36 layers (118.7 B parameters) on 8 GB200: its optimizer states and fp32
    gradients are 237 GB a rank spread evenly, under Grace's 240 GB share, but over it on a pipeline
    stage that also holds the embedding (pp = 4): host memory decides which layouts the search keeps."""
    return get_model("llama3-405b").model_copy(update={"num_layers": 36}), build_cluster("gb200-nvl72", num_devices=8)


def test_offloaded_space_keeps_the_zero_stages_whose_copies_are_one_a_step():
    for framework, stages in (("megatron", (1, 2, 3)), ("deepspeed", (1, 3))):  # DeepSpeed ZeRO-2 accumulates on the host
        job = _job(framework)
        subs = split_spaces(build_space(MODEL, job, _h100(), HELD), MODEL, job, _h100())
        assert subs and all(s.offload == ("optimizer",) and s.zero_stage == stages and s.param_gather == ("bf16",)
                            for s in subs)


def test_fixed_zero_stage_the_search_cannot_price_is_refused_by_name():
    job = _job("deepspeed")
    with pytest.raises(SpecError, match="optimizer_offload_host_accumulation"):
        split_spaces(build_space(MODEL, job, _h100(), Bounds(fixed={"offload": "optimizer", "zero_stage": 2})),
                     MODEL, job, _h100())
    with pytest.raises(SpecError, match="needs a sharded optimizer"):
        split_spaces(build_space(MODEL, job, _h100(), Bounds(fixed={"offload": "optimizer", "zero_stage": 0})),
                     MODEL, job, _h100())


def test_tables_drop_the_states_and_price_the_host_step():
    """The offloaded space's optimizer table is ``optimizer_s`` of the offloaded layout (its copies and
    CPU Adam, all exposed), and its static memory is the one without the states."""
    job, cluster = _job(), _h100()
    sub = split_spaces(build_space(MODEL, job, cluster, HELD), MODEL, job, cluster)[0]
    ctx = Context(MODEL, job, cluster)
    T = build_tables(ctx, sub)
    plain = build_tables(ctx, split_spaces(build_space(MODEL, job, cluster, Bounds(fixed={"offload": "none"})),
                                           MODEL, job, cluster)[0])
    i = sub.factorizations.index((1, 1, 8, 1))
    zi, zp = sub.zero_stage.index(1), plain.space.zero_stage.index(1)
    lay = Layout(tp=1, pp=1, dp=8, zero_stage=1, offload="optimizer")
    assert T.OPT[i, 0, 0, zi] == round(optimizer_s(ctx, lay) / 1e-7) == round(sum(host_optimizer_terms(ctx, lay)) / 1e-7)
    assert all(host_optimizer_terms(ctx, lay))
    j = plain.space.factorizations.index((1, 1, 8, 1))
    rows, plain_rows = ({r.name: r for r in t.rows} for t in (T, plain))
    name = next(n for n in rows if n in plain_rows)
    assert rows[name].static[i, 0, 0, zi] < plain_rows[name].static[j, 0, 0, zp]


def test_plan_with_optimizer_offload_held_reports_what_evaluate_prices():
    res = plan(MODEL, _job(), _h100(), SearchOptions(bounds=HELD, top_k=2))
    for units, ev in zip(res.objective_units, [res.best, *res.runners_up]):
        assert ev.layout.offload == "optimizer" and ev.fits
        again = evaluate(MODEL, _job(), _h100(), ev.layout)
        assert again.step_time_s == ev.step_time_s and again.time.optimizer_s == ev.time.optimizer_s > 0
        assert objective_seconds(units) == pytest.approx(ev.step_time_s, rel=1e-3)
        assert again.memory.optimizer_bytes == 0


def test_host_rule_is_evaluates_check_on_every_cell():
    """``host_overflow`` marks exactly the cells ``cost.step.host_offload_problem`` refuses."""
    model, cluster = _tight()
    job = Job(global_batch_size=16, seq_len=4096, framework="megatron")
    ctx = Context(model, job, cluster)
    for sub in split_spaces(build_space(model, job, cluster, HELD), model, job, cluster):
        over = host_overflow(ctx, sub)
        seen = set()
        for (i, (tp, pp, dp, cp)), (vi, v), (zi, z) in itertools.product(
                enumerate(sub.factorizations), enumerate(sub.vp), enumerate(sub.zero_stage)):
            hs = sub.head_slots[0] and pp > 1
            if pp * v > stage_slots(model.num_layers, pp, hs) or (v > 1 and pp == 1) or expert_ok(
                    model, tp, dp, cp, 1, True, job.profile):
                continue
            lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, vp=v, zero_stage=z, head_slots=hs, offload="optimizer")
            assert over[i, vi, 0, zi] == (host_offload_problem(ctx, lay) is not None)
            seen.add(bool(over[i, vi, 0, zi]))
        assert seen == {True, False}  # the instance has both


def test_engines_agree_with_optimizer_offload():
    """CP-SAT equals the exhaustive search (and every answer passes evaluate's checks) where the
    optimizer is offloaded, held by --fix or offered beside the layouts without it, and where host
    memory rules some layouts out."""
    small = MODEL.model_copy(update={"num_layers": 8})
    _check_engines_agree(small, _job(batch=32), _h100(), HELD)
    _check_engines_agree(small, _job("deepspeed", 32), _h100(), Bounds(offer_offload=True, fixed={"pp": 1}))
    model, cluster = _tight()
    job = Job(global_batch_size=16, seq_len=4096, framework="megatron")
    _check_engines_agree(model, job, cluster, Bounds(fixed={"offload": "optimizer", "tp": 2, "micro_batch_size": 1}))


def test_host_memory_rules_out_what_it_cannot_hold():
    """Llama 3 405B on 8 H100: 810 GB of states a rank against 256 GB of host memory, so no layout."""
    job = Job(global_batch_size=8, seq_len=8192, framework="megatron")
    sub = split_spaces(build_space(get_model("llama3-405b"), job, _h100(), HELD), get_model("llama3-405b"), job,
                       _h100())[0]
    over = host_overflow(Context(get_model("llama3-405b"), job, _h100()), sub)
    assert over[np.array([f[1] == 1 for f in sub.factorizations]), 0].all()
    with pytest.raises(InfeasibleError):
        plan(get_model("llama3-405b"), job, _h100(), SearchOptions(bounds=Bounds(fixed={"offload": "optimizer",
                                                                                        "pp": 1})))


def test_engines_agree_with_both_offloads_where_host_memory_binds():
    """Megatron-Core offloads the activations (pp = 1, no recomputation) and the optimizer together on
    GB200: host memory holds the activations in flight and the states (Llama 3 405B cut to 30 layers,
    99.6 B parameters: 199 GB of states a rank over 8), so the larger micro-batches are out. Each
    micro-batch size and sp is a space of its own, so the rule is exact at each."""
    model, cluster = get_model("llama3-405b").model_copy(update={"num_layers": 30}), build_cluster("gb200-nvl72", num_devices=8)
    job, bounds = Job(global_batch_size=16, seq_len=4096, framework="megatron"), Bounds(fixed={"offload": "activations+optimizer"})
    subs = split_spaces(build_space(model, job, cluster, bounds), model, job, cluster)
    assert all(s.offload == ("activations+optimizer",) and s.recompute == ("none",) and 0 not in s.zero_stage
               and len(s.micro_batch_size) == len(s.sequence_parallel) == 1 for s in subs)
    over = {s.micro_batch_size[0]: host_overflow(Context(model, job, cluster), s).any() for s in subs}
    assert True in over.values() and False in over.values()
    _check_engines_agree(model, job, cluster, bounds)
    best = plan(model, job, cluster, SearchOptions(bounds=bounds)).best
    assert best.layout.offload == "activations+optimizer" and best.time.offload_s == 0.0


@pytest.mark.parametrize("cluster", ["gb200-nvl72", "dgx-h200-superpod"])
def test_fit_counts_optimizer_offload_for_llama3_405b(cluster):
    """Grace memory over NVLink-C2C (GB200) and DDR5 over PCIe (DGX H200) hold the states: fewer
    devices fit with the optimizer offloaded, and at that count nothing fits without it."""
    out = RUN.invoke(main, ["fit", "--model", "llama3-405b", "--cluster", cluster, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    n, m = doc["num_devices"], doc["num_devices_with_offload"]
    assert m < n and doc["offload_mode"] == "optimizer"
    request = Request(model="llama3-405b", cluster=cluster)
    reference = request.load_cluster()
    job = request.build_job(get_model("llama3-405b"), reference)[0]
    assert least_devices(get_model("llama3-405b"), job, reference, Bounds(offer_offload=True)) <= m < \
        least_devices(get_model("llama3-405b"), job, reference)
    there = build_cluster(cluster, num_devices=m)
    job = request.build_job(get_model("llama3-405b"), there)[0]
    assert layouts_fit(get_model("llama3-405b"), job, there, Bounds(fixed={"offload": "optimizer"}))
    assert not layouts_fit(get_model("llama3-405b"), job, there, Bounds(fixed={"offload": "none"}))
    text = RUN.invoke(main, ["fit", "--model", "llama3-405b", "--cluster", cluster]).output
    assert f"fewest devices: {n}; with host offload: {m} (offload=optimizer: Megatron-Core --optimizer-cpu-offload" in text


def test_a_plan_host_memory_refuses_says_so():
    """Where every layout the bounds leave fits the device but offloads more than the host's share
    (the 36-layer cut at pp = 4, whose first stage holds the embedding), the error names host memory,
    not a device shortfall."""
    model, cluster = _tight()
    job = Job(global_batch_size=16, seq_len=4096, framework="megatron")
    with pytest.raises(InfeasibleError) as err:
        plan(model, job, cluster, SearchOptions(bounds=Bounds(fixed={"offload": "optimizer", "pp": 4, "tp": 2})))
    assert "host memory" in str(err.value) and "240.0 GB per device" in str(err.value)
    assert "GiB per device" not in str(err.value) and "more devices" in err.value.hint
