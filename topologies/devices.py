"""Accelerator specs: peak FLOP/s per dtype, memory, power, links, and measured efficiencies.

Spec files use human units with the unit in the key (``hbm_gib``, ``peak_tflops``, ``gbyte_per_s``,
``gbit_per_s``); everything is converted once, here, into SI base units. Every figure in
``data/devices.yaml`` carries its source; contested figures are flagged there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_FROZEN = ConfigDict(frozen=True, extra="forbid")

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class GemmEfficiency(BaseModel):
    """Achieved fraction of dense peak for large matrix multiplies.

    ``large`` is the maximum achievable matmul FLOP/s (MAMF, ml-engineering) divided by the dense
    peak. Smaller GEMMs lose to tile and wave quantization (``cost.compute.wave_efficiency``, from
    ``sm_count``) and pay the device's fixed ``kernel_overhead_s`` on top.
    """

    model_config = _FROZEN

    large: float = Field(gt=0, le=1, description="Fraction of peak for large bf16/fp16 GEMMs (MAMF / peak).")
    large_fp8: float | None = Field(None, gt=0, le=1, description="Same for FP8 GEMMs, if measured.")
    source: str = Field(description="Where the efficiency was measured.")
    sm_count: int | None = Field(
        None, gt=0,
        description="Streaming multiprocessors that run GEMM output tiles in waves (NVIDIA); None: no "
                    "tile/wave quantization is modelled for this device.",
    )
    mamf_shape: tuple[int, int, int] | None = Field(
        None, description="M, N, K of the GEMM whose FLOP/s is ``large`` (its own wave efficiency is "
                          "divided out, so that ``large`` is not charged twice); None: taken as 1.",
    )


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
    attention_efficiency: float | None = Field(
        None, gt=0, le=1,
        description="Achieved fraction of 16-bit peak for fused (flash) attention, fwd+bwd; None: gemm.large.",
    )
    attention_efficiency_fa2: float | None = Field(
        None, gt=0, le=1,
        description="Fused attention with FlashAttention-2 kernels (``--attention flash2``) where they trail "
                    "the family's best kernel; None: the same as attention_efficiency.",
    )
    kernel_overhead_s: float = Field(
        ge=0, description="Fixed launch/framework overhead per kernel on this device (seconds)."
    )
    sources: list[str] = Field(default_factory=list, description="Sources of the figures.")
    contested: list[str] = Field(default_factory=list, description="Figures sources disagree on.")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; fp8 falls back to bf16/fp16 where the device has none."""
        for key in (dtype, "bf16", "fp16") if dtype == "fp8" else (dtype, "fp16", "bf16"):
            value = self.peak_flops_per_s.get(key)
            if value:
                return value
        raise ValueError(f"device {self.id} has no peak FLOP/s for {dtype}")

    def supports(self, dtype: str) -> bool:
        return bool(self.peak_flops_per_s.get(dtype))
