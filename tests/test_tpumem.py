"""Memory as MaxText/XLA holds it on TPU (issue 36 item 2): the bf16 logits XLA keeps, the logits and
one layer's transient never held together, the fp32 parameters as the only master copy, the
weight_dtype of a run, and activations offloaded to host memory (``offload=activations``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.errors import SpecError
from clusterplan.models.library import load_model
from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.studies.runs import evaluate_run, load_runs
from clusterplan.planner.search import SearchOptions

GIB = 2**30
FAMILY_RUNS = Path(__file__).resolve().parents[1] / "planner" / "data" / "family_runs.yaml"


def _v6e(devices: int):
    return load_cluster("tpu-v6e-pod", num_devices=devices)


def _eval(model: str, devices: int, batch: int, layout: str, framework: str = "maxtext", cluster=None, **job):
    job = Job(global_batch_size=batch, seq_len=8192, framework=framework, **job)
    cluster = cluster or _v6e(devices)
    return evaluate(load_model(model), job, cluster, parse_layout(layout, devices))


def test_llama31_8b_recipe_on_v6e_8_fits():
    """tpu-recipes' Llama 3.1 8B on v6e-8 (per_device_batch_size 3, fsdp over 8, layer inputs and
    q/k/v/out projections offloaded) trained; before: 45.6 GiB with full recomputation, 6 B logits."""
    ev = _eval("llama3-8b", 8, 24, "dp=8,zero=3,mbs=3,recompute=full,offload=activations")
    assert ev.fits and ev.memory.fit_bytes < 32 * GIB
    # the logits XLA keeps: the unembedding's bf16 output, 2 B each (benchmarks/xla_tpu_probe.py)
    assert ev.memory.working_bytes == pytest.approx(2 * 3 * 8192 * 128256, rel=0.01)


def test_full_recompute_without_offload_holds_the_layer_inputs():
    """Full recomputation keeps every layer's input on the device; offloading moves exactly that to host."""
    on_device = _eval("llama3-8b", 8, 24, "dp=8,zero=3,mbs=3,recompute=full")
    offloaded = _eval("llama3-8b", 8, 24, "dp=8,zero=3,mbs=3,recompute=full,offload=activations")
    layer_inputs = 2 * 3 * 8192 * 4096 * 32
    assert on_device.memory.activations_bytes == pytest.approx(layer_inputs, rel=1e-6)
    assert offloaded.memory.activations_bytes == 0.0
    assert on_device.memory.fit_bytes - offloaded.memory.fit_bytes == pytest.approx(layer_inputs, rel=1e-6)


def test_offload_transfers_are_priced_beyond_the_compute_they_hide_behind():
    """A narrow host link exposes the copies: the step grows by what exceeds the micro-batch's compute."""
    fast = _eval("llama3-8b", 8, 24, "dp=8,zero=3,mbs=3,recompute=full,offload=activations")
    assert fast.time.offload_s == 0.0  # 12.9 GB round trip at 15 GB/s hides in 3.3 s of compute
    cluster = _v6e(8)
    tier = cluster.device.memory_tiers[0].model_copy(update={"bytes_per_s": 1e9})
    slow_cluster = replace(cluster, device=cluster.device.model_copy(update={"memory_tiers": (tier,)}))
    slow = _eval("llama3-8b", 8, 24, "dp=8,zero=3,mbs=3,recompute=full,offload=activations", cluster=slow_cluster)
    kept = 2 * 3 * 8192 * 4096 * 32
    window = fast.time.compute_s + fast.time.recompute_s
    assert slow.time.offload_s == pytest.approx(2 * kept / 1e9 - window, rel=0.02)
    assert slow.step_time_s > fast.step_time_s


def test_offload_is_refused_where_the_framework_or_the_device_lacks_it():
    model, job = load_model("llama3-8b"), Job(global_batch_size=24, seq_len=8192, framework="torchtitan")
    layout = parse_layout("dp=8,zero=1,mbs=3,recompute=full,offload=activations", 8)
    problems = layout_problems(model, job, load_cluster("dgx-h100-superpod", num_devices=8), layout)
    assert any(msg.startswith("offload=activations") for _, msg in problems)
    mt = Job(global_batch_size=64, seq_len=8192, framework="maxtext")
    problems = layout_problems(model, mt, load_cluster("tpu-v5p-pod", num_devices=64),
                               parse_layout("dp=64,zero=3,mbs=1,recompute=full,offload=activations", 64))
    assert any(key == "offload" and "host memory tier" in msg for key, msg in problems)
    with pytest.raises(SpecError, match="layout.offload"):
        parse_layout("dp=8,offload=gradients")  # optimizer is a mode now (test_optimizer_offload.py)


def test_bf16_weight_dtype_halves_the_optimizer_state():
    """MaxText's weight_dtype bfloat16 (the 70B v6e-32 recipe): parameters and both Adam moments in bf16."""
    fp32 = _eval("llama3-70b", 32, 64, "dp=32,zero=3,mbs=2,recompute=full,offload=activations")
    bf16 = _eval("llama3-70b", 32, 64, "dp=32,zero=3,mbs=2,recompute=full,offload=activations",
                 weight_bytes=2, grad_bytes=2)
    assert bf16.memory.optimizer_bytes == pytest.approx(fp32.memory.optimizer_bytes / 2)
    assert not fp32.fits and bf16.fits


def test_gpu_frameworks_keep_the_logits_beside_the_transient():
    """Megatron's memory is unchanged: 6 B per logit held on top of one layer's transient."""
    ev = _eval("llama3-8b", 8, 8, "tp=1,dp=8,zero=1,mbs=1,recompute=full", framework="megatron",
               cluster=load_cluster("dgx-h100-superpod", num_devices=8))
    logits = 6 * 8192 * 128256
    assert ev.memory.working_bytes > logits


def test_every_trillium_recipe_that_ran_is_evaluated_with_its_offload():
    runs = [r for r in load_runs(FAMILY_RUNS) if r["id"].startswith("maxtext-v6e-")]
    assert len(runs) == 12
    for run in runs:
        res = evaluate_run(run, SearchOptions(), best=False)
        assert res.reason is None, (run["id"], res.reason)
        assert res.layout["offload"] == "activations"
        assert res.fits, run["id"]
        assert abs(res.error) < 0.2, (run["id"], res.error)


def test_llama31_405b_on_two_v6e_256_slices_fits_when_fsdp_spans_them():
    """The 405B recipe (ici_fsdp 256, dcn_fsdp 2, layer inputs offloaded) trained on 512 chips; with
    base.yml's default (one copy of each shard per slice) its states alone would not leave room."""
    layout = "dp=512,zero=3,mbs=1,recompute=full,offload=activations"
    sharded = _eval("llama3-405b", 512, 512, layout + ",shard_across_domains=on")
    replicated = _eval("llama3-405b", 512, 512, layout)
    assert sharded.fits and not replicated.fits
    assert replicated.memory.optimizer_bytes == pytest.approx(2 * sharded.memory.optimizer_bytes)
    # a framework that shards over every rank already does not offer the knob
    problems = layout_problems(load_model("llama3-8b"), Job(global_batch_size=8, seq_len=8192),
                               load_cluster("dgx-h100-superpod", num_devices=8),
                               parse_layout("dp=8,zero=3,shard_across_domains=on", 8))
    assert any(msg.startswith("shard_across_domains=on") for _, msg in problems)


def _gqa_context(framework: str = "maxtext", devices: int = 8):
    from clusterplan.cost.terms import Context
    from clusterplan.models.spec import ModelSpec
    model = ModelSpec(name="gqa", num_layers=2, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
                      ffn_hidden_size=2816, vocab_size=32000, ffn_activation="swiglu")
    job = Job(global_batch_size=8, seq_len=2048, framework=framework)
    return Context(model, job, load_cluster("tpu-v5p-pod", num_devices=devices))


def test_maxtext_minimal_keeps_the_layer_input_and_the_matmul_outputs_backward_reads():
    """remat_policy minimal (checkpoint_dots_with_no_batch_dims; by name since 2025-08) keeps per token
    the layer input h, Q a*d, K and V g*d each, the out-projection's output h and SwiGLU's two up
    projections f each, 2 bytes each, the embed dim sharded over the tensor axis; not the down
    projection's output (JAX drops a residual no backward reads: benchmarks/xla_tpu_probe.py)."""
    from clusterplan.cost.terms import activation_terms
    ctx = _gqa_context()
    h, f, a, g, d = 1024, 2816, 16, 4, 64
    tokens, tp = 2 * 2048, 4  # mbs 2
    dense, moe, _ = activation_terms(ctx, tp, 1, 2, True, "selective")
    assert moe == 0.0
    assert dense == pytest.approx(2 * tokens * (h + a * d + 2 * g * d + h + 2 * f) / tp, rel=1e-12)
    # Megatron's selective (attention core) on the same layer keeps the norms' and linears' inputs and
    # the SwiGLU product besides: more than MaxText's minimal
    megatron = activation_terms(_gqa_context("megatron"), tp, 1, 2, True, "selective")[0]
    assert megatron - dense == pytest.approx(2 * tokens * (2 * h + a * d + f) / tp, rel=1e-12)


def test_maxtext_minimal_reruns_the_attention_core_and_the_elementwise_ops():
    """Backward under minimal re-runs the flash forward, the norms, the rotary, the activation and the
    residual add the MLP's norm reads, no GEMM: more than Megatron's core-attention recompute, less
    than the whole forward."""
    from clusterplan.cost.compute import op_time_s
    from clusterplan.cost.terms import compute_terms, layer_kernels
    from clusterplan.models.ops import layer_ops
    ctx = _gqa_context()
    sel, full = (compute_terms(ctx, 4, 1, 2, True, rc) for rc in ("selective", "full"))
    ops = layer_ops(ctx.model, 2 * 2048, 2048, 4, True, False, None, ctx.job.attention, True, layer_kernels(ctx))
    dev, prec = ctx.cluster.device, ctx.job.gemm_format
    rerun = [op for op in ops if op.core or op.kind == "memory"]
    expected = sum(op_time_s(op, dev, prec) * (0.5 if op.name == "residuals" else 1.0) for op in rerun)
    assert {op.name for op in rerun} >= {"attention", "norms", "rotary", "mlp_act", "residuals"}
    assert sel.recompute_s == pytest.approx(ctx.model.num_layers * expected, rel=1e-12)
    assert sel.attn_s / 3 < sel.recompute_s < full.recompute_s  # attn_s: forward + backward of the core


def test_a_profile_names_a_selective_recompute_kind_it_knows():
    from clusterplan.cost.profile_file import _activations
    with pytest.raises(SpecError, match=r"maxtext.yaml: semantics.selective_recompute: got 'everything'; allowed: "
                                        r"attention_core, op_sac, dots"):
        _activations({"selective_recompute": "everything"}, "maxtext.yaml")


def test_maxtext_64b_on_v5p_128_keeps_what_minimal_keeps():
    """The MaxText v5p 64b config as its README measured it (remat_policy minimal, 16 sequences a
    replica in one pass, base.yml of 2023: 32 heads of 256 beside h 10240, one relu up projection):
    its activations are the 64 layers' inputs, Q, K, V (a x d wide, not h), out-projection outputs and
    the one up projection (priced with Megatron's selective recomputation it needed 127.9 GiB of 95)."""
    run = next(r for r in load_runs(FAMILY_RUNS) if r["id"] == "maxtext-v5p-64b-1x128")
    from clusterplan.planner.studies.runs import price_run
    priced = price_run(run, SearchOptions())[1]
    ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
    m = run["model"]
    h, qkv, f, n = m["hidden_size"], m["num_attention_heads"] * m["head_dim"], m["ffn_hidden_size"], 16 * 2048
    assert qkv != h and m["ffn_activation"] == "gelu"
    assert ev.memory.activations_bytes == pytest.approx(64 * 2 * n * (2 * h + 3 * qkv + f) / 4, rel=1e-9)


def test_maxtext_64b_on_v5p_128_is_predicted_to_fit():
    """It ran (README of 2023-12); with 1 GiB held for the runtime it was priced 0.1 GiB over. XLA
    leaves a v5p program 95.74 GiB (devices.yaml program_memory_gib, benchmarks/results/
    xla_available_2026-11-29.txt), more than the catalogue's 95, so the runtime holds none of it."""
    from clusterplan.cost.step import evaluate
    from clusterplan.planner.studies.runs import price_run
    run = next(r for r in load_runs(FAMILY_RUNS) if r["id"] == "maxtext-v5p-64b-1x128")
    result, priced = price_run(run, SearchOptions())
    ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
    assert result.fits and ev.fits and ev.memory.reserved_bytes == 0.0


def test_maxtext_offers_no_layout_that_keeps_every_activation():
    """MaxText wraps every decoder layer in nn.remat and no remat_policy keeps everything ('none'
    saves nothing in v0.2.4), so recompute=none is neither searched nor priced under maxtext, while
    the other profiles keep it."""
    from click.testing import CliRunner

    from clusterplan.cli import main
    from clusterplan.cost.framework import load_profile
    assert "none" not in load_profile("maxtext").at("2026-08").recompute_modes()
    assert "none" in load_profile("megatron").at("2026-08").recompute_modes()
    runner = CliRunner()
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "16"]
    refused = runner.invoke(main, args + ["--layout", "tp=1,recompute=none"])
    assert refused.exit_code == 2 and "recompute=none" in refused.output and "maxtext" in refused.output
    planned = runner.invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "16"])
    assert planned.exit_code == 0 and "recompute=none" not in planned.output.split("best layout")[1].splitlines()[0]
