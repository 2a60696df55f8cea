"""Training precisions: the number format a job's linear-layer GEMMs run in.

``bf16`` and ``fp16`` run every GEMM in 16 bits. The low precisions run the linear layers' GEMMs
(forward, input gradient, weight gradient) in 8 or 4 bits and keep the rest in 16 bits: attention,
the LM head, the MoE router, norms and the optimizer (Transformer Engine and torchao alike; MaxText
quantizes no logits matmul either). They differ in how a tensor is scaled, which sets what a cast
writes:

- ``fp8``: one scale per tensor (delayed or current scaling). Hopper's FP8 GEMMs take only the TN
  layout, so a cast writes the 8-bit copy and its transpose; a scaled copy can be transposed.
- ``mxfp8``: OCP microscaling, one E8M0 scale per 32 consecutive elements (OCP Microscaling
  Formats (MX) Specification v1.0; Transformer Engine ``MXFP8BlockScaling``). The blocks run along
  the GEMM's reduction dimension, so the copy for the transposed use (weight gradient) is quantized
  again from the 16-bit tensor along the other axis, not transposed.
- ``nvfp4``: NVIDIA's 4-bit E2M1 with one E4M3 scale per 16 elements and a second, FP32 scale per
  tensor (Transformer Engine ``NVFP4BlockScaling``; NVIDIA, "Pretraining Large Language Models
  with NVFP4", arXiv:2509.25149): row- and column-wise copies as for MXFP8.
- ``int8``: 8-bit integer GEMMs with int32 accumulation and scales taken from each tensor as it is
  quantized, one per channel ("dynamic range" quantization): MaxText's AQT int8 training
  (``quantization: int8``; maxtext ``layers/quantizations.py`` ``_get_int8_quant_config``: AQT
  ``config_v3`` with the forward, the input gradient and, since "Local AQT" of 2024-02, the weight
  gradient in 8 bits, gradients rounded stochastically). The weights stay in their training dtype and
  are quantized at every use (AQT's TRAIN mode stores no quantized copy: its freezer holds values only
  in CONVERT and SERVE modes), and the backward quantizes its operands again along their own
  contraction axes: the bytes of FP8's cast and transpose. Each quantization first reduces the
  tensor to its per-channel maxima, as FP8's current scaling does: its casts cost current
  scaling's measured ratio (``cast_time_over_fp8`` below, measured with Transformer Engine on a B300
  and borrowed for XLA's fused quantization on a TPU, where it is not measured).

Bytes per element include the block scales: 1 + 1/32 for MXFP8, 0.5 + 1/16 for NVFP4 (INT8's
per-channel scales, one per row of thousands, are not counted).

Quantizing costs more than its bytes for the block formats: each block's scale is a reduction, and
NVFP4 adds a 16x16 random Hadamard transform on the weight gradient's operands, 2D 16x16 blocks for
weights and stochastic rounding of gradients (Transformer Engine ``NVFP4BlockScaling``). Transformer
Engine's GEMM profile of one layer of a 5B model on a B300 (``te_gemm_profiling`` in
devices.yaml: the same GEMMs timed with their operands quantized beforehand and with quantization
inside the timed step) gives the quantization time of each recipe: FP8 delayed scaling 1.15 ms
(7.802 and 8.123 ms timed against the 6.812 ms FP8 GEMMs), MXFP8 1.82 ms (8.984 - 7.161), NVFP4
2.69 ms (6.453 - 3.764). ``cast_time_over_fp8`` is the ratio to FP8's: 1.58 and 2.34.

FP8's two scalings: delayed scaling takes each tensor's scale from the amax history of earlier
steps and casts in one pass; current (per-tensor, "tensorwise") scaling first reduces the tensor to
its amax, then casts (and all-reduces the amax over the tensor-parallel group). The same profile
times its quantization at 2.335 ms (9.147 - 6.812), 2.03 times delayed scaling's: the internal
format ``fp8_current`` (a job's ``fp8_scaling: current``; ``Job.gemm_format``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LowPrecision:
    """One low-precision GEMM format (see the module docstring)."""

    name: str
    element_bytes: float  # data plus block scales, per element
    block: int | None  # elements per scale; None: one scale per tensor (INT8: per channel, not counted)
    bits: int  # the GEMM's operand width: 8 or 4
    cast_time_over_fp8: float = 1.0  # quantization time over a per-tensor FP8 cast of the same tensors (measured)
    peak_key: str = ""  # the device peak it runs at; "": its own name

    @property
    def cast_bytes(self) -> float:
        """Bytes per element a cast moves: read the 16-bit tensor, write the row-wise copy and the
        copy for the transposed use (a transpose for per-tensor FP8, a second quantization for the
        block formats: the same bytes)."""
        return 2.0 + 2.0 * self.element_bytes


CURRENT_SCALING_CAST_OVER_DELAYED = 2.335 / 1.15
"""Quantization time of a tensor that is reduced to its amax before the cast, over a one-pass cast
(Transformer Engine on a B300, ``te_gemm_profiling``: FP8 current scaling 2.335 ms, delayed 1.15)."""
LOW_PRECISIONS: dict[str, LowPrecision] = {
    "fp8": LowPrecision("fp8", 1.0, None, 8),
    "mxfp8": LowPrecision("mxfp8", 1.0 + 1.0 / 32, 32, 8, cast_time_over_fp8=1.82 / 1.15),
    "nvfp4": LowPrecision("nvfp4", 0.5 + 1.0 / 16, 16, 4, cast_time_over_fp8=2.69 / 1.15),
    "int8": LowPrecision("int8", 1.0, None, 8, cast_time_over_fp8=CURRENT_SCALING_CAST_OVER_DELAYED),
}
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", *LOW_PRECISIONS)
OWN_RATE_PRECISIONS: tuple[str, ...] = ("mxfp8", "nvfp4", "int8")
"""The low precisions with a GEMM rate of their own (``gemm.large_<name>``) and a framework recipe
each (a profile feature of the same name); FP8 is every FP8-capable framework's."""
FP8_SCALINGS: tuple[str, ...] = ("delayed", "current")
FP8_CURRENT = LowPrecision("fp8_current", 1.0, None, 8, cast_time_over_fp8=CURRENT_SCALING_CAST_OVER_DELAYED,
                           peak_key="fp8")
"""FP8 with per-tensor current scaling: FP8's GEMMs, bytes and peak, its casts 2.03x as long."""


_FORMATS: dict[str, LowPrecision] = {**LOW_PRECISIONS, FP8_CURRENT.name: FP8_CURRENT}
_PEAK_KEYS: dict[str, str] = {name: fmt.peak_key or name for name, fmt in _FORMATS.items()}


def low_precision(precision: str) -> LowPrecision | None:
    """The format of a low-precision job (or of ``fp8_current``); None for bf16 and fp16."""
    return _FORMATS.get(precision)


def peak_key(precision: str) -> str:
    """The device peak a precision's GEMMs run at (``fp8_current`` runs at the FP8 peak)."""
    return _PEAK_KEYS.get(precision, precision)
