"""FSDP2's copies on the compute stream (issue 35, torchtitan's single-node FSDP runs): after each
all-gather the gathered buffer is copied into the parameters, before each reduce-scatter the 16-bit
gradients into the fp32 reduce-scatter buffer (``cost.terms.fsdp_copy_s``)."""

from __future__ import annotations

import pytest

from clusterplan.cost.compute import memory_rate
from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import Context, dp_terms, param_counts
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.search import SearchOptions, objective_seconds, plan


def _ctx(devices: int = 8, framework: str = "torchtitan", **job) -> Context:
    job = Job(global_batch_size=2 * devices, seq_len=2048, framework=framework, **job)
    return Context(load_model("llama3-8b"), job, load_cluster("dgx-h100-superpod", num_devices=devices))


def _bytes_per_param(ctx: Context) -> float:
    """The copies' bytes per parameter a second at the device's memory-bound rate."""
    pc = param_counts(ctx.model, 1, 1, 1, 1, True, False)
    return (pc.dense + pc.expert) / memory_rate(ctx.cluster.device)


@pytest.mark.parametrize("zero, gathers", [(3, 2), (2, 1)])
def test_copies_per_micro_batch_by_hand(zero, gathers):
    """Each gather reads and writes 2 B a weight, the reduce-scatter's copy-in reads the 2 B
    gradient and writes it as fp32 (4 B); ZeRO-3 gathers twice a micro-batch, ZeRO-2 once."""
    ctx = _ctx()
    t = dp_terms(ctx, parse_layout(f"dp=8,zero={zero}", 8))
    assert t.copy_s == pytest.approx((gathers * 2 * 2 + 2 + 4) * _bytes_per_param(ctx))
    assert t.copy_s > 0


def test_fp8_all_gather_copies_one_byte_a_weight():
    """torchao's float8 all-gather gathers (and so copies out) one byte a weight."""
    ctx = _ctx(precision="fp8", fp8_all_gather=True)
    t = dp_terms(ctx, parse_layout("dp=8,zero=3", 8))
    assert t.copy_s == pytest.approx((2 * 2 * 1 + 2 + 4) * _bytes_per_param(ctx))


def test_no_copies_where_nothing_is_sharded_or_the_fsdp_is_not_fsdp2():
    """DDP, one rank, Megatron's distributed optimizer and Composer's FSDP (llm-foundry, flat
    parameters) make none of these copies."""
    assert dp_terms(_ctx(), parse_layout("dp=8,zero=0", 8)).copy_s == 0.0
    assert dp_terms(_ctx(), parse_layout("tp=8,dp=1,zero=3", 8)).copy_s == 0.0
    assert dp_terms(_ctx(framework="megatron"), parse_layout("dp=8,zero=1", 8)).copy_s == 0.0
    assert dp_terms(_ctx(model_code="llmfoundry"), parse_layout("dp=8,zero=3", 8)).copy_s == 0.0


def test_the_step_pays_the_copies_every_micro_batch_in_the_open(monkeypatch):
    """Two micro-batches pay them twice; nothing overlaps them (they run on the compute stream):
    the exposed data-parallel time is what it is without them plus one copy time a micro-batch."""
    import clusterplan.cost.terms.dp as dp_module
    ctx = _ctx()
    copy = dp_terms(ctx, parse_layout("dp=8,zero=3", 8)).copy_s
    layouts = {m: parse_layout(f"dp=8,zero=3,mbs={3 - m}", 8) for m in (1, 2)}
    paid = {m: evaluate(ctx.model, ctx.job, ctx.cluster, lay) for m, lay in layouts.items()}
    monkeypatch.setattr(dp_module, "fsdp_copy_s", lambda *args: (0.0, 0.0))
    bare = {m: evaluate(ctx.model, ctx.job, ctx.cluster, lay) for m, lay in layouts.items()}
    for m in (1, 2):
        assert paid[m].num_microbatches == m
        assert paid[m].time.dp_comm_s - bare[m].time.dp_comm_s == pytest.approx(m * copy)
        assert paid[m].step_time_s - bare[m].step_time_s == pytest.approx(m * copy)


def test_pipeline_keeps_fsdp_gathered_so_the_copies_are_once_a_step():
    """With pp > 1 torchtitan keeps the parameters gathered and the gradients unsharded through the
    micro-batches (``fsdp_with_pp: unsharded``): one copy-out and one copy-in a step."""
    ctx = _ctx(16)
    t = dp_terms(ctx, parse_layout("dp=8,pp=2,zero=3", 16))
    pc = param_counts(ctx.model, 1, 2, 1, 1, True, False)
    assert t.copy_s == 0.0
    assert t.blocking_s == pytest.approx((2 * 2 + 2 + 4) * (pc.dense + pc.expert) / memory_rate(ctx.cluster.device))


@pytest.mark.parametrize("engine", ["cpsat", "exhaustive"])
def test_search_objective_carries_the_copies(engine):
    """The searched (integer) objective of the best layout is its evaluated step time, copies
    included, in both engines, and the engines agree."""
    ctx = _ctx()
    result = plan(ctx.model, ctx.job, ctx.cluster, SearchOptions(engine=engine, top_k=1))
    best = result.best
    assert dp_terms(ctx, best.layout).copy_s > 0
    assert objective_seconds(result.objective_units[0]) == pytest.approx(best.step_time_s, rel=1e-3)
    other = plan(ctx.model, ctx.job, ctx.cluster, SearchOptions(engine="exhaustive" if engine == "cpsat" else "cpsat",
                                                                top_k=1))
    assert other.best.step_time_s == pytest.approx(best.step_time_s, rel=1e-6)
