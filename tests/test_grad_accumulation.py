"""Gradient accumulation priced per framework (issue 35): each micro-batch's weight gradients are
added into the step's gradient by a memory-bound pass of its own unless the framework fuses it into
the weight-gradient GEMM (``cost.terms.grad_accumulation_s``, ``semantics.grad_accumulation_history``).

The byte counts are written out here from the frameworks' code (cited in cost/terms/dp.py), not
read from the module, so a change to them shows."""

from __future__ import annotations

import dataclasses

import pytest

from test_search import _check_engines_agree  # tests/ is on the path, as for grids (test_ceilings.py)

from clusterplan.cost.checks import layout_problems
from clusterplan.cost.compute import memory_rate
from clusterplan.cost.layout import Job, Layout, num_microbatches
from clusterplan.cost.profile_file import _grad_accumulation
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import Context, param_counts
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, objective_seconds, plan
from clusterplan.planner.search.space import Bounds, build_space, split_spaces
from clusterplan.planner.search.tables import build_tables
from clusterplan.topologies.library import build_cluster

MODEL = get_model("gpt3-1.3b")
A100 = build_cluster("dgx-a100-superpod", num_devices=16)


def _evaluate(framework: str, layout: Layout, global_batch: int = 64, cluster=A100, **job):
    job = Job(global_batch_size=global_batch, seq_len=2048, framework=framework, **job)
    assert not layout_problems(MODEL, job, cluster, layout), layout_problems(MODEL, job, cluster, layout)
    ev = evaluate(MODEL, job, cluster, layout)
    assert sum(dataclasses.asdict(ev.time).values()) == pytest.approx(ev.step_time_s, rel=1e-12)
    return ev, num_microbatches(job, layout)


def _per_rank_params(layout: Layout, shards: int = 1) -> float:
    pc = param_counts(MODEL, layout.tp, layout.pp, layout.vp, layout.ep)
    return (pc.dense + pc.expert) / shards


def _seconds(num_bytes: float, cluster=A100) -> float:
    return num_bytes / memory_rate(cluster.device)


ZERO1 = Layout(tp=2, pp=2, dp=4, micro_batch_size=2, zero_stage=1, recompute="full", dp_overlap=False)


def test_deepspeed_bf16_optimizer_upcasts_and_adds_every_micro_batch():
    """BF16_Optimizer (fp32 accumulation, ZeRO 0/1): ``hp_grad.add_(lp.grad.to(fp32))`` after every
    backward, the first included: 2 B read + 4 B written by the upcast, 4 + 4 B read and 4 B written
    by the add, over all of the rank's parameters."""
    ev, m = _evaluate("deepspeed", ZERO1, grad_bytes=4)
    assert m == 8
    assert ev.time.grad_accum_s == pytest.approx(_seconds(m * 18 * _per_rank_params(ZERO1)), rel=1e-9)


def test_deepspeed_16_bit_accumulation_and_zero2_add_through_autograd():
    """16-bit accumulation: autograd adds each later micro-batch's .grad in place (read both, write
    one: 6 B), the first taken as it comes; ZeRO-2 has no fp32 buffer, so fp32 gradients add on the
    rank's partition (12 B a parameter of its shard)."""
    ev, m = _evaluate("deepspeed", ZERO1, grad_bytes=2)
    assert ev.time.grad_accum_s == pytest.approx(_seconds((m - 1) * 6 * _per_rank_params(ZERO1)), rel=1e-9)
    zero2 = Layout(tp=2, pp=1, dp=8, micro_batch_size=2, zero_stage=2, recompute="full")  # no ZeRO-2 with pp
    ev, m = _evaluate("deepspeed", zero2, grad_bytes=4)
    assert m == 4
    assert ev.time.grad_accum_s == pytest.approx(_seconds((m - 1) * 12 * _per_rank_params(zero2, 8)), rel=1e-9)


def test_megatron_fuses_the_add_into_the_gemm_since_2022_02():
    """gradient_accumulation_fusion (2022-02 on): nothing of its own; before, the DDP hook's
    ``main_grad.add_(grad)`` every micro-batch: 2 B + 4 B read, 4 B written."""
    ddp = ZERO1.with_(zero_stage=0)  # the distributed optimizer came later
    ev, _ = _evaluate("megatron", ddp)
    assert ev.time.grad_accum_s == 0.0
    old, m = _evaluate("megatron", ddp, framework_date="2021-06")
    assert old.time.grad_accum_s == pytest.approx(_seconds(m * 10 * _per_rank_params(ddp)), rel=1e-9)


def test_torchtitan_fsdp2_adds_the_fp32_shard_from_the_second_micro_batch():
    """FSDP2 reduce-scatters every micro-batch and adds the fp32 shard into .grad
    (``sharded_param.grad._local_tensor += new_sharded_grad``) from the second one."""
    fsdp = Layout(tp=2, pp=1, dp=8, micro_batch_size=2, zero_stage=3, sequence_parallel=True)
    ev, m = _evaluate("torchtitan", fsdp)
    assert m == 4
    assert ev.time.grad_accum_s == pytest.approx(_seconds((m - 1) * 12 * _per_rank_params(fsdp, 8)), rel=1e-9)
    one, m1 = _evaluate("torchtitan", fsdp, global_batch=16)
    assert m1 == 1 and one.time.grad_accum_s == 0.0  # one micro-batch: nothing to add


def test_nanotron_adds_into_its_fp32_buffer_every_micro_batch():
    ddp = Layout(tp=2, pp=1, dp=8, micro_batch_size=2, zero_stage=0, recompute="full")
    ev, m = _evaluate("nanotron", ddp, framework_date="2025-06")
    assert ev.time.grad_accum_s == pytest.approx(_seconds(m * 10 * _per_rank_params(ddp)), rel=1e-9)


def test_maxtext_scan_carry_only_with_gradient_accumulation_steps():
    """MaxText's scan carry (zeros, ``x + y`` per micro-batch: 3 elements moved per parameter) runs
    only with gradient_accumulation_steps > 1 and pp 1; under ZeRO-1 it holds bf16 gradients."""
    tpu = build_cluster("tpu-v5p-pod", num_devices=16)
    fsdp = Layout(tp=1, pp=1, dp=16, micro_batch_size=1, zero_stage=3)
    ev, m = _evaluate("maxtext", fsdp, cluster=tpu)
    assert m == 4
    assert ev.time.grad_accum_s == pytest.approx(_seconds(m * 12 * _per_rank_params(fsdp, 16), tpu), rel=1e-9)
    zero1 = fsdp.with_(zero_stage=1)
    ev, m = _evaluate("maxtext", zero1, cluster=tpu)
    assert ev.time.grad_accum_s == pytest.approx(_seconds(m * 6 * _per_rank_params(zero1), tpu), rel=1e-9)
    one, m1 = _evaluate("maxtext", fsdp, global_batch=16, cluster=tpu)
    assert m1 == 1 and one.time.grad_accum_s == 0.0


def test_an_unknown_accumulation_kind_is_refused_by_name():
    with pytest.raises(SpecError, match=r"semantics.grad_accumulation_history: got 'bogus'; allowed: fused, "):
        _grad_accumulation({"grad_accumulation_history": [{"since": "2024-01", "kind": "bogus"}]}, "profile x")


@pytest.mark.parametrize("framework, cluster, zero, batch, table", [
    ("deepspeed", ("dgx-a100-superpod", 16), 1, 64, "GA"),  # fp32 buffer: every micro-batch
    ("torchtitan", ("dgx-h100-superpod", 16), None, 64, "GAW"),  # autograd: the first taken as it comes
    ("maxtext", ("tpu-v5p-pod", 16), None, 64, "GA1"),  # the scan: none at one micro-batch
    ("maxtext", ("tpu-v5p-pod", 16), None, 16, "GA1"),  # dp 16: one micro-batch, nothing added
])
def test_the_search_prices_what_evaluate_prices(framework, cluster, zero, batch, table):
    """Both engines agree with the accumulation in their tables, and the winners' objectives are
    evaluate's step times, accumulation included (one-sequence micro-batches: 64 / dp of them)."""
    cluster = build_cluster(*cluster)
    job = Job(global_batch_size=batch, seq_len=2048, framework=framework, grad_bytes=4)
    bounds = Bounds(fixed={"micro_batch_size": 1, **({"zero_stage": zero} if zero else {})})
    space = build_space(MODEL, job, cluster, bounds)
    tables = [build_tables(Context(MODEL, job, cluster), sub) for sub in split_spaces(space, MODEL, job, cluster)]
    assert any(getattr(T, table).any() for T in tables)
    _check_engines_agree(MODEL, job, cluster, bounds)
    res = plan(MODEL, job, cluster, SearchOptions(engine="cpsat", top_k=2, bounds=bounds))
    for units, ev in zip(res.objective_units, [res.best, *res.runners_up]):
        assert objective_seconds(units) == pytest.approx(ev.step_time_s, rel=1e-3)
        pays = ev.num_microbatches > 1 and (framework != "maxtext" or ev.layout.pp == 1)  # a pipeline's own scan
        assert (ev.time.grad_accum_s > 0) == pays


def test_the_adds_count_as_busy_time_in_energy_and_in_the_energy_search():
    """Like the optimizer step, the adds keep the device busy: the energy (``cost.energy.busy_s``) and
    the energy objective of both engines count them, and the integer objective is the float energy."""
    from clusterplan.cost.energy import busy_s, objective_weights, step_energy_j
    from clusterplan.planner.search.cpsat import solve_cpsat
    from clusterplan.planner.search.exhaustive import solve_exhaustive
    from clusterplan.planner.search.tables import layout_from_indices

    ev, _ = _evaluate("deepspeed", ZERO1, grad_bytes=4)
    t = ev.time
    assert busy_s(t) == pytest.approx(t.compute_s + t.recompute_s + t.optimizer_s + t.grad_accum_s, rel=1e-12)
    job = Job(global_batch_size=64, seq_len=2048, framework="deepspeed", grad_bytes=4)
    bounds = Bounds(fixed={"micro_batch_size": 1, "zero_stage": 1})
    weights = objective_weights(A100, "energy")
    assert weights[1] > 0
    space = build_space(MODEL, job, A100, bounds)
    T = build_tables(Context(MODEL, job, A100), space, bounds.headroom(job, A100), False, weights)
    assert T.GA.any()
    exhaustive, _ = solve_exhaustive(T, 2)
    cpsat = solve_cpsat(T, top_k=2)
    assert exhaustive and [o for o, _ in cpsat.solutions] == [o for o, _ in exhaustive]
    for value, idx in cpsat.solutions:
        ev = evaluate(MODEL, job, A100, layout_from_indices(T.space, idx, fp8_gathers=T.PG))
        assert ev.time.grad_accum_s > 0
        joules = step_energy_j(A100, ev.step_time_s, ev.busy_s)
        assert objective_seconds(value) * A100.num_devices == pytest.approx(joules, rel=2e-3)
