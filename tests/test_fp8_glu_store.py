"""SwiGLU's inputs kept in FP8 for the backward (``Job.activation_func_fp8_input_store``, the runs
field of the same name): Megatron-Core's ``--activation-func-fp8-input-store`` (21648b5ab0, 2024-04),
DeepSeek-V3's MoE SwiGLU inputs "stored in FP8" (report s3.3.3)."""

from __future__ import annotations

import copy

import pytest

from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.terms import Context, layer_terms
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.search.engine import SearchOptions
from clusterplan.planner.studies.runs import bundled_data_path, evaluate_run, load_runs


def _kinds(model_id: str, store: bool, layout: str = "tp=1,dp=8,ep=8,zero=1,mbs=1,recompute=none"):
    model, cluster = load_model(model_id), load_cluster("dgx-h100-superpod", num_devices=8)
    job = Job(global_batch_size=8, seq_len=4096, activation_func_fp8_input_store=store)
    lay = parse_layout(layout if model.moe else layout.replace(",ep=8", ""), 8)
    return model, layer_terms(Context(model, job, cluster), lay).act_kind_bytes


def test_fp8_store_keeps_one_byte_of_each_swiglu_input():
    model, plain = _kinds("deepseek-v3", False)
    _, stored = _kinds("deepseek-v3", True)
    e, n = model.moe, 4096
    # each routed copy's gate and up (2 x expert width) and the shared experts' lose a byte an element
    moe_saved = n * 2 * e.expert_ffn_hidden_size * (e.top_k * e.load_factor + e.num_shared_experts)
    assert plain[1] - stored[1] == pytest.approx(moe_saved)
    assert plain[0] - stored[0] == pytest.approx(n * 2 * model.ffn_hidden_size)  # the dense layers' MLP
    _, gelu = _kinds("gpt3-175b", False, "tp=8,dp=1,zero=1,mbs=1,recompute=none")
    _, gelu_stored = _kinds("gpt3-175b", True, "tp=8,dp=1,zero=1,mbs=1,recompute=none")
    assert gelu == gelu_stored  # only a SwiGLU has the flag's inputs (Megatron asserts silu with a GLU)


def test_moe_act_recompute_still_drops_only_the_activation_output():
    """With ``moe_act`` recomputed the stored inputs stay (in FP8) and the output is dropped."""
    lay = "tp=1,dp=8,ep=8,zero=1,mbs=1,recompute=selective,recompute_modules=moe_act"
    _, plain = _kinds("deepseek-v3", False, lay)
    _, stored = _kinds("deepseek-v3", True, lay)
    assert 0 < stored[1] < plain[1]


def test_deepseek_v3_run_stores_its_swiglu_inputs_in_fp8_and_other_frameworks_refuse_it():
    run = next(r for r in load_runs(bundled_data_path("runs.yaml")) if r["id"] == "deepseek-v3-2048h800")
    assert run["activation_func_fp8_input_store"] is True
    without = copy.deepcopy(run)
    del without["activation_func_fp8_input_store"]
    opts = SearchOptions()
    stored, plain = evaluate_run(run, opts, best=False), evaluate_run(without, opts, best=False)
    assert stored.reason is None and stored.predicted_peak_memory_bytes < plain.predicted_peak_memory_bytes - 5e9
    other = copy.deepcopy(run)
    other["framework"] = {"name": "torchtitan", "version": "x", "date": "2025-06"}
    res = evaluate_run(other, opts, best=False)
    assert res.reason and res.reason.startswith("activation_func_fp8_input_store: true needs megatron from 2024-04")
