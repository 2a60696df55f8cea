"""The embedding and the output layer each taking a layer's slot in the pipeline split (Layout.head_slots).

Megatron-Core's ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``,
Megatron-DeepSpeed's ``--pp-partition-method 'type:transformer|embedding'`` and torchtitan's own
split since 2025-04: the first and the last rank hold one layer fewer, so the LM head no longer sits
on top of a full rank's layers.
"""

from __future__ import annotations

import ast
import json
import math

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import (Context, head_layer_ratio, layer_terms, param_counts, period_layers,
                                    stage_split)
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.planner.search.space import parse_bounds
from clusterplan.topologies.library import build_cluster

BLOOM = get_model("bloom")  # 70 layers, vocabulary 250,880 x 14,336: the head weighs more than a layer
GPT3 = get_model("gpt3-175b")  # vocabulary 51,200 x 12,288: the head weighs a third of a layer


def test_split_gives_the_first_and_last_rank_a_layer_fewer():
    def split(*args):
        s = stage_split(*args)
        return s.first, s.middle, s.last
    assert split(70, 12, 1, True) == (5, 6, 5)  # 72 slots, 6 a rank (BLOOM's 12 stages)
    assert split(80, 4, 1, True) == (20, 21, 19)  # 82 slots: 21, 21, 20, 20
    assert split(126, 16, 2, True)[1] == 8  # Llama 3 405B: 128 slots over 32 chunks
    assert split(70, 12, 1, False) == (6, 6, 6)  # even: ceil(L / pp) on every rank
    assert split(70, 1, 1, True) == (70, 70, 70)  # no pipeline: nothing to split


def _ctx(model, precision="bf16", cluster=("dgx-a100-superpod", 8)):
    return Context(model, Job(global_batch_size=8, seq_len=2048, precision=precision), build_cluster(*cluster))


def test_the_head_sets_the_period_only_where_it_outweighs_a_layer():
    bloom, gpt3 = _ctx(BLOOM), _ctx(GPT3)
    assert head_layer_ratio(bloom) > 1 > head_layer_ratio(gpt3)
    assert period_layers(bloom, 12, 1, True) == (5, True)  # the last rank: 5 layers and the head
    assert period_layers(gpt3, 8, 1, True) == (math.ceil(98 / 8), False)  # a middle rank's 13 layers
    assert period_layers(bloom, 12, 1, False) == (6, True)


def test_an_fp8_job_weighs_its_16_bit_head_by_time():
    """FP8 runs the layers' GEMMs at twice the 16-bit rate and leaves the head in 16 bits: Llama 3
    405B's head, 0.6 of a layer by FLOPs and by time in bf16, outweighs an FP8 layer on an H100, so
    with head_slots it sets the period there (the GB200 FP8 rows of Megatron-Bridge run so)."""
    llama = get_model("llama3-405b")
    bf16, fp8 = _ctx(llama, "bf16", ("dgx-h100-superpod", 8)), _ctx(llama, "fp8", ("dgx-h100-superpod", 8))
    assert head_layer_ratio(bf16) < 1 < head_layer_ratio(fp8)
    assert period_layers(bf16, 16, 4, True) == (8, False) and period_layers(fp8, 16, 4, True) == (7, True)


def _bloom(head_slots: bool):
    cluster = build_cluster("dgx-a100-superpod", 384)
    job = Job(global_batch_size=2048, seq_len=2048, framework="deepspeed")
    layout = Layout(tp=4, pp=12, dp=8, micro_batch_size=2, recompute="full", zero_stage=1, dp_overlap=False,
                    head_slots=head_slots)
    return Context(BLOOM, job, cluster), layout, evaluate(BLOOM, job, cluster, layout)


def test_bloom_saves_one_layer_per_micro_batch_and_the_embedding_rank_holds_less():
    ctx, layout, on = _bloom(True)
    _, _, off = _bloom(False)
    m = on.num_microbatches
    lt = layer_terms(ctx, layout, m)
    # the compute of one layer's forward and backward per micro-batch is gone from the period
    assert off.time.compute_s - on.time.compute_s == pytest.approx(m * (lt.forward_s + lt.backward_s) / 70, rel=1e-9)
    assert on.step_time_s < off.step_time_s
    # the first rank holds 5 layers and the embedding instead of 6 and the embedding
    heavy_on, heavy_off = param_counts(BLOOM, 4, 12, 1, 1, True, True), param_counts(BLOOM, 4, 12, 1, 1, True, False)
    layer = (BLOOM.attention_params + BLOOM.norm_params_per_layer + BLOOM.dense_mlp_params) / 4
    assert heavy_off.dense - heavy_on.dense == pytest.approx(layer)
    assert on.memory.weights_bytes < off.memory.weights_bytes


def test_a_light_head_hides_in_the_last_ranks_spare_slot():
    cluster = build_cluster("dgx-h100-superpod", 1024)
    job = Job(global_batch_size=1536, seq_len=2048)
    base = Layout(tp=8, pp=8, dp=16, micro_batch_size=1, sequence_parallel=True, recompute="selective")
    on, off = (evaluate(GPT3, job, cluster, base.with_(head_slots=h)) for h in (True, False))
    # 98 slots over 8 ranks: 13 on a middle rank, as the even split's ceil(96 / 8) = 12 plus the head
    # minus the head: the period is 13 layers with no head against 12 layers and the head
    assert on.step_time_s != off.step_time_s
    assert period_layers(Context(GPT3, job, cluster), 8, 1, True) == (13, False)


def test_megatron_needs_an_even_split_of_the_slots():
    cluster = build_cluster("dgx-h100-superpod", 256)
    llama70 = get_model("llama3-70b")
    job = Job(global_batch_size=512, seq_len=8192)
    bad = layout_problems(llama70, job, cluster, parse_layout("tp=8,pp=4,dp=8,head_slots=on"))
    assert [k for k, _ in bad] == ["layers"] and "num_layers + 2 = 82 must be divisible by pp=4" in bad[0][1]
    assert not layout_problems(llama70, job, cluster, parse_layout("tp=8,pp=2,dp=16,head_slots=on"))
    # DeepSpeed's and torchtitan's balanced partitions take any count
    for framework in ("deepspeed", "torchtitan"):
        job_f = Job(global_batch_size=512, seq_len=8192, framework=framework)
        assert not [k for k, _ in layout_problems(llama70, job_f, cluster, parse_layout(
            "tp=8,pp=4,dp=8,zero=1,head_slots=on")) if k == "layers"]


def test_a_framework_without_the_split_refuses_it():
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "64",
                                       "--fix", "head_slots=on"])
    assert result.exit_code == 2 and "head_slots=on: maxtext" in result.stderr and "does not offer it" in result.stderr
    job = Job(global_batch_size=512, seq_len=8192, framework="megatron", framework_date="2024-12")
    bad = layout_problems(get_model("llama3-70b"), job, build_cluster("dgx-h100-superpod", 256),
                          parse_layout("tp=8,pp=2,dp=16,head_slots=on"))
    assert any(k == "framework" and "head_slots=on" in m for k, m in bad)  # the flags arrived in 2025-02


def test_search_under_a_fixed_split_equals_the_evaluation():
    """The search's tables price the split as evaluate does (both engines, same optimum)."""
    model, cluster = get_model("llama3-405b"), build_cluster("dgx-h100-superpod", 2048)
    job = Job(global_batch_size=2048, seq_len=8192)
    results = {}
    for engine in ("cpsat", "exhaustive"):
        bounds = parse_bounds(("pp=16,tp=8,head_slots=on",), ("vp=2",))
        results[engine] = plan(model, job, cluster, SearchOptions(engine=engine, top_k=0, bounds=bounds))
    best = results["cpsat"].best
    assert best.layout.head_slots and best.layout.pp == 16
    assert best.step_time_s == pytest.approx(results["exhaustive"].best.step_time_s, rel=1e-3)
    assert evaluate(model, job, cluster, best.layout).step_time_s == pytest.approx(best.step_time_s, rel=1e-12)


def test_torchtitan_prices_its_own_split_and_exports_it():
    """torchtitan's automatic split counts the embedding and the output as a layer each: plans under
    it price that split, and the exported modules per stage are that split (checked against torchtitan
    itself in tests/test_launchers.py)."""
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--framework", "torchtitan",
            "--fix", "pp=4,tp=1,vp=1"]
    doc = json.loads(CliRunner().invoke(main, ["plan", *args, "--json"]).stdout)
    assert doc["layout"]["head_slots"] is True
    report = CliRunner().invoke(main, ["plan", *args]).stdout
    assert "pipeline split: the embedding and the LM head each take a layer's slot (first rank 8 layers, last 7" in report
    registry = CliRunner().invoke(main, ["export", "--format", "torchtitan", *args]).stdout  # torchtitan 0.3.0
    parts = ast.literal_eval(next(line for line in registry.splitlines()
                                  if "config.parallelism.module_fqns_per_model_part = " in line).split(" = ", 1)[1])
    layers = [sum(x.startswith("layers.") for x in p) for p in parts]
    assert layers == [8, 9, 8, 7] and parts[0][0] == "tok_embeddings" and parts[-1][-1] == "lm_head"  # 34 slots
    toml = CliRunner().invoke(main, ["export", "--format", "torchtitan-0.2", *args]).stdout  # 0.2.2 names it output
    assert json.loads(next(line for line in toml.splitlines() if line.startswith("module_fqns_per_model_part"))
                      .split("=", 1)[1])[-1][-1] == "output"
    off = CliRunner().invoke(main, ["export", "--format", "torchtitan", *args, "--fix", "head_slots=off"]).stdout
    assert "[8, 8, 8, 8]" not in off and "'layers.7'], ['layers.8'" in off  # 8 layers a stage, written out


def test_megatron_and_deepspeed_exports_name_the_split():
    args = ["--model", "llama3-405b", "--cluster", "dgx-h100-superpod", "--devices", "2048",
            "--fix", "pp=16,vp=2,head_slots=on"]
    megatron = CliRunner().invoke(main, ["export", "--format", "megatron", *args]).stdout
    assert "--account-for-embedding-in-pipeline-split" in megatron and "--account-for-loss-in-pipeline-split" in megatron
    assert "--num-virtual-stages-per-pipeline-rank 2" in megatron
    assert "--num-layers-per-virtual-pipeline-stage" not in megatron
    # microsoft/Megatron-DeepSpeed, which the deepspeed export targets, has no such split (BigScience's fork had
    # --pp-partition-method): refused, not written
    ds = CliRunner().invoke(main, ["export", "--format", "deepspeed", *args[:-2], "--fix", "pp=16,head_slots=on,zero=1",
                                   "--framework", "deepspeed"])
    assert ds.exit_code == 2 and "head_slots=on" in ds.stderr


def test_search_chooses_the_split_megatron_offers_and_explain_prices_the_other():
    """Megatron runs the even split by default and the embedding-and-loss split on request: the search
    tries both and keeps the faster (Llama 3 405B at pp 16: 7.7% faster with the split), and explain
    prices the move back; held off with --fix, the move is outside the searched values."""
    # vp held at 4: at vp 8 (128 virtual stages, one slot each) only the split with head slots divides
    args = ["--model", "llama3-405b", "--cluster", "dgx-h100-superpod", "--devices", "2048", "--fix", "pp=16,vp=4"]
    assert json.loads(CliRunner().invoke(main, ["plan", *args, "--json"]).stdout)["layout"]["head_slots"] is True
    doc = json.loads(CliRunner().invoke(main, ["explain", *args, "--json"]).stdout)
    row = next(r for r in doc["sensitivity"] if r["move"] == "head_slots off")
    assert row["allowed"] and row["delta"] > 0.03
    held = ["--model", "llama3-405b", "--cluster", "dgx-h100-superpod", "--devices", "2048", "--fix",
            "pp=16,vp=4,head_slots=off"]
    assert json.loads(CliRunner().invoke(main, ["plan", *held, "--json"]).stdout)["layout"]["head_slots"] is False
    row = next(r for r in json.loads(CliRunner().invoke(main, ["explain", *held, "--json"]).stdout)["sensitivity"]
               if r["move"] == "head_slots on")
    assert not row["allowed"] and "outside the searched values" in row["reason"]


def test_megatron_refused_it_for_moe_until_2025_04():
    """validate_args asserted 'Cannot support load balancing loss and z loss with
    --account-for-embedding-in-pipeline-split' from the flags' arrival (2025-02) until 2025-04-07."""
    mixtral, cluster = get_model("mixtral-8x7b"), build_cluster("dgx-h100-superpod", 64)
    layout = parse_layout("tp=2,pp=2,dp=16,ep=8,sp=on,head_slots=on")
    for date, refused in (("2025-03", True), ("2025-05", False)):
        job = Job(global_batch_size=256, seq_len=4096, framework="megatron", framework_date=date)
        messages = [m for _, m in layout_problems(mixtral, job, cluster, layout)]
        assert any("refuses it for MoE" in m for m in messages) == refused, (date, messages)


def test_a_split_stopped_by_the_time_limit_leaves_the_other_splits_answer(monkeypatch):
    """Each pipeline split is its own CP-SAT solve under a share of --time-limit: where the second
    stops before any layout, the plan keeps the first split's answer and says the search was not
    proven (status FEASIBLE) instead of failing; where every split stops, the solver's error."""
    from clusterplan.models.errors import SolverError
    from clusterplan.planner.search import engine

    real = engine.solve_cpsat

    def second_stops(tables, top_k, limit_s, workers, ceiling=None):
        if ceiling is not None:
            raise SolverError("CP-SAT stopped with status UNKNOWN before finding any layout")
        return real(tables, top_k, limit_s, workers, ceiling)

    monkeypatch.setattr(engine, "solve_cpsat", second_stops)
    model, cluster = get_model("llama3-405b"), build_cluster("dgx-h100-superpod", 2048)
    job = Job(global_batch_size=2048, seq_len=8192)
    res = plan(model, job, cluster, SearchOptions(bounds=parse_bounds(("pp=16",))))
    assert res.status == "FEASIBLE" and res.best.layout.head_slots is False

    def always_stops(tables, top_k, limit_s, workers, ceiling=None):
        raise SolverError("CP-SAT stopped with status UNKNOWN before finding any layout")

    monkeypatch.setattr(engine, "solve_cpsat", always_stops)
    with pytest.raises(SolverError):
        plan(model, job, cluster, SearchOptions(bounds=parse_bounds(("pp=16",))))


def test_one_slot_per_virtual_stage_needs_the_head_slots():
    """Megatron-Bridge ran Llama 3.1 405B NVFP4 on 256 GB200 at pp 16, vp 8 with the embedding and loss
    in the split (26.04.01 table): 128 virtual stages of one slot, the first the embedding alone.
    Without the split, 126 layers cannot fill 128 stages."""
    model, cluster = get_model("llama3-405b"), build_cluster("dgx-h100-superpod", 256)
    job = Job(global_batch_size=1536, seq_len=8192, precision="bf16")
    base = dict(tp=4, pp=16, dp=4, vp=8, micro_batch_size=1, sequence_parallel=True, recompute="none")
    assert not [p for p in layout_problems(model, job, cluster, Layout(**base, head_slots=True)) if p[0] == "layers"]
    assert [p for p in layout_problems(model, job, cluster, Layout(**base, head_slots=False)) if p[0] == "layers"]
    ev = evaluate(model, job, cluster, Layout(**base, head_slots=True))
    assert ev.step_time_s > 0 and math.isfinite(ev.step_time_s)
