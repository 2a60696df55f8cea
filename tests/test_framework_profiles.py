"""Every framework profile is sourced: each feature a release offers, each rule it refuses and each
semantic or overlap figure names a source the profile's ``sources`` define (docs/frameworks.md: "Every
fact names its source in the file's `sources:`"; figures taken as assumptions say so)."""

from __future__ import annotations

import pytest

from clusterplan.cost.framework import FRAMEWORKS, load_profile
from clusterplan.models.files import bundled_yaml


def _doc(framework: str) -> dict:
    return bundled_yaml("clusterplan.cost", "data", "frameworks", f"{framework}.yaml")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_offered_feature_and_rule_names_a_defined_source(framework):
    prof = load_profile(framework)
    unsourced = [name for name, since in prof.since.items()
                 if since is not None and prof.feature_sources.get(name) not in prof.sources]
    unsourced += [rule.id for rule in prof.rules if rule.source not in prof.sources]
    assert not unsourced, f"{framework}: {unsourced}"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_semantic_figure_names_defined_sources_or_says_it_is_assumed(framework):
    doc = _doc(framework)
    missing = [f"{section}.{key}: {name.strip()}" for section in ("semantics", "overlap", "requires")
               for key, value in (doc.get(section) or {}).items()
               if key.endswith("_source") and isinstance(value, str) and not value.startswith("assumed")
               for name in value.split(",") if name.strip() not in doc["sources"]]
    assert not missing, missing


def test_torchtitan_plain_ddp_composes_with_tp_from_its_replicate_release():
    """torchtitan refused DDP beside TP/PP/CP ('DDP has not supported > 1D parallelism') until #2458
    (2026-03-09) replaced DDP by composable replicate, which composes with them."""
    from clusterplan.cost.layout import Job, Layout
    from clusterplan.cost.checks import layout_problems
    from clusterplan.models.library import get_model
    from clusterplan.topologies.library import build_cluster

    model, cluster = get_model("llama3-8b"), build_cluster("dgx-h100-superpod", 16)
    layout = Layout(tp=2, pp=1, dp=8, sequence_parallel=True, zero_stage=0, recompute="selective")

    def refused(date: str) -> list[str]:
        job = Job(global_batch_size=64, seq_len=8192, framework="torchtitan", framework_date=date)
        return [msg for key, msg in layout_problems(model, job, cluster, layout) if "DDP" in msg]

    assert refused("2026-02")
    assert not refused("2026-03")


def test_megatron_keeps_fp16_gradients_in_fp16_and_bf16_gradients_in_fp32():
    """Megatron's validate_args forces fp32 gradient accumulation and reduction for bf16 only; under fp16
    the main grads take the parameters' dtype (no --accumulate-allreduce-grads-in-fp32): 2 bytes a
    gradient, which plans and validated runs both use. DeepSpeed keeps its own rule."""
    from clusterplan.models.library import get_model
    from clusterplan.planner.inputs import build_job
    from clusterplan.topologies.library import build_cluster

    megatron = load_profile("megatron")
    assert (megatron.grad_bytes_for("fp16"), megatron.grad_bytes_for("bf16"), megatron.grad_bytes_for("fp8")) == (2, 4, 4)
    deepspeed = load_profile("deepspeed")
    assert deepspeed.grad_bytes_for("fp16") == deepspeed.grad_bytes
    cluster = build_cluster("dgx-a100-superpod", num_devices=64)
    for precision, expected in (("fp16", 2), ("bf16", 4)):
        job, _ = build_job("gpt3-13b", get_model("gpt3-13b"), cluster, precision=precision, framework="megatron")
        assert job.grad_bytes == expected


@pytest.mark.parametrize("engine", ["cpsat", "exhaustive"])
def test_deepspeed_refuses_zero3_with_a_pipeline_even_without_data_parallel_ranks(engine):
    """DeepSpeed's PipelineEngine asserts the configured ZeRO stage is below 2, whatever dp is: a
    tp 4 x pp 2 layout on 8 GPUs (dp 1) at zero=3 was planned and priced, then refused by the export
    (the rule's ``without_data_parallel``; torchtitan's plain-DDP rules still skip dp 1)."""
    from clusterplan.cost.checks import layout_problems
    from clusterplan.cost.layout import Job, parse_layout
    from clusterplan.models.library import get_model
    from clusterplan.planner.search import SearchOptions, plan
    from clusterplan.planner.search.space import Bounds
    from clusterplan.topologies.library import build_cluster

    model, cluster = get_model("gpt3-13b"), build_cluster("dgx-a100-superpod", num_devices=8)
    job = Job(global_batch_size=64, seq_len=2048, framework="deepspeed", framework_date="2021-04")
    problems = layout_problems(model, job, cluster, parse_layout("tp=4,pp=2,dp=1,mbs=4,zero=3,recompute=none", 8))
    assert any("incompatible with pipeline parallelism" in msg for _, msg in problems)
    res = plan(model, job, cluster, SearchOptions(engine=engine, top_k=5, bounds=Bounds(fixed={"zero_stage": 3})))
    assert all(ev.layout.pp == 1 for ev in [res.best, *res.runners_up])
