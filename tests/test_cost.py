"""Unit tests of the cost model: each term against a hand calculation from its source.

Sources (see shared/FORMULAS.md): Narayanan et al. 2021 (SC21) eq. (3) and Korthikanti et al. 2022
for FLOPs per iteration; PaLM (Chowdhery et al. 2022) app. B for model FLOPs per token; Korthikanti
et al. 2022 section 4 for activation memory; Thakur et al. 2005 and nccl-tests PERFORMANCE.md for
collectives; Narayanan et al. 2021 section 2.2 for the pipeline bubble; Rajbhandari et al. 2020
for ZeRO. Every expected value below is written out from the source, not read back from the code.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from clusterplan.cost import collectives as coll
from clusterplan.cost.compute import (BACKWARD_FACTOR, CAST_TRANSPOSE_RATE_SHARE, fp8_cast_s, gemm_rate, memory_rate,
                                      op_time_s)
from clusterplan.cost.layout import Job, Layout, microbatch_group_size, parse_layout
from clusterplan.cost.step import evaluate, evaluate_ctx, inflight_layers, num_microbatches
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import (
    CUDA_CONTEXT_EAGER_BYTES, CUDA_CONTEXT_LAZY_BYTES, NCCL_COMMUNICATOR_BYTES, NCCL_PAIR_COMMUNICATOR_BYTES,
    OPTIMIZER_STATE_BYTES, RUNTIME_RESERVE_BYTES, WEIGHT_BYTES, Context, activation_bytes, head_terms, layer_terms,
    layers_on_stage, nccl_communicator_sizes, p2p_s, param_counts, runtime_bytes, static_memory, tp_comm_terms,
)
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.models.ops import (
    Op, _gemm, head_ops, layer_ops, megatron_flops_per_iteration, model_flops_per_token,
)
from clusterplan.models.spec import MoESpec, ModelSpec
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.search.engine import plan
from clusterplan.topologies.cluster import GroupProfile
from clusterplan.topologies.library import build_cluster

REL = 1e-9


def gpt_like(h: int = 1024, a: int = 16, layers: int = 8, vocab: int = 50304, **kw) -> ModelSpec:
    """GPT-3 shape: GELU, f = 4h, multi-head attention, untied, dropout on (Korthikanti's setting)."""
    fields = dict(name="gpt-like", num_layers=layers, hidden_size=h, num_attention_heads=a,
                  ffn_hidden_size=4 * h, vocab_size=vocab, ffn_activation="gelu", tied_embeddings=False,
                  dropout=True)
    fields.update(kw)
    return ModelSpec(**fields)


GPT = gpt_like()
MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
                ffn_hidden_size=2816, vocab_size=32000, ffn_activation="swiglu",
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=2816))


@pytest.fixture(scope="module")
def cluster16():
    return build_cluster("dgx-h100-superpod", num_devices=16)


# ---- models/ops.py: FLOPs ------------------------------------------------------------------------
def _model_flops(ops: list[Op]) -> float:
    """FLOPs as counted for MFU: no causal halving (``causal_fraction`` ignored)."""
    return sum(op.flops for op in ops)


@pytest.mark.parametrize("model", [gpt_like(), gpt_like(h=2048, a=32, layers=24, vocab=51200),
                                   get_model("gpt3-175b")], ids=["1k", "2k", "gpt3-175b"])
@pytest.mark.parametrize("seq_len", [1024, 2048])
def test_op_flops_match_megatron_per_iteration(model, seq_len):
    """Sum of the per-op forward FLOPs x3 (fwd + 2x bwd) over all layers plus the LM head is
    Korthikanti's ``72 B s L h^2 (1 + s/(6h) + V/(12 L h))``; with full recomputation the layers run
    their forward twice (x4) while the head does not, which is Narayanan's 96-factor form."""
    batch = 8
    n = batch * seq_len
    layer = _model_flops(layer_ops(model, n, seq_len, tp=1, sp=False, moe=False))
    head = _model_flops(head_ops(model, n, tp=1))
    no_recompute = 3 * model.num_layers * layer + 3 * head
    full_recompute = 4 * model.num_layers * layer + 3 * head
    assert no_recompute == pytest.approx(megatron_flops_per_iteration(model, batch, seq_len, False), rel=REL)
    assert full_recompute == pytest.approx(megatron_flops_per_iteration(model, batch, seq_len, True), rel=REL)


def test_megatron_formula_by_hand():
    """The library function itself, against the printed numbers for one point."""
    m = gpt_like(h=1024, layers=8, vocab=50304)
    B, s, L, h, V = 4, 2048, 8, 1024, 50304
    assert megatron_flops_per_iteration(m, B, s, False) == pytest.approx(
        72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-15)
    assert megatron_flops_per_iteration(m, B, s, True) == pytest.approx(
        96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-15)


def test_layer_gemm_flops_by_hand():
    """qkv 6nh^2, core 4nsh, out 2nh^2, up and down 8nh^2 each (GPT shape, 2 FLOPs per MAC)."""
    m, n, s = GPT, 4096, 2048
    h = m.hidden_size
    flops = {op.name: op.flops for op in layer_ops(m, n, s, 1, False, False)}
    assert flops["qkv"] == pytest.approx(6 * n * h * h, rel=REL)
    assert flops["attention"] == pytest.approx(4 * n * s * h, rel=REL)
    assert flops["attn_out"] == pytest.approx(2 * n * h * h, rel=REL)
    assert flops["mlp_up"] == pytest.approx(8 * n * h * h, rel=REL)
    assert flops["mlp_down"] == pytest.approx(8 * n * h * h, rel=REL)
    assert sum(flops.values()) == pytest.approx(24 * n * h * h + 4 * n * s * h, rel=REL)


def test_gqa_swiglu_flops_by_hand():
    """GQA: K and V have g heads (qkv = 2 n h (h + 2 g d)); SwiGLU: gate + up = 2 n h 2f."""
    m = ModelSpec(name="gqa", num_layers=2, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
                  ffn_hidden_size=2816, vocab_size=32000, ffn_activation="swiglu")
    n, h, d, g, f = 1000, 1024, 64, 4, 2816
    flops = {op.name: op.flops for op in layer_ops(m, n, 2048, 1, False, False)}
    assert flops["qkv"] == pytest.approx(2 * n * h * (h + 2 * g * d), rel=REL)
    assert flops["mlp_up"] == pytest.approx(2 * n * h * 2 * f, rel=REL)
    assert flops["mlp_down"] == pytest.approx(2 * n * f * h, rel=REL)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_splits_matmul_flops(tp):
    """Megatron splits every GEMM and the attention heads ``tp`` ways: per-rank FLOPs are 1/tp."""
    for model, moe in ((GPT, False), (MOE, True)):
        ops1 = [o for o in layer_ops(model, 2048, 2048, 1, False, moe) if o.name != "router"]
        opst = [o for o in layer_ops(model, 2048, 2048, tp, False, moe) if o.name != "router"]
        assert _model_flops(opst) * tp == pytest.approx(_model_flops(ops1), rel=REL)
    assert _model_flops(head_ops(GPT, 2048, tp)) * tp == pytest.approx(_model_flops(head_ops(GPT, 2048, 1)), rel=REL)


def test_model_flops_per_token_mha_untied():
    """``6 N + 12 L s a d`` with N the matmul parameters: the input embedding is a lookup."""
    m, s = GPT, 2048
    L, a, d, h, V = m.num_layers, m.num_attention_heads, m.head_dim_resolved, m.hidden_size, m.vocab_size
    n_matmul = m.num_params - V * h
    assert model_flops_per_token(m, s, causal=False) == pytest.approx(6 * n_matmul + 12 * L * s * a * d, rel=REL)
    assert model_flops_per_token(m, s) == pytest.approx(6 * n_matmul + 6 * L * s * a * d, rel=REL)  # causal half


def test_model_flops_per_token_tied_counts_lm_head():
    """A tied matrix still does the LM-head GEMM: N is the full parameter count (PaLM convention)."""
    m, s = get_model("gpt3-1.3b"), 2048
    assert m.tied_embeddings
    expected = 6 * m.num_params + 12 * m.num_layers * s * m.num_attention_heads * m.head_dim_resolved
    assert model_flops_per_token(m, s, causal=False) == pytest.approx(expected, rel=REL)


def test_model_flops_per_token_agrees_with_op_sum():
    """Per token, 3x the op FLOPs equal ``6N + 12Lsh`` (PaLM count: ops carry the full square and a
    causal fraction) minus the norm weights, which do no GEMM."""
    m, s, n = GPT, 2048, 2048
    per_token = 3 * (m.num_layers * _model_flops(layer_ops(m, n, s, 1, False, False))
                     + _model_flops(head_ops(m, n, 1))) / n
    norms = m.num_layers * m.norm_params_per_layer + m.hidden_size
    assert model_flops_per_token(m, s, causal=False) - per_token == pytest.approx(6 * norms, rel=1e-6)


# ---- cost/compute.py: roofline ---------------------------------------------------------------------
def test_roofline_gemm_and_memory_ops(cluster16):
    dev = cluster16.device
    big = Op("g", "gemm", 1e13, 1e6)
    rate = dev.peak("bf16") * dev.gemm.large * dev.sustained_fraction
    assert gemm_rate(dev, "bf16") == pytest.approx(rate, rel=REL)
    assert op_time_s(big, dev, "bf16") == pytest.approx(1e13 / rate + dev.kernel_overhead_s, rel=REL)
    # backward: two GEMMs of the forward's size, two kernels
    assert op_time_s(big, dev, "bf16", backward=True) == pytest.approx(2e13 / rate + 2 * dev.kernel_overhead_s, rel=REL)
    mem = Op("m", "memory", 0.0, 1e9)
    bw = dev.memory_bytes_per_s * dev.memory_efficiency
    assert memory_rate(dev) == pytest.approx(bw, rel=REL)
    assert op_time_s(mem, dev, "bf16") == pytest.approx(1e9 / bw + dev.kernel_overhead_s, rel=REL)
    assert op_time_s(mem, dev, "bf16", True) == pytest.approx(BACKWARD_FACTOR["memory"] * 1e9 / bw
                                                              + dev.kernel_overhead_s, rel=REL)


def test_roofline_attention_executes_causal_half(cluster16):
    dev = cluster16.device
    att = Op("a", "attention", 1e13, 1e6, causal_fraction=0.5)
    rate = dev.peak("bf16") * dev.attention_efficiency * dev.sustained_fraction
    assert op_time_s(att, dev, "fp8") == pytest.approx(0.5e13 / rate + dev.kernel_overhead_s, rel=REL)
    assert op_time_s(att, dev, "bf16", True) == pytest.approx(2.5 * 0.5e13 / rate + dev.kernel_overhead_s, rel=REL)


def test_fp8_casts_add_to_the_gemm_and_follow_the_norm_fusion():
    """FP8 casts are kernels of their own: a compute-bound GEMM's FP8 time is its compute plus the
    cast-transpose of its input (forward) and of its output gradient (backward), 4 B per element at
    half the streaming rate; a norm-fed GEMM casts its input inside the norm and only transposes it
    in backward (2 B per element); the LM head stays in 16 bits, casts and all."""
    dev = build_cluster("dgx-h100-superpod").device
    share = CAST_TRANSPOSE_RATE_SHARE * memory_rate(dev)
    m, k, n = 8192, 4096, 4096
    plain, fused = _gemm("proj", m, k, n), _gemm("qkv", m, k, n, fp8_input_fused=True)
    compute_fwd = op_time_s(plain, dev, "fp8") - fp8_cast_s(plain, dev, False)
    assert fp8_cast_s(plain, dev, False) == pytest.approx(4.0 * m * k / share + dev.kernel_overhead_s, rel=REL)
    assert fp8_cast_s(fused, dev, False) == 0.0
    assert op_time_s(fused, dev, "fp8") == pytest.approx(compute_fwd, rel=REL)
    assert fp8_cast_s(plain, dev, True) == pytest.approx(4.0 * m * n / share + dev.kernel_overhead_s, rel=REL)
    assert fp8_cast_s(fused, dev, True) == pytest.approx((4.0 * m * n + 2.0 * m * k) / share + dev.kernel_overhead_s,
                                                         rel=REL)
    # compute-bound: the casts add, they do not hide under the math
    assert op_time_s(plain, dev, "fp8") > plain.flops / gemm_rate(dev, "fp8") + fp8_cast_s(plain, dev, False)
    head = _gemm("lm_head", m, k, 128256, high_precision=True)
    assert op_time_s(head, dev, "fp8") == op_time_s(head, dev, "bf16")
    assert op_time_s(head, dev, "fp8", backward=True) == op_time_s(head, dev, "bf16", backward=True)
    assert gemm_rate(dev, "fp8") == pytest.approx(dev.peak("fp8") * dev.gemm.large_fp8 * dev.sustained_fraction_fp8,
                                                  rel=REL)


# ---- cost/terms.activation_bytes: Korthikanti et al. 2022 section 4, flash attention ----------------
# In units of s*b*h bytes, without the 5as/h score term (flash attention does not store it).
S, B = 2048, 2
N_TOK = S * B
SBH = S * B * GPT.hidden_size


def _act(model=GPT, tp=1, sp=False, recompute="none", moe=False, n=N_TOK):
    return activation_bytes(model, n, tp, sp, recompute, moe)


# Regression (fixed in f2490e5): the two layer-norm inputs were counted as 8nh bytes instead of
# Korthikanti's 2 x 2sbh, which gave 38 sbh instead of 34 without parallelism.


def test_activation_no_parallelism_is_34_sbh():
    assert _act() == pytest.approx(34 * SBH, rel=REL)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_activation_tensor_parallel_is_10_plus_24_over_t(tp):
    assert _act(tp=tp) == pytest.approx(SBH * (10 + 24 / tp), rel=REL)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_activation_tensor_sequence_parallel_is_34_over_t(tp):
    assert _act(tp=tp, sp=True) == pytest.approx(SBH * 34 / tp, rel=REL)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_activation_tensor_parallel_shards_24_sbh(tp):
    """The tensor-parallel share (QKV 6, attention output 2, MLP 16 = 24 sbh) divides by t, the
    rest is replicated."""
    assert _act(tp=1) - _act(tp=tp) == pytest.approx(24 * SBH * (1 - 1 / tp), rel=REL)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_sequence_parallel_divides_everything(tp, recompute):
    assert _act(tp=tp, sp=True, recompute=recompute) == pytest.approx(_act(tp=1, recompute=recompute) / tp, rel=REL)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_activation_full_recompute_keeps_layer_input(tp):
    """Full recomputation stores only the layer input, 2 sbh (divided by t with sequence parallel)."""
    assert _act(tp=tp, recompute="full") == pytest.approx(2 * SBH, rel=REL)
    if tp > 1:
        assert _act(tp=tp, sp=True, recompute="full") == pytest.approx(2 * SBH / tp, rel=REL)


# Unfused attention (Megatron-LM before FlashAttention) stores the scores: Korthikanti's full
# ``s b h (34 + 5 a s / h)``, ``s b h (10 + 24/t + 5 a s / (h t))`` with tensor parallelism.
SCORES = GPT.num_attention_heads * N_TOK * S


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_unfused_activation_is_korthikanti_with_the_5as_over_h_term(tp):
    a, h = GPT.num_attention_heads, GPT.hidden_size
    unfused = activation_bytes(GPT, N_TOK, tp, False, "none", False, SCORES)
    assert unfused == pytest.approx(SBH * (10 + 24 / tp + 5 * a * S / (h * tp)), rel=REL)
    with_sp = activation_bytes(GPT, N_TOK, tp, True, "none", False, SCORES)
    assert with_sp == pytest.approx(SBH / tp * (34 + 5 * a * S / h), rel=REL)
    # selective recomputation exists to drop exactly that term: Korthikanti's 34 s b h / t
    assert activation_bytes(GPT, N_TOK, tp, True, "selective", False, SCORES) == pytest.approx(
        SBH / tp * 34, rel=REL)


def test_unfused_attention_ops_count_the_score_passes():
    """Scores written by Q K^T, read and written by the softmax, read/written (+1-byte mask) by
    dropout, read by the context GEMM: 6.5 passes of ``2 a n s`` bytes forward, 9.5 backward; the
    two batched GEMMs carry the core FLOPs of the flash op, without causal skipping."""
    from clusterplan.models.ops import attention_ops

    n, tp = N_TOK, 2
    flash = {op.name: op for op in attention_ops(GPT, n, S, tp)}
    unfused = {op.name: op for op in attention_ops(GPT, n, S, tp, "unfused")}
    assert set(unfused) == {"qkv", "scores", "softmax", "attention_dropout", "context", "attn_out"}
    score_bytes = 2 * GPT.num_attention_heads * n * S / tp
    assert unfused["scores"].flops + unfused["context"].flops == pytest.approx(flash["attention"].flops, rel=REL)
    assert unfused["softmax"].bytes == pytest.approx(2 * score_bytes, rel=REL)
    assert unfused["attention_dropout"].bytes == pytest.approx(2.5 * score_bytes, rel=REL)
    assert all(op.core for name, op in unfused.items() if name not in ("qkv", "attn_out"))
    dev = build_cluster("dgx-a100-superpod", num_devices=8).device
    rate = memory_rate(dev)
    fwd = op_time_s(unfused["softmax"], dev, "bf16")
    bwd = op_time_s(unfused["softmax"], dev, "bf16", backward=True)
    assert fwd == pytest.approx(2 * score_bytes / rate + dev.kernel_overhead_s, rel=REL)
    assert bwd == pytest.approx(3 * score_bytes / rate + dev.kernel_overhead_s, rel=REL)


def test_unfused_attention_is_slower_and_needs_more_memory():
    cluster = build_cluster("dgx-a100-superpod", num_devices=32)
    layout = Layout(tp=1, pp=1, dp=32, micro_batch_size=4, recompute="none", zero_stage=1)
    flash = evaluate(GPT, Job(global_batch_size=256, seq_len=2048), cluster, layout)
    unfused = evaluate(GPT, Job(global_batch_size=256, seq_len=2048, attention="unfused"), cluster, layout)
    assert unfused.time.compute_s > flash.time.compute_s
    assert unfused.memory.activations_bytes > flash.memory.activations_bytes
    with pytest.raises(SpecError, match="job.attention"):
        Job(global_batch_size=8, seq_len=2048, attention="paged")


@pytest.mark.parametrize("tp,sp", [(1, False), (4, False), (4, True)])
def test_activation_selective_keeps_the_attention_output(tp, sp):
    """Selective recomputation re-runs the attention core, whose output the out-projection keeps
    (Korthikanti et al. Table 2, 34 s b h / t): with flash attention there are no scores to drop,
    so it keeps what no recomputation keeps."""
    assert _act(tp=tp, sp=sp, recompute="selective") == pytest.approx(_act(tp=tp, sp=sp), rel=REL)


def test_activation_dropout_masks_are_2_sbh():
    """Two 1-byte dropout masks of s*b*h (attention output and MLP output)."""
    assert _act(GPT) - _act(gpt_like(dropout=False)) == pytest.approx(2 * SBH, rel=REL)


def test_activation_gqa_and_swiglu_generalisation():
    """Q/K/V store ``2 n (a + 2g) d``; a SwiGLU MLP stores ``2 n f (1 + 2)`` against GELU's ``2 n f 2``."""
    base = gpt_like(dropout=False)
    gqa = gpt_like(dropout=False, num_kv_heads=4)
    a, g, d = 16, 4, 64
    assert _act(base) - _act(gqa) == pytest.approx(2 * N_TOK * 2 * (a - g) * d, rel=REL)
    swi = gpt_like(dropout=False, ffn_activation="swiglu")
    assert _act(swi) - _act(base) == pytest.approx(2 * N_TOK * base.ffn_hidden_size, rel=REL)


def test_activation_moe_layer_by_hand():
    """MoE layer: the dense MLP part is replaced by the router's fp32 scores over the 8 experts and
    its k choices (index and probability, 12 B), permuted tokens in and out (2 x 2 n k h) and the
    routed experts' intermediates ``2 n k f_e (1 + ups)``."""
    n, k, h, fe = N_TOK, 2, 1024, 2816
    dense_mlp = 2 * n * MOE.ffn_hidden_size * 3
    moe_mlp = 4 * n * 8 + 12 * n * k + 2 * n * k * h * 2 + 2 * n * k * fe * 3
    assert _act(MOE, moe=True) - _act(MOE, moe=False) == pytest.approx(moe_mlp - dense_mlp, rel=REL)


def test_activation_mla_uses_attention_dims():
    """MLA stores its own per-head widths (DeepSeek-V3: q/k 192, v 128, not h/a = 56), as the FLOPs
    in models.ops already do (regression, fixed in f2490e5): Q, K and V at ``a (2 d_qk + d_v)`` and
    the attention output at ``a d_v``."""
    m = get_model("deepseek-v3")
    qk, v = m.attention_dims
    a = m.num_attention_heads
    with_outputs = _act(m) - _act(m, recompute="full")
    assert with_outputs > 2 * N_TOK * a * (2 * qk + 2 * v)


# ---- cost/collectives.py -------------------------------------------------------------------------
def profile(k: int, domains: int = 1, intra: float = 300e9, inter: float = 50e9, a_in: float = 2e-6,
            a_out: float = 5e-6, nir: bool = False, nir_bw: float = 0.0, sharp: bool = False) -> GroupProfile:
    per = k // domains
    return GroupProfile(num_ranks=k, num_domains=domains, ranks_per_domain=per,
                        intra_bytes_per_s=intra if per > 1 else 0.0, inter_bytes_per_s=inter if domains > 1 else 0.0,
                        intra_latency_s=a_in if per > 1 else 0.0, inter_latency_s=a_out if domains > 1 else 0.0,
                        intra_in_network_reduction=nir, inter_in_network_reduction=sharp,
                        intra_nir_bytes_per_s=nir_bw, torus_axes=0, torus_wraparound=False)


SIZE = 256e6


@pytest.mark.parametrize("k", [2, 4, 8])
def test_ring_all_reduce_single_domain(k):
    p, W, alpha = profile(k), 300e9, 2e-6
    assert coll.all_reduce_s(SIZE, p) == pytest.approx(2 * (k - 1) / k * SIZE / W + 2 * (k - 1) * alpha, rel=REL)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_reduce_scatter_all_gather_single_domain(k):
    p, W, alpha = profile(k), 300e9, 2e-6
    expected = (k - 1) / k * SIZE / W + (k - 1) * alpha
    assert coll.reduce_scatter_s(SIZE, p) == pytest.approx(expected, rel=REL)
    assert coll.all_gather_s(SIZE, p) == pytest.approx(expected, rel=REL)


def test_collectives_of_one_rank_or_no_bytes_are_free():
    for fn in (coll.all_reduce_s, coll.reduce_scatter_s, coll.all_gather_s, coll.all_to_all_s, coll.p2p_s):
        assert fn(SIZE, profile(1)) == 0.0
        assert fn(0.0, profile(8)) == 0.0


def _flat_ring_all_reduce(S, k, n, Wi, We, ai, ae):
    """Flat ring over ``n`` domains of ``k/n``: bandwidth min(intra, k_l * NIC), ring latency with
    ``2 (n - 1)`` network hops and the other ``2 (k - 1) - 2 (n - 1)`` inside domains."""
    kl = k // n
    bw = min(Wi, kl * We)
    return 2 * (k - 1) / k * S / bw + (2 * (k - 1) - 2 * (n - 1)) * ai + 2 * (n - 1) * ae


def _hier_all_reduce(S, k, n, Wi, We, ai, ae, sharp=False):
    """Reduce-scatter in the domain, all-reduce of S/k_l across domains, all-gather in the domain."""
    kl = k // n
    inter = S / kl / We if sharp else 2 * (n - 1) / n * S / kl / We
    return 2 * (kl - 1) / kl * S / Wi + inter + 2 * (kl - 1) * ai + 2 * (n - 1) * ae


@pytest.mark.parametrize("k,n,Wi,We", [(16, 2, 300e9, 50e9), (32, 4, 300e9, 50e9), (16, 2, 300e9, 400e9),
                                       (64, 8, 100e9, 25e9)])
@pytest.mark.parametrize("size", [1e3, 1e6, 1e9])
@pytest.mark.parametrize("sharp", [False, True])
def test_all_reduce_takes_min_of_flat_and_hierarchical(k, n, Wi, We, size, sharp):
    ai, ae = 2e-6, 5e-6
    p = profile(k, n, Wi, We, ai, ae, sharp=sharp)
    flat = _flat_ring_all_reduce(size, k, n, Wi, We, ai, ae)
    hier = _hier_all_reduce(size, k, n, Wi, We, ai, ae, sharp)
    assert coll.all_reduce_s(size, p) == pytest.approx(min(flat, hier), rel=REL)


def test_all_reduce_choice_switches_between_algorithms():
    """Both branches of the min are exercised. While the NICs can feed the ring (``k_l W_e >= W_i``)
    the bandwidth terms differ by ``flat - hier = 2 (n-1)/k (1/W_i - 1/W_e) S``, so with
    ``W_e < W_i`` the flat ring wins for large messages; when they cannot (``k_l W_e < W_i``) the
    hierarchical algorithm wins."""
    k, n, ai, ae = 16, 2, 2e-6, 5e-6
    slow_nic = profile(k, n, 300e9, 10e9, ai, ae)
    hier = _hier_all_reduce(1e9, k, n, 300e9, 10e9, ai, ae)
    assert hier < _flat_ring_all_reduce(1e9, k, n, 300e9, 10e9, ai, ae)
    assert coll.all_reduce_s(1e9, slow_nic) == pytest.approx(hier, rel=REL)
    balanced = profile(k, n, 300e9, 50e9, ai, ae)
    flat = _flat_ring_all_reduce(1e9, k, n, 300e9, 50e9, ai, ae)
    assert flat < _hier_all_reduce(1e9, k, n, 300e9, 50e9, ai, ae)
    assert coll.all_reduce_s(1e9, balanced) == pytest.approx(flat, rel=REL)


@pytest.mark.parametrize("k,n", [(16, 2), (32, 4)])
def test_reduce_scatter_multi_domain_min(k, n):
    Wi, We, ai, ae = 300e9, 50e9, 2e-6, 5e-6
    kl = k // n
    p = profile(k, n, Wi, We, ai, ae)
    ring = (k - 1) / k * SIZE / min(Wi, kl * We) + ((k - 1) - (n - 1)) * ai + (n - 1) * ae
    hier = (kl - 1) / kl * SIZE / Wi + (n - 1) / n * SIZE / kl / We + (kl - 1) * ai + (n - 1) * ae
    assert coll.reduce_scatter_s(SIZE, p) == pytest.approx(min(ring, hier), rel=REL)


def test_one_rank_per_domain_ring_uses_nic():
    """Ranks all in different domains: a ring over NICs, every hop a network hop."""
    k, We, ae = 4, 50e9, 5e-6
    p = profile(k, k, inter=We, a_out=ae)
    assert coll.all_reduce_s(SIZE, p) == pytest.approx(2 * (k - 1) / k * SIZE / We + 2 * (k - 1) * ae, rel=REL)


def test_nvls_in_network_reduction():
    """NVLS: each rank sends its buffer to the switch once and receives the sum once: ``S / W_nir``
    plus two hops, when that beats the ring."""
    k, W, nir_bw, alpha = 8, 370e9, 275e9, 2e-6
    p = profile(k, intra=W, a_in=alpha, nir=True, nir_bw=nir_bw)
    nvls = SIZE / nir_bw + 2 * alpha
    ring = 2 * (k - 1) / k * SIZE / W + 2 * (k - 1) * alpha
    assert nvls < ring
    assert coll.all_reduce_s(SIZE, p) == pytest.approx(nvls, rel=REL)
    # a tiny in-network bandwidth loses to the ring: the min is taken
    slow = profile(k, intra=W, a_in=alpha, nir=True, nir_bw=1e9)
    assert coll.all_reduce_s(SIZE, slow) == pytest.approx(ring, rel=REL)
    # in-network reduction is not used across domains (the hierarchical path handles SHARP)
    multi = profile(16, 2, nir=True, nir_bw=nir_bw)
    assert coll.all_reduce_s(SIZE, multi) == pytest.approx(
        min(_flat_ring_all_reduce(SIZE, 16, 2, 300e9, 50e9, 2e-6, 5e-6),
            _hier_all_reduce(SIZE, 16, 2, 300e9, 50e9, 2e-6, 5e-6)), rel=REL)


def test_all_to_all_single_and_multi_domain():
    """Single domain: ``(k-1)/k S / W`` plus ``k - 1`` hops (FORMULAS card). Across ``n`` domains the
    intra and NIC parts run at once: ``max(S (k_l-1)/k / W_i, S (k-k_l)/k / W_e)`` + latencies."""
    k, Wi, ai = 8, 300e9, 2e-6
    assert coll.all_to_all_s(SIZE, profile(k, intra=Wi, a_in=ai)) == pytest.approx(
        (k - 1) / k * SIZE / Wi + (k - 1) * ai, rel=REL)
    k, n, Wi, We, ai, ae = 32, 4, 300e9, 50e9, 2e-6, 5e-6
    kl = k // n
    expected = max(SIZE * (kl - 1) / k / Wi, SIZE * (k - kl) / k / We) + (kl - 1) * ai + (n - 1) * ae
    assert coll.all_to_all_s(SIZE, profile(k, n, Wi, We, ai, ae)) == pytest.approx(expected, rel=REL)


def test_p2p_intra_and_inter():
    assert coll.p2p_s(SIZE, profile(2, intra=300e9, a_in=2e-6)) == pytest.approx(SIZE / 300e9 + 2e-6, rel=REL)
    assert coll.p2p_s(SIZE, profile(2, 2, inter=50e9, a_out=5e-6)) == pytest.approx(SIZE / 50e9 + 5e-6, rel=REL)


# ---- groups that straddle the scale-up domains unevenly (issue 36) --------------------------------
def test_an_uneven_group_goes_at_the_pace_of_its_slowest_part():
    """32 ranks, 24 in one domain and 8 in the next: a ring leaves the emptier domain through its 8
    NICs; a hierarchical collective reduces inside the fuller domain (24 ranks) last and carries the
    whole buffer across on the emptier one's 8 NICs; an all-to-all's rank in the emptier domain sends
    24/32 of its buffer off it (docs/cost-model.md, section 1.2)."""
    Wi, We, ai, ae, k = 300e9, 50e9, 2e-6, 5e-6, 32
    p = dataclasses.replace(profile(k, 2, Wi, We, ai, ae), ranks_per_domain=24, min_ranks_per_domain=8)
    ring = 2 * 31 / 32 * SIZE / min(Wi, 8 * We) + (2 * 31 - 2) * ai + 2 * ae
    hier = 2 * 23 / 24 * SIZE / Wi + 2 * (1 / 2) * SIZE / 8 / We + 2 * 23 * ai + 2 * ae
    assert coll.all_reduce_s(SIZE, p) == pytest.approx(min(ring, hier), rel=REL)
    rs = min(31 / 32 * SIZE / min(Wi, 8 * We) + 30 * ai + ae, 23 / 24 * SIZE / Wi + SIZE / 2 / 8 / We + 23 * ai + ae)
    assert coll.reduce_scatter_s(SIZE, p) == pytest.approx(rs, rel=REL)
    a2a = max(SIZE * 23 / 32 / Wi, SIZE * 24 / 32 / We) + 23 * ai + ae
    assert coll.all_to_all_s(SIZE, p) == pytest.approx(a2a, rel=REL)


def test_the_slowest_group_shape_sets_a_collective():
    """A layout's groups that differ in shape run at once; the step waits for the slowest."""
    even = profile(32, intra=300e9)
    uneven = dataclasses.replace(profile(32, 2), ranks_per_domain=24, min_ranks_per_domain=8)
    both = dataclasses.replace(even, variants=(uneven,))
    for fn in (coll.all_reduce_s, coll.reduce_scatter_s, coll.all_gather_s, coll.all_to_all_s):
        assert fn(SIZE, both) == max(fn(SIZE, even), fn(SIZE, uneven)) > fn(SIZE, even)


def test_axis_profiles_hold_every_shape_of_their_groups():
    """dp groups of 32 on 256 GB200 (3 racks of 72 and 40 of a fourth) straddle racks at 64-95
    (8 + 24) and 128-159 (16 + 16); pipeline neighbours 4 ranks apart on 8-GPU nodes cross a node
    between 4 and 8; sets of ranks that no layout builds are profiled alone."""
    nvl72 = build_cluster("gb200-nvl72", num_devices=256)
    shapes = {(s.num_domains, s.ranks_per_domain, s.fewest_ranks_per_domain) for s in nvl72.strided_profile(32, 1).shapes}
    assert shapes == {(1, 32, 32), (2, 24, 8), (2, 16, 16)}
    assert nvl72.axis_profile(range(0, 64, 2)) == nvl72.strided_profile(32, 2)
    assert nvl72.axis_profile([0, 5, 7]) == nvl72.group_profile([0, 5, 7])
    pairs = build_cluster("dgx-h100-superpod", num_devices=16).neighbour_profile(4, 4)
    assert [s.num_domains for s in pairs.shapes] == [1, 2]
    aligned = build_cluster("dgx-h100-superpod", num_devices=64)
    assert not aligned.strided_profile(8, 8).variants and not aligned.neighbour_profile(8, 8).variants


LAW_SIZES = (1e3, 1e5, 1e7, 1e9)
LAW_GROUPS = [  # (preset, devices, count, stride): groups that straddle the domains unevenly
    ("gb200-nvl72", 256, 32, 1), ("gb200-nvl72", 256, 16, 4), ("gb200-nvl72", 576, 64, 1),
    ("gb200-nvl72", 576, 32, 2), ("dgx-h100-superpod", 96, 6, 1), ("dgx-h100-superpod", 96, 3, 2),
    ("dgx-a100-superpod", 96, 6, 1),
]


def _over_scale_out(p: GroupProfile) -> GroupProfile:
    """The same number of ranks, each in a domain of its own, on the slowest NIC path the group's
    shapes use."""
    crossing = [s for s in p.shapes if s.num_domains > 1]
    return profile(p.num_ranks, p.num_ranks, inter=min(s.inter_bytes_per_s for s in crossing),
                   a_out=max(s.inter_latency_s for s in crossing))


@pytest.mark.parametrize("preset,n,count,stride", LAW_GROUPS)
def test_straddling_groups_are_between_aligned_and_scale_out(preset, n, count, stride):
    """A group that straddles the scale-up domains unevenly is never faster than the same group laid
    from a domain's first device, nor slower than the same traffic all over the scale-out network
    (on switched domains, whose links are at least as fast as a NIC; on a direct mesh a pair's one
    link can be slower than a NIC: MI300X 44.7 GB/s against 47)."""
    cluster = build_cluster(preset, num_devices=n)
    axis = cluster.strided_profile(count, stride)
    aligned = cluster.group_profile(range(0, count * stride, stride))  # rank 0's group, from a domain's start
    assert axis.variants and aligned.fewest_ranks_per_domain == aligned.ranks_per_domain
    scale_out = _over_scale_out(axis)
    for fn in (coll.all_reduce_s, coll.reduce_scatter_s, coll.all_gather_s, coll.all_to_all_s):
        for size in LAW_SIZES:
            t = fn(size, axis)
            assert fn(size, aligned) * (1 - 1e-12) <= t <= fn(size, scale_out) * (1 + 1e-12), (fn.__name__, size)
    pairs = cluster.neighbour_profile(count, stride, ring=True)
    for size in LAW_SIZES:
        t = coll.p2p_s(size, pairs)
        assert coll.p2p_s(size, cluster.group_profile((0, stride))) <= t <= coll.p2p_s(size, profile(2, 2, inter=min(
            s.inter_bytes_per_s for s in pairs.shapes if s.num_domains > 1), a_out=max(
            s.inter_latency_s for s in pairs.shapes if s.num_domains > 1)))


@pytest.mark.parametrize("preset,n,count,stride", LAW_GROUPS)
def test_one_uneven_group_is_never_faster_than_itself_aligned_when_bandwidth_bound(preset, n, count, stride):
    """Each shape alone, where bandwidth dominates (a 1 GB buffer): its slowest part makes it slower
    than the group laid from a domain's first device. (At 64 MB over 64 GB200, 40 + 24, the
    hierarchical schedule's 39 + 1 latency steps beat the 63 of the aligned ring the model prices, by
    6%; the step is priced at the slowest shape, the aligned one among them, so that never shows.)"""
    cluster = build_cluster(preset, num_devices=n)
    aligned = cluster.group_profile(range(0, count * stride, stride))
    for shape in cluster.strided_profile(count, stride).shapes:
        for fn in (coll.all_reduce_s, coll.reduce_scatter_s, coll.all_to_all_s):
            assert fn(1e9, shape) >= fn(1e9, aligned) * (1 - 1e-12), (fn.__name__, shape)


# ---- cost/terms: communication terms through a real cluster --------------------------------------
def _ctx(cluster, model=GPT, batch=64, seq=2048, precision="bf16") -> Context:
    return Context(model, Job(global_batch_size=batch, seq_len=seq, precision=precision), cluster)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_tp_comm_is_four_collectives_per_layer(cluster16, sp, recompute):
    """Megatron: 2 all-reduces forward and 2 backward of the ``b s h`` activation per layer
    (reduce-scatter + all-gather each with sequence parallel); full recomputation adds the
    forward's two again (x1.5)."""
    ctx, tp, mbs = _ctx(cluster16), 8, 2
    prof = cluster16.group_profile(range(tp))
    size = 2 * mbs * 2048 * GPT.hidden_size
    one = coll.all_gather_s(size, prof) + coll.reduce_scatter_s(size, prof) if sp else coll.all_reduce_s(size, prof)
    mult = 1.5 if recompute == "full" else 1.0
    expected = GPT.num_layers * 4 * one * mult
    assert tp_comm_terms(ctx, tp, 1, mbs, sp, recompute, 1, False) == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("framework,date,sp,pp,share,transfers,gathers", [
    ("megatron", "2021-04", False, 4, 1 / 2, 2, 2),  # scatter-gather (2021-02 to 2023-03): receiver all-gathers
    ("megatron", "", False, 4, 1, 2, 0),  # Megatron-Core: whole tensor from every TP rank ...
    ("megatron", "", True, 4, 1 / 2, 2, 0),  # ... unless sequence parallelism shards it
    ("deepspeed", "2022-02", False, 4, 1 / 2, 4, 3),  # PipelineEngine: partitioned over TP, blocking send, then recv
    ("deepspeed", "2022-02", False, 2, 1 / 2, 2, 3),  # two stages: one neighbour each
    ("deepspeed", "2021-06", False, 4, 1, 4, 0),  # before 2021-09 gradients went whole: priced whole
])
def test_pipeline_p2p_follows_the_framework(cluster16, framework, date, sp, pp, share, transfers, gathers):
    """Per micro-batch slot, ``b s h / cp`` elements each way, split over the TP ranks only where the
    framework scatters them (Narayanan et al. 2021 sec. 4.1; DeepSpeed's PartitionedTensor) or SP
    shards them; a scattered tensor is all-gathered again over the TP ranks (DeepSpeed also re-gathers
    its own output before the backward); paired non-blocking sends cost two transfers, DeepSpeed's
    blocking ones four (deepspeed.yaml)."""
    job = Job(global_batch_size=64, seq_len=2048, framework=framework, framework_date=date)
    ctx = Context(GPT, job, cluster16)
    layout = Layout(tp=2, pp=pp, dp=8 // pp, micro_batch_size=2, sequence_parallel=sp)
    stride = layout.stride("pp")  # every stage's send to the next: the slowest pair sets the pace (at pp=4 on
    pairs = [(r, r + stride) for r in range(16 - stride) if (r // stride) % pp < pp - 1]  # 8-GPU nodes 4->8 crosses)
    full = 2 * 2 * 2048 * GPT.hidden_size
    gather = coll.all_gather_s(full, cluster16.group_profile(range(2)))
    send = max(coll.p2p_s(full * share, cluster16.group_profile(pair)) for pair in pairs)
    expected = transfers * send + gathers * gather
    assert p2p_s(ctx, layout) == pytest.approx(expected, rel=REL)
    assert p2p_s(ctx, layout.with_(pp=1, dp=8)) == 0.0


def test_maxtext_zero3_shards_inside_a_slice_and_replicates_across():
    """MaxText's base.yml puts fsdp on ICI and data on DCN: on 2 slices of 256, ZeRO-3 with dp 512
    keeps each shard twice (memory of dp 256), gathers inside the slice, and all-reduces the shard's
    gradients across the slices once a step. Megatron's ZeRO-3 shards over all 512 ranks."""
    from clusterplan.cost.terms import dp_terms
    model, cluster = get_model("llama2-7b"), build_cluster("tpu-v5e-pod", 512)
    layout = Layout(tp=1, dp=512, zero_stage=3, micro_batch_size=1, recompute="full")
    mt, mg = (Context(model, Job(global_batch_size=512, seq_len=2048, framework=f), cluster) for f in ("maxtext", "megatron"))
    one = Context(model, Job(global_batch_size=256, seq_len=2048, framework="maxtext"), build_cluster("tpu-v5e-pod", 256))
    assert static_memory(mt, layout) == static_memory(one, layout.with_(dp=256))
    assert static_memory(mg, layout).optimizer_bytes == pytest.approx(static_memory(mt, layout).optimizer_bytes / 2)
    pc = param_counts(model, 1, 1, 1, 1)
    inner, across = cluster.strided_profile(256, 1), cluster.strided_profile(2, 256)
    expected = (2 * coll.all_gather_s(WEIGHT_BYTES * pc.dense, inner) + coll.reduce_scatter_s(4 * pc.dense, inner))
    t = dp_terms(mt, layout)
    assert t.per_microbatch_s == pytest.approx(expected, rel=REL)
    assert t.per_step_s == pytest.approx(coll.all_reduce_s(4 * pc.dense / 256, across), rel=REL)
    assert dp_terms(mg, layout).per_step_s == 0.0  # sharded over every rank: no per-step reduction


def test_deepspeed_2021_zero3_gathers_module_by_module_in_the_open(cluster16):
    """DeepSpeed before v0.6.0 (deepspeed.yaml zero3_fetch_history): one collective per partitioned
    module, two gathers and a reduce-scatter per micro-batch, each paying its latency; DP overlap
    refused with ZeRO-3. From v0.6.0: one collective per pass, overlap allowed."""
    from clusterplan.cost.terms import (PYTHON_COPY_S, PYTHON_VIEW_S, dp_profiles, dp_terms, partitioned_modules,
                                        zero3_host_s)
    layout = Layout(tp=1, dp=16, zero_stage=3, micro_batch_size=1, recompute="full")
    old = Job(global_batch_size=64, seq_len=2048, precision="fp16", framework="deepspeed", framework_date="2021-04")
    new = dataclasses.replace(old, framework_date="2022-03")
    modules, experts = partitioned_modules(GPT, 1, 1, 1, 1, True, 100_000)
    assert (modules, experts) == (4 * GPT.num_layers + 2, 0)  # QKV, proj, fc1, fc2 per layer; embedding, output
    ctx = Context(GPT, old, cluster16)
    prof = dp_profiles(ctx, 1, 1, 16, 1, 1, layout.order)[0]
    count = param_counts(GPT, 1, 1, 1, 1).dense
    # until v0.5.5 each gather also copied every rank's partition twice on the host: a Python loop
    # (cost.terms.PYTHON_COPY_S each) and PyTorch's list all_gather (one kernel launch each); each
    # gradient reduce-scatter built one Python view per rank (PYTHON_VIEW_S) that PyTorch copied
    launch = cluster16.device.kernel_overhead_s
    gather, scatter = 16 * (PYTHON_COPY_S + launch), 16 * (PYTHON_VIEW_S + launch)
    assert zero3_host_s(ctx) == pytest.approx((gather / 16, scatter / 16), rel=REL)
    expected = (2 * modules * (coll.all_gather_s(WEIGHT_BYTES * count / modules, prof) + gather)
                + modules * (coll.reduce_scatter_s(old.grad_bytes * count / modules, prof) + scatter))
    assert dp_terms(ctx, layout).per_microbatch_s == pytest.approx(expected, rel=REL)
    v055 = Context(GPT, dataclasses.replace(old, framework_date="2021-11"), cluster16)
    assert zero3_host_s(v055) == pytest.approx((launch, PYTHON_VIEW_S + launch), rel=REL)
    assert dp_terms(v055, layout).per_microbatch_s == pytest.approx(
        expected - 2 * modules * 16 * PYTHON_COPY_S, rel=REL)
    assert zero3_host_s(Context(GPT, new, cluster16)) == (0.0, 0.0)
    bucketed = dp_terms(Context(GPT, new, cluster16), layout).per_microbatch_s
    assert bucketed < expected  # the same bytes, fewer latencies
    assert any(k == "framework" for k, _ in layout_problems(GPT, old, cluster16, layout))
    assert not layout_problems(GPT, old, cluster16, layout.with_(dp_overlap=False))
    assert not layout_problems(GPT, new, cluster16, layout)
    # weights under stage3_param_persistence_threshold stay whole: a narrow model has fewer to fetch
    assert partitioned_modules(gpt_like(h=128, a=2), 1, 1, 1, 1, True, 100_000) == (2, 0)


def test_deepspeed_zero3_gathers_released_modules_again_under_full_recompute(cluster16):
    """DeepSpeed releases a module after its recomputed forward unless its backward comes within
    stage3_max_reuse_distance (1e9) elements of other gathers: at GPT-3 175B's width (h 12288) the
    QKV (453M), attention output (151M) and first MLP projection (604M) are gathered a third time,
    the second (604M, reused at once) is not; a 7B model's modules stay; FSDP2 keeps them all."""
    from clusterplan.cost.terms import dp_profiles, dp_terms, zero3_released_modules
    gpt3 = gpt_like(h=12288, a=96, layers=8)
    ds = Job(global_batch_size=64, seq_len=2048, precision="fp16", framework="deepspeed", framework_date="2022-03")
    h = 12288
    assert zero3_released_modules(Context(gpt3, ds, cluster16), 1) == (3 * h * h + h * h + 4 * h * h, 3)
    assert zero3_released_modules(Context(get_model("llama2-7b"), ds, cluster16), 1) == (0.0, 0)
    tt = dataclasses.replace(ds, framework="torchtitan", framework_date="2025-06", precision="bf16")
    assert zero3_released_modules(Context(gpt3, tt, cluster16), 1) == (0.0, 0)
    ctx = Context(gpt3, ds, cluster16)
    layout = Layout(tp=1, dp=16, zero_stage=3, micro_batch_size=1, recompute="full", dp_overlap=False)
    prof = dp_profiles(ctx, 1, 1, 16, 1, 1, layout.order)[0]
    t = dp_terms(ctx, layout)
    assert t.regather_s == pytest.approx(coll.all_gather_s(WEIGHT_BYTES * 8 * 8 * h * h, prof), rel=REL)
    # paid with full recomputation only: the step grows by exactly it
    full = evaluate(gpt3, ds, cluster16, layout)
    sel = evaluate(gpt3, ds, cluster16, layout.with_(recompute="selective"))
    assert full.time.dp_comm_s - sel.time.dp_comm_s == pytest.approx(full.num_microbatches * t.regather_s, rel=REL)
    assert dp_terms(ctx, layout.with_(zero_stage=1)).regather_s == 0.0


@pytest.mark.parametrize("entry", [{"since": "2021-03", "gather_python": -1, "gather_list": 1},
                                   {"since": "2021-03", "gather_python": 1},
                                   {"since": "2021-03", "gather_python": True, "gather_list": 0},
                                   {"since": "21-3", "gather_python": 0, "gather_list": 0},
                                   {"since": "2021-03", "gather_python": 0, "gather_list": 0, "scatter_list": 1.5}])
def test_zero3_host_copies_history_names_the_bad_field(entry):
    from clusterplan.cost.framework import _zero3_copies
    with pytest.raises(SpecError, match="zero3_host_copies_history"):
        _zero3_copies({"zero3_host_copies_history": [entry]}, "framework profile test")


@pytest.mark.parametrize("pp,vp,m,recompute,share", [
    (1, 1, 8, "none", 7 / 8),  # no pipeline: the first forward and the last backward run alone
    (1, 1, 1, "selective", 0.0),  # one micro-batch: nothing to pair
    (4, 2, 16, "none", (32 - (2 * 3 + 4 + 1)) / 32),  # interleaved warm-up 2 (pp-1) + (vp-1) pp, plus one
    (4, 1, 16, "none", 0.0),  # Megatron refuses it without virtual stages: priced as off
    (1, 1, 8, "full", 0.0),  # ... and with full recomputation
])
def test_ep_overlap_hides_the_steady_state_only(pp, vp, m, recompute, share):
    from clusterplan.cost.terms import ep_overlap_steady_share
    assert ep_overlap_steady_share(pp, vp, m, recompute) == pytest.approx(share)


def test_ep_overlap_is_megatron_since_2025_08_and_follows_its_checks(cluster16):
    model = MOE
    layout = Layout(tp=1, pp=2, vp=2, dp=8, ep=8, micro_batch_size=1, recompute="none", ep_overlap=True)
    job = Job(global_batch_size=64, seq_len=2048, framework="megatron")
    assert not layout_problems(model, job, cluster16, layout)
    problems = dict(layout_problems(model, dataclasses.replace(job, framework_date="2025-07"), cluster16, layout))
    assert "ep_overlap" in problems["framework"]
    for bad in (layout.with_(recompute="full"), layout.with_(vp=1)):
        assert any(k == "framework" for k, _ in layout_problems(model, job, cluster16, bad))
    tt = Job(global_batch_size=64, seq_len=2048, framework="torchtitan")
    assert any("ep_overlap" in msg for _, msg in layout_problems(model, tt, cluster16, layout.with_(pp=1, vp=1, dp=16)))


# ---- cost/step: pipeline bubble and in-flight activations -----------------------------------------
@pytest.mark.parametrize("pp,vp,dp", [(2, 1, 4), (4, 1, 2), (4, 2, 2), (8, 1, 1), (2, 4, 4)])
def test_pipeline_bubble_is_pp_minus_1_over_vp_stage_times(cluster16, pp, vp, dp):
    """bubble = ``(pp - 1)/vp`` x one micro-batch through the most loaded stage; as a share of the
    ideal layer time it is Narayanan's ``(p - 1) / (v m)``."""
    ctx = _ctx(cluster16, batch=64)
    layout = Layout(tp=16 // (pp * dp), pp=pp, dp=dp, vp=vp, micro_batch_size=1, recompute="selective")
    assert not layout_problems(ctx.model, ctx.job, ctx.cluster, layout)
    ev = evaluate_ctx(ctx, layout)
    lt = layer_terms(ctx, layout)
    stage = layers_on_stage(GPT.num_layers, pp, vp) / GPT.num_layers * lt.total_s
    assert ev.time.pp_bubble_s == pytest.approx((pp - 1) / vp * stage, rel=REL)
    m = ev.num_microbatches
    assert m == 64 // dp
    assert ev.time.pp_bubble_s / (m * stage) == pytest.approx((pp - 1) / (vp * m), rel=REL)


def test_compute_term_is_microbatches_times_stage_plus_head(cluster16):
    ctx = _ctx(cluster16)
    layout = Layout(tp=2, pp=4, dp=2, micro_batch_size=2, recompute="full", sequence_parallel=True)
    ev = evaluate_ctx(ctx, layout)
    lt = layer_terms(ctx, layout)
    head = head_terms(ctx, 2, 1, 2, True, layout.stride("tp"))
    frac = layers_on_stage(8, 4, 1) / 8
    m = num_microbatches(ctx.job, layout)
    assert ev.time.compute_s == pytest.approx(m * (frac * (lt.forward_s + lt.backward_s) + head.time_s), rel=REL)
    assert ev.time.recompute_s == pytest.approx(m * frac * lt.forward_s, rel=REL)  # full: one more forward


@pytest.mark.parametrize("L,pp", [(32, 4), (96, 8), (24, 2), (30, 4)])
def test_inflight_layers_1f1b(L, pp):
    """1F1B: the first rank holds ``min(m, p)`` micro-batches of its ``ceil(L/p)`` layers (``L``
    layers' worth when ``p`` divides ``L``), the last rank one."""
    per = math.ceil(L / pp)
    for m in (1, pp - 1, pp, 4 * pp):
        first, last = inflight_layers(L, pp, 1, m)
        assert first == per * min(m, pp)
        assert last == per
    if L % pp == 0:
        assert inflight_layers(L, pp, 1, 100)[0] == L


@pytest.mark.parametrize("L,pp,vp", [(32, 4, 2), (96, 8, 3), (96, 8, 4), (64, 4, 4), (48, 2, 8)])
def test_inflight_layers_interleaved_matches_korthikanti(L, pp, vp):
    """For many micro-batches Megatron's warm-up holds ``2(p-1) + (v-1)p + 1`` chunks of ``L/(pv)``
    layers, which is Korthikanti's ``L (1 + (p-1)/(p v))`` exactly when ``p v`` divides ``L``."""
    first, last = inflight_layers(L, pp, vp, 10_000)
    assert first == pytest.approx(L * (1 + (pp - 1) / (pp * vp)), rel=1e-12)
    assert last == pytest.approx(((vp - 1) * pp + 1) * L / (pp * vp), rel=1e-12)
    # few micro-batches: at most m * v chunks are ever in flight
    assert inflight_layers(L, pp, vp, 1)[0] == pytest.approx(vp * L / (pp * vp), rel=1e-12)


@pytest.mark.parametrize("m,pp,want", [(24, 8, 8), (12, 8, 12), (20, 8, 10), (17, 8, 9), (9, 8, 9), (7, 8, None),
                                       (26, 8, 9), (100, 16, 20)])
def test_microbatch_group_follows_megatron_schedule_rule(m, pp, want):
    """Megatron-Core's interleaved schedule (since 2024-11): a group N in [pp, m] with m % N 0 or
    >= pp; the smallest such N (fewest chunks in flight); without group sizes, pp dividing m."""
    n = microbatch_group_size(m, pp, 2, groups=True)
    assert n == want
    if n is not None:
        assert pp <= n <= m and (m % n == 0 or m % n >= pp)
        assert all(not (m % k == 0 or m % k >= pp) for k in range(pp, n))
    assert microbatch_group_size(m, pp, 2, groups=False) == (pp if m % pp == 0 else None)
    assert microbatch_group_size(m, pp, 1, groups=False) == pp  # no interleaving: no rule


@pytest.mark.parametrize("framework,before,after", [("torchtitan", "2025-05", "2025-06"), ("maxtext", "2024-07", "2024-08")])
def test_one_micro_batch_a_step_without_gradient_accumulation(framework, before, after):
    """torchtitan before 2025-06 and MaxText before 2024-08 do not accumulate gradients: without a
    pipeline a step is one micro-batch (global / dp), and the search offers only that; a pipeline's
    schedule splits the batch either way; Megatron-LM has accumulated since 2020-10."""
    model = get_model("llama3-8b")
    cluster = build_cluster("tpu-v5p-pod" if framework == "maxtext" else "dgx-h100-superpod", num_devices=64)
    two = Layout(tp=4, dp=16, micro_batch_size=4, sequence_parallel=True, recompute="full", zero_stage=3)
    one = two.with_(micro_batch_size=8)
    old, new = (Job(global_batch_size=128, seq_len=8192, framework=framework, framework_date=d) for d in (before, after))
    assert [p for p in layout_problems(model, old, cluster, two) if p[0] == "batch"]
    assert not [p for p in layout_problems(model, new, cluster, two) if p[0] == "batch"]
    assert not [p for p in layout_problems(model, old, cluster, one) if p[0] == "batch"]
    piped = Layout(tp=4, pp=2, dp=8, micro_batch_size=2, sequence_parallel=True, recompute="full", zero_stage=0)
    assert not [p for p in layout_problems(model, old, cluster, piped) if p[0] == "batch"]
    res = plan(model, old, cluster, SearchOptions(top_k=3))
    best = [res.best, *res.runners_up]
    assert best and all(e.layout.pp > 1 or e.layout.dp * e.layout.micro_batch_size == 128 for e in best)
    assert not Job(global_batch_size=128, seq_len=8192, framework="megatron", framework_date="2021-04").one_microbatch(1)


def test_maxtext_tensor_parallelism_shards_the_activations():
    """MaxText's TP shards the activations' embed dimension over the tensor axis (since 2023-01):
    sequence parallelism's memory, so a tp > 1 layout without it is not a MaxText layout."""
    model = get_model("llama3-8b")
    cluster = build_cluster("tpu-v5p-pod", num_devices=64)
    job = Job(global_batch_size=128, seq_len=8192, framework="maxtext")
    layout = Layout(tp=4, dp=16, micro_batch_size=8, sequence_parallel=False, recompute="full", zero_stage=3)
    assert [p for p in layout_problems(model, job, cluster, layout) if p[0] == "framework"]
    assert not layout_problems(model, job, cluster, layout.with_(sequence_parallel=True))


def test_interleaving_with_uneven_micro_batches_follows_the_release():
    """12 micro-batches on 8 stages interleave in Megatron-LM since 2024-11, with the first rank
    holding (vp - 1) x 12 + 2 x 7 + 1 chunks (at most all 12 x vp); the 2024-06 release refuses it."""
    model = get_model("gpt3-175b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=1024)
    layout = Layout(tp=4, pp=8, dp=32, vp=4, micro_batch_size=4, sequence_parallel=True, recompute="full",
                    zero_stage=1)
    new = Job(global_batch_size=1536, seq_len=2048, framework="megatron")
    old = Job(global_batch_size=1536, seq_len=2048, framework="megatron", framework_date="2024-06")
    assert not [p for p in layout_problems(model, new, cluster, layout) if p[0] == "interleave"]
    assert [p for p in layout_problems(model, old, cluster, layout) if p[0] == "interleave"]
    first, _ = inflight_layers(96, 8, 4, 12, microbatch_group_size(12, 8, 4, True))
    assert first == pytest.approx(min(12 * 4, 3 * 12 + 2 * 7 + 1) * 96 / 32)
    assert first > inflight_layers(96, 8, 4, 16)[0]  # a bigger group holds more than the default would


LAYOUTS_16 = [
    Layout(tp=8, pp=1, dp=2, micro_batch_size=1, sequence_parallel=True, recompute="none", zero_stage=1),
    Layout(tp=2, pp=4, dp=2, vp=2, micro_batch_size=2, recompute="selective", zero_stage=0),
    Layout(tp=4, pp=2, dp=1, cp=2, micro_batch_size=1, recompute="full", zero_stage=3, order="tp-dp-cp-pp"),
    Layout(tp=1, pp=1, dp=16, micro_batch_size=4, recompute="full", zero_stage=3, dp_overlap=False),
    Layout(tp=2, pp=2, dp=4, micro_batch_size=1, recompute="none", zero_stage=2, order="tp-cp-pp-dp",
           tp_overlap=True, sequence_parallel=True),
]


@pytest.mark.parametrize("model,layout", [(GPT, l) for l in LAYOUTS_16]
                         + [(MOE, Layout(tp=2, pp=2, dp=4, ep=4, micro_batch_size=1, zero_stage=1)),
                            (MOE, Layout(tp=1, pp=1, dp=16, ep=8, micro_batch_size=2, zero_stage=3))])
def test_evaluation_breakdowns_sum_to_totals(cluster16, model, layout):
    # the sums hold under any framework; these layouts are structurally valid (some combine knobs
    # Megatron does not offer, e.g. ZeRO-2: evaluate still predicts them)
    job = Job(global_batch_size=64, seq_len=2048)
    assert not [p for p in layout_problems(model, job, cluster16, layout) if p[0] != "framework"]
    ev = evaluate(model, job, cluster16, layout)
    parts = dataclasses.asdict(ev.time)
    assert sum(parts.values()) == pytest.approx(ev.step_time_s, rel=REL)
    assert all(v >= 0 for v in parts.values())
    mem = dataclasses.asdict(ev.memory)
    assert sum(mem.values()) == pytest.approx(ev.peak_memory_bytes, rel=REL)
    assert ev.tokens_per_s == pytest.approx(64 * 2048 / ev.step_time_s, rel=REL)
    mfu = model_flops_per_token(model, 2048) * ev.tokens_per_s / 16 / cluster16.device.peak("bf16")
    assert ev.mfu == pytest.approx(mfu, rel=REL)
    assert ev.hfu >= ev.mfu


# ---- ZeRO and parameter counts ----------------------------------------------------------------------
def test_param_counts_single_stage_is_whole_model_over_tp():
    """With pp = 1 the stage holds every weight but the final norm, split ``tp`` ways."""
    for tp in (1, 2, 4):
        pc = param_counts(GPT, tp, 1, 1, 1)
        assert pc.expert == 0
        assert pc.dense * tp == pytest.approx(GPT.num_params - GPT.hidden_size, rel=REL)


def test_param_counts_moe_experts_split_ep_ways():
    for ep in (1, 2, 8):
        pc = param_counts(MOE, 1, 1, 1, ep)
        assert pc.expert == pytest.approx(MOE.num_layers * 8 / ep * MOE.expert_params, rel=REL)
        assert pc.dense + pc.expert * ep == pytest.approx(MOE.num_params - MOE.hidden_size, rel=REL)


def test_param_counts_pipeline_stage_holds_its_layers_and_one_embedding():
    tp, pp = 2, 4
    pc = param_counts(GPT, tp, pp, 1, 1)
    per_layer = GPT.attention_params + GPT.norm_params_per_layer + GPT.dense_mlp_params
    expected = (GPT.num_layers // pp * per_layer + GPT.vocab_size * GPT.hidden_size) / tp
    assert pc.dense == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_shard_over_dp_times_cp(cluster16, zero):
    """ZeRO-1 divides the 12 B/param optimizer states by the data-parallel degree (here dp*cp: the
    distributed optimizer shards over both), ZeRO-2 also the 4 B gradients, ZeRO-3 also the 2 B
    weights, which then keep two layers gathered (in use and prefetched)."""
    ctx = _ctx(cluster16)
    layout = Layout(tp=2, pp=2, dp=2, cp=2, zero_stage=zero)
    pc = param_counts(GPT, 2, 2, 1, 1)
    P, shard = pc.dense, 2 * 2
    st = static_memory(ctx, layout)
    assert st.optimizer_bytes == pytest.approx(OPTIMIZER_STATE_BYTES * P / (shard if zero >= 1 else 1), rel=REL)
    assert st.gradients_bytes == pytest.approx(4 * P / (shard if zero >= 2 else 1), rel=REL)
    weights = WEIGHT_BYTES * P / (shard if zero >= 3 else 1)
    if zero >= 3:
        weights += 2 * WEIGHT_BYTES * P / layers_on_stage(GPT.num_layers, 2, 1)
    assert st.weights_bytes == pytest.approx(weights, rel=REL)
    ev = evaluate_ctx(ctx, layout)
    assert (ev.memory.weights_bytes, ev.memory.gradients_bytes, ev.memory.optimizer_bytes) == pytest.approx(
        (st.weights_bytes, st.gradients_bytes, st.optimizer_bytes), rel=REL)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_shards_experts_over_expert_data_parallel(cluster16, zero):
    """Expert weights are replicated only across ``dp * cp / ep`` ranks: that is their ZeRO shard."""
    ctx = _ctx(cluster16, model=MOE)
    layout = Layout(tp=2, pp=2, dp=4, ep=2, zero_stage=zero)
    pc = param_counts(MOE, 2, 2, 1, 2)
    st = static_memory(ctx, layout)
    on = zero >= 1
    assert st.optimizer_bytes == pytest.approx(12 * (pc.dense / (4 if on else 1) + pc.expert / (2 if on else 1)), rel=REL)
    on = zero >= 2
    assert st.gradients_bytes == pytest.approx(4 * (pc.dense / (4 if on else 1) + pc.expert / (2 if on else 1)), rel=REL)


def test_dp_terms_dense_by_hand(cluster16):
    """ZeRO-0: one all-reduce of the fp32 gradients; ZeRO-1: reduce-scatter of the gradients and
    all-gather of the 16-bit weights per step; ZeRO-2: the reduce-scatter every micro-batch (no full
    gradient buffer to accumulate in) and the weight all-gather after the step, not overlapped
    (DeepSpeed), or at every micro-batch's forward (FSDP2); ZeRO-3: per micro-batch, two weight
    all-gathers (forward and backward) and a gradient reduce-scatter (Rajbhandari et al. 2020, sec. 7)."""
    from clusterplan.cost.terms import dp_traffic
    from clusterplan.cost.terms import dp_terms
    ctx = _ctx(cluster16)
    prof = cluster16.group_profile(range(0, 16, 2))  # tp=2 inside, dp=8 at stride 2
    P = param_counts(GPT, 2, 1, 1, 1).dense
    base = Layout(tp=2, dp=8)
    assert dp_terms(ctx, base.with_(zero_stage=0)).per_step_s == pytest.approx(coll.all_reduce_s(4 * P, prof), rel=REL)
    rs_ag = coll.reduce_scatter_s(4 * P, prof) + coll.all_gather_s(2 * P, prof)
    t = dp_terms(ctx, base.with_(zero_stage=1))
    assert (t.per_step_s, t.per_microbatch_s, t.blocking_s) == pytest.approx((rs_ag, 0.0, 0.0), rel=REL)
    rs, ag = coll.reduce_scatter_s(4 * P, prof), coll.all_gather_s(2 * P, prof)
    pc = param_counts(GPT, 2, 1, 1, 1)
    t = dp_traffic(4, pc, prof, prof, 2, "per_step")
    assert (t.per_step_s, t.per_microbatch_s, t.blocking_s) == pytest.approx((0.0, rs, ag), rel=REL)
    t = dp_traffic(4, pc, prof, prof, 2, "per_microbatch")
    assert (t.per_step_s, t.per_microbatch_s, t.blocking_s) == pytest.approx((0.0, rs + ag, 0.0), rel=REL)
    t = dp_terms(ctx, base.with_(zero_stage=3))
    fsdp = 2 * coll.all_gather_s(2 * P, prof) + coll.reduce_scatter_s(4 * P, prof)
    assert (t.per_step_s, t.per_microbatch_s) == pytest.approx((0.0, fsdp), rel=REL)


@pytest.mark.parametrize("zero", [0, 3])
def test_dp_terms_reduce_experts_when_ep_is_1(cluster16, zero):
    """With ep = 1 the expert weights are replicated like the dense ones and reduced with them
    (regression, fixed in f2490e5: they cost nothing, so ep=1 + ZeRO-3 sharded experts for free)."""
    from clusterplan.cost.terms import dp_terms
    ctx = _ctx(cluster16, model=MOE)
    layout = Layout(tp=1, dp=16, ep=1, zero_stage=zero)
    pc = param_counts(MOE, 1, 1, 1, 1)
    prof = cluster16.group_profile(range(16))
    P = pc.dense + pc.expert
    t = dp_terms(ctx, layout)
    if zero == 0:
        assert t.per_step_s == pytest.approx(coll.all_reduce_s(4 * P, prof), rel=REL)
    else:
        fsdp = 2 * coll.all_gather_s(2 * P, prof) + coll.reduce_scatter_s(4 * P, prof)
        assert t.per_microbatch_s == pytest.approx(fsdp, rel=REL)


def test_grad_bytes_follow_the_job(cluster16):
    layout = Layout(tp=2, pp=2, dp=4, zero_stage=0)
    c4 = static_memory(_ctx(cluster16), layout)
    c2 = static_memory(Context(GPT, Job(global_batch_size=64, seq_len=2048, grad_bytes=2), cluster16), layout)
    assert c4.gradients_bytes == pytest.approx(2 * c2.gradients_bytes, rel=REL)


# ---- cost/layout.parse_layout -------------------------------------------------------------------------
def test_parse_layout_full():
    l = parse_layout("tp=8,pp=8,dp=16,vp=2,mbs=1,recompute=selective,zero=1,sp=on")
    assert (l.tp, l.pp, l.dp, l.vp, l.micro_batch_size, l.recompute, l.zero_stage, l.sequence_parallel) == (
        8, 8, 16, 2, 1, "selective", 1, True)
    assert l.num_devices == 1024


def test_parse_layout_aliases_spaces_and_defaults():
    l = parse_layout(" tp = 4 , pp=2, micro_batch=2, recomp=full, sp=off, order=tp-cp-pp-dp, dp_overlap=no,"
                     " tp_overlap=yes, cp=2, ep=2, zero=0 ")
    assert (l.tp, l.pp, l.dp, l.cp, l.ep) == (4, 2, 1, 2, 2)
    assert (l.micro_batch_size, l.recompute, l.sequence_parallel, l.order, l.dp_overlap, l.tp_overlap,
            l.zero_stage) == (2, "full", False, "tp-cp-pp-dp", False, True, 0)
    assert parse_layout("") == Layout()


def test_parse_layout_fills_dp_from_device_count():
    assert parse_layout("tp=8,pp=4", num_devices=256).dp == 8
    assert parse_layout("tp=8,pp=4,cp=2", num_devices=256).dp == 4
    assert parse_layout("tp=8,dp=3", num_devices=256).dp == 3  # an explicit dp is kept
    assert parse_layout("tp=8").dp == 1


@pytest.mark.parametrize("text,names", [
    ("tp", ["key=value"]),
    ("foo=1", ["foo", "allowed"]),
    ("tp=0", ["layout.tp", "positive"]),
    ("pp=-2", ["layout.pp"]),
    ("mbs=two", ["layout.micro_batch_size"]),
    ("vp=1.5", ["layout.vp"]),
    ("sp=maybe", ["layout.sequence_parallel", "on, off"]),
    ("recompute=some", ["layout.recompute", "selective"]),
    ("order=tp-dp-pp", ["layout.order", "permutation"]),
    ("order=tp-cp-dp-ep", ["layout.order"]),
    ("order=tp-cp-dp-pp@xxz", ["layout.order", "'tp-cp-dp-pp@xxz'", "torus axes", "xyz"]),
    ("order=tp-cp-dp-pp@", ["layout.order", "torus axes"]),
    ("order=tp-cp-dp-pp@xw", ["layout.order", "xy"]),
])
def test_parse_layout_errors_name_the_key(text, names):
    with pytest.raises(SpecError) as err:
        parse_layout(text)
    for name in names:
        assert name in str(err.value)


def test_order_with_a_torus_traversal_reads_only_the_parallel_part():
    l = parse_layout("tp=4,order=tp-cp-dp-pp@xzy", num_devices=128)
    assert l.order == "tp-cp-dp-pp@xzy" and l.traversal == "xzy"
    assert (l.stride("tp"), l.stride("dp")) == (1, 4) and l.group("dp")[:2] == (0, 4)
    assert parse_layout("order=tp-dp-cp-pp@yx").traversal == "yx" and Layout().traversal == ""
    assert "order=tp-cp-dp-pp@xzy" in l.short()


def test_torus_traversal_changes_communication_not_memory():
    """tp=4 on a 4x4x8 slice: on the whole x ring (``@xyz``) rather than half of z, its
    collectives get twice the bandwidth; memory and compute do not depend on placement."""
    cluster = build_cluster("tpu-v5p-pod", num_devices=128)
    ctx = _ctx(cluster, batch=256)
    rows = Layout(tp=4, dp=32, micro_batch_size=2)
    ring = rows.with_(order="tp-cp-dp-pp@xyz")
    a, b = evaluate_ctx(ctx, rows), evaluate_ctx(ctx, ring)
    assert b.time.tp_comm_s < a.time.tp_comm_s
    # (compute_s holds the LM head, whose logits gather is tensor-parallel traffic too)
    assert b.memory == a.memory and b.time.recompute_s == a.time.recompute_s
    # the same terms through the placed context, by hand
    placed = ctx.placed(ring.order)
    assert placed is ctx.placed("tp-dp-cp-pp@xyz") and placed.cluster is cluster.placed("xyz")
    assert ctx.placed("tp-cp-dp-pp@zyx") is ctx and placed.placed("tp-cp-dp-pp") is ctx
    prof = cluster.placed("xyz").group_profile(range(4))
    size = 2 * 2 * 2048 * GPT.hidden_size
    expected = GPT.num_layers * 4 * coll.all_reduce_s(size, prof) * a.num_microbatches
    assert b.time.tp_comm_s == pytest.approx(expected, rel=REL)
    # a traversal that is not the cluster's is a structural problem (and an error when placed)
    assert [k for k, _ in layout_problems(GPT, ctx.job, cluster, rows.with_(order="tp-cp-dp-pp@xy"))] == ["traversal"]
    gpus = build_cluster("dgx-h100-superpod", num_devices=16)
    problems = layout_problems(GPT, ctx.job, gpus, Layout(tp=8, dp=2, order="tp-cp-dp-pp@xyz"))
    assert [k for k, _ in problems] == ["traversal"] and "not a torus" in problems[0][1]


def test_parse_layout_zero_stage_range_is_checked_by_layout_problems(cluster16):
    """parse_layout accepts any non-negative zero stage; the structural check names it."""
    layout = parse_layout("tp=8,zero=5", num_devices=16)
    problems = layout_problems(GPT, Job(global_batch_size=64, seq_len=2048), cluster16, layout)
    assert [k for k, _ in problems] == ["zero"]


def test_parse_layout_unicode_digit_is_spec_error():
    """'²'.isdigit() is True but int('²') fails: it must still be a SpecError (fixed in f2490e5)."""
    with pytest.raises(SpecError, match="layout.tp"):
        parse_layout("tp=²")


def test_layout_problems_name_each_rule(cluster16):
    job = Job(global_batch_size=64, seq_len=2048)
    cases = {
        "device_count": Layout(tp=2, dp=2),
        "heads": Layout(tp=16, dp=1),
        "batch": Layout(tp=1, dp=16, micro_batch_size=8),
        "layers": Layout(tp=1, pp=16, dp=1),
        "interleave": Layout(tp=8, dp=2, vp=2),
        "context": Layout(tp=1, dp=1, cp=16),
        "sequence_parallel": Layout(tp=1, dp=16, sequence_parallel=True),
        "experts": Layout(tp=1, dp=16, ep=2),
    }
    model = gpt_like(a=8, h=1024)  # 8 heads: tp=16 does not divide them
    for key, layout in cases.items():
        job_k = Job(global_batch_size=64, seq_len=2056) if key == "context" else job
        keys = [k for k, _ in layout_problems(model, job_k, cluster16, layout)]
        assert key in keys, (key, keys)


def test_step_energy_is_idle_power_over_the_step_plus_board_power_while_computing():
    """E = N * ((P_idle + P_host) * T + (P_board - P_idle) * T_busy), by hand for one H100 layout."""
    from clusterplan.cost.energy import busy_s, step_energy_j, step_cost_usd

    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    model = get_model("gpt3-1.3b")
    ev = evaluate(model, Job(global_batch_size=512, seq_len=2048), cluster, Layout(tp=2, pp=2, dp=16, vp=2))
    t = ev.time
    busy = t.compute_s + t.recompute_s + t.optimizer_s
    assert busy_s(t) == pytest.approx(busy)
    assert 0 < busy < t.total_s
    by_hand = 64 * ((70.0 + 575.0) * t.total_s + (700.0 - 70.0) * busy)  # devices.yaml, clusters.yaml
    assert ev.busy_s == busy_s(t)  # one kind of layer, an even split: the slowest stage is the mean one
    assert step_energy_j(cluster, t.total_s, ev.busy_s) == pytest.approx(by_hand)
    assert step_cost_usd(cluster, t.total_s) == pytest.approx(3.24 * 64 * t.total_s / 3600)


def test_hierarchical_all_to_all_crosses_the_fabric_once_per_node():
    """DeepEP-style dispatch: the NIC carries only the deduplicated bytes; inside the domain every
    copy except the rank's own goes over the scale-up links; the slower side sets the time."""
    k, n, Wi, We, ai, ae = 32, 4, 300e9, 50e9, 2e-6, 5e-6
    kl = k // n
    remote = SIZE / 3
    expected = max(SIZE * (kl - 1) / kl / Wi, remote / We) + (kl - 1) * ai + (n - 1) * ae
    assert coll.hierarchical_all_to_all_s(SIZE, remote, profile(k, n, Wi, We, ai, ae)) == pytest.approx(expected, rel=REL)


def test_remote_nodes_per_token_by_hand():
    """Uniform top-k over experts spread evenly over nodes: E[nodes hit] = N (1 - C(E - E/N, k) / C(E, k)),
    times (N-1)/N for the remote ones; node-limited routing draws from M nodes' experts only."""
    from math import comb

    from clusterplan.cost.terms import remote_nodes_per_token

    E, k, N = 256, 8, 8
    hit = N * (1 - comb(E - E // N, k) / comb(E, k))
    assert remote_nodes_per_token(E, k, N) == pytest.approx(hit * (N - 1) / N, rel=1e-12)
    M = 4
    hit_m = M * (1 - comb(M * E // N - E // N, k) / comb(M * E // N, k))
    assert remote_nodes_per_token(E, k, N, M) == pytest.approx(hit_m * (N - 1) / N, rel=1e-12)
    assert remote_nodes_per_token(E, k, N, M) < remote_nodes_per_token(E, k, N) < k
    assert remote_nodes_per_token(8, 2, 1) == 0.0  # one node: nothing crosses the fabric


def test_remote_nodes_from_the_emptiest_domain_by_hand():
    """An expert group straddling domains unevenly is timed at its rank in the emptiest domain: with a
    share ``o`` of the experts at home and the rest split over the other ``N - 1`` domains, each other
    domain is hit unless all ``k`` picks miss it: ``(N - 1) (1 - C(E - m, k) / C(E, k))``, ``m = E (1 -
    o) / (N - 1)``. Equal shares give the even formula; a smaller home share sends more across."""
    from math import comb

    from clusterplan.cost.terms import remote_nodes_per_token

    E, k, N = 256, 8, 2
    m = E * (1 - 8 / 64)  # 8 of an expert group of 64 at home, the other 56 in one other domain
    assert remote_nodes_per_token(E, k, N, own_share=8 / 64) == pytest.approx(
        (N - 1) * (1 - comb(int(E - m), k) / comb(E, k)), rel=1e-12)
    for n, limit in ((2, None), (8, None), (8, 4)):
        even = remote_nodes_per_token(E, k, n, limit)
        assert remote_nodes_per_token(E, k, n, limit, own_share=1 / n) == pytest.approx(even, rel=1e-12)
        assert even < remote_nodes_per_token(E, k, n, limit, own_share=0.5 / n) <= min(k, n - 1)


def test_deepseek_v3_all_to_all_halves_with_node_limited_routing():
    """DeepSeek-V3 routes each token to at most 4 nodes (section 3.2): on 8 nodes the InfiniBand
    bytes fall to about 3.2 remote nodes per token, from 7 of 8 copies under a flat all-to-all. Only a
    deduplicating dispatcher (DeepEP, what DeepSeek ran) gains from it: NCCL's all-to-all (and ``auto``)
    sends every copy wherever the experts lie."""
    model = get_model("deepseek-v3")
    assert model.moe.max_nodes_per_token == 4
    cluster = build_cluster("hgx-h800", num_devices=2048)
    job = Job(global_batch_size=15360, seq_len=4096, precision="fp8")
    flat = Layout(tp=1, pp=16, dp=128, ep=64, micro_batch_size=1, recompute="selective")
    free_model = model.model_copy(update={"moe": model.moe.model_copy(update={"max_nodes_per_token": None})})
    assert evaluate(model, job, cluster, flat).time.ep_comm_s == evaluate(free_model, job, cluster, flat).time.ep_comm_s
    layout = flat.with_(moe_dispatcher="deepep")
    limited = evaluate(model, job, cluster, layout).time.ep_comm_s
    free = evaluate(free_model, job, cluster, layout).time.ep_comm_s
    assert 0 < limited < 0.75 * free


# ---- MoE parallel folding (expert tensor parallelism 1, ep carved from tp x cp x dp) ------------------
def test_folded_expert_group_is_the_tp_block_times_part_of_dp():
    folded = parse_layout("tp=2,dp=8,ep=8,etp=1,sp=on")
    assert not folded.expert_tp and "etp=1" in folded.short()
    assert folded.group("ep") == tuple(range(8))  # tp ranks {0,1} x dp ranks {0,2,4,6}
    assert folded.group("edp") == (0, 8)  # tp*dp/ep = 2 replicas of each expert
    plain = Layout(tp=2, dp=8, ep=4)
    assert plain.group("ep") == (0, 2, 4, 6) and plain.group("edp") == (0, 8)
    assert parse_layout("tp=4,ep=4,etp=4").expert_tp
    with pytest.raises(SpecError, match="layout.etp"):
        parse_layout("tp=4,ep=4,etp=2")


def test_folded_experts_are_whole_and_shard_over_tp_times_dp():
    """Folded: each rank holds E/ep whole experts (not split tp ways); ZeRO shards them over the
    tp*cp*dp/ep ranks that hold the same experts."""
    from clusterplan.cost.terms import owned_params

    model = get_model("mixtral-8x7b")
    plain = param_counts(model, 4, 1, 1, 8, True)
    folded = param_counts(model, 4, 1, 1, 8, False)
    assert folded.dense == pytest.approx(plain.dense, rel=REL)
    assert folded.expert == pytest.approx(4 * plain.expert, rel=REL)
    lay = Layout(tp=4, dp=16, ep=8, expert_tp=False, sequence_parallel=True)
    assert owned_params(folded, lay, True) == pytest.approx(folded.dense / 16 + folded.expert / (4 * 16 // 8), rel=REL)


def test_folding_drops_the_mlp_tensor_parallel_collectives_of_moe_layers():
    """An all-MoE model (Mixtral): with folded experts only the attention's two collectives per layer
    remain, half of the four; the compute FLOPs are the same."""
    model = get_model("mixtral-8x7b")
    assert model.num_dense_layers == 0
    ctx = Context(model, Job(global_batch_size=64, seq_len=4096), build_cluster("dgx-h100-superpod", num_devices=64))
    full = tp_comm_terms(ctx, 4, 1, 1, True, "none", 1, False, True)
    folded = tp_comm_terms(ctx, 4, 1, 1, True, "none", 1, False, False)
    assert folded == pytest.approx(full / 2, rel=REL)


def test_folded_expert_all_to_all_stays_in_the_node():
    """tp=4, ep=8 on 8-GPU nodes: folded, the expert group is 8 adjacent GPUs (NVLink only); carved
    from dp alone it strides 4 and spans 4 nodes (InfiniBand). With Mixtral's long sequences the
    saved traffic outweighs reading whole experts, so folding is faster here (with short ones it
    is not: whole experts cost weight reads and larger expert gradients)."""
    model = get_model("mixtral-8x7b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    job = Job(global_batch_size=128, seq_len=32768)
    plain = evaluate(model, job, cluster, Layout(tp=4, dp=16, ep=8, sequence_parallel=True))
    folded = evaluate(model, job, cluster, Layout(tp=4, dp=16, ep=8, sequence_parallel=True, expert_tp=False))
    assert cluster.group_profile(Layout(tp=4, dp=16, ep=8, expert_tp=False).group("ep")).num_domains == 1
    assert cluster.group_profile(Layout(tp=4, dp=16, ep=8).group("ep")).num_domains == 4
    assert folded.time.ep_comm_s < plain.time.ep_comm_s
    assert folded.time.tp_comm_s == pytest.approx(plain.time.tp_comm_s / 2, rel=1e-6)
    assert folded.step_time_s < plain.step_time_s
    problems = layout_problems(model, job, cluster, Layout(tp=4, dp=16, ep=8, expert_tp=False))
    assert any("sequence parallelism" in msg for _, msg in problems)


# ---- GEMM efficiency by size: tile and wave quantization ----------------------------------------------
def test_wave_efficiency_by_hand():
    """128x256 output tiles, one per SM per wave: 1024^3 on an H100 (132 SMs) is 8 x 4 = 32 tiles in
    one wave (24% of the SMs); 4096^3 is 512 tiles in 4 waves (512 / 528)."""
    from clusterplan.cost.compute import wave_efficiency

    assert wave_efficiency(1024, 1024, 1, 132) == pytest.approx(32 / 132, rel=REL)
    assert wave_efficiency(4096, 4096, 1, 132) == pytest.approx(512 / 528, rel=REL)
    assert wave_efficiency(100, 256, 1, 132) == pytest.approx(100 * 256 / (132 * 128 * 256), rel=REL)  # a partial tile
    assert wave_efficiency(512, 1536, 16, 132) == pytest.approx(16 * 4 * 6 / (ceil_div(16 * 4 * 6, 132) * 132), rel=REL)
    assert wave_efficiency(1024, 1024, 1, None) == 1.0  # no SM count: not modelled


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def test_small_gemms_follow_the_measured_h100_size_curve():
    """The H100 size curve (calibration-sources.md (b), bf16 square GEMMs: 176.6 TFLOP/s at 1024^3,
    788.7 at 4096^3) is reproduced within 35% at the small end by wave quantization alone; the large
    end is MAMF less the output write (the epilogue, 5% of a 4096^3 GEMM on H100: within 7%).
    Per-kernel overhead adds on top (3 us on a 12 us GEMM)."""
    dev = build_cluster("dgx-h100-superpod", num_devices=8).device
    rate = lambda n: 2 * n**3 / (op_time_s(_square(n), dev, "bf16") - dev.kernel_overhead_s)
    assert rate(4096) / 1e12 == pytest.approx(788.7 * dev.sustained_fraction, rel=0.07)
    assert rate(1024) / 1e12 == pytest.approx(176.6 * dev.sustained_fraction, rel=0.35)
    assert rate(1024) < 0.3 * rate(4096)


def _square(n: int):
    from clusterplan.models.ops import Op

    return Op("square", "gemm", 2.0 * n**3, 2.0 * 3 * n * n, rows=n, cols=n)


def test_flash2_attention_is_slower_on_hopper_only():
    """FlashAttention-2 reaches 35% of peak on H100 against the FA3-derived 54% (both cited in
    devices.yaml), at head size 128; at GPT's head size the two kernels' measured head-size factors
    (0.88 and 0.79 of their rates at 128 on Hopper) scale them; on A100 FA2 is the family's best, so
    the two agree."""
    from clusterplan.cost.compute import head_dim_factor
    from clusterplan.models.ops import attention_ops

    n = 8192
    for preset, ratio in (("dgx-h100-superpod", 0.54 / 0.35), ("dgx-a100-superpod", 1.0)):
        dev = build_cluster(preset, num_devices=8).device
        best = next(op for op in attention_ops(GPT, n, n, 1) if op.kind == "attention")
        fa2 = next(op for op in attention_ops(GPT, n, n, 1, "flash2") if op.kind == "attention")
        t = lambda op: op_time_s(op, dev, "bf16") - dev.kernel_overhead_s
        heads = head_dim_factor(dev, "", best.head_dim) / head_dim_factor(dev, "fa2", fa2.head_dim)
        assert t(fa2) / t(best) == pytest.approx(ratio * heads, rel=1e-6), preset


def test_flash1_attention_runs_at_its_share_of_flash2():
    """FlashAttention-1-era kernels (2023's Triton ports, flash-attn 1.x) at FA1_OVER_FA2 of
    FlashAttention-2's rate (Dao 2023 section 4.1), on every device; the other ops are unchanged."""
    from clusterplan.cost.compute import FA1_OVER_FA2
    from clusterplan.models.ops import attention_ops

    n = 8192
    for preset in ("dgx-h100-superpod", "dgx-a100-superpod", "gaudi2-cluster"):
        dev = build_cluster(preset, num_devices=8).device
        fa2, fa1 = (attention_ops(GPT, n, n, 1, kind) for kind in ("flash2", "flash1"))
        t = lambda op: op_time_s(op, dev, "bf16") - dev.kernel_overhead_s
        core2, core1 = (next(op for op in ops if op.kind == "attention") for ops in (fa2, fa1))
        assert t(core1) * FA1_OVER_FA2 == pytest.approx(t(core2), rel=1e-6), preset
        assert [t(op) for op in fa1 if op.kind != "attention"] == [t(op) for op in fa2 if op.kind != "attention"]


def test_llmfoundry_model_code_holds_the_fused_loss_bytes():
    """llm-foundry's MPT loss (flash-attn's fused cross-entropy) holds 4 B per logit at its peak, not
    the 12 of torchtitan's eager loss; the step time differs only by FSDP2's copies around each
    gather and reduce-scatter, which Composer's FSDP (flat parameters) does not make."""
    import dataclasses

    from clusterplan.cost.terms import FUSED_LOSS_LOGIT_BYTES, dp_terms
    cluster = build_cluster("dgx-h100-superpod", num_devices=8)
    job = Job(global_batch_size=64, seq_len=2048, framework="torchtitan")
    layout = Layout(dp=8, micro_batch_size=4, zero_stage=3)
    native = evaluate(GPT, job, cluster, layout)
    mpt = evaluate(GPT, dataclasses.replace(job, model_code="llmfoundry"), cluster, layout)
    logits = 4 * 2048 * GPT.vocab_size
    assert native.memory.working_bytes - mpt.memory.working_bytes == pytest.approx((12 - FUSED_LOSS_LOGIT_BYTES) * logits)
    copies = native.num_microbatches * dp_terms(Context(GPT, job, cluster), layout).copy_s
    assert copies > 0
    assert mpt.step_time_s == pytest.approx(native.step_time_s - copies)


def test_stage_memory_first_and_last(cluster16):
    """With pp > 1 both stages are reported and the peak is the larger of the two."""
    job = Job(global_batch_size=64, seq_len=2048)
    ev = evaluate(GPT, job, cluster16, Layout(tp=2, pp=4, dp=2, micro_batch_size=1, sequence_parallel=True,
                                               recompute="none", zero_stage=1))
    first, last = ev.stage_memory_bytes
    assert max(first, last) == pytest.approx(ev.peak_memory_bytes, rel=1e-9)
    assert first != last
    flat = evaluate(GPT, job, cluster16, Layout(tp=2, pp=1, dp=8, micro_batch_size=1, zero_stage=1))
    assert flat.stage_memory_bytes is None


# ---- runtime outside the allocator: CUDA context and NCCL buffers -------------------------------
@pytest.mark.parametrize("layout, sizes", [
    (Layout(dp=64), (64,)),  # the data-parallel group spans every rank: one communicator
    (Layout(tp=8, dp=8), (8, 8, 64)),
    (Layout(tp=8, pp=6, dp=8), (2, 6, 8, 8, 384)),  # + pipeline group and the pair it sends to
    (Layout(tp=2, cp=2, dp=4), (2, 2, 8, 16)),  # gradients over dp x cp
    (Layout(tp=2, dp=8, ep=4), (2, 2, 4, 8, 16)),  # + expert (4) and expert-data (2 x 8 / (4 x 2)) groups
])
def test_nccl_communicators_per_rank(layout, sizes):
    assert nccl_communicator_sizes(layout) == sizes


def _runtime(framework: str, date: str, layout: Layout, cluster) -> float:
    job = Job(global_batch_size=64, seq_len=2048, framework=framework, framework_date=date)
    return runtime_bytes(Context(GPT, job, cluster), layout)


def test_runtime_counts_context_by_release_and_nccl_buffers_per_communicator(cluster16):
    """PyTorch 1.13 loads CUDA modules lazily: an older framework pays the eager context; each
    communicator adds its buffers, a pair less than a larger group, and from NCCL 2.22 only its
    ring's."""
    three_d = Layout(tp=4, pp=2, dp=2)
    comms = (NCCL_COMMUNICATOR_BYTES * 2  # tp (4 ranks) and the default group (16)
             + NCCL_PAIR_COMMUNICATOR_BYTES * 3)  # two-rank groups: pp, dp and the pair sends go to
    assert _runtime("megatron", "2021-04", three_d, cluster16) == pytest.approx(CUDA_CONTEXT_EAGER_BYTES + comms)
    assert _runtime("megatron", "2024-06", three_d, cluster16) == pytest.approx(CUDA_CONTEXT_LAZY_BYTES + comms)
    # NCCL 2.22 connects lazily: from 2024-07 a communicator holds its ring's share only
    assert (_runtime("torchtitan", "2025-01", Layout(dp=16), cluster16)
            == pytest.approx(CUDA_CONTEXT_LAZY_BYTES + NCCL_COMMUNICATOR_BYTES / 3))
    assert (_runtime("megatron", "2024-07", three_d, cluster16)
            == pytest.approx(CUDA_CONTEXT_LAZY_BYTES + NCCL_COMMUNICATOR_BYTES * 2 / 3 + NCCL_PAIR_COMMUNICATOR_BYTES * 3 / 2))
    assert _runtime("megatron", "2024-06", three_d, cluster16) > _runtime("megatron", "2024-06", Layout(dp=16), cluster16)


def test_runtime_placeholder_off_nccl_and_none_on_sram():
    """On a TPU the runtime keeps what XLA leaves no program (measured: v6e 0.75 GiB of 32; none on
    v5p, whose catalogue 95 GiB is under XLA's 95.74); Gaudi keeps the unmeasured 1 GiB reserve; an
    SRAM machine has no runtime heap."""
    tpu = build_cluster("tpu-v5p-pod", num_devices=64)
    assert _runtime("maxtext", "2025-01", Layout(tp=4, dp=16), tpu) == 0.0
    v6e = build_cluster("tpu-v6e-pod", num_devices=64)
    assert _runtime("maxtext", "2025-01", Layout(tp=4, dp=16), v6e) == pytest.approx(0.75 * 2**30)
    gaudi = build_cluster("gaudi2-cluster", num_devices=16)
    assert _runtime("deepspeed", "2025-01", Layout(dp=16), gaudi) == RUNTIME_RESERVE_BYTES
    wafer = build_cluster("cerebras-cs3-cluster", num_devices=4)
    assert _runtime("megatron", "2025-01", Layout(dp=4), wafer) == 0.0


def test_runtime_is_in_what_must_fit(cluster16):
    """The runtime counts in the fit and in nvidia-smi's view, not in the allocator's peaks."""
    ev = evaluate(GPT, Job(global_batch_size=64, seq_len=2048), cluster16,
                  Layout(tp=2, pp=2, dp=4, micro_batch_size=1, zero_stage=1))
    mem = ev.memory
    assert mem.reserved_bytes == pytest.approx(runtime_bytes(Context(GPT, Job(global_batch_size=64, seq_len=2048),
                                                                     cluster16), ev.layout))
    assert mem.fit_bytes == pytest.approx(mem.allocated_bytes + mem.reserved_bytes)
    assert ev.peak_memory_bytes == pytest.approx(mem.fit_bytes + mem.allocator_bytes)


# ---- MoE routing: capacity factor and load imbalance ----------------------------------------------
def _moe_variant(**update) -> ModelSpec:
    base = get_model("mixtral")
    return base.model_copy(update={"moe": base.moe.model_copy(update=update)})


def test_moe_load_factor_prices_the_most_loaded_rank(cluster16):
    """Padding to a capacity factor, or a dropless router's imbalance, makes the most loaded
    expert-parallel rank process (and keep) that many more routed tokens: slower and heavier, with
    the model FLOPs (MFU's numerator) unchanged."""
    job = Job(global_batch_size=64, seq_len=4096)
    layout = Layout(tp=2, dp=8, ep=8, micro_batch_size=1, recompute="none", zero_stage=1, sequence_parallel=True)
    base, padded, skewed = (evaluate(m, job, cluster16, layout) for m in (
        _moe_variant(), _moe_variant(capacity_factor=1.25), _moe_variant(load_imbalance=1.5)))
    assert base.step_time_s < padded.step_time_s < skewed.step_time_s
    assert base.memory.activations_bytes < padded.memory.activations_bytes < skewed.memory.activations_bytes
    assert padded.mfu * padded.step_time_s == pytest.approx(base.mfu * base.step_time_s, rel=1e-9)
    assert _moe_variant(capacity_factor=1.25, load_imbalance=3.0).moe.load_factor == 1.25  # capacity caps the load
    assert _moe_variant().moe.load_factor == 1.0


def test_moe_router_keeps_fp32_scores_per_expert():
    """The router's fp32 softmax over every expert and its choices stay for backward."""
    from clusterplan.cost.terms import ROUTER_BYTES_PER_CHOICE, ROUTER_BYTES_PER_SCORE, moe_mlp_activation_bytes
    m = get_model("mixtral")
    few, many = m, m.model_copy(update={"moe": m.moe.model_copy(update={"num_experts": 64})})
    extra = moe_mlp_activation_bytes(many, 1000.0, 3) - moe_mlp_activation_bytes(few, 1000.0, 3)
    assert extra == pytest.approx(1000.0 * (64 - m.moe.num_experts) * ROUTER_BYTES_PER_SCORE)
    assert ROUTER_BYTES_PER_CHOICE > 0


# ---- expert parallelism over context x data (issue 36 item 1) -----------------------------------------
def test_expert_group_spans_context_then_data_like_megatrons_expert_rank_generator():
    """Megatron-Core's expert ranks run etp (= tp), ep, edp, pp over the world, the dense ones tp, cp,
    dp, pp: with tp=2, cp=4, dp=4 and ep=8 the expert group of rank 0 is every other rank of the
    first 16 (cp innermost, then two dp ranks), and the 2 ranks holding the same experts stride 16."""
    lay = Layout(tp=2, cp=4, dp=4, ep=8, sequence_parallel=True)
    assert lay.group("ep") == tuple(range(0, 16, 2))
    assert lay.group("edp") == (0, 16)
    assert Layout(tp=2, dp=8, ep=4).group("ep") == (0, 2, 4, 6)  # cp = 1: the first ep data-parallel ranks
    assert Layout(tp=2, cp=2, dp=4, ep=2).group("ep") == (0, 2)  # ep inside cp: the context-parallel pair


def test_ep_over_cp_and_dp_evaluates_and_prices_the_frameworks_group():
    """tp=2, cp=8, dp=4, ep=8 on 64 H100s (Megatron-Core since 2024-11 runs it: world % (etp ep pp) = 0;
    ep does not divide dp): evaluated, with the all-to-all over the 8 tp-strided ranks of one node
    pair's context block, as priced over exactly those ranks."""
    from clusterplan.cost.terms.comm import _ep_open_s

    model = get_model("mixtral-8x7b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    job = Job(global_batch_size=128, seq_len=32768)
    lay = parse_layout("tp=2,cp=8,dp=4,ep=8,mbs=1,sp=on")
    assert layout_problems(model, job, cluster, lay) == []
    ev = evaluate(model, job, cluster, lay)
    assert 1.0 < ev.step_time_s < 100.0 and ev.time.ep_comm_s > 0
    ranks = lay.group("ep")
    assert ranks == tuple(range(0, 16, 2))
    ctx = Context(model, job, cluster)
    assert ev.time.ep_comm_s == pytest.approx(
        _ep_open_s(ctx, 2, 8, 8, 1, True, "selective", ranks) * num_microbatches(job, lay), rel=0.05)


def test_ep_over_cp_is_refused_where_the_framework_refuses_it():
    """Megatron-Core before 2024-11 carved ep from dp alone; torchtitan until 2025-12 needed ep to be
    a multiple of cp; nobody runs ep that does not divide cp x dp."""
    model = get_model("mixtral-8x7b")
    cluster = build_cluster("dgx-h100-superpod", num_devices=64)
    lay = parse_layout("tp=2,cp=8,dp=4,ep=8,mbs=1,sp=on")
    old = layout_problems(model, Job(global_batch_size=128, seq_len=32768, framework_date="2024-06"), cluster, lay)
    assert any(k == "experts" and "ep=8 must divide dp=4" in m for k, m in old)
    titan = Job(global_batch_size=128, seq_len=32768, framework="torchtitan", framework_date="2025-10")
    inside = parse_layout("tp=2,cp=8,dp=4,ep=4,mbs=1,sp=on,zero=3")
    assert any(k == "experts" and "multiple of cp=8" in m for k, m in layout_problems(model, titan, cluster, inside))
    assert not [m for k, m in layout_problems(model, titan, cluster, lay.with_(zero_stage=3)) if k == "experts"]
    odd = parse_layout("tp=2,cp=2,dp=2,ep=8,mbs=1,sp=on")
    small = build_cluster("dgx-h100-superpod", num_devices=8)
    assert any("must divide cp x dp = 2x2 = 4" in m
               for _, m in layout_problems(model, Job(global_batch_size=128, seq_len=32768), small, odd))
