"""The cluster: a device spec plus a networkx graph of devices, switches and links.

Graph schema (every builder in ``builders.py`` produces exactly this):

* Device nodes are the integers ``0 .. num_devices-1`` in physical order: devices of one scale-up
  domain (an NVSwitch node, an NVL72 rack, a Gaudi box, a TPU slice) are consecutive, and inside a
  torus the order is row-major over ``coord``. Attributes: ``kind="device"``, ``domain`` (int,
  scale-up domain index), ``coord`` (tuple, torus coordinate, tori only).
* Switch or host nodes are strings (``"nvsw/3"``, ``"leaf/su0/rail2"``, ``"spine/4"``, ``"host/7"``).
  Attributes: ``kind`` (``"switch"`` or ``"host"``), ``level`` and, where the switch reduces in the
  network (NVLink SHARP, InfiniBand SHARP), ``in_network_reduction=True`` with ``nir_fraction``:
  the measured all-reduce algorithm bandwidth with in-network reduction divided by the device's
  nominal link rate to that switch (8x H100 NVLS: 275 GB/s algbw / 450 GB/s = 0.61, nccl-tests #212).
  Torus links carry ``wraparound=True`` on every device's edges along an axis that wraps.
* Edges carry ``bytes_per_s`` (nominal, per direction), ``latency_s`` (per hop), ``level`` (one of
  :data:`SCALE_UP_LEVELS` or :data:`SCALE_OUT_LEVELS`) and ``achieved_fraction``: the measured bus
  bandwidth of a large collective on that kind of link divided by its nominal rate (e.g. 370/450
  for NVLink4 rings, nccl #1455), a physical property of the link with its source in the preset.
  Parallel cables between two switches are one edge whose ``bytes_per_s`` is their sum.

The fabric question every collective asks is :meth:`Cluster.group_profile`: for one group of
device ranks, how many domains does it span, how many members per domain, and what per-device
bandwidth and per-hop latency does it get inside a domain and across domains, as read from the
edges that group's traffic uses.

Ranks are device ids, except on a torus laid out under another traversal: :meth:`Cluster.placed`
returns a view whose ranks are laid on the chips of each slice with the torus axes varying in the
traversal's order (fastest first) instead of row-major, so the same rank groups land on other
torus axes. The view shares the graph and asks it about the chips its ranks map to.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Sequence

import networkx as nx
import numpy as np

from clusterplan.models.errors import SpecError
from clusterplan.topologies.devices import DeviceSpec

SCALE_UP_LEVELS = frozenset({"nvlink", "xgmi", "ici_x", "ici_y", "ici_z", "roce_scaleup", "wafer", "c2c"})
SCALE_OUT_LEVELS = frozenset({"nic", "leaf", "spine", "core", "dcn", "host"})
TORUS_AXES = "xyz"  # coord index 0, 1, 2; device ids are row-major, so the last axis varies fastest


@dataclass(frozen=True)
class GroupProfile:
    """What one group of ranks gets from the fabric, per device and per direction."""

    num_ranks: int
    num_domains: int
    ranks_per_domain: int
    intra_bytes_per_s: float  # achieved, per device, inside a domain (0 when one rank per domain)
    inter_bytes_per_s: float  # achieved, per device, across domains (0 when one domain)
    intra_latency_s: float  # one ring step inside a domain
    inter_latency_s: float  # one ring step across domains
    intra_in_network_reduction: bool  # NVLS-like all-reduce inside the domain
    inter_in_network_reduction: bool  # SHARP-like all-reduce across domains
    intra_nir_bytes_per_s: float  # achieved all-reduce algorithm bandwidth with in-network reduction
    torus_axes: int  # torus axes the group spans inside a domain (0 for switched fabrics)
    torus_wraparound: bool  # every spanned torus axis wraps around
    min_ranks_per_domain: int = 0
    """Ranks in the domain holding the fewest of the group's: below ``ranks_per_domain`` where the
    group straddles domains unevenly (0: every domain holds ``ranks_per_domain``)."""
    inter_gpu_initiated_rdma: bool = True
    """Whether a GPU kernel can post RDMA across domains itself (InfiniBand/RoCE ConnectX, NVSHMEM's
    IBGDA) rather than through a host proxy thread (AWS EFA): ``LinkEntry.gpu_initiated_rdma`` of the
    device's NICs (true within one domain)."""
    variants: tuple["GroupProfile", ...] = ()
    """The other shapes the groups of the same communicator take (:meth:`Cluster.axis_profile`):
    where a layout's groups straddle the scale-up domains unevenly they differ from one another, all
    run their collectives at once, and the step waits for the slowest (``cost.collectives``)."""

    @property
    def fewest_ranks_per_domain(self) -> int:
        """Ranks of the group in its emptiest domain (``ranks_per_domain`` for an even group)."""
        return self.min_ranks_per_domain or self.ranks_per_domain

    @property
    def shapes(self) -> tuple["GroupProfile", ...]:
        """This group and the differently shaped groups of its communicator."""
        return (self, *self.variants)


@dataclass(frozen=True, eq=False)
class Cluster:
    """A sized cluster: ``num_devices`` copies of ``device`` wired as ``graph``.

    ``domain_size`` is the number of devices per scale-up domain; ``nodes_per_domain`` is 1 except
    for NVLink Switch domains spanning several hosts. ``family`` names the builder used.
    """

    id: str
    name: str
    family: str
    device: DeviceSpec
    num_devices: int
    domain_size: int
    devices_per_node: int
    graph: nx.Graph = field(repr=False)
    torus_shape: tuple[int, ...] | None = None
    description: str = ""
    sources: tuple[str, ...] = ()
    reference_size: int = 0
    oversubscription: float = 1.0
    in_network_reduction: tuple[str, ...] = ()
    power_overhead_w_per_device: float = 0.0
    pue: float = 1.0  # facility power usage effectiveness: energy figures are multiplied by it
    host_power_given: bool = False  # power_overhead_w_per_device was set by the user (0 included)
    weight_streaming: bool = False
    traversal: str = ""
    """Torus axes, fastest first, along which ranks are laid on each slice's chips; "" for device
    ids as built (row-major over ``coord``). Set only on the views :meth:`placed` returns."""
    base: "Cluster | None" = field(default=None, repr=False)
    """The cluster a :meth:`placed` view was made from (None on a cluster as built)."""
    rank_to_device: np.ndarray | None = field(default=None, repr=False)
    """Device id of each rank in a :meth:`placed` view."""
    link_caveats: tuple[str, ...] = ()
    """What the preset's links rest on where it is not a measurement (a link class's ``note``: EFA's
    assumed fraction and latency), as ``unvalidated`` lines for the report (``planner.caveats``)."""
    segment_devices: int = 0
    """Devices a job is allocated in each scale-up domain where not the whole domain (Slurm's block
    topology ``--segment``; ``domain_size`` is then the segment); 0 where it takes any whole nodes."""
    bandwidth_scale: tuple[float, float] = (1.0, 1.0)
    """Factors on the bandwidth collectives achieve inside and across scale-up domains (a user's
    calibration, ``planner.studies.calibration``); (1, 1) as built."""
    calibration: dict | None = field(default=None, repr=False)
    """The user's calibration asked for on this cluster (``planner.studies.calibration``): where it
    was fitted, whether it applies here, its values and its interval; None: none asked for."""

    @property
    def platform(self) -> str:
        """``tpu`` for Google TPU pods, ``gpu`` for the rest (what a framework profile runs on)."""
        return "tpu" if self.device.family.startswith("google-tpu") else "gpu"

    @property
    def num_domains(self) -> int:
        return -(-self.num_devices // self.domain_size)

    @property
    def num_nodes(self) -> int:
        return -(-self.num_devices // self.devices_per_node)

    @property
    def physical(self) -> "Cluster":
        """The cluster as built: ranks are device ids."""
        return self.base or self

    @property
    def torus_axis_names(self) -> str:
        """Names of the torus axes (``"xyz"`` for a 3D torus), "" for other fabrics."""
        return TORUS_AXES[: len(self.torus_shape)] if self.torus_shape else ""

    @property
    def default_traversal(self) -> str:
        """Row-major device ids: the last torus axis varies fastest (``"zyx"`` in 3D, ``"yx"`` in 2D)."""
        return self.torus_axis_names[::-1]

    def traversals(self) -> tuple[str, ...]:
        """One traversal of each class that gives different groups, the default first.

        Two traversals meeting the same sequence of axis lengths, wraparound flags and link
        bandwidths lay every rank group on congruent chips, so only the first of each class is kept
        (on a 4x4x4 cube every traversal is the default one; on 4x4x8 three classes remain).
        Axes of length 1 carry nothing and are left out of the comparison.
        """
        seen, out = set(), []
        for t in map("".join, itertools.permutations(self.default_traversal)):
            key = tuple(self._torus_axis_facts(a) for a in t if self.torus_shape[TORUS_AXES.index(a)] > 1)
            if key not in seen:
                seen.add(key)
                out.append(t)
        return tuple(out)

    def _torus_axis_facts(self, axis: str) -> tuple[int, bool, float]:
        """(length, wraps, achieved link bandwidth) of one torus axis, read from device 0's edges."""
        base = self.physical
        edges = [d for d in base.graph.adj[0].values() if d["level"] == f"ici_{axis}"]
        return (base.torus_shape[TORUS_AXES.index(axis)], any(d.get("wraparound") for d in edges),
                max((_achieved(d) for d in edges), default=0.0))

    def traversal_problem(self, traversal: str) -> str | None:
        """Why ``traversal`` cannot lay ranks on this cluster, or None ("" is always fine)."""
        if not traversal:
            return None
        if self.torus_shape is None:
            return f"{self.id} is not a torus, so the order takes no @ suffix"
        axes = self.torus_axis_names
        if sorted(traversal) != sorted(axes):
            shape = "x".join(map(str, self.torus_shape))
            return (f"the @ suffix must list the torus axes {', '.join(axes)} of the {shape} slice, each once, "
                    f"fastest first (default @{self.default_traversal})")
        return None

    def placed(self, traversal: str) -> "Cluster":
        """This cluster with ranks laid on each slice's chips along ``traversal`` (fastest first).

        ``""`` or the default traversal return the cluster as built. Within a slice, rank ``q`` is
        decomposed in mixed radix over the torus lengths in the traversal's order and mapped to the
        row-major chip id of that coordinate; ranks of later slices stay in their slice.

        Raises
        ------
        SpecError
            When ``traversal`` is not a permutation of this cluster's torus axes.

        Examples
        --------
        >>> from clusterplan.topologies.library import build_cluster
        >>> c = build_cluster("tpu-v5p-pod", num_devices=128)  # 4x4x8
        >>> c.placed("xyz").rank_to_device[:5].tolist()  # x fastest: ranks 0-3 walk the x axis
        [0, 32, 64, 96, 8]
        """
        problem = self.traversal_problem(traversal)
        if problem:
            raise SpecError(f"order: got traversal {traversal!r}; {problem}")
        if traversal in ("", self.default_traversal):
            return self.physical
        return _placed(self.physical, traversal)

    def devices(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """Device ids of ``ranks``, sorted."""
        if self.rank_to_device is None:
            return tuple(sorted(ranks))
        return tuple(sorted(self.rank_to_device[np.asarray(ranks, dtype=np.int64)].tolist()))

    def ranks(self, devices: Sequence[int]) -> tuple[int, ...]:
        """Ranks of device ids ``devices``, sorted: the inverse of :meth:`devices`."""
        if self.rank_to_device is None:
            return tuple(sorted(devices))
        return tuple(sorted(self._device_to_rank[np.asarray(devices, dtype=np.int64)].tolist()))

    @cached_property
    def _device_to_rank(self) -> np.ndarray:
        """The inverse of :attr:`rank_to_device`, computed once per placed view."""
        inverse = np.empty_like(self.rank_to_device)
        inverse[self.rank_to_device] = np.arange(len(self.rank_to_device))
        return inverse

    def torus_span(self, ranks: Sequence[int]) -> list[tuple[str, int, int, bool]]:
        """The torus axes a group spans inside its slice: ``(axis, extent, length, wraps)`` each,
        ``wraps`` when the group closes the axis's ring (what :attr:`GroupProfile.torus_wraparound`
        counts). Empty on other fabrics."""
        if self.torus_shape is None:
            return []
        base, devices = self.physical, self.devices(ranks)
        first = [d for d in devices if base.graph.nodes[d]["domain"] == base.graph.nodes[devices[0]]["domain"]]
        coords = [base.graph.nodes[d]["coord"] for d in first]
        out = []
        for ax, name in enumerate(self.torus_axis_names):
            extent = len({c[ax] for c in coords})
            if extent > 1:
                length, wraps, _ = self._torus_axis_facts(name)
                out.append((name, extent, length, wraps and extent == length and extent > 2))
        return out

    def group_profile(self, ranks: Sequence[int]) -> GroupProfile:
        """Read from the graph what bandwidth and latency the group ``ranks`` gets.

        Parameters
        ----------
        ranks : device ranks of one communicator (all groups of a parallel axis are translates of
            one another, so one representative group describes the axis).

        Returns
        -------
        GroupProfile
        """
        return _group_profile(self.physical, self.devices(ranks))

    def strided_profile(self, count: int, stride: int) -> GroupProfile:
        """:meth:`axis_profile` of ``0, stride, ..., (count - 1) * stride``, cached by its shape."""
        return _axis_profile(self, ((count, stride),))

    def axis_profile(self, ranks: Sequence[int]) -> GroupProfile:
        """The profile of the communicator whose group holding rank 0 is ``ranks``: that group's
        :meth:`group_profile`, with the other shapes its translates take as ``variants``.

        A layout builds every communicator of an axis (or of several axes together) from arithmetic
        progressions of ranks, ``(count, stride)`` each; its groups are the translates of the one
        holding rank 0, by the ranks whose digits along those progressions are 0. Where they tile
        the scale-up domains evenly they all look alike; where they straddle them unevenly (dp groups
        of 32 on 72-GPU racks: 0-31, 32-63, then 64-95 with 8 ranks in one rack and 24 in the next)
        they differ, and each distinct split of ranks over domains is profiled once, the first group
        with it standing for the others (what they share beyond it, e.g. which switch tiers their
        traffic climbs, is read from that group). ``ranks`` of another shape: their own profile.

        Examples
        --------
        >>> from clusterplan.topologies.library import build_cluster
        >>> nvl72 = build_cluster("gb200-nvl72", num_devices=256)
        >>> [(v.num_domains, v.ranks_per_domain, v.fewest_ranks_per_domain) for v in nvl72.strided_profile(32, 1).shapes]
        [(1, 32, 32), (2, 24, 8), (2, 16, 16)]
        """
        return _ranks_profile(self, ranks if type(ranks) is tuple else tuple(int(r) for r in ranks))

    def neighbour_profile(self, count: int, stride: int, ring: bool = False) -> GroupProfile:
        """Point-to-point between neighbours along an axis of ``count`` ranks at ``stride``: the
        pair ``(0, stride)`` with, as ``variants``, a pair that crosses a domain boundary where some
        does (pipeline stages of 4 ranks' stride on 8-GPU nodes: 0-4 inside a node, 4-8 across);
        ``ring`` adds the pairs that close each ring (context parallelism's last rank to its first).
        Each step waits for its slowest pair."""
        return _neighbour_profile(self, count, stride, ring)


def _edge(graph: nx.Graph, u, v) -> dict:
    return graph.edges[u, v]


def _device_edges(graph: nx.Graph, rank: int, levels: frozenset[str]) -> list[tuple[object, dict]]:
    return [(v, d) for v, d in graph.adj[rank].items() if d["level"] in levels]


def _achieved(d: dict) -> float:
    return d["bytes_per_s"] * d.get("achieved_fraction", 1.0)


def _intra_bandwidth(cluster: Cluster, rank: int, members: set[int]) -> tuple[float, float, bool, float, int, bool]:
    """Per-device achieved scale-up bandwidth for a group, its per-hop latency, and torus facts.

    Switched domains (NVSwitch, NVLink Switch): the device's links to its switches, whatever the
    group size. Direct meshes (MI300X xGMI, Gaudi RoCE): only the links to peers inside the group
    carry its traffic. Tori: only the links along axes the group spans; an axis without a
    wraparound link forces the ring to double back over the same links, halving the bandwidth.
    """
    graph = cluster.graph
    edges = _device_edges(graph, rank, SCALE_UP_LEVELS)
    if not edges:
        return 0.0, 0.0, False, 0.0, 0, False
    to_switch = [(v, d) for v, d in edges if not isinstance(v, int)]
    if to_switch:
        bw = sum(_achieved(d) for _, d in to_switch)
        lat = 2 * max(d["latency_s"] for _, d in to_switch)
        nir_nodes = [v for v, _ in to_switch if graph.nodes[v].get("in_network_reduction")]
        nir_fraction = max((graph.nodes[v].get("nir_fraction", 0.0) for v in nir_nodes), default=0.0)
        nir_bw = sum(d["bytes_per_s"] for _, d in to_switch) * nir_fraction
        return bw, lat, bool(nir_nodes), nir_bw, 0, False
    peers = [(v, d) for v, d in edges if v in members]
    if cluster.torus_shape is None:
        bw = sum(_achieved(d) for _, d in peers)
        lat = max((d["latency_s"] for _, d in peers), default=0.0)
        return bw, lat, False, 0.0, 0, False
    return _torus_bandwidth(cluster, rank, members, edges)


def _torus_bandwidth(cluster: Cluster, rank: int, members: set[int], edges) -> tuple[float, float, bool, float, int, bool]:
    graph = cluster.graph
    coord = graph.nodes[rank]["coord"]
    member_coords = [graph.nodes[m]["coord"] for m in members]
    spanned = [ax for ax in range(len(coord)) if len({c[ax] for c in member_coords}) > 1]
    bw, lat, wrap_all = 0.0, 0.0, True
    for ax in spanned:
        extent = len({c[ax] for c in member_coords})
        axis_edges = [d for v, d in edges if d["level"] == f"ici_{'xyz'[ax]}"]
        wraps = extent == cluster.torus_shape[ax] and extent > 2 and any(d.get("wraparound") for d in axis_edges)
        # With its wraparound link the axis is a ring: a bidirectional ring drives both of the
        # device's links on that axis. Without it, a ring laid on a line uses each link in both
        # directions for the same ring, so the device gets one link's worth ("How to Scale Your
        # Model" pt 3: no wraparound ~2x slower). Counted per link, not as half the device's edges:
        # a device at the end of a line (or in a 2-member group) has one edge, or an edge to a
        # non-member, which must not change the group's bandwidth.
        axis_bw = max(_achieved(d) for d in axis_edges) * (2.0 if wraps else 1.0)
        bw += axis_bw
        lat = max([lat] + [d["latency_s"] for d in axis_edges])
        wrap_all &= wraps
    return bw, lat, False, 0.0, len(spanned), wrap_all and bool(spanned)


@lru_cache(maxsize=64)
def _scale_out_view(cluster: Cluster) -> nx.Graph:
    g = cluster.graph
    return nx.subgraph_view(g, filter_edge=lambda u, v: g.edges[u, v]["level"] in SCALE_OUT_LEVELS)


def _uplink_ratio(cluster: Cluster, switch) -> float:
    """Uplink over downlink capacity of a switch: below 1 means oversubscribed."""
    graph, level = cluster.graph, cluster.graph.nodes[switch].get("level")
    order = ["nic", "leaf", "spine", "core"]
    up = down = 0.0
    for v, d in graph.adj[switch].items():
        other = graph.nodes[v]
        if other.get("kind") == "device" or (level in order and other.get("level") in order and order.index(other.get("level")) < order.index(level)):
            down += d["bytes_per_s"]
        else:
            up += d["bytes_per_s"]
    return 1.0 if down == 0 or up == 0 else min(1.0, up / down)


def _inter_bandwidth(cluster: Cluster, ranks: tuple[int, ...]) -> tuple[float, float, bool, bool]:
    """Per-device achieved bandwidth across domains for this group, per-hop latency, SHARP, and
    whether every NIC of the device takes GPU-initiated RDMA (``LinkEntry.gpu_initiated_rdma``).

    The device's own scale-out edges give its NIC rate; the path to the farthest member in another
    domain says which switch tiers the traffic climbs, and each tier's uplink/downlink ratio
    (oversubscription) scales the rate down.
    """
    graph = cluster.graph
    first = ranks[0]
    nic_edges = _device_edges(graph, first, SCALE_OUT_LEVELS)
    if not nic_edges:
        return 0.0, 0.0, False, True
    bw = sum(_achieved(d) for _, d in nic_edges)
    gpu_rdma = all(d.get("gpu_initiated_rdma", True) for _, d in nic_edges)
    # Several devices sharing one host NIC (TPU hosts): the edge to the host is the device's share.
    other_domain = [r for r in ranks if graph.nodes[r]["domain"] != graph.nodes[first]["domain"]]
    farthest = other_domain[-1]
    path_nodes = nx.shortest_path(_scale_out_view(cluster), first, farthest)
    edges = [graph.edges[u, v] for u, v in zip(path_nodes, path_nodes[1:])]
    switches = [n for n in path_nodes[1:-1] if graph.nodes[n].get("kind") == "switch"]
    # Oversubscription bites at every switch the traffic must climb out of (all but the top one).
    top = len(switches) // 2
    ratio = 1.0
    for sw in switches[:top]:
        ratio = min(ratio, _uplink_ratio(cluster, sw))
    latency = sum(d["latency_s"] for d in edges)
    sharp = bool(switches) and all(graph.nodes[s].get("in_network_reduction") for s in switches)
    return bw * ratio, latency, sharp, gpu_rdma


@lru_cache(maxsize=4096)
def _group_profile(cluster: Cluster, ranks: tuple[int, ...]) -> GroupProfile:
    graph = cluster.graph
    domains: dict[int, list[int]] = {}
    for r in ranks:
        domains.setdefault(graph.nodes[r]["domain"], []).append(r)
    per_domain = max(len(v) for v in domains.values())
    first_domain = domains[graph.nodes[ranks[0]]["domain"]]
    intra_bw = intra_lat = nir_bw = 0.0
    nir, axes, wraps = False, 0, False
    if per_domain > 1:
        # An uneven group's collective goes at the pace of its slowest part: on a direct mesh the part
        # with the fewest members has the fewest links among them. An even group reads its first part.
        looks = [first_domain] if len(first_domain) > 1 else []
        smallest = min((v for v in domains.values() if len(v) > 1), key=len)
        if not looks or len(smallest) < len(looks[0]):
            looks.append(smallest)
        reads = [_intra_bandwidth(cluster, part[0], set(part)) for part in looks]
        intra_bw, intra_lat = min(r[0] for r in reads), max(r[1] for r in reads)
        nir, nir_bw = all(r[2] for r in reads), min(r[3] for r in reads)
        axes, wraps = reads[0][4], reads[0][5]
    inter_bw = inter_lat = 0.0
    sharp, gpu_rdma = False, True
    if len(domains) > 1:
        inter_bw, inter_lat, sharp, gpu_rdma = _inter_bandwidth(cluster, ranks)
    up, out = cluster.bandwidth_scale
    return GroupProfile(
        num_ranks=len(ranks),
        num_domains=len(domains),
        ranks_per_domain=per_domain,
        intra_bytes_per_s=intra_bw * up,
        inter_bytes_per_s=inter_bw * out,
        intra_latency_s=intra_lat,
        inter_latency_s=inter_lat,
        intra_in_network_reduction=nir and per_domain > 2,
        inter_in_network_reduction=sharp,
        intra_nir_bytes_per_s=nir_bw * up,
        torus_axes=axes,
        torus_wraparound=wraps,
        min_ranks_per_domain=min(len(v) for v in domains.values()),
        inter_gpu_initiated_rdma=gpu_rdma,
    )



def _progressions(ranks: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """``ranks`` as a product of arithmetic progressions from 0, ``(count, stride)`` each, innermost
    first (how a layout's order builds its groups); None for a set of another shape."""
    todo = set(ranks)
    have, axes = {0}, []
    if 0 not in todo:
        return None
    while len(have) < len(todo):
        stride = min(todo - have)
        count = 1
        while all(h + count * stride in todo for h in have):
            count += 1
        grown = {h + j * stride for h in have for j in range(count)}
        if count == 1 or len(grown) != len(have) * count:
            return None
        have = grown
        axes.append((count, stride))
    return tuple(axes) if have == todo else None


@lru_cache(maxsize=4096)
def _ranks_profile(cluster: Cluster, ranks: tuple[int, ...]) -> GroupProfile:
    axes = _progressions(ranks)
    return _group_profile(cluster.physical, cluster.devices(ranks)) if axes is None else _axis_profile(cluster, axes)


@lru_cache(maxsize=64)
def _rank_domains(cluster: Cluster) -> np.ndarray:
    """The scale-up domain of each rank of ``cluster`` (a view's ranks through its device map)."""
    graph = cluster.physical.graph
    domains = np.array([graph.nodes[d]["domain"] for d in range(cluster.num_devices)], dtype=np.int64)
    return domains if cluster.rank_to_device is None else domains[cluster.rank_to_device]


def _translates(n: int, axes: tuple[tuple[int, int], ...]) -> np.ndarray | None:
    """Every group built like the progressions ``axes``, one row of ranks each (the group of rank 0
    first); None where they do not tile ``range(n)`` (progressions that are no layout's digits)."""
    rank = np.arange(n)
    base = np.ones(n, bool)
    members = np.zeros(1, np.int64)
    for count, stride in axes:
        base &= (rank // stride) % count == 0
        members = (members[:, None] + np.arange(count) * stride).ravel()
    rows = rank[base][:, None] + np.sort(members)[None, :]
    if rows.size != n or rows.max() >= n or not (np.bincount(rows.ravel(), minlength=n) == 1).all():
        return None
    return rows


def _splits(domains: np.ndarray) -> np.ndarray:
    """Per row of domain ids, the ranks in each domain, most first (0-padded to the row length)."""
    groups, k = domains.shape
    ordered = np.sort(domains, axis=1)
    new_run = np.ones((groups, k), bool)
    new_run[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run = np.cumsum(new_run, axis=1) - 1
    counts = np.bincount((np.arange(groups)[:, None] * k + run).ravel(), minlength=groups * k).reshape(groups, k)
    return -np.sort(-counts, axis=1)


def _one_domain_or_whole_domains(cluster: Cluster) -> bool:
    return cluster.num_devices <= cluster.domain_size or cluster.num_devices % cluster.domain_size == 0


def _splits_alike(cluster: Cluster, axes: tuple[tuple[int, int], ...]) -> bool:
    """Whether every group built from ``axes`` splits over the domains as rank 0's does, known without
    listing them. On whole domains, progressions that stride over whole domains move a group's ranks
    domain by domain, so the others decide: all of them inside a domain's share (the widest span
    divides the domain), or one that fills whole domains alike (its stride divides the domain and its
    span is whole domains: tp x cp = 32 on 8-GPU nodes)."""
    if cluster.num_devices <= cluster.domain_size:
        return True
    if not _one_domain_or_whole_domains(cluster):
        return False
    d = cluster.domain_size
    within = [(count, stride) for count, stride in axes if stride % d]
    if not within or d % max(count * stride for count, stride in within) == 0:
        return True
    (count, stride), = within if len(within) == 1 else ((0, 0),)
    return count > 0 and d % stride == 0 and count * stride % d == 0


@lru_cache(maxsize=4096)
def _axis_profile(cluster: Cluster, axes: tuple[tuple[int, int], ...]) -> GroupProfile:
    """:meth:`Cluster.axis_profile` of the group built from the progressions ``axes``."""
    rows = None if _splits_alike(cluster, axes) else _translates(cluster.num_devices, axes)
    if rows is None:  # every group alike, or not a tiling of the cluster: the group of rank 0
        members = np.zeros(1, np.int64)
        for count, stride in axes:
            members = (members[:, None] + np.arange(count) * stride).ravel()
        return _group_profile(cluster.physical, cluster.devices(members.tolist()))
    _, first = np.unique(_splits(_rank_domains(cluster)[rows]), axis=0, return_index=True)
    profiles = [_group_profile(cluster.physical, cluster.devices(rows[i].tolist())) for i in sorted(first)]
    return _with_variants(profiles)


def _with_variants(profiles: list[GroupProfile]) -> GroupProfile:
    """The first profile, the distinct others as its variants."""
    variants = tuple(dict.fromkeys(p for p in profiles[1:] if p != profiles[0]))
    return replace(profiles[0], variants=variants) if variants else profiles[0]


@lru_cache(maxsize=4096)
def _neighbour_profile(cluster: Cluster, count: int, stride: int, ring: bool) -> GroupProfile:
    if count < 2:
        return _group_profile(cluster.physical, cluster.devices((0,)))
    d = cluster.domain_size
    if cluster.num_devices <= d or (_one_domain_or_whole_domains(cluster) and (stride % d == 0 or d % (count * stride) == 0)):
        return _group_profile(cluster.physical, cluster.devices((0, stride)))  # every pair crosses, or none
    rank = np.arange(cluster.num_devices)
    digit = (rank // stride) % count
    lower = rank[(digit < count - 1) & (rank + stride < cluster.num_devices)]
    pairs = [np.stack([lower, lower + stride], axis=1)]
    if ring and count > 2:
        first = rank[(digit == 0) & (rank + (count - 1) * stride < cluster.num_devices)]
        pairs.append(np.stack([first, first + (count - 1) * stride], axis=1))
    pairs = np.concatenate(pairs)
    domains = _rank_domains(cluster)[pairs]
    crossing = np.flatnonzero(domains[:, 0] != domains[:, 1])
    inside = np.flatnonzero(domains[:, 0] == domains[:, 1])
    picks = [0] + [int(w[0]) for w in (inside, crossing) if len(w)]
    return _with_variants([_group_profile(cluster.physical, cluster.devices(pairs[i].tolist())) for i in picks])


@lru_cache(maxsize=64)
def _placed(cluster: Cluster, traversal: str) -> Cluster:
    """The :meth:`Cluster.placed` view, one object per (cluster, traversal): cost caches key on it."""
    shape, size = cluster.torus_shape, cluster.domain_size
    rank = np.arange(size)
    device = np.zeros(size, dtype=np.int64)
    for axis in traversal:  # fastest first: peel one mixed-radix digit per axis
        ax = TORUS_AXES.index(axis)
        device += (rank % shape[ax]) * math.prod(shape[ax + 1:])
        rank //= shape[ax]
    ranks = np.arange(cluster.num_devices)
    mapping = (ranks // size) * size + device[ranks % size]
    mapping.setflags(write=False)
    return replace(cluster, traversal=traversal, base=cluster, rank_to_device=mapping)


def size_step(cluster: Cluster, num_devices: int) -> int:
    """The step between the device counts near ``num_devices`` that a job can use on ``cluster``'s
    fabric (at any size of it): a whole node; beyond one segment, where the job is allocated whole
    segments of each scale-up domain (``Cluster.segment_devices``: Slurm's block topology
    ``--segment``), a whole segment. A job on whole nodes of NVL72 racks may use part of its last
    rack (76 = 72 + 4): groups that straddle the racks unevenly are priced at their slowest group
    (``Cluster.axis_profile``). Tori and grids step by whole nodes (hosts, instances): their own
    rules (``builders.tpu_slice_layout``, ``builders.grid_layout``) say which counts form slices or
    grids.

    >>> from clusterplan.topologies.library import build_cluster
    >>> nvl72, segments = build_cluster("gb200-nvl72"), build_cluster("gb200-nvl72", domain_devices=64)
    >>> size_step(nvl72, 100), size_step(segments, 60), size_step(segments, 100)
    (4, 4, 64)
    """
    node, segment = cluster.devices_per_node, cluster.segment_devices
    if segment and num_devices > segment:
        return segment
    return node


def with_what_if(cluster: "Cluster", price_per_device_hour: float | None, pue: float | None,
                 host_power_w: float | None = None) -> "Cluster":
    """``cluster`` with a rental price per device-hour, a facility PUE and a host power per device
    set (None: unchanged)."""
    from dataclasses import replace

    changes: dict = {}
    if host_power_w is not None:
        changes.update(power_overhead_w_per_device=float(host_power_w), host_power_given=True)
    if price_per_device_hour is not None:
        changes["device"] = cluster.device.model_copy(update={"price_per_hour_usd": float(price_per_device_hour)})
    if pue is not None:
        changes["pue"] = float(pue)
    return replace(cluster, **changes) if changes else cluster
