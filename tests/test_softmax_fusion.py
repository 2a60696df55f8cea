"""Megatron's fused scale-mask-softmax takes only the shapes its dispatch accepts; elsewhere the
unfused attention's softmax runs as PyTorch ops (models.ops.softmax_fused, EAGER_SOFTMAX_BYTES).
The BigScience Megatron-DeepSpeed fork of 2021-10 to 2022-03 read the kernel's rows per block from
the heads per rank (deepspeed.yaml softmax_fusion_history, source bigscience_fused_softmax)."""

from __future__ import annotations

import dataclasses

import pytest

from clusterplan.cost.compute import memory_rate, op_time_s
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.profile_file import _softmax_history, load_profile
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import SpecError
from clusterplan.models.ops import (ACT_BYTES, EAGER_SOFTMAX_BYTES, FUSED, Kernels, attention_ops,
                                    softmax_batches_per_block, softmax_fused)
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.library import build_cluster

S = 2048
BIGSCIENCE = Kernels(softmax_rule=("heads", 2048))


def _fused(kernels: Kernels, mbs: int, heads: int) -> bool:
    return softmax_fused(kernels, mbs * S, S, heads)


def test_rows_per_block_follow_the_kernels_warp_layout():
    """A warp of min(32, next power of two) threads, 128 threads a block, 2 rows a warp up to 128."""
    assert [softmax_batches_per_block(w) for w in (2, 4, 8, 12, 16, 32, 2048)] == [128, 64, 32, 16, 16, 8, 4]


def test_bigscience_fork_reproduces_the_chronicles_heads_table():
    """chronicles-prequel 'NHEADs comparison', TP 8, MBS 4 (heads per rank = NHEADS / 8): 64 and
    128 heads run near 120-125 s, 112 heads 138.72 s; 'NHEADS=108 breaks constraints'. At TP 8
    with 64 heads, micro-batches of 1 and 2 miss the 32 rows a block of 8-wide rows takes."""
    assert _fused(BIGSCIENCE, 4, 64 // 8) and _fused(BIGSCIENCE, 4, 128 // 8)
    assert not _fused(BIGSCIENCE, 4, 112 // 8)
    assert [_fused(BIGSCIENCE, mbs, 8) for mbs in (1, 2, 4, 8)] == [False, False, True, True]
    assert all(_fused(BIGSCIENCE, mbs, 16) for mbs in (1, 2, 4))  # TP 4, 64 heads
    # the declared order (rows per block of 2048-wide rows: 4) takes all of them
    keys = Kernels(softmax_rule=("keys", 2048))
    assert all(_fused(keys, mbs, h) for mbs in (1, 2, 4) for h in (8, 12, 16)) and _fused(keys, 4, 14)
    assert not _fused(keys, 1, 6)  # b x np = 6: not a multiple of 4
    assert not softmax_fused(keys, 4 * 4096, 4096, 8)  # keys beyond 2048
    assert softmax_fused(Kernels(softmax_rule=("keys", 4096)), 4 * 4096, 4096, 8)
    assert _fused(FUSED, 1, 6)  # no rule: every shape fused


def test_eager_softmax_moves_nine_times_the_bytes():
    """The PyTorch path (fp32 upcast, scale, mask, softmax, cast back) moves 36 bytes per score
    forward and 40 backward against the fused kernel's 4 and 6."""
    model = ModelSpec(name="t", num_layers=2, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384,
                      vocab_size=50304, ffn_activation="gelu")
    n, tp = 2 * S, 4
    fused = {op.name: op for op in attention_ops(model, n, S, tp, "unfused")}["softmax"]
    eager = {op.name: op for op in attention_ops(model, n, S, tp, "unfused", BIGSCIENCE)}["softmax"]
    scores = n * S * model.num_attention_heads / tp
    assert fused.bytes == pytest.approx(4 * scores)
    assert eager.bytes == pytest.approx(EAGER_SOFTMAX_BYTES[0] * scores)
    dev = build_cluster("dgx-a100-superpod", num_devices=8).device
    bwd = op_time_s(eager, dev, "bf16", backward=True) - dev.kernel_overhead_s
    assert bwd == pytest.approx(EAGER_SOFTMAX_BYTES[1] * scores / memory_rate(dev))
    assert ACT_BYTES == 2


def test_deepspeed_profile_prices_the_fork_before_its_march_2022_sync():
    """A BigScience-shaped 181B layer at TP 8, 64 heads, full recompute: the February 2022 release
    pays the eager softmax at micro-batch 2 (forward twice, backward once per layer and micro-batch)
    and not at 4; the March release and the Megatron profile price both fused."""
    prof = load_profile("deepspeed")
    assert prof.at("2022-02").softmax_rule == ("heads", 2048)
    assert prof.at("2022-03").softmax_rule == ("keys", 4096)
    assert load_profile("megatron").at("2022-02").softmax_rule == ("", 0)
    model = ModelSpec(name="b", num_layers=12, hidden_size=14336, num_attention_heads=64, ffn_hidden_size=57344,
                      vocab_size=250880, ffn_activation="gelu")
    cluster = build_cluster("dgx-a100-superpod", num_devices=16)
    feb = Job(global_batch_size=64, seq_len=S, framework="deepspeed", framework_date="2022-02", attention="unfused")
    mar = dataclasses.replace(feb, framework_date="2022-03")
    for mbs, slower in ((2, True), (4, False)):
        layout = Layout(tp=8, pp=2, dp=1, micro_batch_size=mbs, recompute="full", zero_stage=1, dp_overlap=False)
        old, new = evaluate(model, feb, cluster, layout), evaluate(model, mar, cluster, layout)
        assert (old.time.compute_s + old.time.recompute_s > new.time.compute_s + new.time.recompute_s) is slower
        if not slower:
            assert old.step_time_s == pytest.approx(new.step_time_s)


def test_profile_history_is_checked():
    with pytest.raises(SpecError, match="block_dim: got 'rows'; allowed: keys, heads"):
        _softmax_history({"softmax_fusion_history": [{"since": "2021-10", "block_dim": "rows", "max_keys": 2048}]}, "x")
    with pytest.raises(SpecError, match="max_keys: got 8; allowed: an integer above 16"):
        _softmax_history({"softmax_fusion_history": [{"since": "2021-10", "block_dim": "keys", "max_keys": 8}]}, "x")
