"""Hybrid sharded data parallelism (issue 38 item 2, ``dp_shard=N``): ZeRO shards over N data-parallel
ranks, dp/N replicas all-reduce the shards' gradients once a step."""

from __future__ import annotations

import json

import pytest

from clusterplan.cost import collectives as coll
from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import Context, dp_terms, param_counts
from clusterplan.models.errors import SpecError
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.report.export import export


def _eval(layout: str, framework: str = "torchtitan", cluster: str = "dgx-h100-superpod", devices: int = 64,
          model: str = "llama3-8b", **job):
    job = Job(global_batch_size=devices, seq_len=4096, framework=framework, **job)
    return evaluate(load_model(model), job, load_cluster(cluster, num_devices=devices), parse_layout(layout, devices))


def _problems(layout: str, framework: str, devices: int = 64, **job) -> list[str]:
    job = Job(global_batch_size=devices, seq_len=4096, framework=framework, **job)
    return [msg for _, msg in layout_problems(load_model("llama3-8b"), job,
                                              load_cluster("dgx-h100-superpod", num_devices=devices),
                                              parse_layout(layout, devices))]


def test_layout_text_round_trips_and_default_is_unwritten():
    lay = parse_layout("dp=64,zero=3,dp_shard=8", 64)
    assert lay.dp_shard == 8 and "dp_shard=8" in lay.short()
    assert "dp_shard" not in parse_layout("dp=64,zero=3", 64).short()
    with pytest.raises(SpecError, match=r"layout.dp_shard: got 'x'"):
        parse_layout("dp=64,dp_shard=x", 64)


def test_states_shard_over_the_group_and_the_replicas_all_reduce_across_nodes():
    """torchtitan HSDP: FSDP over the 8 GPUs of a node, 8 replicas over the scale-out fabric."""
    full, hybrid = _eval("dp=64,zero=3"), _eval("dp=64,zero=3,dp_shard=8")
    assert hybrid.memory.optimizer_bytes == pytest.approx(8 * full.memory.optimizer_bytes)
    assert hybrid.memory.gradients_bytes == pytest.approx(8 * full.memory.gradients_bytes)
    assert _eval("dp=64,zero=3,dp_shard=64").step_time_s == full.step_time_s
    # the per-step all-reduce: 1/8 of the fp32 gradients over ranks 8 apart (one per node)
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=64)
    job = Job(global_batch_size=64, seq_len=4096, framework="torchtitan")
    ctx = Context(model, job, cluster)
    t = dp_terms(ctx, parse_layout("dp=64,zero=3,dp_shard=8", 64))
    pc = param_counts(model, 1, 1, 1, 1, True, False)
    across = coll.all_reduce_s(4 * (pc.dense + pc.expert) / 8, cluster.strided_profile(8, 8))
    assert t.per_step_s == pytest.approx(across) and across > 0
    assert dp_terms(ctx, parse_layout("dp=64,zero=3", 64)).per_step_s == 0.0


def test_maxtext_default_is_dp_shard_of_one_slice_and_across_domains_is_all_ranks():
    """MaxText's base.yml default (fsdp on ICI, data on DCN) is dp_shard = the ranks of one slice;
    shard_across_domains=on (dcn_fsdp) is dp_shard = dp: the same figures either way."""
    run = dict(framework="maxtext", cluster="tpu-v6e-pod", devices=512)
    default, one_slice = _eval("dp=512,zero=3", **run), _eval("dp=512,zero=3,dp_shard=256", **run)
    assert (default.step_time_s, default.memory.total_bytes) == (one_slice.step_time_s, one_slice.memory.total_bytes)
    across, every = _eval("dp=512,zero=3,shard_across_domains=on", **run), _eval("dp=512,zero=3,dp_shard=512", **run)
    assert (across.step_time_s, across.memory.total_bytes) == (every.step_time_s, every.memory.total_bytes)
    assert default.memory.optimizer_bytes == pytest.approx(2 * every.memory.optimizer_bytes)


def test_megatron_partial_distributed_optimizer_shards_the_optimizer_only():
    """--num-distributed-optimizer-instances 8 (dp_shard=8 of 64): optimizer states /8, grads whole."""
    full, partial = _eval("dp=64,zero=1", "megatron"), _eval("dp=64,zero=1,dp_shard=8", "megatron")
    assert partial.memory.optimizer_bytes == pytest.approx(8 * full.memory.optimizer_bytes)
    assert partial.memory.gradients_bytes == full.memory.gradients_bytes


@pytest.mark.parametrize("layout, framework, job, expected", [
    ("dp=64,zero=3,dp_shard=7", "torchtitan", {}, "dp_shard=7: must divide dp=64"),
    ("dp=64,zero=3,dp_shard=1", "torchtitan", {}, "be at least 2"),
    ("dp=32,cp=2,zero=3,dp_shard=8", "torchtitan", {}, "cp=1 and ep=1 only"),
    ("dp=64,zero=3,dp_shard=8", "megatron", {}, "shards hybrid with zero 1 only"),
    ("dp=64,zero=1,dp_shard=8", "nanotron", {}, "has no hybrid sharded data parallelism (it has it in no release)"),
    ("dp=64,zero=3,dp_shard=8", "torchtitan", {"framework_date": "2024-08"}, "(it has it since 2024-09)"),
])
def test_refusals_name_the_knob_and_what_is_allowed(layout, framework, job, expected):
    assert any(expected in msg for msg in _problems(layout, framework, **job))


def _doc(layout: str, framework: str) -> dict:
    from clusterplan import cli
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--global-batch", "128",
            "--framework", framework]
    with cli.evaluate_command.make_context("evaluate", [*args, "--layout", layout]) as ctx:
        params = {k: v for k, v in ctx.params.items() if k not in ("as_json", "layout_text")}
        doc, _, _ = cli.evaluate_request(cli._request(**params), layout)
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize("fmt, framework, layout, expected", [
    ("torchtitan", "torchtitan", "dp=64,mbs=2,zero=3,dp_shard=8",
     ["data_parallel_replicate_degree = 8", "data_parallel_shard_degree = 8"]),
    ("maxtext", "maxtext", "dp=64,mbs=2,zero=3,dp_shard=16", ["ici_fsdp_parallelism=8", "dcn_fsdp_parallelism=2",
                                                               "dcn_data_parallelism=4"]),
    ("megatron", "megatron", "dp=64,mbs=2,zero=1,dp_shard=8", ["--num-distributed-optimizer-instances 8"]),
])
def test_exports_write_the_launchers_hybrid_sharding(fmt, framework, layout, expected):
    text = export(_doc(layout, framework), fmt)
    assert all(e in text for e in expected), text


def test_export_refuses_hybrid_sharding_the_launcher_lacks():
    """A plan document (edited by hand: the profile refuses the pair) with dp_shard under a ZeRO stage
    the launcher's hybrid sharding does not run with is refused, not exported without it."""
    doc = _doc("dp=64,mbs=2,zero=1,dp_shard=8", "megatron")
    doc["layout"]["zero_stage"] = 3
    with pytest.raises(SpecError, match=r"--format megatron: dp_shard=8 with zero=3: its hybrid sharding runs with zero 1 only"):
        export(doc, "megatron")


def test_deepspeed_export_refuses_mics_its_pinned_release_removed():
    with pytest.raises(SpecError, match=r"--format deepspeed: dp_shard=8: DeepSpeed's hybrid sharding \(MiCS"):
        export(_doc("dp=64,mbs=2,zero=3,dp_shard=8", "deepspeed"), "deepspeed")


def _run(**layout) -> dict:
    """A torchtitan run of a 7B Llama on 64 A100s with its layout published (the format of
    planner/data/RUNS_FORMAT.md); the measured figure only has to be a valid one."""
    return {"id": "hsdp-probe", "framework": {"name": "torchtitan", "date": "2026-02"}, "source": "test",
            "confidence": "low", "seq_len": 2048, "global_batch_size": 128, "micro_batch_size": 2, "precision": "bf16",
            "model": {"name": "llama-7b-like", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                      "num_kv_heads": 32, "ffn_hidden_size": 11008, "vocab_size": 32000, "ffn_activation": "swiglu"},
            "hardware": {"cluster": "dgx-a100-superpod", "device": "a100-sxm4-80gb", "count": 64},
            "layout": {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "ep": 1, "zero_stage": 3, "recompute": "none", **layout},
            "measured": {"step_time_s": 1.0}}


def test_validate_prices_a_published_dp_shard(tmp_path):
    """A run's ``layout.dp_shard`` is held when ``validate`` prices it, and a bad one is named."""
    import yaml
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies.runs import evaluate_run, load_runs
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [_run(), dict(_run(dp_shard=8), id="h")]}))
    full, hybrid = (evaluate_run(r, SearchOptions(), best=False) for r in load_runs(path))
    assert hybrid.layout["dp_shard"] == 8 and not full.layout["dp_shard"]
    assert hybrid.predicted_step_time_s != full.predicted_step_time_s
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [_run(dp_shard=7)]}))
    bad = evaluate_run(load_runs(path)[0], SearchOptions(), best=False)
    assert bad.reason and "dp_shard=7: must divide dp=64" in bad.reason


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_with_dp_shard_held(seed):
    """``--fix dp_shard=N`` narrows the search to what hybrid sharding runs with (dp divisible by N,
    cp = ep = 1, the framework's ZeRO stages) and prices every layout with it: CP-SAT equals the
    exhaustive enumerator, and the winner is what evaluate prices."""
    import dataclasses
    from test_search import _check_engines_agree, random_instance  # tests/ is on the path (test_offload_search.py)
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    model, job, cluster, bounds = random_instance(7000 + seed)
    framework = ("torchtitan", "megatron", "maxtext")[seed % 3]
    job = Job(global_batch_size=job.global_batch_size, seq_len=job.seq_len, precision="bf16", framework=framework)
    fixed = {k: v for k, v in bounds.fixed.items() if k not in ("zero_stage", "cp", "order")}
    bounds = dataclasses.replace(bounds, fixed={**fixed, "dp_shard": 2 if seed < 3 else 4},
                                 maximum={k: v for k, v in bounds.maximum.items() if k != "cp"})
    _check_engines_agree(model, job, cluster, bounds)
    try:
        res = plan(model, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=bounds))
    except Exception:  # noqa: BLE001 -- no layout of the instance runs hybrid (checked alike above)
        return
    best = res.best.layout
    assert best.dp_shard == bounds.fixed["dp_shard"] and best.dp % best.dp_shard == 0
    assert best.zero_stage in job.profile.profile.dp_shard_stages
    assert objective_seconds(res.objective_units[0]) == pytest.approx(
        evaluate(model, job, cluster, best).step_time_s, rel=1e-3)


def test_min_and_max_do_not_take_dp_shard():
    from clusterplan.planner.search.space import parse_bounds
    with pytest.raises(SpecError, match=r"dp_shard is not searched over a range; use --fix dp_shard=N \(0: the framework's own grouping\)"):
        parse_bounds(minimum=("dp_shard=8",))
    assert parse_bounds(fix=("dp_shard=8",)).fixed == {"dp_shard": 8}


def test_explain_prices_the_held_group_halved_doubled_and_off():
    from clusterplan.planner.explain import sensitivities
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=64)
    job = Job(global_batch_size=128, seq_len=4096, framework="torchtitan")
    best = evaluate(model, job, cluster, parse_layout("dp=64,mbs=1,zero=3,dp_shard=8", 64))
    rows = {r["move"]: r for r in sensitivities(model, job, cluster, best)}
    for move, shard in (("dp_shard 4", 4), ("dp_shard 16", 16), ("dp_shard off", 0)):
        lay = best.layout.with_(dp_shard=shard)
        assert rows[move]["step_time_s"] == pytest.approx(evaluate(model, job, cluster, lay).step_time_s)
    assert not any(m.startswith("dp_shard") for m in
                   (r["move"] for r in sensitivities(model, job, cluster, evaluate(model, job, cluster, best.layout.with_(dp_shard=0)))))


# ---- the search offers hybrid sharding (planner.search.hsdp) ----------------------------------------

def _oversubscribed(framework: str, batch: int = 2048):
    """Llama 3 8B on 256 H100 whose leaf switches are 4:1 oversubscribed: sharding over every rank
    crosses the thin uplinks at every micro-batch, a node's shard group does not."""
    from clusterplan.topologies.library import build_cluster
    model, cluster = load_model("llama3-8b"), build_cluster("dgx-h100-superpod", num_devices=256, oversubscription=4)
    return model, Job(global_batch_size=batch, seq_len=8192, framework=framework), cluster


@pytest.mark.parametrize("framework,stages", [("torchtitan", (2, 3)), ("megatron", (1,))])
def test_search_offers_hybrid_sharding_and_picks_it_where_it_wins(framework, stages):
    """The search offers a shard group of one node's data-parallel ranks (and two nodes') at the
    framework's hybrid stages and picks it where it beats sharding over every rank (before, it offered
    none: ``--fix dp_shard=N`` only). The winner is priced as evaluate prices it, and holding the
    framework's own grouping (``--fix dp_shard=0``) gives a slower plan."""
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    from clusterplan.planner.search.space import Bounds
    model, job, cluster = _oversubscribed(framework)
    res = plan(model, job, cluster, SearchOptions(top_k=0))
    best = res.best.layout
    assert best.dp_shard >= 2 and best.dp % best.dp_shard == 0 and best.zero_stage in stages
    assert best.tp * best.dp_shard in (8, 16)  # one node's GPUs, or two nodes'
    assert objective_seconds(res.objective_units[0]) == pytest.approx(evaluate(model, job, cluster, best).step_time_s,
                                                                      rel=1e-3)
    own = plan(model, job, cluster, SearchOptions(top_k=0, bounds=Bounds(fixed={"dp_shard": 0})))
    assert own.best.layout.dp_shard == 0 and own.best.step_time_s > res.best.step_time_s


def test_search_offers_groups_of_one_and_two_scale_up_domains():
    """The ZeRO axis holds (stage, group) pairs: the framework's own first, then each hybrid stage with
    one domain's data-parallel ranks and with two (at least 2 ranks, dividing dp, below dp)."""
    from clusterplan.planner.search.hsdp import candidate_group
    from clusterplan.planner.search.space import Bounds, build_space
    model, job, cluster = _oversubscribed("torchtitan")
    S = build_space(model, job, cluster, Bounds())
    own = [z for z, k in zip(S.zero_stage, S.zero_shard) if k == 0]
    assert own == sorted(set(S.zero_stage)) and [(z, k) for z, k in zip(S.zero_stage, S.zero_shard) if k] == [
        (2, 1), (3, 1), (2, 2), (3, 2)]
    assert [candidate_group(S, (1, 1, 256, 1), k) for k in (1, 2)] == [8, 16]
    assert [candidate_group(S, (8, 1, 32, 1), k) for k in (1, 2)] == [2, 4]  # tp fills a node: two nodes, four
    assert [candidate_group(S, (2, 2, 64, 1), k) for k in (1, 2)] == [4, 8]
    assert candidate_group(S, (1, 1, 128, 2), 1) == 0 and candidate_group(S, (8, 1, 2, 1), 1) == 0  # cp > 1; dp = 2
    held = build_space(model, job, cluster, Bounds(fixed={"dp_shard": 0}))
    assert not held.zero_shard and 0 in held.zero_stage


@pytest.mark.parametrize("framework,date", [("deepspeed", None), ("torchtitan", "2024-06"), ("megatron", "2024-10"),
                                            ("nanotron", None)])
def test_search_leaves_hybrid_sharding_out_where_the_framework_lacks_it(framework, date):
    """DeepSpeed's MiCS is gone from its pinned release (``semantics.dp_shard_searched: false``);
    torchtitan before its HSDP (2024-09), Megatron before its partial distributed optimizer (2024-11)
    and nanotron have none: their spaces hold the framework's own grouping alone."""
    from clusterplan.planner.search.space import Bounds, build_space
    model, job, cluster = _oversubscribed(framework)
    if date:
        job = Job(global_batch_size=2048, seq_len=8192, framework=framework, framework_date=date)
    S = build_space(model, job, cluster, Bounds())
    assert not S.zero_shard and len(S.zero_stage) == len(set(S.zero_stage))


# random instances (tests/test_search.py) whose spaces hold hybrid entries, four per framework; in
# 7107, 7113 (torchtitan) and 7133 (MaxText) a runner-up has a shard group
HYBRID_SEEDS = [7107, 7110, 7113, 7116, 7102, 7108, 7111, 7114, 7103, 7118, 7130, 7133]


@pytest.mark.parametrize("seed", HYBRID_SEEDS)
def test_engines_agree_with_dp_shard_searched(seed):
    """CP-SAT equals the exhaustive enumerator where the search offers hybrid sharding (torchtitan,
    Megatron-Core, MaxText on random instances), and each of the top four, with a shard group or
    without, is priced as evaluate prices it."""
    import dataclasses
    from test_search import _check_engines_agree, random_instance  # tests/ is on the path (test_offload_search.py)
    from clusterplan.planner.search import SearchOptions, objective_seconds, plan
    from clusterplan.planner.search.space import build_space
    model, job, cluster, bounds = random_instance(seed)
    framework = ("torchtitan", "megatron", "maxtext")[seed % 3]
    job = Job(global_batch_size=job.global_batch_size, seq_len=job.seq_len, precision="bf16", framework=framework)
    bounds = dataclasses.replace(bounds, fixed={k: v for k, v in bounds.fixed.items() if k != "zero_stage"})
    assert any(build_space(model, job, cluster, bounds).zero_shard)
    _check_engines_agree(model, job, cluster, bounds)
    try:
        res = plan(model, job, cluster, SearchOptions(engine="exhaustive", top_k=3, bounds=bounds))
    except Exception:  # noqa: BLE001 -- nothing fits (checked alike above)
        return
    for ev, units in zip([res.best, *res.runners_up], res.objective_units):
        assert objective_seconds(units) == pytest.approx(evaluate(model, job, cluster, ev.layout).step_time_s, rel=1e-3)
