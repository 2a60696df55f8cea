"""Roofline time of each op on a device: ``max(FLOPs / achieved peak, bytes / achieved bandwidth)``.

Achieved rates are properties of the device (``topologies/data/devices.yaml``): the large-GEMM
efficiency measured by ml-engineering's MAMF benchmark (burst clocks), the sustained fraction of it
under the power-saturated clocks of a long training step (ml-engineering's MSMF vs MAMF), a
fused-attention efficiency from the FlashAttention papers, an achieved fraction of HBM bandwidth,
and a fixed per-kernel overhead.

Backward multipliers: a linear layer's backward is two GEMMs (input and weight gradients) of the
forward's size (Narayanan et al. 2021: "backward costs twice the forward"); a flash-attention
backward runs five matmuls against the forward's two (Dao 2023, FlashAttention-2 section 3.1),
i.e. 2.5x the forward FLOPs; element-wise backward passes read the saved input and the incoming
gradient and write one gradient, about twice the forward bytes. An op may carry its own factor
(the unfused attention's softmax and dropout, ``models.ops.unfused_attention_ops``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from clusterplan.models.ops import ACT_BYTES, MLP_BLOCK_OPS, Op
from clusterplan.topologies.devices import DeviceSpec
from clusterplan.topologies.precisions import LOW_PRECISIONS, low_precision

BACKWARD_FACTOR = {"gemm": 2.0, "attention": 2.5, "bmm": 2.0, "memory": 2.0}
UNMEASURED_ATTENTION_OVER_MAMF = 0.5
"""Fused attention's achieved fraction of peak as a share of the MAMF fraction, on a device with no
fused-attention measurement. Measured pairs: A100 FlashAttention-2 0.53 / 0.869 = 0.61, H100
FlashAttention-3 0.54 / 0.803 = 0.67, H100 FlashAttention-2 0.35 / 0.803 = 0.44 (devices.yaml
calibration). 0.5 sits inside that range, and it makes the causal kernel (half the scores executed)
cost exactly as much per model FLOP (PaLM count, no causal halving) as the GEMMs, so that MFU stays
under the device's matmul ceiling. Taking the MAMF fraction itself (the former fallback) ran
attention at twice the GEMM rate per model FLOP: MFU 109.7% for Mixtral at 32k tokens on Gaudi 2."""
FA1_OVER_FA2 = 0.55
"""FlashAttention-1-era kernels' forward-plus-backward rate as a share of FlashAttention-2's. Dao 2023
(FlashAttention-2, section 4.1, A100): FlashAttention-2 is "around 1.3-1.5x faster than
FlashAttention in Triton in the forward pass and around 2x faster in the backward pass", and "around
2x" faster than FlashAttention (CUDA, flash-attn 1.x) in both. With the backward's 2.5 forwards of
work (``BACKWARD_FACTOR``), the Triton kernel takes (1.4 + 2.5 x 2) / (1 + 2.5) = 1.83 times
FlashAttention-2's time: 0.55 (flash-attn 1.x: 0.5). For 2023's Triton FlashAttention ports
(llm-foundry's ``attn_impl: triton``) and flash-attn 1.x; on Hopper neither uses its new features, so
the same share of FlashAttention-2's Hopper rate (not measured there)."""
GEMM_TILE = (128, 256)  # output tile of a large cuBLAS/CUTLASS GEMM (ml-engineering MAMF shape rules)
FP8_CAST_TRANSPOSE_BYTES = LOW_PRECISIONS["fp8"].cast_bytes
"""Bytes per element of an FP8 cast-transpose (4): read the 16-bit tensor once, write its 8-bit copy and
the transposed 8-bit copy (Hopper's FP8 GEMMs take only the TN layout, so the weight- and
input-gradient GEMMs need transposed operands: Transformer Engine's ``fp8_cast_transpose_fused``;
Blackwell's MXFP8 writes row- and column-wise scaled copies alike). One pass: delayed scaling takes
its scale from earlier steps, MX block scaling from the block itself."""
CAST_TRANSPOSE_RATE_SHARE = 0.5
"""Share of the device's streaming rate (``memory_rate``) that a cast-transpose reaches: its
transposed writes go through shared-memory tiles, and its tensors are short. Measured on H100 SXM:
Transformer Engine's kernel casts FP16 to FP8 with transpose, 4096 x 4096 in 51.5 us and 3072 x 3072
in 24.5 us (NVIDIA/TransformerEngine PR #101, 2023-03), 1.30 and 1.54 TB/s counting 4 B per element,
0.44 and 0.52 of the 2.97 TB/s a copy streams; benchmarks/gpu_probe.py's one-pass Triton kernel on
Llama 3 8B's activations and gradients, 8192 tokens, 0.31 to 0.80 (median 0.49) on an H100 and 0.51 to
0.74 (median 0.62) on an H200 (benchmarks/results/gpu_probe_fp8_*_2026-11-27.json)."""
FP8_TRANSPOSE_BYTES = 2.0 * LOW_PRECISIONS["fp8"].element_bytes
"""Bytes per element of the backward transpose of an input cast inside its norm (read and write 1 B:
Transformer Engine's ``LayerNormLinear`` keeps the norm's FP8 output and transposes it for the
weight gradient)."""


def gemm_rate(device: DeviceSpec, precision: str) -> float:
    """Achieved FLOP/s of a large GEMM in ``precision`` (``DeviceSpec.gemm_flops_per_s``)."""
    return device.gemm_flops_per_s(precision)


def attention_rate(device: DeviceSpec, precision: str, variant: str = "") -> float:
    """Achieved FLOP/s of fused attention; it runs in 16-bit even in FP8 training. ``variant="fa2"``:
    FlashAttention-2 kernels, slower where the device has a figure for them (Hopper); ``"fa1"``:
    FlashAttention-1-era kernels, ``FA1_OVER_FA2`` of that. A device with no fused-attention
    measurement gets ``UNMEASURED_ATTENTION_OVER_MAMF`` of its MAMF fraction."""
    if variant == "fa1":
        return attention_rate(device, precision, "fa2") * FA1_OVER_FA2
    dtype = "bf16" if low_precision(precision) else precision
    eff = (device.attention_efficiency_fa2 if variant == "fa2" else None) or device.attention_efficiency
    if eff is None:
        eff = device.gemm.large * UNMEASURED_ATTENTION_OVER_MAMF
    return device.peak(dtype) * eff * device.sustained_fraction


SMALL_HEAD_DIM, FULL_HEAD_DIM = 64, 128


def head_dim_factor(device: DeviceSpec, variant: str, head_dim: int) -> float:
    """Fused attention's rate at head size ``head_dim`` over its rate at 128, where the rates are
    measured (``attention_d64_fraction``; FlashAttention-2's ``attention_d64_fraction_fa2``, which
    the FlashAttention-1-era kernels priced from FlashAttention-2's rate take too): at head size 64
    a kernel's tile does half the FLOPs per byte of K and V, and its softmax (the exponentials of a
    tile) costs the same. 1 at 128 and above; the measured fraction at 64 and below; a straight
    line between (not measured). 1 where the device has no figure."""
    frac = (device.attention_d64_fraction_fa2 if variant in ("fa2", "fa1") else None) or device.attention_d64_fraction
    if not frac or not head_dim or head_dim >= FULL_HEAD_DIM:
        return 1.0
    if head_dim <= SMALL_HEAD_DIM:
        return frac
    return frac + (1.0 - frac) * (head_dim - SMALL_HEAD_DIM) / (FULL_HEAD_DIM - SMALL_HEAD_DIM)


def memory_rate(device: DeviceSpec) -> float:
    return device.memory_bytes_per_s * device.memory_efficiency


def wave_efficiency(rows: float, cols: float, groups: int, sm_count: int | None) -> float:
    """Share of the SMs' tile slots doing useful work for ``groups`` GEMMs of ``rows x cols`` output.

    Output tiles of ``GEMM_TILE`` run one per SM in waves: a GEMM of ``t`` tiles on ``S`` SMs takes
    ``ceil(t / S)`` waves, and edge tiles are partly empty (tile and wave quantization, NVIDIA's
    Matrix Multiplication Background guide; ml-engineering: "winners typically have wave_eff >=
    ~0.99"). It explains the size curve measured on H100 (1024^3: 18% of peak against 80% for large
    GEMMs; 32 tiles on 132 SMs give 24%). Large GEMMs are near 1, which MAMF already includes.
    """
    if not sm_count or rows <= 0 or cols <= 0:
        return 1.0
    tm, tn = GEMM_TILE
    tiles = groups * math.ceil(rows / tm) * math.ceil(cols / tn)
    waves = math.ceil(tiles / sm_count)
    return min(1.0, groups * rows * cols / (waves * sm_count * tm * tn))


def _shape_efficiency(op: Op, device: DeviceSpec) -> float:
    """The op's wave efficiency relative to that of the GEMM the device's MAMF was measured on.

    The backward GEMMs are taken at the forward's output shape (their outputs are the input and
    weight gradients: other shapes, of the same sizes for square-ish layers)."""
    g = device.gemm
    own = wave_efficiency(op.rows, op.cols, op.groups, g.sm_count)
    ref = _mamf_wave(g.mamf_shape[0], g.mamf_shape[1], g.sm_count) if g.mamf_shape else 1.0
    return min(1.0, own / ref)


@lru_cache(maxsize=256)
def _mamf_wave(rows: float, cols: float, sm_count: int | None) -> float:
    """:func:`wave_efficiency` of the GEMM a device's MAMF was measured on (one per device)."""
    return wave_efficiency(rows, cols, 1, sm_count)


def _output_elements(op: Op, backward: bool) -> float:
    """Elements a GEMM writes: its output forward; backward, the input gradient (``M x K``) and the
    weight gradient (``K x N``)."""
    k = op.flops / (2.0 * op.groups * op.rows * op.cols)
    return op.groups * (op.rows * k + k * op.cols) if backward else op.groups * op.rows * op.cols


def _epilogue_s(op: Op, device: DeviceSpec, backward: bool) -> float:
    """Writing a GEMM's output tiles, after each tile's K loop: time the main loop does not hide.

    A tile's accumulators are written to memory once its whole K loop is done (the epilogue), so the
    write adds to the loop rather than overlapping it: a GEMM with a short K spends a larger share in
    its epilogue. Measured on an H200 by benchmarks/gpu_probe.py over 80 shapes (docs/cost-model.md):
    going from K = 8192 to K = 2048 costs bf16 GEMMs 8% and FP8 GEMMs 20% of their throughput; this
    term predicts the change to 2.0% (bf16) and 5.6% (fp8) mean error, against 4.4% and 13% without
    it. The K loop is taken to run at the MAMF rate, so no shape is priced faster than the measured
    maximum; that is conservative by the MAMF shape's own epilogue share (2.3% at the H200 probe's
    best shape, K = 8192; 9% at ml-engineering's H100 shape, K = 2816). On the probe's decoder
    layers this version predicted -3.2% to +0.6%, against -5.0% to -2.5% with the K loop rescaled to
    reproduce the MAMF shape exactly. Charged on devices whose MAMF shape is known (NVIDIA)."""
    if not device.gemm.mamf_shape or op.rows <= 0 or op.cols <= 0:
        return 0.0
    return ACT_BYTES * _output_elements(op, backward) / memory_rate(device)


def fp8_cast_s(op: Op, device: DeviceSpec, backward: bool, precision: str = "fp8") -> float:
    """The casts around one low-precision GEMM: their own memory-bound kernels, run before the GEMM on
    the same stream, so they add to its time (an earlier version hid them under the GEMM's compute).

    Forward, the input's cast-transpose (``FP8_CAST_TRANSPOSE_BYTES`` per element) unless the norm
    before the GEMM casts it (``Op.fp8_input_fused``); backward, the output gradient's
    cast-transpose, plus the transpose of a norm-cast input, at ``CAST_TRANSPOSE_RATE_SHARE`` of the
    streaming rate. On the probe's H100 and H200 the FP8 casts took 8% to 24% of the time of Llama 3
    8B's linear layers at 8192 tokens (``benchmarks/gpu_probe.py --only fp8_linear``). The block
    formats take ``LowPrecision.cast_time_over_fp8`` times as long for the same tensors (measured on a
    B300: ``topologies.precisions``). Weights are cast once per step (Transformer Engine's
    ``is_first_microbatch``) and not counted."""
    fmt = low_precision(precision) or LOW_PRECISIONS["fp8"]
    if backward:
        outputs = _output_elements(op, False) if op.rows and op.cols else op.input_elements
        data = FP8_CAST_TRANSPOSE_BYTES * outputs + (FP8_TRANSPOSE_BYTES * op.input_elements if op.fp8_input_fused else 0.0)
    else:
        data = 0.0 if op.fp8_input_fused else FP8_CAST_TRANSPOSE_BYTES * op.input_elements
    seconds = data * fmt.cast_time_over_fp8 / (CAST_TRANSPOSE_RATE_SHARE * memory_rate(device))
    return seconds + (device.kernel_overhead_s if data else 0.0)


def op_time_s(op: Op, device: DeviceSpec, precision: str, backward: bool = False) -> float:
    """Seconds for ``op`` (its backward when ``backward``) on one device."""
    factor = (op.backward_factor or BACKWARD_FACTOR[op.kind]) if backward else 1.0
    mem_s = op.bytes * factor / memory_rate(device)
    cast_s = 0.0
    if op.kind == "memory":
        compute_s = 0.0
    elif op.kind == "attention":
        compute_s = (op.flops * op.causal_fraction * factor / attention_rate(device, precision, op.variant)
                     / head_dim_factor(device, op.variant, op.head_dim))
    else:  # GEMMs; unfused attention's batched GEMMs ("bmm"), the LM head and the router stay in 16 bits
        low = low_precision(precision) is not None
        dtype = "bf16" if low and (op.kind == "bmm" or op.high_precision) else precision
        compute_s = op.flops * factor / gemm_rate(device, dtype)
        if op.unaligned:  # no 16-byte loads: the narrower-load kernel's measured rate
            compute_s /= device.unaligned_gemm_fraction
        compute_s = compute_s / _shape_efficiency(op, device) + _epilogue_s(op, device, backward)
        if low and dtype == precision and op.kind == "gemm" and device.supports(dtype):
            cast_s = fp8_cast_s(op, device, backward, dtype)
    kernels = 2 if backward and op.kind == "gemm" else 1
    overhead = device.kernel_overhead_s
    if device.mlp_block_kernel_overhead_s is not None and op.name in MLP_BLOCK_OPS:
        overhead = device.mlp_block_kernel_overhead_s  # left eager by a partial graph (graphed_device)
    return max(compute_s, mem_s) + cast_s + kernels * overhead


def ops_time_s(ops: list[Op], device: DeviceSpec, precision: str, backward: bool = False) -> float:
    return sum(op_time_s(op, device, precision, backward) for op in ops)


GRAPH_NODE_SHARE = 0.58 / 2.7
"""The per-kernel launch cost a kernel replayed from a CUDA graph pays, as a share of an eagerly
launched one's: 0.58 us per node of a replayed graph against 2.6-2.8 us per asynchronous
``cuLaunchKernel`` of the same no-op kernels (ahrefs/ocannl issue #488, RTX 5070 Ti, CUDA 13.3; a
consumer GPU, so the ratio is taken, not the figures; docs/calibration-sources.md (a)). The
per-kernel figure it scales, ``DeviceSpec.kernel_overhead_s``, is the bundled (or calibrated)
launch + framework cost per kernel; a graph removes PyTorch's dispatch and the driver call, and
what is left is the device's own gap between nodes. A graph's replay call costs the host once per
graph (15 us on that machine); it is issued while the device runs the previous graph, so it hides
(the host runs ahead of the device between synchronisations) and is not charged."""


def graphed_device(device: DeviceSpec, scope: str, eager_moe: bool = False) -> DeviceSpec:
    """``device`` as the kernels a CUDA graph scope (``Layout.cuda_graph``) replays see it: their
    per-kernel cost at ``GRAPH_NODE_SHARE`` of it (``scope`` none: the device itself). Both
    scopes graph every transformer layer's kernels; ``full`` also graphs the embedding, the LM head
    and the loss, which ``layer`` leaves eager: a handful of kernels per micro-batch against some
    fifteen per layer, priced as graphed in both. With ``eager_moe`` (a dropless MoE model under a
    framework whose per-layer graphs capture only the attention, ``semantics.cuda_graph_dropless_moe``)
    the MLP blocks' kernels (``models.ops.MLP_BLOCK_OPS``) keep the eager cost."""
    if scope == "none":
        return device
    update = {"kernel_overhead_s": device.kernel_overhead_s * GRAPH_NODE_SHARE}
    if eager_moe:
        update["mlp_block_kernel_overhead_s"] = device.kernel_overhead_s
    return device.model_copy(update=update)
