"""Pipeline schedules as a layout knob (issue 38 item 1): ``schedule=1f1b|interleaved|zb1p|zbv|dualpipe|
dualpipev|looped``, its default from vp, its refusals, its bubble and its memory."""

from __future__ import annotations

import pytest

from clusterplan.cost.framework import load_profile, unoffered
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import bubble_s
from clusterplan.models.errors import SpecError
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster

BASE = "tp=2,sp=on,pp=4,dp=2,zero=2"
ZB = BASE + ",vp=2,schedule=zb1p"  # torchtitan runs zero bubble interleaved (2+ stages per rank)


def _run(text: str, framework: str = "torchtitan"):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=16)
    job = Job(global_batch_size=64, seq_len=8192, framework=framework)
    layout = parse_layout(text)
    return layout_problems(model, job, cluster, layout), evaluate(model, job, cluster, layout)


def test_layout_text_writes_only_a_schedule_other_than_vps_default():
    assert parse_layout("pp=4,schedule=1f1b") == parse_layout("pp=4")
    assert parse_layout("pp=4,vp=2,schedule=interleaved").short() == parse_layout("pp=4,vp=2").short()
    assert "schedule" not in parse_layout("pp=4,vp=2").short()
    text = parse_layout("pp=4,vp=2,schedule=zbv").short()
    assert text.endswith("schedule=zbv")
    assert parse_layout(",".join(text.split())).schedule == "zbv"
    assert Layout(vp=2, schedule="interleaved").pipeline_schedule == "interleaved" == Layout(vp=2).pipeline_schedule


def test_unknown_schedule_names_the_field_and_the_allowed_values():
    with pytest.raises(SpecError, match=r"layout.schedule: got 'gpipe'; allowed: 1f1b, interleaved, zb1p, zbv"):
        parse_layout("pp=4,schedule=gpipe")


@pytest.mark.parametrize("text, words", [
    (BASE + ",schedule=zbv", "needs vp=2"),
    (BASE + ",vp=2,schedule=1f1b", "needs vp=1"),
    (BASE + ",schedule=looped", "needs vp > 1"),
    ("tp=2,sp=on,pp=1,dp=8,zero=2,schedule=zb1p", "needs pp > 1"),
])
def test_a_schedule_refuses_a_shape_it_cannot_run(text, words):
    problems, _ = _run(text)
    assert any(key == "schedule" and words in message for key, message in problems), problems


def test_frameworks_without_a_schedule_refuse_it_with_its_since_date():
    problems, _ = _run(BASE + ",vp=2,schedule=zbv", "megatron")
    assert any("schedule=zbv: megatron" in m and "no such pipeline schedule" in m for _, m in problems), problems
    early = load_profile("torchtitan").at("2025-01")
    message = unoffered(early, "nvidia-h100", {"schedule": "zbv"})
    assert message and "only from 2025-02" in message[0]
    assert not _run(BASE + ",vp=2,schedule=zbv")[0]
    problems, _ = _run(BASE + ",schedule=dualpipe")
    assert any("schedule=dualpipe: torchtitan" in m for _, m in problems)


def test_the_default_schedule_prices_exactly_as_before():
    for text in (BASE, BASE + ",vp=2"):
        implied = parse_layout(text + (",schedule=1f1b" if "vp" not in text else ",schedule=interleaved"))
        assert _run(text)[1] == _run(implied.short().replace(" ", ","))[1]


def test_bubbles_follow_the_published_formulas_at_equal_f_b_w():
    # F = B_input = W = 1: one micro-batch through a rank takes 3, its backward 2
    pp = 8
    one_f_one_b = bubble_s("1f1b", pp, 1, 3.0, 2.0)
    assert one_f_one_b == pytest.approx(3 * (pp - 1))
    assert bubble_s("zb1p", pp, 1, 3.0, 2.0) == pytest.approx(one_f_one_b / 3)  # Qi et al.: a third
    assert bubble_s("zbv", pp, 2, 3.0, 2.0) == 0.0  # ZB-V: zero at F = B = W
    assert bubble_s("dualpipe", pp, 1, 3.0, 2.0) == pytest.approx((pp / 2 - 1) * 2)  # DeepSeek-V3 Table 2
    assert bubble_s("dualpipev", pp, 2, 3.0, 2.0) == pytest.approx((pp - 1) * 2 / 2)
    assert bubble_s("looped", pp, 2, 3.0, 2.0) == bubble_s("interleaved", pp, 2, 3.0, 2.0)


def test_zero_bubble_schedules_shorten_the_step_and_keep_1f1b_memory():
    _, plain = _run(BASE)
    _, inter = _run(BASE + ",vp=2")
    problems, zb = _run(ZB)
    _, zbv = _run(BASE + ",vp=2,schedule=zbv")
    assert not problems
    assert zb.time.pp_bubble_s < inter.time.pp_bubble_s and zb.step_time_s < inter.step_time_s
    assert zbv.time.pp_bubble_s < zb.time.pp_bubble_s
    assert zb.memory.activations_bytes == inter.memory.activations_bytes  # ZB-H1 keeps its schedule's in-flight count
    assert zbv.memory.activations_bytes == pytest.approx(plain.memory.activations_bytes)  # ZB-V: 1F1B's


def test_torchtitan_runs_zero_bubble_with_several_stages_per_rank_only():
    problems, _ = _run(BASE + ",schedule=zb1p")
    assert any("schedule=zb1p with vp=1" in m and "vp >= 2" in m for _, m in problems), problems


def test_dualpipe_doubles_the_weights_and_looped_holds_every_microbatch():
    _, plain = _run(BASE)
    _, dual = _run(BASE + ",schedule=dualpipe")
    assert dual.memory.weights_bytes == 2 * plain.memory.weights_bytes
    assert dual.memory.activations_bytes == pytest.approx(plain.memory.activations_bytes * 5 / 4)  # pp + 1 of pp
    _, inter = _run(BASE + ",vp=2")
    _, looped = _run(BASE + ",vp=2,schedule=looped")
    assert looped.time.pp_bubble_s == inter.time.pp_bubble_s
    assert looped.memory.activations_bytes > 2 * inter.memory.activations_bytes


def test_dualpipe_puts_the_embedding_and_the_head_on_one_rank():
    """DualPipe's rank r holds stage r and its mirror pp - 1 - r (DeepSeek-V3 report, Table 2 and
    section 3.2.3): the first and the last rank hold the same parameters, stage 0's and stage pp - 1's,
    not twice their own (as it was); a middle rank twice a middle stage."""
    from clusterplan.cost.step import memory_static_bytes
    from clusterplan.cost.terms.context import Context

    # DeepSeek-V3's three dense layers sit on the first stage: its stages differ
    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100-superpod", num_devices=16)
    ctx = Context(model, Job(global_batch_size=64, seq_len=8192, framework="megatron"), cluster)
    plain, dual = parse_layout(BASE), parse_layout(BASE + ",schedule=dualpipe")
    first, last, second = (memory_static_bytes(ctx, plain, r) for r in ("first", "last", "second"))
    assert first != last
    assert memory_static_bytes(ctx, dual, "first") == pytest.approx(first + last)
    assert memory_static_bytes(ctx, dual, "last") == pytest.approx(first + last)
    assert memory_static_bytes(ctx, dual, "second") == pytest.approx(2 * second)


def test_dualpipe_hides_the_expert_all_to_alls_beyond_its_warm_up():
    """DualPipe pairs each forward chunk with a backward chunk of the mirrored stage at vp 1 (DeepSeek-V3
    report section 3.2.1): EP overlap hides every micro-batch's all-to-alls but those run while the
    rank fills its pp + 1 in flight; Megatron's combined 1F1B hides none at vp 1 (it refuses it)."""
    from clusterplan.cost.terms import ep_overlap_steady_share

    assert ep_overlap_steady_share(16, 1, 120, "selective", schedule="dualpipe") == pytest.approx((120 - 17) / 120)
    assert ep_overlap_steady_share(16, 1, 120, "selective") == 0.0
    assert ep_overlap_steady_share(16, 1, 120, "full", schedule="dualpipe") == 0.0
    assert ep_overlap_steady_share(16, 1, 16, "none", schedule="dualpipe") == 0.0


def test_explain_prices_each_schedule_the_framework_runs():
    from clusterplan.planner.explain import sensitivities

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=16)
    job = Job(global_batch_size=64, seq_len=8192, framework="torchtitan")
    best = evaluate(model, job, cluster, parse_layout(BASE))
    rows = {r["move"]: r for r in sensitivities(model, job, cluster, best)}
    assert rows["schedule zb1p (vp 2)"]["step_time_s"] < best.step_time_s
    assert "schedule zbv (vp 2)" in rows and "schedule dualpipe" not in rows  # torchtitan has DualPipeV only
    megatron = Job(global_batch_size=64, seq_len=8192)
    plain = evaluate(model, megatron, cluster, parse_layout(BASE))
    assert not any(r["move"].startswith("schedule") for r in sensitivities(model, megatron, cluster, plain))
    zbv = evaluate(model, job, cluster, parse_layout(BASE + ",vp=2,schedule=zbv"))
    back = {r["move"]: r for r in sensitivities(model, job, cluster, zbv)}["schedule interleaved"]
    assert back["step_time_s"] > zbv.step_time_s


def _plan_doc(framework: str, fixed: str) -> dict:
    import json

    from click.testing import CliRunner

    from clusterplan.cli import main

    done = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                                     "--framework", framework, "--fix", fixed, "--json", "--top", "0"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


@pytest.mark.parametrize("schedule, vp, name", [("zbv", 2, "ZBVZeroBubble"), ("dualpipev", 2, "DualPipeV"),
                                                ("zb1p", 2, "InterleavedZeroBubble"), ("looped", 2, "LoopedBFS"),
                                                ("", 2, "Interleaved1F1B"), ("", 1, "1F1B")])
def test_torchtitan_exports_write_the_schedule_the_plan_priced(schedule, vp, name):
    from clusterplan.planner.report.export import export

    doc = _plan_doc("torchtitan", "pp=4,vp=2")
    doc["layout"].update(schedule=schedule, vp=vp)
    assert f"pipeline_parallel_schedule={name!r}" in export(doc, "torchtitan").replace(" ", "")
    doc["inputs"]["framework"]["date"] = "2026-02"  # torchtitan 0.2.2's release, which has every one of them
    assert f'pipeline_parallel_schedule = "{name}"' in export(doc, "torchtitan-0.2")


def test_exports_refuse_a_schedule_their_launcher_lacks():
    from clusterplan.planner.report.export import export

    doc = _plan_doc("torchtitan", "pp=4,vp=2")
    doc["layout"].update(schedule="zb1p", vp=1)
    with pytest.raises(SpecError, match="at least 2 stages per rank"):
        export(doc, "torchtitan")
    doc["layout"].update(schedule="dualpipe", vp=1)
    with pytest.raises(SpecError, match="schedule=dualpipe: torchtitan has no such pipeline schedule"):
        export(doc, "torchtitan")
    mlm = _plan_doc("megatron", "pp=4")
    mlm["layout"]["schedule"] = "zb1p"
    for fmt in ("megatron", "slurm"):
        with pytest.raises(SpecError, match=f"export --format {fmt}: schedule=zb1p: megatron has no such"):
            export(mlm, fmt)


def test_a_published_schedule_is_priced_by_validate():
    """A run's ``layout.schedule`` (RUNS_FORMAT.md) is applied after the search of its unpublished
    knobs and priced; a framework without it keeps it (the run used it)."""
    import copy
    from pathlib import Path

    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies.runs import evaluate_run, load_runs

    runs = load_runs(Path(__file__).resolve().parents[1] / "planner" / "data" / "runs.yaml")
    run = next(r for r in runs if (r.get("layout") or {}).get("pp", 1) > 1 and (r["layout"].get("vp") or 1) == 1)
    plain = evaluate_run(run, SearchOptions(), best=False)
    zb = copy.deepcopy(run)
    zb["layout"]["schedule"] = "zb1p"
    priced = evaluate_run(zb, SearchOptions(), best=False)
    assert plain.reason is None and priced.reason is None, (plain.reason, priced.reason)
    assert priced.layout["schedule"] == "zb1p" and priced.predicted_step_time_s < plain.predicted_step_time_s
    zb["layout"]["schedule"] = "gpipe"
    assert "layout.schedule: got 'gpipe'" in evaluate_run(zb, SearchOptions(), best=False).reason


def test_the_timeline_does_not_draw_a_named_schedule_as_1f1b():
    from clusterplan.planner.report.timeline import build_timeline

    doc = _plan_doc("torchtitan", "pp=4,vp=2,schedule=interleaved")  # held: the search would run zero bubble
    assert len(build_timeline(doc).rows) == min(4, doc["layout"]["pp"])  # the default schedule is drawn per stage
    doc["layout"]["schedule"] = "zbv"
    timeline = build_timeline(doc)
    assert not timeline.rows and "the zbv pipeline schedule is not drawn" in timeline.note


def test_a_schedule_against_its_vp_is_reported_once_by_its_own_rule():
    problems, _ = _run(BASE + ",vp=2,schedule=1f1b", "megatron")
    assert [key for key, _ in problems] == ["schedule"], problems
    problems, _ = _run(BASE.replace("zero=2", "zero=1") + ",schedule=dualpipe", "megatron")  # 32 micro-batches
    assert [key for key, _ in problems] == ["framework"], problems
    problems, _ = _run("tp=2,sp=on,pp=4,dp=2,zero=2,mbs=8,schedule=dualpipe")  # 4 micro-batches < 2 pp
    assert any(key == "schedule" and "at least 2 pp" in m for key, m in problems), problems


# ---- the search offers zero bubble --------------------------------------------------------------------
def _search(framework: str, bounds, num_devices: int = 16, engine: str = "cpsat"):
    from clusterplan.planner.search import SearchOptions, plan

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=num_devices)
    job = Job(global_batch_size=64, seq_len=8192, framework=framework)
    return model, job, cluster, plan(model, job, cluster, SearchOptions(bounds=bounds, engine=engine, top_k=3))


def test_zero_bubble_is_no_slower_and_holds_the_same_memory_at_every_sampled_layout():
    """The claim the search's choice rests on (planner.search.space.SEARCHED_SCHEDULES), on the
    formulas themselves: zb1p against the schedule vp implies at equal knobs, every rank's memory;
    and why ZB-V is left out: it holds more than interleaving on some rank of some layout."""
    import random

    from clusterplan.cost.step import rank_memories
    from clusterplan.cost.terms import Context

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=64)
    r, zbv_more, checked = random.Random(38), 0, 0
    for _ in range(60):
        tp, pp, vp, mbs = r.choice([1, 2, 4]), r.choice([2, 4, 8]), r.choice([1, 2, 4]), r.choice([1, 2])
        layout = Layout(tp=tp, pp=pp, dp=64 // (tp * pp), vp=vp, micro_batch_size=mbs, sequence_parallel=tp > 1,
                        recompute=r.choice(["none", "selective", "full"]), zero_stage=r.choice([0, 2, 3]))
        for framework in ("torchtitan", "megatron"):
            job = Job(global_batch_size=r.choice([128, 256]), seq_len=4096, framework=framework)
            zb = layout.with_(schedule="zb1p")
            if layout_problems(model, job, cluster, layout) or layout_problems(model, job, cluster, zb.with_(vp=2)):
                continue
            ctx, m = Context(model, job, cluster), evaluate(model, job, cluster, layout).num_microbatches
            base, fast = evaluate(model, job, cluster, layout), evaluate(model, job, cluster, zb)
            assert fast.step_time_s < base.step_time_s
            mem = {k: v.total_bytes for k, v in rank_memories(ctx, layout, m).items()}
            assert {k: v.total_bytes for k, v in rank_memories(ctx, zb, m).items()} == mem
            checked += 1
            if vp == 2:
                zbv = {k: v.total_bytes for k, v in rank_memories(ctx, layout.with_(schedule="zbv"), m).items()}
                zbv_more += any(zbv[k] > mem[k] for k in mem)
    assert checked > 40 and zbv_more > 0


def test_a_torchtitan_pipeline_plan_runs_zero_bubble_priced_as_evaluate_prices_it():
    from clusterplan.planner.search import objective_seconds
    from clusterplan.planner.search.space import Bounds

    for engine in ("cpsat", "exhaustive"):
        model, job, cluster, res = _search("torchtitan", Bounds({"pp": 4, "vp": 2}), engine=engine)
        best = res.best.layout
        assert best.schedule == "zb1p" and best.pipeline_schedule == "zb1p"
        assert objective_seconds(res.objective_units[0]) == pytest.approx(res.best.step_time_s, rel=1e-3)
        assert res.best.step_time_s == evaluate(model, job, cluster, best).step_time_s
        plain = evaluate(model, job, cluster, best.with_(schedule=""))
        assert res.best.step_time_s < plain.step_time_s
        assert res.best.peak_memory_bytes == plain.peak_memory_bytes


def test_megatron_plans_never_carry_a_schedule():
    from clusterplan.planner.search.space import Bounds

    _, _, _, res = _search("megatron", Bounds({"pp": 4}, {"vp": 2}))
    assert res.best.layout.vp >= 2 and all(ev.layout.schedule == "" for ev in [res.best, *res.runners_up])


def test_fix_schedule_holds_the_named_schedule():
    from clusterplan.planner.search.space import Bounds, parse_bounds

    _, _, _, res = _search("torchtitan", parse_bounds(("schedule=zb1p",)))
    assert all(ev.layout.schedule == "zb1p" and ev.layout.pp > 1 and ev.layout.vp > 1 for ev in [res.best, *res.runners_up])
    _, _, _, res = _search("torchtitan", parse_bounds(("schedule=interleaved,pp=4",)))
    assert all(ev.layout.schedule == "" and ev.layout.vp > 1 for ev in [res.best, *res.runners_up])
    _, _, _, res = _search("torchtitan", parse_bounds(("schedule=1f1b,pp=4",)))
    assert all(ev.layout.pipeline_schedule == "1f1b" for ev in [res.best, *res.runners_up])


@pytest.mark.parametrize("framework, fixed, words", [
    ("torchtitan", "schedule=zbv", "the search offers only 1f1b, interleaved, zb1p"),
    ("megatron", "schedule=zb1p", "schedule=zb1p: megatron"),
    ("torchtitan", "schedule=gpipe", "allowed: 1f1b, interleaved, zb1p, zbv"),
])
def test_fix_schedule_refuses_what_the_search_cannot_hold(framework, fixed, words):
    from click.testing import CliRunner

    from clusterplan.cli import main

    done = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                                     "--framework", framework, "--fix", fixed])
    assert done.exit_code == 2 and words in done.output, done.output


def test_dualpipe_last_rank_holds_the_first_stage_in_flight():
    """DualPipe's last rank enters the reverse direction first, whose first stage holds the model's
    first layers (deepseek-ai/DualPipe ``dualpipe.py`` ``step()``): like rank 0 it holds pp micro-batches
    of stage 0 and one of stage pp - 1; rank 1 holds pp - 1 of stage 1 and two of stage pp - 2. Before,
    the last rank was charged pp + 1 micro-batches of its own stage (DeepSeek-V3: 17 x 4 MoE layers)."""
    from clusterplan.cost.stages import rank_layers
    from clusterplan.cost.step import rank_inflight

    model, pp = load_model("deepseek-v3"), 16
    stages = [rank_layers(model.num_layers, model.num_dense_layers, pp, 1, r) for r in range(pp)]

    def kinds(*pairs):
        return (sum(c * stages[s].num_dense for c, s in pairs),
                sum(c * (stages[s].layers - stages[s].num_dense) for c, s in pairs))
    held = {rank: rank_inflight(model, pp, 1, 120, None, False, rank, "dualpipe").moments
            for rank in ("first", "second", "last")}
    assert held["first"] == held["last"] == (kinds((pp, 0), (1, pp - 1)),)
    assert held["second"] == (kinds((pp - 1, 1), (2, pp - 2)),)
    assert sum(held["last"][0]) == (pp + 1) * 4  # pp + 1 chunks of 4 layers (DeepSeek-V3 Table 2)
    assert held["last"][0][0] == pp * 3  # stage 0's three dense layers, pp times
