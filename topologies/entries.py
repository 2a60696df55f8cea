"""The entries of device and cluster files in human units, units in the keys (``data/devices.yaml``,
``data/clusters.yaml`` and users' cluster files), validated by pydantic with a physically sane range
for every figure; :mod:`topologies.library` converts them once into SI."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from clusterplan.topologies.devices import Dtype, GemmEfficiency, MemoryTier

MAX_DEVICES = 262_144  # 2^18: room above today's ~100k-GPU clusters, and a graph that still builds in seconds
# Physically sane ranges of the figures of device and cluster files (and the command line's overrides of
# them), in the files' units: beyond them a value is a typo or a unit slip, and the cost model's arithmetic
# (float seconds, int64 quanta) overflows (a nic_gbit_per_s or memory_gib of 1e300 ended in OverflowError).
MIN_NIC_GBIT_PER_S = 1.0  # 1 GbE, the slowest NIC any cluster carries (today's: 100 to 800 Gb/s)
MAX_NIC_GBIT_PER_S = 1e6  # a petabit per device and direction (the command line's bound)
MAX_GBYTE_PER_S = 1e9  # an exabyte per second: memory (Cerebras WSE-3's SRAM: 21e6 GB/s) and links
MAX_PEAK_TFLOPS = 1e7  # 10 EFLOP/s per device (a WSE-3: 125,000 TFLOP/s)
MAX_MEMORY_GIB = 1e6  # a pebibyte per device (HBM today: up to 288 GiB)
MAX_POWER_W = 1e6  # a megawatt per device (a CS-3 system: 23 kW)
MAX_PRICE_PER_HOUR_USD = 1e4  # the command line's --price-per-device-hour bound
MAX_HOST_POWER_W = 1e5  # the command line's --host-power-w bound
MAX_LATENCY_US = 1e6  # one second per hop

Family = Literal["nvswitch", "nvlink-domain", "gaudi", "xgmi", "tpu-torus", "cerebras", "groq", "grid", "pods"]
FAT_TREE_FAMILIES = frozenset({"nvswitch", "nvlink-domain", "gaudi", "xgmi", "grid"})
WHOLE_NODE_FAMILIES = (FAT_TREE_FAMILIES - {"grid"}) | {"groq", "pods"}
GBIT = 1e9 / 8  # bytes/s per Gb/s
GBYTE = 1e9
US = 1e-6
_REQUIRED = {
    "nvswitch": ("scale_up_link", "scale_out"),
    "nvlink-domain": ("scale_up_link", "scale_out", "domain_size"),
    "gaudi": ("scale_up_link", "scale_out"),
    "xgmi": ("scale_up_link", "scale_out"),
    "tpu-torus": ("torus", "scale_out"),
    "cerebras": ("scale_out",),
    "groq": ("scale_up_link", "scale_out"),
    "grid": ("grid", "scale_out"),
    "pods": ("scale_out",),
}


# ---- file entries, in human units ---------------------------------------------------------------
class _Entry(BaseModel):
    # NaN and infinities are bad input in every figure of a file (a NaN bandwidth sizes nothing)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class CalibrationEntry(_Entry):
    """One device family's physical calibration constants."""

    memory_efficiency: float = Field(gt=0, le=1, description="Achieved / peak memory bandwidth, streaming kernels.")
    memory_efficiency_source: str = Field(description="Where it was measured.")
    kernel_overhead_s: float = Field(ge=0, le=1e-3, description="Launch + framework overhead per kernel (s).")
    kernel_overhead_source: str = Field(description="Where it comes from.")
    sustained_fraction: float = Field(
        1.0, gt=0, le=1, description="Sustained (power-saturated) over burst matmul throughput.")
    sustained_fraction_source: str = Field("", description="Where it was measured.")
    sustained_fraction_fp8: float | None = Field(
        None, gt=0, le=1, description="The same for FP8 GEMMs, where measured; None: sustained_fraction.")
    sustained_fraction_fp8_source: str = Field("", description="Where it was measured.")
    attention_efficiency: float | None = Field(
        None, gt=0, le=1, description="Fused attention fwd+bwd achieved fraction of 16-bit peak.")
    attention_efficiency_source: str = Field("", description="Where it was measured.")
    attention_efficiency_fa2: float | None = Field(
        None, gt=0, le=1, description="The same for FlashAttention-2 kernels where they trail the family's best.")
    attention_efficiency_fa2_source: str = Field("", description="Where it was measured.")
    comm_kernel_slowdown: list[tuple[float, float]] = Field(
        default_factory=list,
        description="Measured slowdown of large GEMMs while a communication kernel holds a share of the SMs: "
                    "[SM share, slowdown] points (benchmarks/gpu_probe.py, section overlap).")
    comm_kernel_slowdown_source: str = Field("", description="Where it was measured.")
    comm_kernel_slowdown_measured: bool = Field(
        False, description="True where the curve was measured on this family; False where borrowed.")
    attention_d64_fraction: float | None = Field(
        None, gt=0, le=1, description="Fused attention fwd+bwd at head size 64 over 128 (benchmarks/gpu_probe.py, "
                                      "section attention); None: not priced.")
    attention_d64_fraction_fa2: float | None = Field(
        None, gt=0, le=1, description="The same for FlashAttention-2 kernels where measured apart.")
    attention_d64_fraction_source: str = Field("", description="Where it was measured, or whose it borrows.")
    unaligned_gemm_fraction: float | None = Field(
        None, gt=0, le=1, description="A 16-bit GEMM with K or N not a multiple of 8 elements over the aligned "
                                      "rate (benchmarks/gpu_probe.py, section tp_shard_unfused); None: not priced.")
    unaligned_gemm_fraction_source: str = Field("", description="Where it was measured, or whose it borrows.")

    @model_validator(mode="after")
    def _curve(self) -> "CalibrationEntry":
        for share, slowdown in self.comm_kernel_slowdown:
            if not (0 < share <= 1 and 0 <= slowdown <= 10):
                raise ValueError(f"comm_kernel_slowdown: point [{share}, {slowdown}]: the SM share must be in (0, 1] "
                                 "and the slowdown in [0, 10]")
        points = sorted(self.comm_kernel_slowdown)
        for (s0, d0), (s1, d1) in zip(points, points[1:]):
            if s1 == s0 or d1 < d0:
                raise ValueError(f"comm_kernel_slowdown: points [{s0}, {d0}] and [{s1}, {d1}]: each SM share once, and "
                                 "the slowdown must not fall as the share grows")
        return self


class MemoryTierEntry(_Entry):
    """One memory tier beyond the device's primary memory (devices.yaml ``memory_tiers``)."""

    name: str = Field(min_length=1)
    capacity_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB)
    capacity_gib: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB)
    gbyte_per_s: float | None = Field(None, gt=0, le=MAX_GBYTE_PER_S,
                                      description="Bandwidth per device, 1e9 B/s; null: not published.")
    dram_gbyte_per_s: float | None = Field(None, gt=0, le=MAX_GBYTE_PER_S,
                                           description="The host memory's own bandwidth per device, 1e9 B/s "
                                                       "(what a CPU optimizer step reads and writes at); null: not published.")
    source: str = ""

    @model_validator(mode="after")
    def _one_capacity(self) -> MemoryTierEntry:
        if (self.capacity_gb is None) == (self.capacity_gib is None):
            raise ValueError("give exactly one of capacity_gb, capacity_gib")
        return self

    def to_spec(self) -> MemoryTier:
        capacity = self.capacity_gib * 2**30 if self.capacity_gib is not None else self.capacity_gb * 1e9
        return MemoryTier(name=self.name, capacity_bytes=capacity,
                          bytes_per_s=None if self.gbyte_per_s is None else self.gbyte_per_s * GBYTE,
                          dram_bytes_per_s=None if self.dram_gbyte_per_s is None else self.dram_gbyte_per_s * GBYTE,
                          source=self.source)


class DeviceEntry(_Entry):
    """One device of devices.yaml (or inline in a cluster file)."""

    id: str = Field(min_length=1)
    name: str
    vendor: str
    family: str = Field(description="Device family; presets accept devices of one family.")
    calibration: str | None = Field(None, description="Calibration group (see devices.yaml).")
    memory_efficiency: float | None = Field(None, gt=0, le=1, description="Overrides the group's.")
    kernel_overhead_s: float | None = Field(None, ge=0, le=1e-3, description="Overrides the group's.")
    peak_tflops: dict[Dtype, Annotated[float, Field(gt=0, le=MAX_PEAK_TFLOPS)]] = Field(
        min_length=1, description="Dense peak per dtype, TFLOP/s.")
    memory_kind: Literal["hbm", "sram"]
    memory_gib: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB)
    memory_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB)
    memory_mib: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB * 1024)
    memory_gbyte_per_s: float = Field(gt=0, le=MAX_GBYTE_PER_S)
    program_memory_gib: float | None = Field(None, gt=0, le=MAX_MEMORY_GIB,
                                             description="Memory the runtime leaves a program, measured (GiB).")
    scale_up_gbyte_per_s_per_dir: float = Field(ge=0, le=MAX_GBYTE_PER_S)
    scale_out_gbit_per_s: float = Field(ge=0, le=MAX_NIC_GBIT_PER_S)
    power_w: float | None = Field(None, gt=0, le=MAX_POWER_W)
    idle_power_w: float | None = Field(None, gt=0, le=MAX_POWER_W)
    price_per_hour_usd: float | None = Field(None, gt=0, le=MAX_PRICE_PER_HOUR_USD,
                                             description="Rental price per device-hour, USD.")
    compute_capability: float | None = Field(None, gt=0, le=99, description="CUDA compute capability (NVIDIA).")
    gemm: GemmEfficiency
    memory_tiers: list[MemoryTierEntry] = Field(default_factory=list, description="Tiers beyond the primary memory.")
    sources: list[str] = Field(default_factory=list)
    contested: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_memory_key_and_calibration(self) -> DeviceEntry:
        given = [k for k in ("memory_gib", "memory_gb", "memory_mib") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of memory_gib, memory_gb, memory_mib (given: {given or 'none'})")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError("peak_tflops: every value must be > 0")
        if self.calibration is None and (self.memory_efficiency is None or self.kernel_overhead_s is None):
            raise ValueError("give calibration (a group of devices.yaml) "
                             "or both memory_efficiency and kernel_overhead_s")
        return self

    @property
    def memory_bytes(self) -> float:
        if self.memory_gib is not None:
            return self.memory_gib * 2**30
        if self.memory_mib is not None:
            return self.memory_mib * 2**20
        return self.memory_gb * 1e9


class LinkEntry(_Entry):
    """A class of link and its measured calibration."""

    achieved_fraction: float = Field(gt=0, le=1, description="Measured busbw / nominal rate.")
    latency_us: float = Field(ge=0, le=MAX_LATENCY_US, description="Latency per device-to-switch or device-to-device edge.")
    switch_hop_us: float | None = Field(None, ge=0, le=MAX_LATENCY_US, description="Latency per switch-to-switch edge.")
    gpu_initiated_rdma: bool = Field(True, description="Whether a GPU kernel can post RDMA on these NICs itself "
                                     "(InfiniBand/RoCE ConnectX: NVSHMEM's IBGDA); false where a host proxy thread "
                                     "posts it (AWS EFA): how DeepEP-style dispatchers cross the link.")
    source: str = ""
    note: str = ""


MAX_OVERSUBSCRIPTION = 64.0  # far beyond any built fat-tree (1:1 to 1:8); more is a typo, not a design


class ScaleOutEntry(_Entry):
    """The scale-out fabric of a preset."""

    nic_gbit_per_s: float = Field(ge=MIN_NIC_GBIT_PER_S, le=MAX_NIC_GBIT_PER_S,
                                  description="NIC bandwidth per device, one direction, Gb/s.")
    link: str
    nodes_per_su: int | None = Field(None, gt=0, le=MAX_DEVICES)
    switch_radix: int | None = Field(None, ge=2, le=65_536)
    oversubscription: float = Field(1.0, ge=1, le=MAX_OVERSUBSCRIPTION, description="Leaf downlink / uplink capacity.")
    leaves_per_su: int | None = Field(None, gt=0, le=MAX_DEVICES)
    sharp: bool = False
    sharp_nir_fraction: float | None = Field(None, gt=0, le=1)
    global_gbit_per_s: float | None = Field(
        None, ge=MIN_NIC_GBIT_PER_S, le=MAX_NIC_GBIT_PER_S,
        description="pods family: per-device rate between pods (null: nic_gbit_per_s).")


class GridEntry(_Entry):
    """A 2D/3D grid of directly linked chips (mesh or torus per axis), one grid per domain."""

    shape: list[int] = Field(min_length=2, max_length=3, description="Full grid, slowest axis first (x, y[, z]).")
    wraparound: list[bool] = Field(description="Per axis: a wraparound link closes the axis when the grid spans it.")
    link_share: list[float] = Field(
        description="Per axis: fraction of the device's scale-up bandwidth carried by ONE link of that axis.")
    link: str
    fabric: str = Field(description="Vendor name of the chip-to-chip links (edge attribute).")

    @model_validator(mode="after")
    def _per_axis(self) -> GridEntry:
        n = len(self.shape)
        if len(self.wraparound) != n or len(self.link_share) != n:
            raise ValueError(f"wraparound and link_share need one entry per axis of shape {self.shape}")
        if any(not 1 <= d <= MAX_DEVICES for d in self.shape) or any(not 0 < f <= 1 for f in self.link_share):
            raise ValueError(f"shape entries must be 1 to {MAX_DEVICES:,} and link_share entries in (0, 1]")
        return self


class TorusEntry(_Entry):
    """TPU slice rules."""

    max_slice_shape: list[Annotated[int, Field(gt=0, le=4096)]] = Field(min_length=2, max_length=3)
    wrap: Literal["full_cubes", "full_axis"]
    ici_gbyte_per_s_per_link: float = Field(gt=0, le=MAX_GBYTE_PER_S)
    link: str
    chips_per_host: int = Field(gt=0, le=4096)


class PresetEntry(_Entry):
    """One cluster preset (or a cluster file after merging with its base)."""

    id: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    name: str
    family: Family
    device: str
    device_family: str
    reference_size: int = Field(gt=0, le=MAX_DEVICES)
    devices_per_node: int = Field(gt=0, le=MAX_DEVICES)
    domain_size: int | None = Field(None, gt=0, le=MAX_DEVICES)
    domain_devices: int | None = Field(
        None, gt=0, le=MAX_DEVICES,
        description="Devices a job is allocated in each scale-up domain it uses, where not the whole domain: the "
                    "segment of Slurm's block topology (--segment, in nodes, times devices_per_node; e.g. 64 of an "
                    "NVL72 rack's 72 with --segment 16). nvlink-domain families only; null: any whole nodes.")
    description: str = ""
    scale_up_link: str | None = Field(None, min_length=1, description="A link class (null: none).")
    nvls_nir_fraction: float | None = Field(None, gt=0, le=1)
    scale_out: ScaleOutEntry | None = None
    torus: TorusEntry | None = None
    grid: GridEntry | None = None
    power_overhead_w_per_device: float = Field(0.0, ge=0, le=MAX_HOST_POWER_W)
    price_per_device_hour_usd: float | None = Field(
        None, gt=0, le=MAX_PRICE_PER_HOUR_USD,
        description="Rental price per device-hour (USD) on this cluster, replacing the device's catalogue price "
                    "(--price-per-device-hour replaces this one); null: the device's.")
    sources: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _family_needs(self) -> PresetEntry:
        missing = [k for k in _REQUIRED[self.family] if getattr(self, k) is None]
        so = self.scale_out
        if self.family in FAT_TREE_FAMILIES and so is not None:
            missing += [f"scale_out.{k}" for k in ("nodes_per_su", "switch_radix") if getattr(so, k) is None]
        if self.family in ("groq", "pods") and so is not None and so.nodes_per_su is None:
            missing.append("scale_out.nodes_per_su")
        if missing:
            raise ValueError(f"family {self.family} needs {', '.join(missing)}")
        if so is not None and so.sharp and so.sharp_nir_fraction is None:
            raise ValueError("scale_out.sharp: true needs scale_out.sharp_nir_fraction")
        return self
