"""Alpha-beta collective times over the bandwidths the fabric gives one group.

Every function takes the per-rank buffer size ``size_bytes`` (the full, un-sharded buffer for
all-gather and reduce-scatter, as nccl-tests counts it) and a :class:`GroupProfile` read from the
cluster graph, and returns seconds. Where several algorithms exist (flat ring, hierarchical,
in-network reduction) the fastest is used, as NCCL's tuner does.

Sources: ring all-reduce ``2 (k-1)/k * S / W + 2 (k-1) alpha`` and reduce-scatter/all-gather
``(k-1)/k * S / W`` (Thakur et al. 2005; nccl-tests doc/PERFORMANCE.md bus-bandwidth factors);
hierarchical all-reduce (reduce-scatter in the node, all-reduce of ``S/k_local`` across nodes,
all-gather in the node; FORMULAS.md); in-network reduction sends each byte once (NVLS/SHARP,
nccl-tests PR #239); torus rings per axis ("How to Scale Your Model", part 3).

Groups that straddle the scale-up domains unevenly (``k_max`` ranks in the fullest domain,
``k_min`` in the emptiest) go at the pace of their slowest part: a ring leaves each domain through
the NICs of the ranks it has there, so through ``k_min`` NICs where it has fewest; a hierarchical
collective reduces inside every domain at once, the fullest (``k_max`` ranks) last, and each
domain's ranks carry its whole buffer across, ``S / k_min`` each where it has fewest; an
all-to-all's rank in the emptiest domain sends the most off it, ``(k - k_min) / k`` of its buffer.
Where a layout's groups differ in shape (``GroupProfile.variants``), all run at once and the step
waits for the slowest: each function returns the slowest over the shapes. docs/cost-model.md,
section 1.2, derives both.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from functools import wraps
from typing import Iterator

from clusterplan.topologies.cluster import GroupProfile

_MEMO: dict | None = None  # while ``memoized`` runs: (collective, sizes..., id(profile)) -> (profile, seconds)


@contextmanager
def memoized() -> Iterator[None]:
    """Within the block, each collective is timed once per sizes and group profile object and its
    time reused (a search's data-parallel tables ask the same gradient reduction once per ZeRO stage);
    the times are forgotten when the outermost block ends. Each entry holds its profile, so the id it
    is keyed on stays that object's."""
    global _MEMO
    outer = _MEMO
    _MEMO = {} if outer is None else outer
    try:
        yield
    finally:
        _MEMO = outer


def _slowest_shape(collective):
    """``collective`` over every shape of the profile's groups (``GroupProfile.shapes``): the slowest."""
    @wraps(collective)
    def timed(*args: float | GroupProfile) -> float:
        *sizes, p = args
        memo = _MEMO
        if memo is not None:
            hit = memo.get(key := (collective, *sizes, id(p)))
            if hit is not None and hit[0] is p:
                return hit[1]
        seconds = max(collective(*sizes, shape) for shape in p.shapes) if p.variants else collective(*args)
        if memo is not None:
            memo[key] = (p, seconds)
        return seconds
    return timed


def _ring_bandwidth(p: GroupProfile) -> float:
    """Bus bandwidth of a flat ring: each domain's segment leaves through its ``k_local`` NICs."""
    limits = []
    if p.ranks_per_domain > 1:
        limits.append(p.intra_bytes_per_s)
    if p.num_domains > 1:  # the domain holding fewest of the group's ranks has fewest NICs to leave by
        limits.append(p.fewest_ranks_per_domain * p.inter_bytes_per_s)
    return min(limits) if limits else math.inf


def _ring_latency(p: GroupProfile, steps_per_rank: int) -> float:
    """NCCL ring latency: inter-domain steps pay the network hop, the rest the scale-up hop."""
    inter_steps = steps_per_rank * (p.num_domains - 1) if p.num_domains > 1 else 0
    intra_steps = steps_per_rank * (p.num_ranks - 1) - inter_steps
    return intra_steps * p.intra_latency_s + inter_steps * p.inter_latency_s


def _phase_time(fraction_bytes: float, bandwidth: float) -> float:
    return 0.0 if fraction_bytes <= 0 else fraction_bytes / bandwidth


@_slowest_shape
def all_reduce_s(size_bytes: float, p: GroupProfile) -> float:
    """All-reduce of ``size_bytes`` per rank over the group; 0 for a group of one."""
    k = p.num_ranks
    if k <= 1 or size_bytes <= 0:
        return 0.0
    ring = 2 * (k - 1) / k * size_bytes / _ring_bandwidth(p) + _ring_latency(p, 2)
    options = [ring]
    kl, n = p.ranks_per_domain, p.num_domains
    if n > 1 and kl > 1:
        options.append(_hierarchical_all_reduce_s(size_bytes, p))
    if n == 1 and p.intra_in_network_reduction and p.intra_nir_bytes_per_s > 0:
        # NVLS: each rank sends its buffer to the switch once and receives the sum once.
        options.append(size_bytes / p.intra_nir_bytes_per_s + 2 * p.intra_latency_s)
    return min(options)


def _hierarchical_all_reduce_s(size_bytes: float, p: GroupProfile) -> float:
    kl, n = p.ranks_per_domain, p.num_domains
    intra = 2 * _phase_time((kl - 1) / kl * size_bytes, p.intra_bytes_per_s)  # the fullest domain's
    shard = size_bytes / p.fewest_ranks_per_domain  # what each rank of the emptiest domain carries across
    if p.inter_in_network_reduction:
        inter = shard / p.inter_bytes_per_s  # SHARP: each byte crosses the NIC once each way
    else:
        inter = 2 * (n - 1) / n * shard / p.inter_bytes_per_s
    latency = 2 * (kl - 1) * p.intra_latency_s + 2 * (n - 1) * p.inter_latency_s
    return intra + inter + latency


@_slowest_shape
def reduce_scatter_s(size_bytes: float, p: GroupProfile) -> float:
    """Reduce-scatter of a ``size_bytes`` buffer (each rank keeps ``1/k`` of it)."""
    k = p.num_ranks
    if k <= 1 or size_bytes <= 0:
        return 0.0
    ring = (k - 1) / k * size_bytes / _ring_bandwidth(p) + _ring_latency(p, 1)
    kl, n = p.ranks_per_domain, p.num_domains
    if n > 1 and kl > 1:
        hier = (_phase_time((kl - 1) / kl * size_bytes, p.intra_bytes_per_s)
                + (n - 1) / n * size_bytes / p.fewest_ranks_per_domain / p.inter_bytes_per_s
                + (kl - 1) * p.intra_latency_s + (n - 1) * p.inter_latency_s)
        return min(ring, hier)
    return ring


def all_gather_s(size_bytes: float, p: GroupProfile) -> float:
    """All-gather into a ``size_bytes`` buffer; the mirror image of reduce-scatter."""
    return reduce_scatter_s(size_bytes, p)


@_slowest_shape
def all_to_all_s(size_bytes: float, p: GroupProfile) -> float:
    """All-to-all where each rank holds ``size_bytes`` and keeps ``1/k`` of it.

    The ``k_local - 1`` peers inside the domain are reached over scale-up links, the others over
    the rank's NIC; both proceed at once, so the slower side sets the time (How to Scale Your
    Model, part 12: ``B / (M * W_node)`` across ``M`` nodes).
    """
    k = p.num_ranks
    if k <= 1 or size_bytes <= 0:
        return 0.0
    kl = p.ranks_per_domain
    intra = _phase_time(size_bytes * (kl - 1) / k, p.intra_bytes_per_s)
    inter = _phase_time(size_bytes * (k - p.fewest_ranks_per_domain) / k, p.inter_bytes_per_s)
    latency = (kl - 1) * p.intra_latency_s + (p.num_domains - 1) * p.inter_latency_s
    return max(intra, inter) + latency


@_slowest_shape
def hierarchical_all_to_all_s(size_bytes: float, remote_bytes: float, p: GroupProfile) -> float:
    """All-to-all that crosses the fabric once per destination domain (DeepEP's internode kernels:
    a token goes over RDMA once to each node holding any of its experts, and is forwarded to those
    experts' devices over the scale-up links there).

    ``size_bytes``: what the rank sends in all (every copy); ``remote_bytes``: what leaves its
    domain after deduplication. Both phases run at once; the slower sets the time.
    """
    k = p.num_ranks
    if k <= 1 or size_bytes <= 0:
        return 0.0
    kl = p.ranks_per_domain
    intra = _phase_time(size_bytes * (kl - 1) / kl, p.intra_bytes_per_s)
    inter = _phase_time(remote_bytes, p.inter_bytes_per_s)
    latency = (kl - 1) * p.intra_latency_s + (p.num_domains - 1) * p.inter_latency_s
    return max(intra, inter) + latency


@_slowest_shape
def p2p_s(size_bytes: float, p: GroupProfile) -> float:
    """Point-to-point send of ``size_bytes`` between the two ranks of ``p``."""
    if p.num_ranks <= 1 or size_bytes <= 0:
        return 0.0
    if p.num_domains > 1:
        return size_bytes / p.inter_bytes_per_s + p.inter_latency_s
    return size_bytes / p.intra_bytes_per_s + p.intra_latency_s
