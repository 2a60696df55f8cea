"""Adam moments kept in another dtype than the master weights (``Job.moment_bytes``, the runs
field ``optimizer_moment_dtype``): DeepSeek-V3's BF16 AdamW moments beside FP32 master weights
(report s3.3.3), Megatron-Core's precision-aware optimizer (``--exp-avg-dtype``/``--exp-avg-sq-dtype``)."""

from __future__ import annotations

import copy

import pytest

from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import optimizer_state_bytes
from clusterplan.models.errors import SpecError
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.search.engine import SearchOptions
from clusterplan.planner.studies.runs import bundled_data_path, evaluate_run, load_runs


def test_bf16_moments_keep_fp32_masters_and_two_thirds_of_the_state():
    assert optimizer_state_bytes(Job(global_batch_size=8, seq_len=4096)) == 12.0
    assert optimizer_state_bytes(Job(global_batch_size=8, seq_len=4096, moment_bytes=2)) == 8.0  # 4 + 2 x 2
    assert optimizer_state_bytes(Job(global_batch_size=8, seq_len=4096, weight_bytes=2)) == 6.0  # MaxText bf16
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-superpod", num_devices=8)
    layout = parse_layout("dp=8,zero=1,mbs=1,recompute=full", 8)
    fp32 = evaluate(model, Job(global_batch_size=8, seq_len=8192), cluster, layout)
    bf16 = evaluate(model, Job(global_batch_size=8, seq_len=8192, moment_bytes=2), cluster, layout)
    assert bf16.memory.optimizer_bytes == pytest.approx(fp32.memory.optimizer_bytes * 8 / 12)
    assert bf16.memory.gradients_bytes == fp32.memory.gradients_bytes
    with pytest.raises(SpecError, match="job.moment_bytes"):
        Job(global_batch_size=8, seq_len=4096, moment_bytes=16)


def _deepseek_run() -> dict:
    return next(r for r in load_runs(bundled_data_path("runs.yaml")) if r["id"] == "deepseek-v3-2048h800")


def test_deepseek_v3_run_is_priced_with_its_bf16_moments():
    run = _deepseek_run()
    assert run["optimizer_moment_dtype"] == "bf16"
    fp32 = copy.deepcopy(run)
    del fp32["optimizer_moment_dtype"]
    opts = SearchOptions()
    with_bf16, without = evaluate_run(run, opts, best=False), evaluate_run(fp32, opts, best=False)
    assert with_bf16.reason is None and without.reason is None
    assert with_bf16.predicted_peak_memory_bytes < without.predicted_peak_memory_bytes
    bad = copy.deepcopy(run)
    bad["optimizer_moment_dtype"] = "int4"
    res = evaluate_run(bad, opts, best=False)
    assert res.reason and "optimizer_moment_dtype: got 'int4'; allowed: bf16, fp16, fp32" in res.reason
