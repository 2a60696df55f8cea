"""What a framework's kernels keep and move: FP8 training's saved activations (Transformer Engine,
the megatron profile, keeps the FP8 copy of each linear's input for the weight gradient,
``semantics.fp8_saved_inputs``; torchao's float8 under torchtitan keeps the high-precision input)
and the AdamW implementation by release (``semantics.optimizer_history``)."""

import pytest

from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.terms import activation_bytes
from clusterplan.models.library import get_model
from clusterplan.topologies.library import build_cluster

LLAMA = get_model("llama3-70b")
CLUSTER = build_cluster("dgx-h100-superpod", num_devices=64)


def _act(framework: str, precision: str, layout: Layout) -> float:
    job = Job(global_batch_size=64, seq_len=8192, precision=precision, framework=framework)
    return evaluate(LLAMA, job, CLUSTER, layout).memory.activations_bytes


def test_transformer_engine_keeps_fp8_inputs():
    layout = Layout(tp=8, pp=1, dp=8, sequence_parallel=True, recompute="none", zero_stage=1)
    bf16, fp8 = _act("megatron", "bf16", layout), _act("megatron", "fp8", layout)
    h, f, a_d = LLAMA.hidden_size, LLAMA.ffn_hidden_size, LLAMA.num_attention_heads * LLAMA.head_dim_resolved
    # per token and layer: attention and MLP inputs and fc2's input drop to 1 byte, the
    # out-projection's FP8 copy of the attention output adds 1 byte
    expected = activation_bytes(LLAMA, 1.0, 1, False, "none", False) - (2 * h + f - a_d)
    per_token = activation_bytes(LLAMA, 1.0, 1, False, "none", False, fp8_inputs=True)
    assert per_token == pytest.approx(expected)
    assert fp8 < bf16


def test_torchao_float8_keeps_high_precision_inputs():
    layout = Layout(tp=1, pp=1, dp=64, recompute="none", zero_stage=3)
    assert _act("torchtitan", "fp8", layout) == pytest.approx(_act("torchtitan", "bf16", layout))


def test_torchtitan_adamw_was_foreach_until_2025_02():
    """torchtitan passed foreach=True until its fused-AdamW default (#881, 2025-02): one memory pass
    per multi-tensor op, 84 B a parameter with fp32 gradients against the fused kernel's 30."""
    from clusterplan.cost.terms import Context, optimizer_s
    layout = Layout(tp=1, pp=1, dp=64, recompute="none", zero_stage=3)

    def opt(date: str) -> float:
        job = Job(global_batch_size=64, seq_len=8192, framework="torchtitan", framework_date=date)
        return optimizer_s(Context(LLAMA, job, CLUSTER), layout)
    assert opt("2024-12") == pytest.approx(opt("2025-06") * 84 / 30)
