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

from models.ops import Op
from topologies.devices import DeviceSpec

BACKWARD_FACTOR = {"gemm": 2.0, "attention": 2.5, "bmm": 2.0, "memory": 2.0}
FP8_CAST_BYTES_PER_ELEMENT = 3.0  # read a 16-bit input, write an 8-bit copy (Transformer Engine cast)


def gemm_rate(device: DeviceSpec, precision: str) -> float:
    """Achieved FLOP/s of a large GEMM in ``precision``."""
    if precision == "fp8" and device.supports("fp8"):
        return device.peak("fp8") * (device.gemm.large_fp8 or device.gemm.large) * device.sustained_fraction
    return device.peak("bf16" if precision == "fp8" else precision) * device.gemm.large * device.sustained_fraction


def attention_rate(device: DeviceSpec, precision: str) -> float:
    """Achieved FLOP/s of fused attention; it runs in 16-bit even in FP8 training."""
    dtype = "bf16" if precision == "fp8" else precision
    return device.peak(dtype) * (device.attention_efficiency or device.gemm.large) * device.sustained_fraction


def memory_rate(device: DeviceSpec) -> float:
    return device.memory_bytes_per_s * device.memory_efficiency


def op_time_s(op: Op, device: DeviceSpec, precision: str, backward: bool = False) -> float:
    """Seconds for ``op`` (its backward when ``backward``) on one device."""
    factor = (op.backward_factor or BACKWARD_FACTOR[op.kind]) if backward else 1.0
    mem_s = op.bytes * factor / memory_rate(device)
    if op.kind == "memory":
        compute_s = 0.0
    elif op.kind == "attention":
        compute_s = op.flops * op.causal_fraction * factor / attention_rate(device, precision)
    elif op.kind == "bmm":  # unfused attention's batched GEMMs: cuBLAS, 16-bit even in FP8 training
        compute_s = op.flops * factor / gemm_rate(device, "bf16" if precision == "fp8" else precision)
    else:
        compute_s = op.flops * factor / gemm_rate(device, precision)
        if precision == "fp8" and device.supports("fp8"):
            mem_s += FP8_CAST_BYTES_PER_ELEMENT * op.input_elements * factor / memory_rate(device)
    kernels = 2 if backward and op.kind == "gemm" else 1
    return max(compute_s, mem_s) + kernels * device.kernel_overhead_s


def ops_time_s(ops: list[Op], device: DeviceSpec, precision: str, backward: bool = False) -> float:
    return sum(op_time_s(op, device, precision, backward) for op in ops)


def gemm_time_s(ops: list[Op], device: DeviceSpec, precision: str, backward: bool = False) -> float:
    """Time of the GEMMs alone: what tensor-parallel communication can hide behind."""
    return sum(op_time_s(op, device, precision, backward) for op in ops if op.kind == "gemm")
