"""The bundled device and cluster library, sizing of presets, and user cluster files.

Devices live in ``data/devices.yaml`` and presets in ``data/clusters.yaml`` (human units, units in
the keys, a source for every figure); both are read once through :mod:`importlib.resources`, so an
installed wheel works, and converted once into SI (:class:`~topologies.devices.DeviceSpec`, the
builder parameters of :mod:`topologies.builders`). Every user mistake is a
:class:`~models.errors.SpecError` naming the field, the value given and what is allowed.

Sizes
-----
``build_cluster(preset, num_devices=None, num_nodes=None, ...)``: give at most one of the two
(both only if they agree); neither means the preset's reference size. NVSwitch, NVLink-domain,
Gaudi, MI300X and Groq presets need whole nodes (a multiple of ``devices_per_node``: 8, or 4 for
a GB200 tray). TPU presets need a slice shape (v4/v5p: 4, 8, 16, 32 or whole 4x4x4 cubes such as
64 -> 4x4x4; v5e/v6e: 1, 4, 8, ... 256 -> 16x16) or, beyond the largest slice, equal slices joined
over DCN. Cerebras takes any number of CS-3 systems. Grid presets (Trn2, Tenstorrent Galaxy, Dojo)
take part of one grid (a rectangle, e.g. 16 -> one 1x4x4 trn2 instance or 4x4 of a 5x5 Dojo tile)
or whole grids (64-chip UltraServers, 32-chip Galaxies, 25-chip tiles); pods presets (Graphcore,
SambaNova) whole nodes. ``num_nodes`` counts hosts (TPU: 4 or 8 chips).

Cluster files (``load_cluster_file``)
-------------------------------------
A YAML (or JSON) mapping; ``format: clusterplan-cluster/1`` is optional. Either start from a preset
with ``base:`` and override any preset key (mappings merge key by key), or give a whole preset::

    format: clusterplan-cluster/1
    base: dgx-h100-superpod          # optional: start from this preset
    id: my-pod                       # default: the file name
    name: Our H100 pod
    num_nodes: 16                    # or num_devices (default: reference_size)
    device: h100-sxm5-80gb           # a device id, or an inline device (devices.yaml keys)
    scale_out: {nic_gbit_per_s: 200, oversubscription: 2}
    price_per_device_hour_usd: 2.1   # optional: the rental price on this cluster (else the device's)
    domain_devices: 64               # optional, NVLink Switch domains (NVL72 racks): each rack's segment

Without ``base`` the preset keys are required: ``family`` (nvswitch | nvlink-domain | gaudi | xgmi |
tpu-torus | cerebras | groq | grid | pods), ``device``, ``devices_per_node``, ``scale_up_link`` (a link
class), ``scale_out`` (``nic_gbit_per_s``, ``link``, ``nodes_per_su``, ``switch_radix``,
``oversubscription``, ``leaves_per_su``, ``sharp``, ``sharp_nir_fraction``, and for pods
``global_gbit_per_s``), ``torus`` for TPUs, ``grid`` for grids (``shape``, ``wraparound``,
``link_share``, ``link``, ``fabric``: one domain's 2D/3D grid of direct chip-to-chip links, a mesh
axis where ``wraparound`` is false), ``domain_size`` for NVLink domains. ``domain_devices`` (NVLink
Switch domains only, as ``--domain-devices``): the devices a job is allocated in each domain where not
all of them, a multiple of ``devices_per_node`` (Slurm's block topology allocates whole segments of a
block: ``--segment 16`` takes 16 of an NVL72 rack's 18 trays, 64 GPUs); the job then runs on whole
segments (256 GB200 = 4 racks of 64). Without it a job takes whole nodes, and its last rack may be
partly used (256 GB200 = 3 racks of 72 and 40 of a fourth). A device may list
``memory_tiers`` (``name``, ``capacity_gb``/``capacity_gib``, ``gbyte_per_s``, ``source``): tiers
besides its primary memory, carried into ``DeviceSpec.memory_tiers`` in SI units. New link classes go under ``links:`` as
``name: {achieved_fraction, latency_us, switch_hop_us, source}``; the bundled ones (``ib_ndr``,
``nvlink4_nvswitch``, ...) are listed in ``data/clusters.yaml``. An inline device needs the
devices.yaml keys plus ``calibration`` (a bundled group such as ``nvidia-hopper``) or both
``memory_efficiency`` and ``kernel_overhead_s``; its ``price_per_hour_usd`` is its price, which the
cluster's ``price_per_device_hour_usd`` and then ``--price-per-device-hour`` replace.

Every figure has a physically sane range (``MIN_NIC_GBIT_PER_S`` and the other bounds of
:mod:`topologies.entries`, the file entries' schemas, in the files' units): a NIC of 1 to 1e6 Gb/s,
memory up to a pebibyte, bandwidths up to 1e9 GB/s, peaks up to 1e7 TFLOP/s, power up to a
megawatt, a price up to 10,000 USD per device-hour, latencies up to a second, sizes up to
``MAX_DEVICES``. A value outside is named with its range.

Examples
--------
>>> c = build_cluster("dgx-superpod", num_nodes=4)
>>> c.id, c.num_devices, c.domain_size
('dgx-h100-superpod', 32, 8)
>>> load_device("h100-sxm5-80gb").peak("bf16")
989400000000000.0
"""

from __future__ import annotations

import copy
import difflib
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from clusterplan.models.files import bundled_yaml, load_file
from clusterplan.models.errors import SpecError, format_validation_error, shown
from clusterplan.topologies import builders
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.devices import DeviceSpec
from clusterplan.topologies.entries import (  # noqa: F401 (the ranges and entries are re-exported: docs, cli, tests)
    FAT_TREE_FAMILIES, GBIT, GBYTE, MAX_DEVICES, MAX_GBYTE_PER_S, MAX_HOST_POWER_W, MAX_LATENCY_US, MAX_MEMORY_GIB,
    MAX_NIC_GBIT_PER_S, MAX_OVERSUBSCRIPTION, MAX_PEAK_TFLOPS, MAX_POWER_W, MAX_PRICE_PER_HOUR_USD, MIN_NIC_GBIT_PER_S,
    US, WHOLE_NODE_FAMILIES, CalibrationEntry, DeviceEntry, Family, GridEntry, LinkEntry, MemoryTierEntry, PresetEntry,
    ScaleOutEntry, TorusEntry)

DEVICES_RESOURCE = ("data", "devices.yaml")
CLUSTERS_RESOURCE = ("data", "clusters.yaml")
CLUSTER_FILE_FORMAT = "clusterplan-cluster/1"
_DEVICE_HINT = "run `clusterplan devices` to list the bundled devices"
_CLUSTER_HINT = "run `clusterplan clusters` to list the bundled cluster presets"


@dataclass(frozen=True, kw_only=True)
class ClusterEntry:
    """One row of :func:`list_clusters`."""

    id: str
    aliases: tuple[str, ...]
    name: str
    family: str
    """Builder family."""
    device: str
    """Default device id."""
    device_family: str
    """Devices this preset accepts."""
    reference_size: int
    """Devices at the reference size."""
    devices_per_node: int
    description: str


# ---- the bundled data ---------------------------------------------------------------------------
def _document(name: str) -> dict:
    """One bundled YAML (parsed once: ``models.files.bundled_yaml``)."""
    return bundled_yaml("clusterplan.topologies", "data", name)


@lru_cache(maxsize=1)
def _sources() -> dict[str, str]:
    table = {**_document(DEVICES_RESOURCE[1])["sources"], **_document(CLUSTERS_RESOURCE[1])["sources"]}
    return {key: f"{value['title']} <{value['url']}>" for key, value in table.items()}


def resolve_sources(ids: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Source ids -> "title <url>"; anything else (an inline URL or note) is kept as written."""
    table = _sources()
    return tuple(table.get(s, s) for s in ids)


def _validated(resource: str, key: str, cls, label: str) -> dict:
    """Section ``key`` of a bundled YAML file, each entry validated as ``cls``.

    A mapping section keeps its keys; a list section is keyed by each entry's ``id``.
    """
    raw = _document(resource)[key]
    if isinstance(raw, dict):
        return {k: _validate(cls, v, f"{resource}: {label} {k}") for k, v in raw.items()}
    entries = [_validate(cls, d, f"{resource}: {d.get('id')}") for d in raw]
    return {e.id: e for e in entries}


@lru_cache(maxsize=1)
def _calibration() -> dict[str, CalibrationEntry]:
    return _validated(DEVICES_RESOURCE[1], "calibration", CalibrationEntry, "calibration")


@lru_cache(maxsize=1)
def _device_entries() -> dict[str, DeviceEntry]:
    return _validated(DEVICES_RESOURCE[1], "devices", DeviceEntry, "device")


@lru_cache(maxsize=1)
def _links() -> dict[str, LinkEntry]:
    return _validated(CLUSTERS_RESOURCE[1], "links", LinkEntry, "link")


@lru_cache(maxsize=1)
def _presets() -> dict[str, PresetEntry]:
    return _validated(CLUSTERS_RESOURCE[1], "presets", PresetEntry, "preset")


@lru_cache(maxsize=1)
def _preset_index() -> dict[str, str]:
    """Lower-cased id, alias and name -> preset id."""
    index: dict[str, str] = {}
    for entry in _presets().values():
        for key in (entry.id, entry.name, *entry.aliases):
            assert index.setdefault(key.lower(), entry.id) == entry.id, f"{key!r} names two presets"
    return index


# ---- devices ---------------------------------------------------------------------------------------
def device_from_entry(entry: DeviceEntry, where: str = "device") -> DeviceSpec:
    """Convert a file entry (human units) into a DeviceSpec (SI), once."""
    group = None
    if entry.calibration is not None:
        group = _calibration().get(entry.calibration)
        if group is None:
            raise SpecError(f"{where}: calibration: unknown group {entry.calibration!r}; "
                            f"allowed: {', '.join(_calibration())}")
    if entry.idle_power_w is not None and (entry.power_w is None or entry.idle_power_w > entry.power_w):
        raise SpecError(f"{where}: idle_power_w: got {entry.idle_power_w:g} W; must not exceed power_w "
                        f"({entry.power_w} W), and needs it")
    return DeviceSpec(
        id=entry.id, name=entry.name, vendor=entry.vendor, family=entry.family,
        peak_flops_per_s={k: v * 1e12 for k, v in entry.peak_tflops.items()},
        memory_kind=entry.memory_kind, memory_bytes=entry.memory_bytes,
        program_memory_bytes=None if entry.program_memory_gib is None else entry.program_memory_gib * 2**30,
        memory_bytes_per_s=entry.memory_gbyte_per_s * GBYTE,
        memory_efficiency=entry.memory_efficiency or group.memory_efficiency,
        power_w=entry.power_w, idle_power_w=entry.idle_power_w, price_per_hour_usd=entry.price_per_hour_usd,
        compute_capability=entry.compute_capability,
        scale_up_bytes_per_s=entry.scale_up_gbyte_per_s_per_dir * GBYTE,
        scale_out_bytes_per_s=entry.scale_out_gbit_per_s * GBIT,
        gemm=entry.gemm, memory_tiers=tuple(t.to_spec() for t in entry.memory_tiers),
        sustained_fraction=group.sustained_fraction if group else 1.0,
        sustained_fraction_fp8=group.sustained_fraction_fp8 if group else None,
        attention_efficiency=group.attention_efficiency if group else None,
        attention_efficiency_fa2=group.attention_efficiency_fa2 if group else None,
        comm_kernel_slowdown=tuple(sorted(map(tuple, group.comm_kernel_slowdown))) if group else (),
        comm_kernel_slowdown_measured=bool(group and group.comm_kernel_slowdown_measured),
        unaligned_gemm_fraction=(group.unaligned_gemm_fraction or 1.0) if group else 1.0,
        attention_d64_fraction=group.attention_d64_fraction if group else None,
        attention_d64_fraction_fa2=group.attention_d64_fraction_fa2 if group else None,
        kernel_overhead_s=entry.kernel_overhead_s if entry.kernel_overhead_s is not None else group.kernel_overhead_s,
        sources=list(resolve_sources(entry.sources)), contested=list(entry.contested),
    )


@lru_cache(maxsize=None)
def _bundled_device(device_id: str) -> DeviceSpec:
    return device_from_entry(_device_entries()[device_id], f"devices.yaml: {device_id}")


def resolve_device_id(name: str) -> str:
    """Map a device id or display name (any case) to its id, or raise SpecError with suggestions."""
    entries = _device_entries()
    index = {k.lower(): e.id for e in entries.values() for k in (e.id, e.name)}
    device_id = index.get(str(name).strip().lower())
    if device_id is None:
        raise SpecError(_unknown("device", str(name), index, _DEVICE_HINT))
    return device_id


def load_device(name: str) -> DeviceSpec:
    """Return the bundled device ``name`` (id or display name) in SI units.

    Raises
    ------
    SpecError
        If no bundled device has that name; the message suggests close names.

    Examples
    --------
    >>> d = load_device("a100-sxm4-80gb")
    >>> d.memory_bytes / 2**30, d.scale_up_bytes_per_s / 1e9
    (80.0, 300.0)
    """
    return _bundled_device(resolve_device_id(name))


def list_devices() -> list[DeviceSpec]:
    """Every bundled device, in catalogue order."""
    return [_bundled_device(device_id) for device_id in _device_entries()]


# ---- clusters --------------------------------------------------------------------------------------
def resolve_cluster_id(name: str) -> str:
    """Map a preset id, alias or name (any case) to its id, or raise SpecError with suggestions."""
    preset_id = _preset_index().get(str(name).strip().lower())
    if preset_id is None:
        head, _, size = str(name).strip().lower().rpartition(":")
        if head in _preset_index() and size.isdigit():  # compare's ID:DEVICES where one cluster is asked for
            raise SpecError(f"cluster: got {name!r}; give the preset id alone and the size as --devices {size} "
                            f"(ID:DEVICES is compare's form for a candidate cluster)")
        hint = _CLUSTER_HINT + ", or pass the path of a YAML cluster file"
        raise SpecError(_unknown("cluster", str(name), _preset_index(), hint))
    return preset_id


def list_clusters() -> list[ClusterEntry]:
    """One row per bundled preset, in library order."""
    return [
        ClusterEntry(id=e.id, aliases=tuple(e.aliases), name=e.name, family=e.family, device=e.device,
                     device_family=e.device_family, reference_size=e.reference_size,
                     devices_per_node=e.devices_per_node, description=e.description)
        for e in _presets().values()
    ]


def build_cluster(preset_id: str, num_devices: int | None = None, num_nodes: int | None = None,
                  device: str | None = None, scale_out_gbit_per_s: float | None = None,
                  oversubscription: float | None = None, domain_devices: int | None = None) -> Cluster:
    """Build a bundled preset at a size, optionally with another device of its family.

    Parameters
    ----------
    preset_id : preset id, alias or name (``dgx-superpod``).
    num_devices, num_nodes : the size (at most one, or both if they agree; default: reference size).
    device : a device id of the preset's device family (default: the preset's device).
    scale_out_gbit_per_s : NIC bandwidth per device, one direction, replacing the preset's.
    oversubscription : leaf downlink/uplink ratio (>= 1) for fat-tree presets.
    domain_devices : devices a job uses in each multi-host NVLink Switch domain (64 of an NVL72
        rack's 72, as SLURM's ``--segment 16`` allocates), a multiple of the devices per node.

    Returns
    -------
    Cluster
        Shared between equal calls (builds are cached): treat its graph as read-only.

    Raises
    ------
    SpecError
        Unknown preset or device, a device of another family, a size the fabric cannot take.
    """
    entry = _presets()[resolve_cluster_id(preset_id)]
    size = _num_devices(entry, num_devices, num_nodes)
    device_id = resolve_device_id(device) if device is not None else entry.device
    return _build_bundled(entry.id, size, device_id, _nic_rate("scale_out_gbit_per_s", scale_out_gbit_per_s),
                          _oversubscription(entry, oversubscription), _segment(entry, size, domain_devices))


@lru_cache(maxsize=64)
def _build_bundled(preset_id: str, num_devices: int, device_id: str, scale_out: float | None,
                   oversubscription: float | None, domain_devices: int | None = None) -> Cluster:
    entry = _segmented(_override(_presets()[preset_id], scale_out, oversubscription), domain_devices)
    return assemble_cluster(entry, _family_device(entry, _bundled_device(device_id)), num_devices, _links())


def _override(entry: PresetEntry, scale_out: float | None, oversubscription: float | None) -> PresetEntry:
    given = (("nic_gbit_per_s", scale_out), ("oversubscription", oversubscription))
    changes = {k: v for k, v in given if v is not None}
    if not changes:
        return entry
    return entry.model_copy(update={"scale_out": entry.scale_out.model_copy(update=changes)})


def _segmented(entry: PresetEntry, domain_devices: int | None) -> PresetEntry:
    """``entry`` with a job's segment of each scale-up domain (checked by :func:`_domain_devices`) as
    the domain its graph is built with; ``entry`` itself without one."""
    if domain_devices is None:
        return entry
    return entry.model_copy(update={"domain_size": domain_devices, "domain_devices": domain_devices})


def _domain_devices(entry: PresetEntry, value: int | None, where: str = "") -> int | None:
    """``domain_devices`` (the command line's, else the preset's or cluster file's) checked against
    the preset: an NVLink Switch domain spanning several hosts, used by whole hosts, up to its size."""
    if value is None:
        return None
    where = f"{where}: " if where else ""
    if entry.family != "nvlink-domain":
        raise SpecError(f"{where}domain_devices: preset {entry.id} ({entry.family}) has no NVLink Switch domain spanning "
                        f"several hosts to fill in part (given: {value!r}); allowed with nvlink-domain presets "
                        "(gb200-nvl72, gb300-nvl72)")
    size, per_node = entry.domain_size, entry.devices_per_node
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= size or value % per_node:
        raise SpecError(f"{where}domain_devices: got {value!r}; allowed: a multiple of the {per_node} devices per node "
                        f"from {per_node} to the domain's {size}")
    return value


def _segment(entry: PresetEntry, num_devices: int, domain_devices: int | None, where: str = "") -> int | None:
    """The devices a job is allocated in each scale-up domain: the command line's ``domain_devices``,
    else the preset's or cluster file's (``where`` names the file), checked; None for whole nodes."""
    given = entry.domain_devices if domain_devices is None else domain_devices
    return _whole_segments(num_devices, _domain_devices(entry, given, where if domain_devices is None else ""))


def _whole_segments(num_devices: int, segment: int | None) -> int | None:
    """``segment`` (``domain_devices``), checked against the size: beyond one segment, whole ones, as
    Slurm's block topology allocates (``--segment``: a node count larger than the segment must divide
    by it; slurm.schedmd.com/topology.html, "User Options")."""
    if segment is not None and num_devices > segment and num_devices % segment:
        lower = num_devices // segment * segment
        raise SpecError(f"num_devices: {num_devices:,} is not whole segments of {segment} devices (domain_devices "
                        f"{segment}; Slurm's --segment takes a node count that divides by it): use {lower:,} or "
                        f"{lower + segment:,}, or drop domain_devices to use whole nodes (the last rack in part)")
    return segment


def _nic_rate(name: str, value: float | None) -> float | None:
    """A NIC rate override (Gb/s), in the range a cluster file's ``nic_gbit_per_s`` takes."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            MIN_NIC_GBIT_PER_S <= value <= MAX_NIC_GBIT_PER_S):
        raise SpecError(f"{name}: got {value!r:.80}; allowed: a number of Gb/s from {MIN_NIC_GBIT_PER_S:g} (1 GbE) "
                        f"to {MAX_NIC_GBIT_PER_S:g}")
    return float(value)


def _oversubscription(entry: PresetEntry, value: float | None) -> float | None:
    if value is None:
        return None
    if entry.family not in FAT_TREE_FAMILIES:
        raise SpecError(f"oversubscription: preset {entry.id} ({entry.family}) has no switched fat-tree to "
                        f"oversubscribe (given: {value!r}); allowed with "
                        f"{', '.join(sorted(FAT_TREE_FAMILIES))} presets")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_OVERSUBSCRIPTION:
        raise SpecError(f"oversubscription: must be a number from 1 to {MAX_OVERSUBSCRIPTION:g} (leaf downlink / "
                        f"uplink capacity; given: {value!r})")
    return float(value)


def _count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    try:
        count = operator.index(value)
    except TypeError:
        count = None
    if count is None or isinstance(value, bool) or count <= 0:
        raise SpecError(f"{name}: must be a positive whole number (given: {shown(value)})")
    if count > MAX_DEVICES:
        raise SpecError(f"{name}: {shown(count)} exceeds the largest cluster clusterplan models ({MAX_DEVICES:,} "
                        "devices, above the largest published training clusters); use fewer")
    return count


def _num_devices(entry: PresetEntry, num_devices: Any, num_nodes: Any) -> int:
    """Resolve and check the size for this preset's fabric."""
    devices, nodes = _count("num_devices", num_devices), _count("num_nodes", num_nodes)
    if nodes is not None:
        if devices is not None and devices != nodes * entry.devices_per_node:
            raise SpecError(f"num_devices: {devices} disagrees with num_nodes {nodes} x {entry.devices_per_node} "
                            f"devices per node = {nodes * entry.devices_per_node}; give one of them")
        devices = nodes * entry.devices_per_node
    devices = entry.reference_size if devices is None else devices
    if devices > MAX_DEVICES:
        raise SpecError(f"num_devices: {devices:,} exceeds the largest cluster clusterplan models "
                        f"({MAX_DEVICES:,} devices, above the largest published training clusters); use fewer")
    per_node = entry.devices_per_node
    if entry.family in WHOLE_NODE_FAMILIES and devices % per_node:
        lower = max(per_node, devices // per_node * per_node)
        raise SpecError(f"num_devices: {devices} is not allowed for {entry.id}: it is built of whole "
                        f"{per_node}-device nodes, so use a positive multiple of {per_node} "
                        f"(e.g. {lower} or {lower + per_node}), or give num_nodes")
    if entry.family == "tpu-torus":
        builders.tpu_slice_layout(devices, tuple(entry.torus.max_slice_shape))
    if entry.family == "grid":
        builders.grid_layout(devices, tuple(entry.grid.shape))
    return devices


def _family_device(entry: PresetEntry, device: DeviceSpec) -> DeviceSpec:
    if device.family == entry.device_family:
        return device
    allowed = [d.id for d in _device_entries().values() if d.family == entry.device_family]
    fits = [p.id for p in _presets().values() if p.device_family == device.family]
    fix = f"; presets for {device.family}: {', '.join(fits)}" if fits else ""
    raise SpecError(f"device: {device.id} (family {device.family}) cannot run on {entry.id}, which takes "
                    f"{entry.device_family} devices ({', '.join(allowed) or 'none bundled'}); drop the device or "
                    f"pick another preset{fix}")


# ---- assembling a Cluster ----------------------------------------------------------------------------
def _link(links: Mapping[str, LinkEntry], name: str, where: str) -> builders.Link:
    entry = links.get(name)
    if entry is None:
        raise SpecError(f"{where}: unknown link class {name!r}; allowed: {', '.join(links)} "
                        "(or define it under links:)")
    return builders.Link(achieved_fraction=entry.achieved_fraction, latency_s=entry.latency_us * US,
                         switch_hop_latency_s=(entry.switch_hop_us or 0.0) * US,
                         gpu_initiated_rdma=entry.gpu_initiated_rdma)


def _fat_tree(entry: PresetEntry, links: Mapping[str, LinkEntry]) -> builders.FatTree:
    so = entry.scale_out
    return builders.FatTree(
        nic_bytes_per_s=so.nic_gbit_per_s * GBIT, link=_link(links, so.link, f"{entry.id}: scale_out.link"),
        nodes_per_su=so.nodes_per_su, switch_radix=so.switch_radix, oversubscription=so.oversubscription,
        leaves_per_su=so.leaves_per_su, sharp_nir_fraction=so.sharp_nir_fraction if so.sharp else None,
    )


def _torus(entry: PresetEntry, links: Mapping[str, LinkEntry]) -> builders.Torus:
    t, so = entry.torus, entry.scale_out
    return builders.Torus(
        max_slice_shape=tuple(t.max_slice_shape), wrap=t.wrap, link_bytes_per_s=t.ici_gbyte_per_s_per_link * GBYTE,
        link=_link(links, t.link, f"{entry.id}: torus.link"), chips_per_host=t.chips_per_host,
        dcn_bytes_per_s=so.nic_gbit_per_s * GBIT, dcn_link=_link(links, so.link, f"{entry.id}: scale_out.link"),
    )


def _grid(entry: PresetEntry, device: DeviceSpec, links: Mapping[str, LinkEntry]) -> builders.Grid:
    g = entry.grid
    return builders.Grid(
        shape=tuple(g.shape), wraparound=tuple(g.wraparound),
        link_bytes_per_s=tuple(f * device.scale_up_bytes_per_s for f in g.link_share),
        link=_link(links, g.link, f"{entry.id}: grid.link"), fabric=g.fabric,
    )


def _fabric(entry: PresetEntry, device: DeviceSpec, n: int, links: Mapping[str, LinkEntry]) -> builders.Fabric:
    """Call the family's builder with SI parameters."""
    family, per_node = entry.family, entry.devices_per_node
    up = _link(links, entry.scale_up_link, f"{entry.id}: scale_up_link") if entry.scale_up_link else None
    if family == "nvswitch":
        return builders.build_nvswitch(device, n, devices_per_node=per_node, link=up,
                                       nvls_nir_fraction=entry.nvls_nir_fraction, fat_tree=_fat_tree(entry, links))
    if family == "nvlink-domain":
        return builders.build_nvlink_domain(device, n, domain_size=entry.domain_size, devices_per_node=per_node,
                                            link=up, nvls_nir_fraction=entry.nvls_nir_fraction,
                                            fat_tree=_fat_tree(entry, links))
    if family in ("gaudi", "xgmi"):
        build = builders.build_gaudi if family == "gaudi" else builders.build_xgmi
        return build(device, n, devices_per_node=per_node, link=up, fat_tree=_fat_tree(entry, links))
    if family == "tpu-torus":
        return builders.build_tpu_torus(device, n, torus=_torus(entry, links))
    if family == "grid":
        return builders.build_grid(device, n, grid=_grid(entry, device, links), devices_per_node=per_node,
                                   fat_tree=_fat_tree(entry, links))
    so = entry.scale_out
    if family == "pods":
        return builders.build_pods(device, n, devices_per_node=per_node, link=up,
                                   pod_link=_link(links, so.link, f"{entry.id}: scale_out.link"),
                                   nodes_per_pod=so.nodes_per_su, pod_bytes_per_s=so.nic_gbit_per_s * GBIT,
                                   global_bytes_per_s=(so.global_gbit_per_s or so.nic_gbit_per_s) * GBIT)
    if family == "cerebras":
        return builders.build_cerebras(device, n, io_bytes_per_s=so.nic_gbit_per_s * GBIT,
                                       link=_link(links, so.link, f"{entry.id}: scale_out.link"),
                                       nir_fraction=so.sharp_nir_fraction if so.sharp else None)
    return builders.build_groq(device, n, devices_per_node=per_node, link=up, nodes_per_rack=so.nodes_per_su,
                               global_bytes_per_s=so.nic_gbit_per_s * GBIT)


def assemble_cluster(entry: PresetEntry, device: DeviceSpec, num_devices: int,
                     links: Mapping[str, LinkEntry]) -> Cluster:
    """Build the graph and wrap it with the preset's facts; the device's NIC rate becomes the fabric's."""
    fabric = _fabric(entry, device, num_devices, links)
    update = {"scale_out_bytes_per_s": entry.scale_out.nic_gbit_per_s * GBIT}
    if entry.price_per_device_hour_usd is not None:  # the cluster file's price wins over the catalogue's
        update["price_per_hour_usd"] = entry.price_per_device_hour_usd
    device = device.model_copy(update=update)
    return Cluster(
        id=entry.id, name=entry.name, family=entry.family, device=device, num_devices=num_devices,
        domain_size=fabric.domain_size, devices_per_node=entry.devices_per_node, graph=fabric.graph,
        torus_shape=fabric.torus_shape, description=entry.description, sources=resolve_sources(entry.sources),
        reference_size=entry.reference_size,
        oversubscription=entry.scale_out.oversubscription if entry.family in FAT_TREE_FAMILIES else 1.0,
        in_network_reduction=fabric.in_network_reduction,
        power_overhead_w_per_device=entry.power_overhead_w_per_device,
        weight_streaming=entry.family == "cerebras",
        segment_devices=entry.domain_devices or 0, link_caveats=_link_caveats(entry, links),
    )


def _link_caveats(entry: PresetEntry, links: Mapping[str, LinkEntry]) -> tuple[str, ...]:
    """An ``unvalidated`` line per link class of the preset whose calibration is not a measurement."""
    names = dict.fromkeys(n for n in (entry.scale_out.link, entry.scale_up_link) if n)
    return tuple(f"unvalidated: the {name} links' achieved bandwidth and latency are assumed ({links[name].source})"
                 for name in names if name in links and links[name].note.startswith("unvalidated"))


# ---- cluster files ---------------------------------------------------------------------------------
def load_cluster_file(path: str | Path, num_devices: int | None = None, num_nodes: int | None = None,
                      device: str | None = None, scale_out_gbit_per_s: float | None = None,
                      oversubscription: float | None = None, domain_devices: int | None = None) -> Cluster:
    """Build a cluster from a YAML/JSON cluster file (format in the module docstring).

    The keyword arguments are the command line's overrides: a size (``num_devices`` or
    ``num_nodes``) replaces the file's, ``device`` its device (a catalogue id), and the NIC rate
    and oversubscription go into its ``scale_out`` block.

    Raises
    ------
    SpecError
        Missing or malformed file, unknown keys, base, device or link class, invalid values, or a
        size the fabric cannot take; each message names the field and what is allowed.
    """
    path = Path(path)
    data = _read_mapping(path)
    where = str(path)
    fmt = data.pop("format", CLUSTER_FILE_FORMAT)
    if fmt != CLUSTER_FILE_FORMAT:
        raise SpecError(f"{where}: format: expected {CLUSTER_FILE_FORMAT!r} (given: {fmt!r})")
    links = {**_links(), **_user_links(data.pop("links", None) or {}, where)}
    file_devices, file_nodes = data.pop("num_devices", None), data.pop("num_nodes", None)
    if num_devices is None and num_nodes is None:
        num_devices, num_nodes = file_devices, file_nodes
    if device is not None:
        data["device"] = device
    _file_scale_out(data, scale_out_gbit_per_s, oversubscription, where)
    _check_file_keys(data, where)
    raw_device = data.pop("device", None)
    device = _file_device(raw_device, where)
    if isinstance(raw_device, str) and data.get("base") is not None and "device_family" not in data:
        # a bundled device on a preset's fabric: the same family rule as --device (a file that means
        # another fabric says so with device_family, or describes its own device)
        _family_device(_presets()[resolve_cluster_id(str(data["base"]))], device)
    merged = _merge_base(data, where)
    if device is not None:
        merged["device"] = device.id
        merged.setdefault("device_family", device.family)
    merged.setdefault("id", path.stem)
    merged.setdefault("name", merged["id"])
    if "reference_size" not in merged:
        merged["reference_size"] = _reference_size(num_devices, num_nodes, merged.get("devices_per_node"), where)
    entry = _validate(PresetEntry, merged, where)
    _oversubscription(entry, oversubscription)  # the command line's value, checked as for a preset
    size = _num_devices(entry, num_devices, num_nodes)
    entry = _segmented(entry, _segment(entry, size, domain_devices, where))
    device = device or load_device(entry.device)
    return assemble_cluster(entry, device, size, links)


CLUSTER_FILE_KEYS = ("format", "base", "num_devices", "num_nodes", "links")  # read before the preset fields


def _check_file_keys(data: dict, where: str) -> None:
    """A key that is neither a preset field nor a cluster-file key is a typo: named, with the
    closest allowed key (``num_nodez`` -> ``num_nodes``) and the whole list."""
    allowed = [*CLUSTER_FILE_KEYS, *(k for k in PresetEntry.model_fields if k != "id")]
    unknown = [str(k) for k in data if k not in allowed and k != "id"]
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SpecError(f"{where}: {unknown[0]}: unknown key{hint}; allowed: {', '.join(['id', *allowed])}")


def _file_scale_out(data: dict, scale_out_gbit_per_s: float | None, oversubscription: float | None,
                    where: str) -> None:
    """The command line's NIC rate and oversubscription, written into the file's ``scale_out``."""
    if scale_out_gbit_per_s is None and oversubscription is None:
        return
    if not isinstance(data.get("scale_out") or {}, Mapping):
        raise SpecError(f"{where}: scale_out: expected a mapping of scale-out fields (given: "
                        f"{data['scale_out']!r:.80}); the command line's overrides go into it")
    scale_out = dict(data.get("scale_out") or {})
    if scale_out_gbit_per_s is not None:
        scale_out["nic_gbit_per_s"] = _nic_rate("scale_out_gbit_per_s", scale_out_gbit_per_s)
    if oversubscription is not None:
        scale_out["oversubscription"] = oversubscription
    data["scale_out"] = scale_out


def _merge_base(data: dict, where: str) -> dict:
    base = data.pop("base", None)
    if base is None:
        return data
    preset = _presets()[resolve_cluster_id(str(base))].model_dump(exclude={"id", "aliases"}, exclude_none=True)
    if "device" in data or "device_family" in data:
        preset.pop("device_family", None)
    return _deep_merge(preset, data)


def _deep_merge(base: dict, over: Mapping) -> dict:
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _reference_size(num_devices: Any, num_nodes: Any, per_node: Any, where: str) -> Any:
    if num_devices is not None:
        return num_devices
    if num_nodes is not None and isinstance(per_node, int):
        return num_nodes * per_node
    raise SpecError(f"{where}: num_devices: missing; give num_devices or num_nodes (or base: a preset)")


def _file_device(value: Any, where: str) -> DeviceSpec | None:
    if value is None or isinstance(value, str):
        return None if value is None else load_device(value)
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: device: expected a device id or a mapping of device fields (given: {value!r})")
    return device_from_entry(_validate(DeviceEntry, dict(value), f"{where}: device"), f"{where}: device")


def _user_links(raw: Any, where: str) -> dict[str, LinkEntry]:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: links: expected a mapping of link class name -> fields (given: {raw!r})")
    return {str(k): _validate(LinkEntry, v, f"{where}: links.{k}") for k, v in raw.items()}


def _read_mapping(path: Path) -> dict:
    if not path.exists():
        raise SpecError(f"cluster: file {str(path)!r} does not exist; {_CLUSTER_HINT}")
    data = load_file(path, f"cluster file {str(path)!r}")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of cluster fields at top level, got {type(data).__name__}")
    return data


# ---- errors ----------------------------------------------------------------------------------------
def _unknown(kind: str, name: str, index: Mapping[str, str], hint: str) -> str:
    key = name.strip().lower()
    contains = [k for k in index if key and key in k] if len(key) >= 2 else []
    close = contains + difflib.get_close_matches(key, list(index), n=6, cutoff=0.5)
    suggestions = list(dict.fromkeys(index[c] for c in close))[:3]
    did_you_mean = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    return f"{kind}: unknown {kind} {name!r}; {did_you_mean}{hint}"


def _validate(model: type[BaseModel], data: Any, where: str):
    """Validate ``data`` as ``model``; pydantic errors become one SpecError, one line per field."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping of fields (given: {data!r})")
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(format_validation_error(err, where, _LABELS.get(model.__name__, "entry"), model)) from None


_LABELS = {"PresetEntry": "cluster", "DeviceEntry": "device", "LinkEntry": "link class",
           "CalibrationEntry": "calibration group"}
