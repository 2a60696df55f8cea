"""Accelerator specs: peak FLOP/s per dtype, memory, power, links, and measured efficiencies.

Spec files use human units with the unit in the key (``hbm_gib``, ``peak_tflops``, ``gbyte_per_s``,
``gbit_per_s``); everything is converted once, here, into SI base units. Every figure in
``data/devices.yaml`` carries its source; contested figures are flagged there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from clusterplan.topologies.precisions import LOW_PRECISIONS, OWN_RATE_PRECISIONS, low_precision, peak_key

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_GemmDim = Annotated[int, Field(gt=0, le=1_000_000)]  # a GEMM dimension, at most a million

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4", "int8"]  # int8: integer ops, TOPS


class GemmEfficiency(BaseModel):
    """Achieved fraction of dense peak for large matrix multiplies.

    ``large`` is the maximum achievable matmul FLOP/s (MAMF, ml-engineering) divided by the dense
    peak. Smaller GEMMs lose to tile and wave quantization (``cost.compute.wave_efficiency``, from
    ``sm_count``) and pay the device's fixed ``kernel_overhead_s`` on top.
    """

    model_config = _FROZEN

    large: float = Field(gt=0, le=1, description="Fraction of peak for large bf16/fp16 GEMMs (MAMF / peak).")
    large_fp8: float | None = Field(None, gt=0, le=1, description="Same for FP8 GEMMs, if measured.")
    large_mxfp8: float | None = Field(
        None, gt=0, le=1, description="Same for MXFP8 GEMMs (of the MXFP8 peak); None: large_fp8.")
    large_nvfp4: float | None = Field(
        None, gt=0, le=1, description="Same for NVFP4 GEMMs (of the NVFP4 peak); None: large_fp8.")
    large_int8: float | None = Field(
        None, gt=0, le=1, description="Same for INT8 GEMMs (of the INT8 peak); None: large_fp8.")
    low_measured: tuple[str, ...] = Field(
        (), description="The formats with a rate of their own (mxfp8, nvfp4, int8) whose large_* figure was "
                        "measured on this very device; the others are borrowed and labelled unvalidated in plans.")
    low_source: str = Field("", description="Where large_mxfp8, large_nvfp4 and large_int8 come from (or are "
                                            "borrowed from).")
    source: str = Field(description="Where the efficiency was measured (or borrowed from).")
    measured: bool = Field(
        False,
        description="True only where a cited benchmark measured ``large`` on this very device (ml-engineering's "
                    "MAMF table or another named GEMM benchmark); False where the figure is borrowed from "
                    "another part or is a placeholder.",
    )
    sm_count: int | None = Field(
        None, gt=0, le=100_000,
        description="Streaming multiprocessors that run GEMM output tiles in waves (NVIDIA); None: no "
                    "tile/wave quantization is modelled for this device.",
    )
    mamf_shape: tuple[_GemmDim, _GemmDim, _GemmDim] | None = Field(
        None, description="M, N, K of the GEMM whose FLOP/s is ``large`` (its own wave efficiency is "
                          "divided out, so that ``large`` is not charged twice); None: taken as 1.",
    )


class MemoryTier(BaseModel):
    """One memory tier besides the device's primary memory (``memory_bytes``, the fit check's), SI units.

    Slower, larger tiers: streaming memory (Graphcore DDR behind the IPU's SRAM), DDR behind a
    dataflow chip's HBM (SambaNova SN40L), HBM on interface processors (Tesla Dojo DIPs); or the
    on-chip SRAM of a DRAM device (Tenstorrent, SN40L). Recorded for the cost model to price;
    nothing reads it yet.
    """

    model_config = _FROZEN

    name: str = Field(description="Tier name, e.g. ddr, streaming, dip_hbm.")
    capacity_bytes: float = Field(gt=0, description="Capacity per device (bytes).")
    bytes_per_s: float | None = Field(None, gt=0, description="Bandwidth per device (bytes/s); None: not published.")
    dram_bytes_per_s: float | None = Field(None, gt=0, description="The host memory's own bandwidth per device "
                                           "(bytes/s), what a CPU optimizer step runs at (layout offload=optimizer); "
                                           "None: not published.")
    source: str = Field("", description="Where the figures come from.")


class DeviceSpec(BaseModel):
    """One accelerator, in SI base units."""

    model_config = _FROZEN

    id: str = Field(description="Catalogue id, e.g. h100-sxm5-80gb.")
    name: str = Field(description="Human name.")
    vendor: str = Field(description="Vendor.")
    family: str = Field(description="Hardware family used in validation summaries (e.g. nvidia-a100).")
    peak_flops_per_s: dict[str, float] = Field(
        description="Dense peak FLOP/s per dtype (no structured sparsity)."
    )
    memory_kind: Literal["hbm", "sram"] = Field(description="hbm or on-chip sram (SRAM-only machines).")
    memory_bytes: float = Field(gt=0, description="Usable memory per device (bytes).")
    program_memory_bytes: float | None = Field(
        None, gt=0, description="What the device's runtime leaves a program of its memory, measured (XLA's "
                                "available HBM on TPUs); None: not measured (cost.terms.memory.runtime_bytes).")
    memory_bytes_per_s: float = Field(gt=0, description="Memory bandwidth (bytes/s).")
    memory_efficiency: float = Field(
        gt=0, le=1, description="Achieved fraction of memory bandwidth for streaming kernels."
    )
    power_w: float | None = Field(None, gt=0, description="Board power (TDP) in watts.")
    idle_power_w: float | None = Field(
        None, gt=0,
        description="Power of an idle device holding no work (watts); drawn while it waits on communication "
                    "or a pipeline bubble. None: unknown (energy then assumes power_w throughout).",
    )
    price_per_hour_usd: float | None = Field(None, gt=0, description="Indicative cloud price per device-hour.")
    compute_capability: float | None = Field(
        None, gt=0, description="CUDA compute capability (NVIDIA's CUDA GPUs table), which frameworks branch on "
                                "(e.g. torchtitan's SDPA backend); None: not an NVIDIA GPU.")
    scale_up_bytes_per_s: float = Field(
        ge=0, description="Scale-up (NVLink/ICI/xGMI/...) bandwidth per device per direction."
    )
    scale_out_bytes_per_s: float = Field(
        ge=0, description="Scale-out (NIC) bandwidth per device per direction."
    )
    gemm: GemmEfficiency = Field(description="Achieved GEMM efficiency by size.")
    sustained_fraction: float = Field(
        1.0, gt=0, le=1,
        description="Sustained (power-saturated clocks) over burst matmul throughput; applies to all compute.",
    )
    sustained_fraction_fp8: float | None = Field(
        None, gt=0, le=1,
        description="The same for FP8 GEMMs where measured (they keep more of their burst rate); None: "
                    "sustained_fraction.",
    )
    attention_efficiency: float | None = Field(
        None, gt=0, le=1,
        description="Achieved fraction of 16-bit peak for fused (flash) attention, fwd+bwd; None: not measured "
                    "(cost.compute then assumes a fixed share of gemm.large, UNMEASURED_ATTENTION_OVER_MAMF).",
    )
    attention_efficiency_fa2: float | None = Field(
        None, gt=0, le=1,
        description="Fused attention with FlashAttention-2 kernels (``--attention flash2``) where they trail "
                    "the family's best kernel; None: the same as attention_efficiency.",
    )
    kernel_overhead_s: float = Field(
        ge=0, description="Fixed launch/framework overhead per kernel on this device (seconds)."
    )
    mlp_block_kernel_overhead_s: float | None = Field(
        None, ge=0, description="Per-kernel overhead of the MLP blocks' kernels where a CUDA graph of a dropless MoE model "
                                "leaves them eager and graphs the rest (cost.compute.graphed_device); None: kernel_overhead_s.")
    comm_kernel_slowdown: tuple[tuple[float, float], ...] = Field(
        (), description="Measured slowdown of large GEMMs beside a communication kernel that holds a share of the "
                        "SMs, as (SM share, slowdown) points; empty: not measured (cost.terms.overlap_share).")
    comm_kernel_slowdown_measured: bool = Field(
        False, description="Whether comm_kernel_slowdown was measured on this device family (else borrowed).")
    attention_d64_fraction: float | None = Field(
        None, gt=0, le=1, description="Fused attention fwd+bwd at head size 64 over head size 128; None: not priced.")
    attention_d64_fraction_fa2: float | None = Field(
        None, gt=0, le=1, description="The same for FlashAttention-2 kernels; None: attention_d64_fraction.")
    unaligned_gemm_fraction: float = Field(
        1.0, gt=0, le=1,
        description="Rate of a 16-bit GEMM whose K or N is not a multiple of 8 elements over the aligned rate "
                    "(models.ops.ALIGN_ELEMENTS); 1: not measured, not priced.")
    memory_tiers: tuple[MemoryTier, ...] = Field(
        (), description="Memory tiers besides ``memory_bytes`` (see MemoryTier); empty for most devices.")
    sources: list[str] = Field(default_factory=list, description="Sources of the figures.")
    contested: list[str] = Field(default_factory=list, description="Figures sources disagree on.")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; a low precision falls back to bf16/fp16 where the device has none."""
        for key in (peak_key(dtype), "bf16", "fp16") if low_precision(dtype) else (dtype, "fp16", "bf16"):
            value = self.peak_flops_per_s.get(key)
            if value:
                return value
        raise ValueError(f"device {self.id} has no peak FLOP/s for {dtype}")

    def supports(self, dtype: str) -> bool:
        return bool(self.peak_flops_per_s.get(peak_key(dtype)))

    def low_precisions(self) -> tuple[str, ...]:
        """The low-precision GEMM formats this device has tensor-core math for."""
        return tuple(p for p in LOW_PRECISIONS if self.supports(p))

    def gemm_fraction(self, precision: str) -> float:
        """MAMF over dense peak for ``precision``'s GEMMs: ``gemm.large_mxfp8`` / ``large_nvfp4`` /
        ``large_int8`` where the data gives them, else ``gemm.large_fp8`` (then ``gemm.large``)."""
        fp8 = self.gemm.large_fp8 or self.gemm.large
        own = {"mxfp8": self.gemm.large_mxfp8, "nvfp4": self.gemm.large_nvfp4,
               "int8": self.gemm.large_int8}.get(precision)
        return own or fp8

    def gemm_flops_per_s(self, precision: str) -> float:
        """Achieved FLOP/s of a large GEMM in ``precision``: dense peak x MAMF fraction x sustained fraction.

        A low precision uses its own peak and :meth:`gemm_fraction`, and the FP8 sustained fraction
        (measured for FP8; the 4-bit format takes it too); a device without that math runs a
        low-precision job's GEMMs in bf16.
        """
        if low_precision(precision):
            peak = self.peak_flops_per_s.get(peak_key(precision))
            if peak:
                return peak * self.gemm_fraction(precision) * (self.sustained_fraction_fp8 or self.sustained_fraction)
            return self.peak("bf16") * self.gemm.large * self.sustained_fraction
        return self.peak(precision) * self.gemm.large * self.sustained_fraction

    def matmul_ceiling(self, precision: str) -> float:
        """The best fraction of the bf16 (16-bit) dense peak this device can reach in ``precision``.

        The large-GEMM rate (:meth:`gemm_flops_per_s`) over ``peak("bf16")``, the denominator of MFU: no
        layout's MFU can exceed it. At most 1 for 16-bit precisions; FP8 on a device with FP8 math can
        exceed 1 (its peak is twice the bf16 one).
        """
        return self.gemm_flops_per_s(precision) / self.peak("bf16")

    @property
    def efficiency_validated(self) -> bool:
        """Whether the matmul efficiency (``gemm.large``) was measured on this very device."""
        return self.gemm.measured

    @property
    def efficiency_note(self) -> str:
        """One line on where the matmul ceiling comes from, for reports."""
        if self.gemm.measured:
            return f"measured: {self.gemm.source}"
        return f"unvalidated: no measured matmul ceiling for {self.name}; {self.gemm.source}"

    def low_precision_note(self, precision: str) -> str | None:
        """The label of an MXFP8, NVFP4 or INT8 plan whose GEMM rate was not measured on this device
        (``gemm.low_measured``): borrowed from another part, or the FP8 (else 16-bit) fraction."""
        if precision not in OWN_RATE_PRECISIONS or not self.supports(precision) or precision in self.gemm.low_measured:
            return None
        where = self.gemm.low_source or f"the {'per-tensor FP8' if self.gemm.large_fp8 else '16-bit'} fraction taken"
        return f"unvalidated: no measured {precision.upper()} GEMM rate for {self.name}; {where}"
