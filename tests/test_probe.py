"""The cost model against what ``benchmarks/gpu_probe.py`` measured on a real GPU.

The probe files in ``benchmarks/results/`` hold one H200's measurements (eager PyTorch layers,
torchtitan's own Llama block under each recompute mode, its loss); ``benchmarks/compare_probe.py``
prices the same layers with the cost model. These tests hold the model to the measurements, so a
change to a compute or activation term that breaks agreement with real hardware fails here. They
need no GPU: the measurements are data.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from clusterplan.cost.framework import load_profile
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import activation_bytes, op_sac_activation_bytes
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.topologies.library import build_cluster

REPO = Path(__file__).resolve().parents[1]


def _compare():
    spec = importlib.util.spec_from_file_location("compare_probe", REPO / "benchmarks" / "compare_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CP = _compare()
PROBES = {p.name: json.loads(p.read_text()) for p in CP.PROBES}


def test_probe_files_are_present():
    assert set(PROBES) == {"gpu_probe_h200_2026-11-26.json", "gpu_probe2_h200_2026-11-26.json",
                           "gpu_probe3_h200_2026-11-26.json", "gpu_probe_h100_2026-11-26.json",
                           "gpu_probe_h100_small_run_2026-11-26.json", "gpu_probe_h100_tp_shard_2026-11-26.json",
                           "gpu_probe_overlap_h100_2026-11-26.json", "gpu_probe_overlap2_h100_2026-11-26.json",
                           "gpu_probe_overlap3_h100_2026-11-26.json", "gpu_probe_overlap4_h100_2026-11-26.json",
                           "gpu_probe_overlap5_h100_2026-11-26.json", "gpu_probe_moe_h100_2026-11-26.json",
                           "gpu_probe_fp8_h100_2026-11-27.json", "gpu_probe_fp8_h200_2026-11-27.json",
                           "gpu_probe_expert_gemms_h100_2026-11-27.json",
                           "gpu_probe_tp_shard_unfused_h100_2026-11-28.json"}


EXPERTS = CP.expert_gemm_rows(PROBES["gpu_probe_expert_gemms_h100_2026-11-27.json"])


@pytest.mark.parametrize("row", [r for r in EXPERTS if r["gemm_flops"] >= 50e9], ids=lambda r: r["case"])
def test_expert_gemms_never_priced_faster_than_any_way_of_launching_them(row):
    """MoE expert GEMMs at Megatron-Bridge's per-rank shapes on an H100: where each expert's GEMM is
    large enough (>= 50 GFLOP, 40 us and more) not to be bound by its launch, the model's grouped price
    is no faster than the best measured launch (one by one, over four streams as Transformer Engine
    did until 2026, grouped) and within 25% of it: the MoE runs' too-fast error is not in these GEMMs."""
    best = max(row[k] for k in ("sequential", "four_streams", "grouped") if row[k])
    assert 0.75 * best <= row["predicted_tflops"] <= best


FP8 = [dict(r, probe=name) for name in ("gpu_probe_fp8_h100_2026-11-27.json", "gpu_probe_fp8_h200_2026-11-27.json")
       for r in CP.fp8_rows(PROBES[name])]


@pytest.mark.parametrize("row", [r for r in FP8 if "linear" not in r["case"] and "GEMM" in r["case"]],
                         ids=lambda r: f"{r['probe'][10:14]}-{r['case'][:5]}")
def test_sustained_gemm_rate_within_5_percent_of_measured(row):
    """bf16 and FP8 GEMMs run back to back for 30 s on an H100 and an H200 at 700 W: the device's
    burst MAMF times its sustained fraction (bf16: 0.849, FP8: 0.905) holds the measured rate."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.05)


@pytest.mark.parametrize("row", [r for r in FP8 if "tokens" in r["case"]], ids=lambda r: f"{r['probe'][10:14]}-{r['case'][:4]}")
def test_fp8_linear_layer_priced_between_measured_and_25_percent_slower(row):
    """Llama 3 8B's linear layers in FP8 at 8192 tokens (GEMMs and their cast-transposes) on one GPU:
    the model prices them 5-22% slow (the GEMM epilogue counted on top of a MAMF that includes it;
    casts at half the streaming rate, Transformer Engine's measured kernel, where the probe's Triton
    kernel did a little better), never faster than measured; the casts are a real share of it."""
    assert row["measured_s"] <= row["predicted_s"] <= 1.25 * row["measured_s"]
    assert 0.5 * row["measured_cast_s"] <= row["predicted_cast_s"] <= 1.6 * row["measured_cast_s"]


TP_SHARD = CP.tp_shard_rows(PROBES["gpu_probe_h100_tp_shard_2026-11-26.json"])


@pytest.mark.parametrize("row", TP_SHARD, ids=lambda r: r["case"])
def test_tp_shard_time_within_11_percent_of_measured(row):
    """One tensor-parallel rank of BigScience's GPT layers (h 13824/14336, tp 8, head dim 216-224,
    FlashAttention-2) on an H100: the roofline is 4-10% slow here."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.11)


@pytest.mark.parametrize("hidden", [13824, 14336])
def test_tp_shard_per_token_time_falls_from_micro_batch_1_to_4_as_measured(hidden):
    """Measured: 4-6% less time per token at each doubling from 1 to 4 (the model's direction too);
    from 4 to 8 the measurement rises 1.5-2.4% while the model keeps falling (docs/cost-model.md)."""
    rows = {r["micro_batch"]: r for r in TP_SHARD if r["hidden"] == hidden}
    for small, large in ((1, 2), (2, 4)):
        assert rows[large]["measured_s_per_token"] < rows[small]["measured_s_per_token"]
        assert rows[large]["predicted_s_per_token"] < rows[small]["predicted_s_per_token"]


@pytest.mark.parametrize("name", ["gpu_probe_h100_2026-11-26.json", "gpu_probe_h200_2026-11-26.json"])
def test_head_size_64_attention_priced_at_the_measured_share_of_head_size_128(name):
    """SDPA causal attention fwd+bwd at head size 64 ran at 0.76-0.82 (cuDNN) and 0.86-0.89
    (FlashAttention-2) of its head-size-128 rate at 2k-8k tokens on an H100 and an H200; the model's
    head_dim_factor holds each within 0.04 (it was 1: head size 64 priced as fast as 128)."""
    from clusterplan.cost.compute import head_dim_factor
    from clusterplan.topologies.library import load_device
    dev = load_device(CP.DEVICE_OF[PROBES[name]["device"]["name"]])
    rows = {(r["backend"], r["seq"], r["head_dim"]): r["fwd_bwd_tflops"] for r in PROBES[name]["attention"]}
    for backend, variant in (("CUDNN_ATTENTION", ""), ("FLASH_ATTENTION", "fa2")):
        for seq in (2048, 4096, 8192):
            measured = rows[(backend, seq, 64)] / rows[(backend, seq, 128)]
            assert head_dim_factor(dev, variant, 64) == pytest.approx(measured, abs=0.04)
    assert head_dim_factor(dev, "", 128) == head_dim_factor(dev, "", 192) == 1.0


UNFUSED = CP.tp_shard_unfused_rows(PROBES["gpu_probe_tp_shard_unfused_h100_2026-11-28.json"])


@pytest.mark.parametrize("row", UNFUSED, ids=lambda r: r["case"])
def test_unfused_tp_shard_within_11_percent_of_measured_at_every_head_size(row):
    """One tensor-parallel rank of 2022 Megatron-DeepSpeed's GPT layer (unfused attention, fp16,
    dropout) on an H100, at head sizes 225 and 108 (not multiples of 8) as at 224 and 216: priced
    within 11%. Without the unaligned-GEMM rate the head-size-225 layers were 11-16% fast."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.11)


@pytest.mark.parametrize("mbs", [1, 2, 4, 8])
def test_unaligned_head_size_priced_slower_as_measured(mbs):
    """Hidden 14400 with 64 heads (head size 225) ran 10-15% slower per token than hidden 14336
    (head size 224) on the probe; the model prices it at least 5% slower per token, not 0.4% (the
    FLOPs' difference) as when every GEMM was priced aligned."""
    rows = {r["hidden"]: r for r in UNFUSED if r["micro_batch"] == mbs and r["tp"] == 8}
    scale = 14336 / 14400
    assert rows[14400]["measured_s"] * scale > 1.08 * rows[14336]["measured_s"]
    assert rows[14400]["predicted_s"] * scale > 1.05 * rows[14336]["predicted_s"]


@pytest.mark.parametrize("row", CP.layer_rows(PROBES["gpu_probe_h100_2026-11-26.json"])[:4], ids=lambda r: r["case"])
def test_h100_layer_time_within_6_percent_of_measured(row):
    """The same large layers on an H100 (700 W): the H200-derived constants carry over."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.06)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_torchtitan_loss_bytes_per_logit_eager_and_compiled_are_the_measured_peaks(mode):
    loss = PROBES["gpu_probe_h100_2026-11-26.json"]["loss"][mode]
    prof = load_profile("torchtitan")
    held = prof.compiled_logit_bytes if mode == "compiled" else prof.logit_bytes
    assert held == pytest.approx(loss["backward_peak_bytes_per_logit"], abs=0.05)


def test_torchtitan_compiles_its_loss_by_release():
    """Compiled loss from 2024-10-22 to 2024-12-18 and again from 2025-04-02 (a month counts in the
    state it ended with); never without compile."""
    prof = load_profile("torchtitan")
    expect = {"2024-09": 12, "2024-10": 4, "2024-11": 4, "2024-12": 12, "2025-03": 12, "2025-04": 4, "2026-02": 4}
    assert {d: prof.at(d).logit_bytes(True) for d in expect} == expect
    assert {prof.at(d).logit_bytes(False) for d in expect} == {12}
    assert load_profile("megatron").at(None).logit_bytes(True) == load_profile("megatron").logit_bytes


SMALL_RUN = CP.small_run_rows(PROBES["gpu_probe_h100_small_run_2026-11-26.json"])


@pytest.mark.parametrize("row", SMALL_RUN, ids=lambda r: r["case"])
def test_fsdp2_training_run_allocated_peak_within_3_percent(row):
    """A real FSDP2 training step on one H100 (torchtitan's structure, 1.5 B parameters, 128k
    vocabulary) against ``validate``'s pricing of the same run: fp32 shards and no 16-bit copy,
    no gradient at a one-micro-batch step's peak, the loss by release (compiled or eager)."""
    assert row["predicted_bytes"] == pytest.approx(row["measured_bytes"], rel=0.03)


@pytest.mark.parametrize("row", SMALL_RUN, ids=lambda r: r["case"])
def test_fsdp2_training_run_reserved_peak_within_12_percent(row):
    """Reserved = allocated x (1 + the measured mean allocator share, 0.235); the cases spread
    from 0.105 to 0.311 around it, so the reserved peak is a coarser figure than the allocated."""
    assert row["predicted_reserved_bytes"] == pytest.approx(row["measured_reserved_bytes"], rel=0.12)


def test_fsdp2_gradients_absent_at_a_one_microbatch_peak_only():
    one = _eval("torchtitan").memory
    two = evaluate(get_model("llama3-8b"), Job(global_batch_size=16, seq_len=8192, framework="torchtitan"),
                   build_cluster("dgx-h100-superpod", num_devices=8),
                   Layout(dp=8, zero_stage=3, recompute="selective", micro_batch_size=1)).memory
    assert one.gradients_bytes == 0.0
    assert two.gradients_bytes == pytest.approx(4 * 8.03e9 / 8, rel=0.01)
    assert _eval("megatron").memory.gradients_bytes > 0  # Megatron's gradient buffer is persistent
    # FSDP2 keeps no 16-bit copy of its shard (DeepSpeed ZeRO-3 does): only the gathered layers
    assert one.weights_bytes == pytest.approx(_eval("deepspeed").memory.weights_bytes - 2 * 8.03e9 / 8, rel=0.01)


@pytest.mark.parametrize("row", CP.layer_rows(PROBES["gpu_probe_h200_2026-11-26.json"]), ids=lambda r: r["case"])
def test_layer_time_within_6_percent_of_measured(row):
    """Forward+backward of one decoder layer (eager PyTorch, bf16, one H200): roofline vs measured
    (2.3-5.0% fast with H200's own MAMF: docs/cost-model.md)."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.06)


@pytest.mark.parametrize("row", CP.layer_rows(PROBES["gpu_probe_h200_2026-11-26.json"]), ids=lambda r: r["case"])
def test_layer_activations_within_3_percent_of_measured(row):
    assert row["predicted_bytes"] == pytest.approx(row["measured_bytes"], rel=0.03)


SMALL = [r for r in CP.layer_rows(PROBES["gpu_probe3_h200_2026-11-26.json"]) if r["measured_s"] < 2e-3]
LARGE_REPEAT = [r for r in CP.layer_rows(PROBES["gpu_probe3_h200_2026-11-26.json"]) if r["measured_s"] >= 4e-3]


@pytest.mark.parametrize("row", LARGE_REPEAT, ids=lambda r: r["case"])
def test_layer_time_repeat_run_within_6_percent(row):
    """A second probe run, with the large layers again and a GPT layer of width 4,096 at one
    2,048-token micro-batch."""
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.06)


@pytest.mark.xfail(reason="small layers are host-bound in eager PyTorch (about 46 kernels at 10-19 us of dispatch "
                          "each: benchmarks/gpu_probe.py 'launch'); the model charges 4.5 us per kernel on top of GPU "
                          "time instead of max(GPU time, dispatch time): docs/cost-model.md, known limitations",
                   strict=True)
@pytest.mark.parametrize("row", SMALL, ids=lambda r: r["case"])
def test_small_layer_time_within_6_percent(row):
    assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.06)


@pytest.mark.parametrize("row", CP.titan_rows(PROBES["gpu_probe2_h200_2026-11-26.json"]), ids=lambda r: r["case"])
def test_torchtitan_block_activations_within_1_percent(row):
    """torchtitan's own Llama-3-8B block: eager and compiled, no AC, per-op SAC and full AC."""
    assert row["predicted_bytes"] == pytest.approx(row["measured_bytes"], rel=0.01)


@pytest.mark.parametrize("probe", ["gpu_probe2_h200_2026-11-26.json", "gpu_probe_h100_2026-11-26.json"])
def test_torchtitan_block_time_within_9_percent_without_full_ac(probe):
    """torchtitan's own Llama-3-8B block (eager and compiled; no AC and per-op SAC) on an H200 and an
    H100: forward + backward + recompute as the profile prices it, eager element-wise kernels
    included (measured -0.1% to +6.3%). So most of what the torchtitan Llama-8B runs of 2024-12
    landed fast before eager kernels were priced is not in this layer's compute at torch 2.11 (whose
    RMSNorm is a fused kernel)."""
    for row in CP.titan_rows(PROBES[probe]):
        if "ac=full" not in row["case"]:
            assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.09), row["case"]


@pytest.mark.parametrize("probe", ["gpu_probe2_h200_2026-11-26.json", "gpu_probe_h100_2026-11-26.json"])
def test_torchtitan_block_time_under_full_ac_within_13_percent(probe):
    """Full AC re-runs the forward before the backward; the model prices that as one more forward,
    while the probe's layers recompute in 5.4 to 5.6 ms against a 6.9 ms first forward (H200,
    gpu_probe_h200: fwd_s_per_layer), so full AC is priced 8-13% slow: a known limitation
    (docs/cost-model.md). The H100's repeat_kv full-AC row (31.5 ms, 16% above the H200's where every
    other row differs by 3%) is within it too."""
    for row in CP.titan_rows(PROBES[probe]):
        if "ac=full" in row["case"]:
            assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=0.13), row["case"]


@pytest.mark.parametrize("probe", ["gpu_probe2_h200_2026-11-26.json", "gpu_probe_h100_2026-11-26.json"])
def test_torchtitan_eager_kernels_cost_what_compile_saves(probe):
    """The eager element-wise kernels (fp32 complex rotary, silu then product; models.ops.Kernels)
    against the compiled graph, torchtitan block without AC: measured 0.52 ms (H200) and 0.72 ms
    (H100) a layer, priced 0.65 and 0.93. The gap is held within 0.5x to 1.5x of the measurement."""
    rows = {row["case"]: row for row in CP.titan_rows(PROBES[probe])}
    eager, compiled = rows["titan eager ac=none repeat_kv"], rows["titan compile ac=none repeat_kv"]
    measured = eager["measured_s"] - compiled["measured_s"]
    predicted = eager["predicted_s"] - compiled["predicted_s"]
    assert 0.5 * measured <= predicted <= 1.5 * measured


def test_torchtitan_loss_bytes_per_logit_is_the_measured_backward_peak():
    loss = PROBES["gpu_probe2_h200_2026-11-26.json"]["loss"]
    assert load_profile("torchtitan").logit_bytes == pytest.approx(loss["backward_peak_bytes_per_logit"], abs=0.05)


def test_eager_and_kv_repeat_terms_against_hand_count():
    """Llama-3-8B layer at n tokens: Korthikanti 2nh(4) + 2n(a+2g)d + 2nad + 3 x 2nf; eager adds
    silu's 2nf, repeat_kv adds K and V at a - g more heads."""
    m = get_model("llama3-8b")
    n, h, f, a, g, d = 8192, 4096, 14336, 32, 8, 128
    fused = 2 * n * h * 4 + 2 * n * (a + 2 * g) * d + 2 * n * a * d + 3 * 2 * n * f
    assert activation_bytes(m, n, 1, False, "none", False) == pytest.approx(fused)
    assert activation_bytes(m, n, 1, False, "none", False, eager=True) == pytest.approx(fused + 2 * n * f)
    assert activation_bytes(m, n, 1, False, "none", False, kv_repeat=True) == pytest.approx(
        fused + 2 * 2 * n * (a - g) * d)
    # compiled per-op SAC drops w2's output, which backward never reads
    assert op_sac_activation_bytes(m, n, 1, False) - op_sac_activation_bytes(m, n, 1, False, True) == \
        pytest.approx(2 * n * h)


def test_huggingface_model_code_keeps_fp32_norm_copies_and_its_loss_logits():
    """A transformers Llama (model_code huggingface): each LlamaRMSNorm keeps a 4 B fp32 copy and
    the 2 B normalised tensor instead of its 2 B input (+8nh a layer), SwiGLU keeps its SiLU as
    eager modules do, and the loss holds 12 B per logit."""
    from clusterplan.cost.terms import HF_LOGIT_BYTES
    m, n = get_model("llama2-7b"), 4096.0
    h = m.hidden_size
    eager = activation_bytes(m, n, 1, False, "none", False, eager=True, kv_repeat=True)
    assert activation_bytes(m, n, 1, False, "none", False, eager=True, kv_repeat=True, fp32_norms=True) - eager \
        == pytest.approx(8 * n * h)
    cluster = build_cluster("dgx-a100-superpod", num_devices=8)
    layout = Layout(dp=8, zero_stage=3, recompute="none")
    ev = {code: evaluate(m, Job(global_batch_size=8, seq_len=4096, framework="deepspeed", model_code=code),
                         cluster, layout) for code in ("native", "huggingface")}
    assert ev["huggingface"].memory.activations_bytes > ev["native"].memory.activations_bytes
    assert HF_LOGIT_BYTES == 12.0
    with pytest.raises(SpecError, match="job.model_code"):
        Job(global_batch_size=8, seq_len=4096, model_code="hf")


def test_deepspeed_bf16_optimizer_keeps_16_bit_grads_beside_its_fp32_buffer():
    """DeepSpeed's BF16_Optimizer (ZeRO 0/1, gradients accumulated in fp32) holds an unsharded fp32
    buffer and the 16-bit .grad tensors: 6 B a parameter; 16-bit accumulation holds 2 B."""
    from clusterplan.cost.terms import Context, param_counts, static_memory
    m = get_model("llama2-7b")
    cluster = build_cluster("dgx-a100-superpod", num_devices=8)
    layout = Layout(dp=8, zero_stage=1, recompute="full")
    grads = {g: static_memory(Context(m, Job(global_batch_size=8, seq_len=4096, framework="deepspeed", grad_bytes=g),
                                      cluster), layout).gradients_bytes for g in (2, 4)}
    pc = param_counts(m, 1, 1, 1, 1, True)
    assert grads[2] == pytest.approx(2 * (pc.dense + pc.expert))
    assert grads[4] == pytest.approx(6 * (pc.dense + pc.expert))
    megatron = static_memory(Context(m, Job(global_batch_size=8, seq_len=4096, grad_bytes=4), cluster), layout)
    assert megatron.gradients_bytes == pytest.approx(4 * (pc.dense + pc.expert))


def test_fp8_all_gather_halves_the_fsdp_weight_gathers():
    """torchao's float8 all-gather (tensorwise, FSDP2) gathers one byte per weight, not two; a bf16
    job or a job without it gathers 16-bit weights."""
    from clusterplan.cost.terms import Context, dp_terms, gather_bytes
    m = get_model("llama3-8b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    layout = Layout(dp=64, zero_stage=3, recompute="selective")

    def gathers(**job):
        ctx = Context(m, Job(global_batch_size=64, seq_len=8192, framework="torchtitan", **job), cluster)
        return dp_terms(ctx.placed(layout.order), layout).per_microbatch_s
    base = gathers(precision="fp8")
    assert gathers(precision="fp8", fp8_all_gather=True) < base
    assert gathers(precision="bf16", fp8_all_gather=True) == pytest.approx(gathers(precision="bf16"))
    assert gather_bytes(Job(global_batch_size=8, seq_len=8, precision="fp8", fp8_all_gather=True)) == 1.0
    with pytest.raises(SpecError, match="fp8_all_gather"):
        Job(global_batch_size=8, seq_len=8, fp8_all_gather="yes")


def test_kv_repeat_follows_the_torchtitan_release():
    prof = load_profile("torchtitan")
    assert prof.at("2025-06").kv_repeated and not prof.at("2026-02").kv_repeated
    assert not load_profile("megatron").at(None).kv_repeated


def test_op_sac_leaves_cudnn_attention_unsaved_on_blackwell():
    """torchtitan ran cuDNN SDPA first on compute capability >= 10.0 from 2025-05 while its per-op
    SAC save list missed that op until 2025-12: the attention output goes unsaved and attention
    runs again in backward, on Blackwell only, in that window only."""
    at = load_profile("torchtitan").at
    assert not at("2025-08").op_sac_saves_attention(10.0) and not at("2025-08").op_sac_saves_attention(10.3)
    assert at("2025-08").op_sac_saves_attention(9.0) and at("2025-08").op_sac_saves_attention(None)
    assert at("2025-04").op_sac_saves_attention(10.0) and at("2025-12").op_sac_saves_attention(10.0)
    m, n = get_model("llama3-8b"), 8192.0
    a, d = m.num_attention_heads, m.attention_dims[1]
    assert op_sac_activation_bytes(m, n, 1, False) - op_sac_activation_bytes(m, n, 1, False, attention_saved=False) \
        == pytest.approx(2 * n * a * d + 4 * n * a)
    cluster = build_cluster("dgx-b200-superpod", num_devices=8)
    layout = Layout(dp=8, zero_stage=3, recompute="selective")
    ev = {date: evaluate(m, Job(global_batch_size=8, seq_len=8192, framework="torchtitan", framework_date=date),
                         cluster, layout) for date in ("2025-08", "2025-12")}
    assert ev["2025-08"].memory.activations_bytes < ev["2025-12"].memory.activations_bytes
    assert ev["2025-08"].time.recompute_s > ev["2025-12"].time.recompute_s


def _eval(framework: str, compiled: bool = False):
    cluster = build_cluster("dgx-h100-superpod", num_devices=8)
    job = Job(global_batch_size=8, seq_len=8192, framework=framework, compiled=compiled)
    return evaluate(get_model("llama3-8b"), job, cluster, Layout(dp=8, zero_stage=3, recompute="selective"))


def test_allocator_cache_counts_in_reserved_not_in_the_fit():
    ev = _eval("torchtitan")
    mem = ev.memory
    frac = load_profile("torchtitan").allocator_reserved_fraction
    assert frac > 0
    assert mem.allocator_bytes == pytest.approx(frac * mem.allocated_bytes)
    assert ev.peak_memory_bytes == pytest.approx(mem.allocated_bytes + mem.reserved_bytes + mem.allocator_bytes)
    assert ev.fits == (mem.allocated_bytes + mem.reserved_bytes <= ev.capacity_bytes)
    meg = _eval("megatron").memory  # Megatron's own share, read from its logs (not torchtitan's)
    assert meg.allocator_bytes == pytest.approx(load_profile("megatron").allocator_reserved_fraction * meg.allocated_bytes)
    assert load_profile("megatron").allocator_reserved_fraction != frac


def test_deepspeeds_pipeline_engine_keeps_its_own_measured_allocator_share():
    """DeepSpeed's logs measured the caching allocator's reserve by engine path: the PipelineEngine
    (pp > 1) at 0.168 and 0.167 of the allocated peak, ZeRO-3 without a pipeline at 0.093 and 0.081
    (bigscience_ds_logs); each path is priced with its own mean, not one mean of the four (0.127)."""
    prof = load_profile("deepspeed")
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    job = Job(global_batch_size=64, seq_len=4096, framework="deepspeed")
    piped = evaluate(get_model("llama3-8b"), job, cluster, Layout(tp=2, pp=4, dp=2, zero_stage=1, recompute="full")).memory
    flat = evaluate(get_model("llama3-8b"), job, cluster, Layout(dp=16, zero_stage=3, recompute="full")).memory
    assert piped.allocator_bytes == pytest.approx(0.1675 * piped.allocated_bytes)
    assert flat.allocator_bytes == pytest.approx(0.087 * flat.allocated_bytes)
    assert (prof.allocator_reserved_fraction_pipeline, prof.allocator_reserved_fraction) == (0.1675, 0.087)
    assert load_profile("torchtitan").allocator_reserved_fraction_pipeline is None  # one share for every layout


def test_compiled_torchtitan_keeps_fewer_activations():
    assert _eval("torchtitan", compiled=True).memory.activations_bytes < _eval("torchtitan").memory.activations_bytes


def test_job_compiled_must_be_a_bool():
    with pytest.raises(SpecError, match="job.compiled"):
        Job(global_batch_size=8, seq_len=8192, compiled="yes")


def test_the_reserved_peak_never_exceeds_the_device():
    """The allocator's cache is its measured share of the allocated peak, but the caching allocator
    frees its cache and retries before failing an allocation: a layout that fits never shows a
    reserved peak above the device's memory (here 70.6 GiB allocated leaves 9 GiB, less than 23.5%)."""
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    job = Job(global_batch_size=2048, seq_len=8192, framework="torchtitan")
    ev = evaluate(get_model("llama3-70b"), job, cluster,
                  Layout(tp=4, dp=2, cp=2, sequence_parallel=True, zero_stage=3, recompute="full"))
    mem = ev.memory
    assert ev.fits
    assert mem.allocator_bytes < load_profile("torchtitan").allocator_reserved_fraction * mem.allocated_bytes
    assert ev.peak_memory_bytes == pytest.approx(cluster.device.memory_bytes)


MOE = [r for r in CP.moe_rows(PROBES["gpu_probe_moe_h100_2026-11-26.json"]) if not r["case"].endswith("index-add")]


@pytest.mark.parametrize("row", MOE, ids=lambda r: r["case"])
def test_moe_mlp_activations_within_2_percent_of_measured(row):
    """One rank's MoE MLP on an H100 with Megatron-Core's scatter_add combine: the routed
    activations the memory model charges are what autograd keeps (docs/cost-model.md)."""
    assert row["predicted_bytes"] == pytest.approx(row["measured_bytes"], rel=0.02)


def test_moe_mlp_time_is_under_predicted_as_documented():
    """The eager block's atomic scatter-adds and unvectorized SwiGLU are not priced (the Megatron-Bridge
    recipes fuse them): the model is fast on every case, most where the experts are small."""
    errors = {r["case"]: r["predicted_s"] / r["measured_s"] - 1 for r in MOE}
    assert all(-0.65 < e < 0 for e in errors.values()), errors
    assert errors["qwen3-30b-a3b-moe-t4096"] < errors["mixtral-8x7b-moe-t8192"]


OVERLAP = [r for name in sorted(PROBES) if "overlap" in name for r in CP.overlap_rows(PROBES[name])]
REFERENCE_SHAPES = {(8192, 8192, 8192), (8192, 3584, 8192)}


def test_overlap_curve_is_the_median_of_the_valid_copy_runs():
    """The H100's comm_kernel_slowdown curve (what NCCL overlap is charged) is, at each block count,
    the median of the valid runs' measured slowdowns of the two reference GEMMs beside the copy
    kernel, which every such run keeps above the bare SM share's slowdown from 8 blocks up. Rows whose
    copy kernel timed a compile (compare_probe marks them) are left out: two at 4 blocks, one at 16."""
    import statistics
    by_blocks = {}
    for r in OVERLAP:
        if r["side"] == "copy" and not r["delay"] and r["shape"] in REFERENCE_SHAPES and "fp8" not in (r["compute"] or ""):
            by_blocks.setdefault(r["blocks"], []).append(r)
    assert sorted(by_blocks) == [4, 8, 16, 32]
    assert [sum(not r["valid"] for r in by_blocks[b]) for b in (4, 8, 16, 32)] == [2, 0, 1, 0]
    for blocks, rows in by_blocks.items():
        valid = [r for r in rows if r["valid"]]
        assert len(valid) >= 4
        assert valid[0]["curve"] == pytest.approx(statistics.median(r["measured"] for r in valid), abs=0.01), blocks
        if blocks >= 8:
            assert all(r["measured"] > r["sm_share_slowdown"] for r in valid), blocks


def test_gemms_of_fewer_waves_lose_more_to_the_tail_effect():
    """Beside 32 copy blocks: an 8192x1792x8192 GEMM (3.4 waves) slows more than the large-GEMM curve,
    one of 54 waves about as much as the curve; fp8 like bf16."""
    rows = {r["case"]: r for r in CP.overlap_rows(PROBES["gpu_probe_overlap5_h100_2026-11-26.json"]) if r["valid"]}
    few, many = rows["8192x1792x8192 + copy 32"], rows["8192x28672x8192 + copy 32"]
    assert few["measured"] > many["measured"] + 0.05 and few["measured"] > few["curve"]
    assert many["measured"] == pytest.approx(many["curve"], abs=0.05)
    assert rows["fp8 8192x8192x8192 + copy 32"]["measured"] == pytest.approx(many["curve"], abs=0.05)


def test_attention_beside_nccl_shaped_kernels_loses_about_the_sm_share():
    """Causal SDPA beside 16 and 32 copy blocks slows about as much as the SMs it loses (the model
    charges the context-parallel ring the SM share), while a GEMM with few waves loses more than the
    curve taken on large GEMMs (the curve is not conservative for small GEMMs: docs/cost-model.md)."""
    rows = {r["case"]: r for r in CP.overlap_rows(PROBES["gpu_probe_overlap4_h100_2026-11-26.json"]) if r["valid"]}
    for blocks in (16, 32):
        r = rows[f"sdpa-causal-8k-h32-d128 + copy {blocks}"]
        assert r["measured"] < r["sm_share_slowdown"] * 1.1 < r["curve"]
    small = rows["4096x3584x8192 + copy 16"]
    assert small["measured"] > small["curve"]
