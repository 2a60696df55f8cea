"""Builders: one per fabric family, each producing the graph schema of :mod:`topologies.cluster`.

Every builder takes a :class:`~topologies.devices.DeviceSpec`, a device count and the fabric's
parameters in SI units (converted once by :mod:`topologies.library`), and returns a :class:`Fabric`.
They share these conventions:

* Device ranks are ``0 .. n-1``; consecutive ranks share a node and a scale-up domain.
* Parallel cables are one edge whose ``bytes_per_s`` is their sum, and a tier of identical switches
  serving one group is one node (``num_switches`` says how many physical switches it stands for):
  one NVSwitch node per 8-GPU node, one spine node per pod, one core node. This keeps a
  16,384-GPU graph near 35,000 edges, which builds in a fraction of a second.
* Scale-out edges: ``nic`` from a device to its first switch (its NIC rate, or its share of a
  host NIC), ``spine`` from leaf to spine, ``core`` from spine to core; TPU hosts use ``host`` and
  ``dcn``. Oversubscription is the leaf's downlink / uplink capacity ratio: the uplink edge carries
  ``down / oversubscription``.

Families: :func:`build_nvswitch` (DGX/HGX nodes on a rail-optimized fat-tree),
:func:`build_nvlink_domain` (GB200 NVL72 racks), :func:`build_tpu_torus` (TPU slices),
:func:`build_gaudi` and :func:`build_xgmi` (direct all-to-all nodes), :func:`build_cerebras` and
:func:`build_groq` (SRAM-only machines), :func:`build_grid` (2D/3D grids of directly linked chips,
mesh or torus per axis: Tesla Dojo training tiles, Tenstorrent Galaxy, AWS Trn2 UltraServers) and
:func:`build_pods` (small fully linked nodes under a virtual switch per pod and one above:
Graphcore Bow Pods, SambaNova racks).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import networkx as nx

from clusterplan.models.errors import SpecError
from clusterplan.topologies.devices import DeviceSpec


# ---- parameters (SI) ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Link:
    """Calibration of one class of link."""

    achieved_fraction: float
    """Measured large-message bus bandwidth / nominal rate, in (0, 1]."""
    latency_s: float
    """Latency of one device-to-switch (or device-to-device) edge."""
    switch_hop_latency_s: float = 0.0
    """Latency of one switch-to-switch edge of the same fabric."""
    gpu_initiated_rdma: bool = True
    """Whether a GPU kernel posts RDMA on these NICs itself (IBGDA) rather than through a host proxy."""


@dataclass(frozen=True, kw_only=True)
class FatTree:
    """A leaf/spine(/core) scale-out fabric; the spine tier is split into pods beyond two tiers."""

    nic_bytes_per_s: float
    """Scale-out bandwidth per device, one direction (all its NIC ports together)."""
    link: Link
    nodes_per_su: int
    """Nodes per scalable unit (the nodes under one set of leaves)."""
    switch_radix: int
    """Ports per switch, counted at the device port speed."""
    oversubscription: float = 1.0
    """Leaf downlink / uplink capacity (>= 1)."""
    leaves_per_su: int | None = None
    """None: rail-optimized (device slot i of every node -> leaf i). n: each device has one port
    into each of the n leaves of its scalable unit (Gaudi's 3 scale-out ports)."""
    sharp_nir_fraction: float | None = None
    """In-network reduction (InfiniBand SHARP, SwarmX) on every switch, or None."""


@dataclass(frozen=True, kw_only=True)
class Torus:
    """TPU slice rules and links."""

    max_slice_shape: tuple[int, ...]
    """Largest single slice, e.g. (16, 16) or (16, 16, 24)."""
    wrap: Literal["full_cubes", "full_axis"]
    """full_cubes: every axis wraps when the slice is made of whole 4x4x4 cubes (v4, v5p);
    full_axis: an axis wraps when it spans the whole pod dimension (v5e, v6e)."""
    link_bytes_per_s: float
    """Nominal bandwidth of one ICI link, one direction."""
    link: Link
    chips_per_host: int
    dcn_bytes_per_s: float
    """Data-center network bandwidth per chip (its share of the host NIC), one direction."""
    dcn_link: Link


@dataclass(frozen=True, kw_only=True)
class Grid:
    """One domain's grid of directly linked chips and its links (SI)."""

    shape: tuple[int, ...]
    """The full grid of one domain, slowest axis first; device ids are row-major over it."""
    wraparound: tuple[bool, ...]
    """Per axis: a wraparound link closes the axis into a ring when the grid spans the whole axis
    (a torus axis); False: a line (a mesh axis, e.g. Dojo tiles, Tenstorrent Galaxy)."""
    link_bytes_per_s: tuple[float, ...]
    """Per axis: nominal bandwidth of ONE link of that axis, one direction."""
    link: Link
    fabric: str = ""
    """Vendor name of the links (edge attribute ``fabric``: neuronlink, ethernet, dojo)."""


@dataclass(frozen=True, kw_only=True)
class Fabric:
    """What a builder returns; :mod:`topologies.library` wraps it into a Cluster."""

    graph: nx.Graph
    domain_size: int
    torus_shape: tuple[int, ...] | None = None
    in_network_reduction: tuple[str, ...] = ()


# ---- small helpers -----------------------------------------------------------------------------
def _edge(bytes_per_s: float, link: Link, level: str, latency_s: float | None = None, **extra) -> dict:
    """Edge attributes of the schema."""
    return {
        "bytes_per_s": bytes_per_s,
        "latency_s": link.latency_s if latency_s is None else latency_s,
        "level": level,
        "achieved_fraction": link.achieved_fraction,
        **({} if link.gpu_initiated_rdma else {"gpu_initiated_rdma": False}),
        **extra,
    }


def _switch(level: str, nir_fraction: float | None = None, num_switches: int | None = None) -> dict:
    """Switch node attributes; ``nir_fraction`` marks in-network reduction; ``num_switches`` (fat-tree
    tiers only) counts the physical switches an aggregated node stands for."""
    attrs = {"kind": "switch", "level": level}
    if num_switches is not None:
        attrs["num_switches"] = num_switches
    if nir_fraction:
        attrs.update(in_network_reduction=True, nir_fraction=nir_fraction)
    return attrs


def _num_switches(ports: float, radix: int) -> int:
    return max(1, math.ceil(ports / radix - 1e-9))


def _add_devices(graph: nx.Graph, num_devices: int, domain_size: int) -> None:
    graph.add_nodes_from((r, {"kind": "device", "domain": r // domain_size}) for r in range(num_devices))


def _tags(nvls: float | None, fat_tree: FatTree | None) -> tuple[str, ...]:
    return (("nvls",) if nvls else ()) + (("sharp",) if fat_tree and fat_tree.sharp_nir_fraction else ())


# ---- scale-up building blocks --------------------------------------------------------------------
def _add_switched_domains(graph: nx.Graph, num_devices: int, domain_size: int, prefix: str,
                          bytes_per_s: float, link: Link, nvls_nir_fraction: float | None) -> None:
    """One aggregated NVSwitch / NVLink-switch node per domain; each device's full NVLink rate to it."""
    num_domains = -(-num_devices // domain_size)
    graph.add_nodes_from((f"{prefix}/{d}", _switch("nvlink", nvls_nir_fraction)) for d in range(num_domains))
    graph.add_edges_from(
        (r, f"{prefix}/{r // domain_size}", _edge(bytes_per_s, link, "nvlink")) for r in range(num_devices)
    )


def _add_full_mesh(graph: nx.Graph, num_devices: int, group_size: int, pair_bytes_per_s: float,
                   link: Link, level: str) -> None:
    """Direct links between every pair of devices of each group (xGMI, Gaudi RoCE, Groq C2C)."""
    for base in range(0, num_devices, group_size):
        members = range(base, min(base + group_size, num_devices))
        graph.add_edges_from(
            (a, b, _edge(pair_bytes_per_s, link, level)) for a, b in itertools.combinations(members, 2)
        )


# ---- the fat-tree ----------------------------------------------------------------------------------
def _leaf_name(su: int, k: int, rails: bool) -> str:
    return f"leaf/su{su}/{'rail' if rails else 'port'}{k}"


def _add_leaves(graph: nx.Graph, num_devices: int, devices_per_node: int, ft: FatTree) -> dict[tuple[int, int], float]:
    """Device-to-leaf edges; returns each leaf's downlink capacity keyed by (su, leaf index)."""
    rails = ft.leaves_per_su is None
    per_port = ft.nic_bytes_per_s / (1 if rails else ft.leaves_per_su)
    down: dict[tuple[int, int], float] = {}
    edges = []
    for rank in range(num_devices):
        node, slot = divmod(rank, devices_per_node)
        su = node // ft.nodes_per_su
        for k in (slot,) if rails else range(ft.leaves_per_su):
            down[su, k] = down.get((su, k), 0.0) + per_port
            edges.append((rank, _leaf_name(su, k, rails), _edge(per_port, ft.link, "nic")))
    ports_factor = (1 + 1 / ft.oversubscription) / per_port  # down + up ports per byte/s of downlink
    graph.add_nodes_from(
        (_leaf_name(su, k, rails),
         _switch("leaf", ft.sharp_nir_fraction, _num_switches(cap * ports_factor, ft.switch_radix)))
        for (su, k), cap in down.items()
    )
    graph.add_edges_from(edges)
    return down


def _pod_sus(num_ports: float, ports_per_su: float, radix: int, num_sus: int) -> int:
    """Scalable units per spine pod: all of them in a two-tier tree (at most radix^2/2 ports, e.g.
    2048 at radix 64 = 8 SUs of 256 GPUs, as the B200 RA table), else a k-ary fat-tree pod of
    radix^2/4 ports (4 SUs at radix 64: the RA's 16-SU row has 128 spines in pods, 64 core)."""
    if num_ports <= radix * radix / 2:
        return num_sus
    return max(1, int(radix * radix / 4 // ports_per_su))


def _add_fat_tree(graph: nx.Graph, num_devices: int, devices_per_node: int, ft: FatTree) -> None:
    """Leaves per (scalable unit, rail or port), one spine node per pod, one core node above pods."""
    down = _add_leaves(graph, num_devices, devices_per_node, ft)
    if len(down) < 2:
        return
    rails = ft.leaves_per_su is None
    port_bytes = ft.nic_bytes_per_s / (1 if rails else ft.leaves_per_su)
    ports_per_su = ft.nodes_per_su * devices_per_node * (1 if rails else ft.leaves_per_su)
    num_sus = 1 + max(su for su, _ in down)
    pod_sus = _pod_sus(sum(down.values()) / port_bytes, ports_per_su, ft.switch_radix, num_sus)
    spine_down: dict[int, float] = {}
    edges = []
    hop = ft.link.switch_hop_latency_s
    for (su, k), cap in down.items():
        up = cap / ft.oversubscription
        pod = su // pod_sus
        spine_down[pod] = spine_down.get(pod, 0.0) + up
        edges.append((_leaf_name(su, k, rails), f"spine/pod{pod}", _edge(up, ft.link, "spine", hop)))
    three_tier = len(spine_down) > 1
    graph.add_nodes_from(
        (f"spine/pod{p}", _switch("spine", ft.sharp_nir_fraction,
                                  _num_switches(cap / port_bytes * (2 if three_tier else 1), ft.switch_radix)))
        for p, cap in spine_down.items()
    )
    graph.add_edges_from(edges)
    if three_tier:  # spines are non-blocking upward: each pod's uplink equals its downlink
        core_ports = sum(spine_down.values()) / port_bytes
        graph.add_node("core", **_switch("core", ft.sharp_nir_fraction, _num_switches(core_ports, ft.switch_radix)))
        graph.add_edges_from(
            (f"spine/pod{p}", "core", _edge(cap, ft.link, "core", hop)) for p, cap in spine_down.items()
        )


# ---- (a) NVSwitch nodes and (b) NVLink Switch domains ----------------------------------------------
def build_nvswitch(device: DeviceSpec, num_devices: int, *, devices_per_node: int, link: Link,
                   nvls_nir_fraction: float | None, fat_tree: FatTree) -> Fabric:
    """DGX/HGX nodes: one aggregated NVSwitch per node (the GPU's full NVLink rate per direction),
    NVLink SHARP where ``nvls_nir_fraction`` is given, on a rail-optimized fat-tree.

    Examples
    --------
    >>> from clusterplan.topologies.library import load_device
    >>> ft = FatTree(nic_bytes_per_s=50e9, link=Link(achieved_fraction=0.94, latency_s=2e-6),
    ...              nodes_per_su=32, switch_radix=64)
    >>> fab = build_nvswitch(load_device("h100-sxm5-80gb"), 16, devices_per_node=8,
    ...                      link=Link(achieved_fraction=0.822, latency_s=0.95e-6),
    ...                      nvls_nir_fraction=0.611, fat_tree=ft)
    >>> fab.graph.edges[0, "nvsw/0"]["bytes_per_s"], sorted(n for n in fab.graph if isinstance(n, str))[:3]
    (450000000000.0, ['leaf/su0/rail0', 'leaf/su0/rail1', 'leaf/su0/rail2'])
    """
    graph = nx.Graph()
    _add_devices(graph, num_devices, devices_per_node)
    _add_switched_domains(graph, num_devices, devices_per_node, "nvsw", device.scale_up_bytes_per_s,
                          link, nvls_nir_fraction)
    _add_fat_tree(graph, num_devices, devices_per_node, fat_tree)
    return Fabric(graph=graph, domain_size=devices_per_node, in_network_reduction=_tags(nvls_nir_fraction, fat_tree))


def build_nvlink_domain(device: DeviceSpec, num_devices: int, *, domain_size: int, devices_per_node: int,
                        link: Link, nvls_nir_fraction: float | None, fat_tree: FatTree) -> Fabric:
    """NVLink Switch domains spanning several hosts (GB200 NVL72: 72 GPUs over 18 switch chips,
    aggregated into one node per rack); every host's NICs join a rail-optimized fat-tree."""
    graph = nx.Graph()
    _add_devices(graph, num_devices, domain_size)
    _add_switched_domains(graph, num_devices, domain_size, "nvlsw", device.scale_up_bytes_per_s,
                          link, nvls_nir_fraction)
    _add_fat_tree(graph, num_devices, devices_per_node, fat_tree)
    return Fabric(graph=graph, domain_size=domain_size, in_network_reduction=_tags(nvls_nir_fraction, fat_tree))


# ---- (d) Gaudi and (e) MI300X: direct all-to-all nodes ----------------------------------------------
def _build_mesh(device: DeviceSpec, num_devices: int, devices_per_node: int, link: Link, level: str,
                fat_tree: FatTree) -> Fabric:
    graph = nx.Graph()
    _add_devices(graph, num_devices, devices_per_node)
    pair_bytes_per_s = device.scale_up_bytes_per_s / max(1, devices_per_node - 1)
    _add_full_mesh(graph, num_devices, devices_per_node, pair_bytes_per_s, link, level)
    _add_fat_tree(graph, num_devices, devices_per_node, fat_tree)
    return Fabric(graph=graph, domain_size=devices_per_node, in_network_reduction=_tags(None, fat_tree))


def build_gaudi(device: DeviceSpec, num_devices: int, *, devices_per_node: int, link: Link,
                fat_tree: FatTree) -> Fabric:
    """HLS-2/HLS-3 boxes: 21 of 24 RoCE ports all-to-all, 3 per peer (the device's scale-up rate / 7
    per pair: 37.5 GB/s/dir on Gaudi 2, 75 on Gaudi 3); 3 scale-out ports per card, one into each
    of 3 leaves (``fat_tree.leaves_per_su``)."""
    return _build_mesh(device, num_devices, devices_per_node, link, "roce_scaleup", fat_tree)


def build_xgmi(device: DeviceSpec, num_devices: int, *, devices_per_node: int, link: Link,
               fat_tree: FatTree) -> Fabric:
    """AMD MI300X platforms: 8 GPUs fully meshed by 7 xGMI links (64 GB/s/dir each, no switch), so a
    2-GPU group gets one link and an 8-GPU group seven; one NIC per GPU on a rail fat-tree."""
    return _build_mesh(device, num_devices, devices_per_node, link, "xgmi", fat_tree)


# ---- (c) TPU tori -------------------------------------------------------------------------------------
_SLICES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_SMALL_SLICES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4)}  # Cloud TPU v4/v5p topologies


def _fits(shape: tuple[int, ...], max_shape: tuple[int, ...]) -> bool:
    return all(a <= b for a, b in zip(sorted(shape), sorted(max_shape)))


def _cube_shape(num_chips: int, max_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Most cubic a x b x c (a <= b <= c, each a multiple of 4) of ``num_chips`` that fits."""
    if num_chips % 64:
        return None
    cubes = num_chips // 64
    shapes = [
        (4 * a, 4 * b, 4 * (cubes // (a * b)))
        for a in range(1, cubes + 1) for b in range(a, cubes // a + 1)
        if cubes % (a * b) == 0 and cubes // (a * b) >= b
    ]
    fitting = [s for s in shapes if _fits(s, max_shape)]
    return min(fitting, key=lambda s: (s[2], -s[0])) if fitting else None  # shortest longest axis


def slice_shape(num_chips: int, max_slice_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Shape of a single slice of ``num_chips`` under ``max_slice_shape``, or None if none exists.

    Examples
    --------
    >>> [slice_shape(n, (16, 16, 24)) for n in (8, 64, 128, 6144, 96)]
    [(2, 2, 2), (4, 4, 4), (4, 4, 8), (16, 16, 24), None]
    >>> slice_shape(128, (16, 16))
    (8, 16)
    """
    if len(max_slice_shape) == 2:
        shape = _SLICES_2D.get(num_chips)
    else:
        shape = _SMALL_SLICES_3D.get(num_chips) or _cube_shape(num_chips, max_slice_shape)
    return shape if shape is not None and _fits(shape, max_slice_shape) else None


def _slice_sizes(max_slice_shape: tuple[int, ...]) -> list[int]:
    limit = math.prod(max_slice_shape)
    small = list(_SLICES_2D) if len(max_slice_shape) == 2 else [*_SMALL_SLICES_3D, *range(64, limit + 1, 64)]
    return [n for n in small if n <= limit and slice_shape(n, max_slice_shape)]


def tpu_slice_layout(num_chips: int, max_slice_shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(number of slices, slice shape): one slice up to the largest slice, beyond that equal slices
    of the largest size dividing ``num_chips``, joined over the data-center network (multislice).

    Raises
    ------
    SpecError
        When ``num_chips`` forms neither one slice nor equal slices.

    Examples
    --------
    >>> tpu_slice_layout(256, (16, 16)), tpu_slice_layout(1024, (16, 16))
    ((1, (16, 16)), (4, (16, 16)))
    """
    shape = slice_shape(num_chips, max_slice_shape)
    if shape is not None:
        return 1, shape
    sizes = _slice_sizes(max_slice_shape)
    if num_chips > sizes[-1]:
        for size in reversed(sizes):
            if num_chips % size == 0:
                return num_chips // size, slice_shape(size, max_slice_shape)
    examples = ", ".join(f"{n} ({'x'.join(map(str, slice_shape(n, max_slice_shape)))})" for n in sizes[:6])
    raise SpecError(
        f"num_devices: {num_chips} chips do not form a TPU slice: one slice takes {examples}, ... up to "
        f"{sizes[-1]} ({'x'.join(map(str, max_slice_shape))}); beyond that, equal slices over DCN: a multiple "
        f"of a slice size (e.g. {2 * sizes[-1]})"
    )


def _wraps(shape: tuple[int, ...], torus: Torus) -> tuple[bool, ...]:
    """Which axes of a slice close into a ring (only axes longer than 2 can)."""
    if torus.wrap == "full_cubes":
        whole_cubes = all(d % 4 == 0 for d in shape)
        return tuple(whole_cubes and d > 2 for d in shape)
    return tuple(d == full and d > 2 for d, full in zip(shape, torus.max_slice_shape))


def _add_torus_slice(graph: nx.Graph, base: int, shape: tuple[int, ...], wraps: tuple[bool, ...], torus: Torus) -> None:
    """Devices of one slice in row-major order over ``coord`` and their ICI links per axis."""
    strides = [math.prod(shape[ax + 1:]) for ax in range(len(shape))]
    coords = list(itertools.product(*(range(d) for d in shape)))
    graph.add_nodes_from((base + i, {"coord": c}) for i, c in enumerate(coords))
    edges = []
    for i, c in enumerate(coords):
        for ax, length in enumerate(shape):
            step = 1 if c[ax] + 1 < length else (1 - length if wraps[ax] else 0)
            if step == 0:  # an axis of 2 has one link; of 1, none
                continue
            attrs = _edge(torus.link_bytes_per_s, torus.link, f"ici_{'xyz'[ax]}", wraparound=wraps[ax])
            edges.append((base + i, base + i + step * strides[ax], attrs))
    graph.add_edges_from(edges)


def _add_hosts(graph: nx.Graph, num_devices: int, chips_per_host: int, torus: Torus) -> None:
    """Hosts own consecutive chips; each chip's DCN share -> host -> one DCN switch."""
    num_hosts = -(-num_devices // chips_per_host)
    graph.add_nodes_from((f"host/{h}", {"kind": "host", "level": "host"}) for h in range(num_hosts))
    graph.add_node("dcn", **_switch("dcn"))
    graph.add_edges_from(
        (r, f"host/{r // chips_per_host}", _edge(torus.dcn_bytes_per_s, torus.dcn_link, "host", 0.0))
        for r in range(num_devices)
    )
    graph.add_edges_from(
        (f"host/{h}", "dcn", _edge(torus.dcn_bytes_per_s * chips_per_host, torus.dcn_link, "dcn"))
        for h in range(num_hosts)
    )


def build_tpu_torus(device: DeviceSpec, num_devices: int, *, torus: Torus) -> Fabric:
    """TPU slices: 2D/3D tori with wraparound per axis as the family allows; each slice is a domain;
    hosts on the data-center network join slices (multislice).

    Examples
    --------
    >>> from clusterplan.topologies.library import build_cluster
    >>> g = build_cluster("tpu-v5e-pod").graph
    >>> g.nodes[17]["coord"], g.edges[0, 15]["wraparound"], g.edges[0, 1]["level"]
    ((1, 1), True, 'ici_y')
    """
    num_slices, shape = tpu_slice_layout(num_devices, torus.max_slice_shape)
    size = math.prod(shape)
    graph = nx.Graph()
    _add_devices(graph, num_devices, size)
    wraps = _wraps(shape, torus)
    for s in range(num_slices):
        _add_torus_slice(graph, s * size, shape, wraps, torus)
    _add_hosts(graph, num_devices, min(torus.chips_per_host, size), torus)
    return Fabric(graph=graph, domain_size=size, torus_shape=shape)


# ---- (f) SRAM-only machines ---------------------------------------------------------------------------
def build_cerebras(device: DeviceSpec, num_devices: int, *, io_bytes_per_s: float, link: Link,
                   nir_fraction: float | None) -> Fabric:
    """CS-3 systems, each wafer its own device and domain, on the SwarmX broadcast/reduce tier
    (one aggregated switch; ``io_bytes_per_s`` per system) with MemoryX, which streams weights."""
    graph = nx.Graph()
    _add_devices(graph, num_devices, 1)
    graph.add_node("swarmx", **_switch("leaf", nir_fraction))
    graph.add_node("memoryx", kind="host", level="host")
    graph.add_edges_from((r, "swarmx", _edge(io_bytes_per_s, link, "nic")) for r in range(num_devices))
    # MemoryX capacity is not published: assume it keeps up with every system at once.
    graph.add_edge("memoryx", "swarmx", **_edge(io_bytes_per_s * num_devices, link, "host"))
    return Fabric(graph=graph, domain_size=1, in_network_reduction=("swarmx",) if nir_fraction else ())


def build_groq(device: DeviceSpec, num_devices: int, *, devices_per_node: int, link: Link,
               nodes_per_rack: int, global_bytes_per_s: float) -> Fabric:
    """GroqNodes of 8 chips fully connected by C2C links; the chips' global ports form a software-
    scheduled Dragonfly, modelled as one virtual switch per rack and one above the racks (TSPs
    route for each other: there is no physical switch)."""
    graph = nx.Graph()
    _add_devices(graph, num_devices, devices_per_node)
    pair_bytes_per_s = device.scale_up_bytes_per_s / max(1, devices_per_node - 1)
    _add_full_mesh(graph, num_devices, devices_per_node, pair_bytes_per_s, link, "c2c")
    _groups_under_one_switch(graph, num_devices, devices_per_node * nodes_per_rack, "dragonfly/rack", "dragonfly/global",
                             global_bytes_per_s, global_bytes_per_s, link)
    return Fabric(graph=graph, domain_size=devices_per_node)


def _groups_under_one_switch(graph, num_devices: int, group_size: int, group_prefix: str, top: str,
                             member_bytes_per_s: float, global_bytes_per_s: float, link) -> None:
    """Each run of ``group_size`` chips hangs off its own leaf switch (``member_bytes_per_s`` per
    chip); with more than one group, the leaves join at one global switch whose links carry
    ``global_bytes_per_s`` per chip of the group (Groq's dragonfly racks, Graphcore/SambaNova pods)."""
    num_groups = -(-num_devices // group_size)
    graph.add_nodes_from((f"{group_prefix}{k}", _switch("leaf")) for k in range(num_groups))
    graph.add_edges_from((r, f"{group_prefix}{r // group_size}", _edge(member_bytes_per_s, link, "nic"))
                         for r in range(num_devices))
    if num_groups > 1:
        graph.add_node(top, **_switch("spine"))
        for k in range(num_groups):
            chips = min(group_size, num_devices - k * group_size)
            graph.add_edge(f"{group_prefix}{k}", top,
                           **_edge(global_bytes_per_s * chips, link, "spine", link.switch_hop_latency_s))


# ---- (g) grids of directly linked chips: 2D meshes (Dojo, Tenstorrent) and tori (Trainium2) ------------
def _grid_sub_shape(num_chips: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The part of a grid ``num_chips`` fill: whole trailing axes with a partial leading one when
    they divide it (a trn2 instance is 1x4x4 of the 4x4x4 UltraServer), else the most square
    rectangle that fits, axes ordered as ``shape``; None when none fits."""
    for lead in range(len(shape)):
        rest = math.prod(shape[lead + 1:])
        if num_chips % rest == 0 and num_chips // rest <= shape[lead]:
            return (1,) * lead + (num_chips // rest,) + tuple(shape[lead + 1:])
    best = None
    for dims in itertools.product(*(range(1, d + 1) for d in shape)):
        if math.prod(dims) == num_chips and (best is None or max(dims) < max(best)):
            best = dims
    return best


def grid_layout(num_chips: int, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(number of domains, the grid each occupies): part of one grid up to a whole one, beyond
    that whole grids (domains joined by the scale-out network).

    Raises
    ------
    SpecError
        When ``num_chips`` neither fits one grid nor is a multiple of a whole grid.

    Examples
    --------
    >>> grid_layout(16, (4, 4, 4)), grid_layout(128, (4, 4, 4)), grid_layout(16, (5, 5))
    ((1, (1, 4, 4)), (2, (4, 4, 4)), (1, (4, 4)))
    """
    full = math.prod(shape)
    if num_chips <= full:
        sub = _grid_sub_shape(num_chips, shape)
        if sub is not None:
            return 1, sub
    elif num_chips % full == 0:
        return num_chips // full, tuple(shape)
    fits = [n for n in range(1, full + 1) if _grid_sub_shape(n, shape)]
    raise SpecError(
        f"num_devices: {num_chips} chips do not form a {'x'.join(map(str, shape))} grid: use part of one grid "
        f"({', '.join(map(str, fits[-6:]))}, ...) or a multiple of {full} (whole grids, e.g. {2 * full})"
    )


def build_grid(device: DeviceSpec, num_devices: int, *, grid: Grid, devices_per_node: int,
               fat_tree: FatTree) -> Fabric:
    """Chips on a 2D/3D grid of direct links, one grid per domain; the grid's devices carry
    ``coord`` and their links the levels ``ici_x``/``ici_y``/``ici_z`` (axis 0, 1, 2), as TPU tori
    do, so :meth:`Cluster.group_profile` prices a group on the axes it spans: an axis that wraps
    gives a ring both of the device's links on it, a mesh axis (no wraparound) one link's worth,
    half the bandwidth of the torus ring of the same length. Domains (and, inside a domain, the
    hosts' NICs) join a rail-optimized fat-tree (EFA, TTPoE or Ethernet).

    Examples
    --------
    >>> from clusterplan.topologies.library import build_cluster
    >>> c = build_cluster("tenstorrent-galaxy", num_devices=32)
    >>> c.torus_shape, c.graph.edges[0, 1]["level"], c.graph.edges[0, 1]["wraparound"]
    ((4, 8), 'ici_y', False)
    """
    num_domains, shape = grid_layout(num_devices, grid.shape)
    size = math.prod(shape)
    wraps = tuple(w and d == full and d > 2 for w, d, full in zip(grid.wraparound, shape, grid.shape))
    graph = nx.Graph()
    _add_devices(graph, num_devices, size)
    strides = [math.prod(shape[ax + 1:]) for ax in range(len(shape))]
    coords = list(itertools.product(*(range(d) for d in shape)))
    for k in range(num_domains):
        base = k * size
        graph.add_nodes_from((base + i, {"coord": c}) for i, c in enumerate(coords))
        edges = []
        for i, c in enumerate(coords):
            for ax, length in enumerate(shape):
                step = 1 if c[ax] + 1 < length else (1 - length if wraps[ax] else 0)
                if step == 0:
                    continue
                attrs = _edge(grid.link_bytes_per_s[ax], grid.link, f"ici_{'xyz'[ax]}", wraparound=wraps[ax],
                              fabric=grid.fabric)
                edges.append((base + i, base + i + step * strides[ax], attrs))
        graph.add_edges_from(edges)
    _add_fat_tree(graph, num_devices, devices_per_node, fat_tree)
    return Fabric(graph=graph, domain_size=size, torus_shape=shape, in_network_reduction=_tags(None, fat_tree))


# ---- (h) pods: small fully linked nodes under per-pod and global virtual switches ------------------------
def build_pods(device: DeviceSpec, num_devices: int, *, devices_per_node: int, link: Link | None,
               pod_link: Link, nodes_per_pod: int, pod_bytes_per_s: float, global_bytes_per_s: float) -> Fabric:
    """Nodes of ``devices_per_node`` chips fully linked to each other (the device's scale-up rate
    shared over its peers: Graphcore's in-machine IPU-Links), one virtual switch per pod carrying
    each device's ``pod_bytes_per_s`` (IPU-Links between machines of a Bow Pod, a rack's fabric)
    and one above the pods carrying ``global_bytes_per_s`` per device (GW-Links), so traffic
    between pods is limited by the uplink/downlink ratio of the pod switch. A device without a
    published scale-up rate (``scale_up_bytes_per_s == 0``) is its own domain and reaches every
    other device through the pod switch.
    """
    scale_up = device.scale_up_bytes_per_s > 0
    if scale_up and link is None:
        raise SpecError(f"scale_up_link: device {device.id} has a scale-up rate, so the preset needs a link class")
    domain = devices_per_node if scale_up else 1
    graph = nx.Graph()
    _add_devices(graph, num_devices, domain)
    if scale_up and devices_per_node > 1:
        pair = device.scale_up_bytes_per_s / (devices_per_node - 1)
        _add_full_mesh(graph, num_devices, devices_per_node, pair, link, "c2c")
    _groups_under_one_switch(graph, num_devices, devices_per_node * nodes_per_pod, "pod/", "pods/global",
                             pod_bytes_per_s, global_bytes_per_s, pod_link)
    return Fabric(graph=graph, domain_size=domain)
