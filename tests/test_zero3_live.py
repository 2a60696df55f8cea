"""ZeRO-3's live set of gathered weights and full-size gradients (``cost.terms.zero3_live_bytes``):
DeepSpeed before v0.6.0 gathers one module at a time, prefetches the next only under
``stage3_max_live_parameters`` and reduces a gradient above the reduce bucket whole, holding it
until the next reduction; later releases and other frameworks keep two layers gathered. The same
memory in ``evaluate`` and in both search engines."""

from __future__ import annotations

import pytest

from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import Context, param_counts, static_memory
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.planner.search.space import Bounds
from clusterplan.planner.studies.runs import bundled_data_path, evaluate_run, load_runs
from clusterplan.topologies.library import build_cluster

# Narayanan et al. 2021, Table 1's 529.6B row (the shape memory_runs.yaml records)
GPT530 = ModelSpec(name="gpt-529.6b", num_layers=105, hidden_size=20480, num_attention_heads=128, num_kv_heads=128,
                   ffn_hidden_size=81920, vocab_size=51200, ffn_activation="gelu", seq_len=2048)


def _job(date: str, framework: str = "deepspeed", batch: int = 2560) -> Job:
    return Job(global_batch_size=batch, seq_len=2048, precision="fp16", framework=framework, framework_date=date,
               grad_bytes=2)  # DeepSpeed's fp16 gradients (semantics.grad_bytes), as validate prices the runs


def _beside_shards(date: str, framework: str = "deepspeed") -> tuple[float, float]:
    """Weights and gradients of the 529.6B model at ZeRO-3 on 640 GPUs, less their shards."""
    cluster = build_cluster("dgx-a100-superpod", num_devices=640)
    layout = Layout(tp=1, dp=640, zero_stage=3, micro_batch_size=4, recompute="full")
    job = _job(date, framework)
    static = static_memory(Context(GPT530, job, cluster), layout)
    pc = param_counts(GPT530, 1, 1, 1, 1)
    shard = (pc.dense + pc.expert) / 640
    weights = 0.0 if not job.profile.profile.sharded_weight_copy else 2 * shard
    return static.weights_bytes - weights, static.gradients_bytes - job.grad_bytes * shard


def test_deepspeed_2021_holds_one_mlp_matrix_its_gradient_and_the_one_before():
    """h = 20480: an MLP projection is 4h^2 = 1.68e9 elements, over the 1e9 live bound, so nothing
    is prefetched beside it; the attention output (h^2 = 4.2e8) prefetches the first MLP projection
    (2.1e9 gathered). The peak is the first MLP projection's backward: its weight (2 bytes x 4h^2),
    its gradient and the second projection's, reduced whole (both above the 5e8 bucket), 2 x 4h^2
    x 2 bytes: 10.1 GB in all, where two gathered layers (2 x 12h^2 x 2 bytes) are 20.1 GB."""
    h = GPT530.hidden_size
    weights, grads = _beside_shards("2021-04")
    assert weights == pytest.approx(2 * 4 * h * h, rel=1e-6)
    assert grads == pytest.approx(2 * 2 * 4 * h * h, rel=1e-6)
    assert weights + grads < 0.51 * 2 * 2 * 12 * h * h


@pytest.mark.parametrize("date,framework", [("2022-06", "deepspeed"), ("2025-01", "torchtitan")])
def test_later_releases_and_fsdp_keep_two_layers_gathered(date, framework):
    """From v0.6.0 (2022-03) DeepSpeed prefetches by bucket; FSDP prefetches the next layer: two
    layers' weights (2 x 12h^2 elements, 2 bytes each, with the layer's norms and the vocabulary's
    share), no full-size gradient."""
    h, pc = GPT530.hidden_size, param_counts(GPT530, 1, 1, 1, 1)
    weights, grads = _beside_shards(date, framework)
    assert weights == pytest.approx(2 * 2 * (pc.dense + pc.expert) / GPT530.num_layers, rel=1e-6)
    assert weights > 2 * 2 * 12 * h * h and grads == pytest.approx(0.0, abs=1.0)


def test_the_640_gpu_run_that_trained_is_predicted_to_fit():
    """Narayanan et al. 2021 Table 2: ZeRO-3 ran the 529.6B model on 640 GPUs at micro-batch 4 (138
    teraFLOP/s per GPU); priced with two gathered layers it needed 90.0 GB of 85.9."""
    runs = {r["id"]: r for r in load_runs(bundled_data_path("memory_runs.yaml"))}
    result = evaluate_run(runs["narayanan2021-t2-zero3-529.6b-640gpu-mbs4"], SearchOptions(), best=False)
    assert result.reason is None and result.measured_fits is True and result.fits is True


@pytest.mark.parametrize("engine", ["cpsat", "exhaustive"])
def test_the_search_holds_the_live_set_as_evaluate_does(engine):
    """GPT-3 13B under DeepSpeed of 2021-04 at ZeRO-3 on 8 A100s: the search's memory of its best
    layout and runners-up is evaluate's, with the module-by-module live set."""
    model, cluster = get_model("gpt3-13b"), build_cluster("dgx-a100-superpod", num_devices=8)
    job = _job("2021-04", batch=64)
    res = plan(model, job, cluster, SearchOptions(engine=engine, top_k=3, bounds=Bounds(fixed={"zero_stage": 3, "dp": 8})))
    for ev in [res.best, *res.runners_up]:
        again = evaluate(model, job, cluster, ev.layout)
        assert ev.memory.fit_bytes == pytest.approx(again.memory.fit_bytes)
        shard_grads = job.grad_bytes * model.num_params / 8
        assert ev.memory.gradients_bytes > shard_grads + job.grad_bytes * 4 * model.hidden_size ** 2


def test_a_bad_live_kind_in_a_profile_names_the_field():
    from clusterplan.cost.profile_file import _zero3
    with pytest.raises(SpecError, match=r"semantics.zero3_live_history: got 'modules'; allowed: layers, module_prefetch"):
        _zero3({"zero3_live_history": [{"since": "2021-03", "live": "modules"}]}, "deepspeed.yaml")
    with pytest.raises(SpecError, match=r"semantics.zero3_max_live_numel: got -1"):
        _zero3({"zero3_max_live_numel": -1}, "deepspeed.yaml")
