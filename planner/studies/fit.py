"""The fewest devices (or the smallest device) on which some layout of a job fits, found by search.

A size fits when the search space at that size (the job's framework, the user's bounds) holds at
least one layout that passes every structural rule and fits in memory: the same test ``plan``
applies, so the answer is a size on which ``plan`` succeeds.

Which sizes are checked, smallest first:

* none below :func:`least_devices`: the gradients and optimizer states of every parameter, spread
  over every device (the most sharding any framework offers), already exceed a device's memory;
* the sizes a job can use on the fabric (``topologies.cluster.size_step``): part of a node where the
  fabric takes it, whole nodes, and beyond one segment whole segments where the job is allocated
  segments of each scale-up domain (``--domain-devices``: Slurm's ``--segment`` on NVL72 racks); a
  size the fabric refuses (a TPU count that forms no slice) is skipped;
* every such size up to :data:`EXACT_STEPS` steps, then :data:`SIZES_PER_DOUBLING` per doubling
  (multiples of a step that doubles with the size, so round sizes such as 4,096 stay on the ladder).

Memory does not fall monotonically with the device count (the batch must divide by ``dp x
micro-batch``, layers split unevenly), so no bisection: the first size on the ladder that fits is
the answer, and :attr:`FitAnswer.every_size` says whether every size the fabric accepts between
the bound and the answer was checked. The search stops at ``max_devices``, after ``max_checks``
sizes or after ``budget_s`` seconds (then the answer is "not found", never a guess).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Iterator

import clusterplan.cost.terms as cost_terms
import clusterplan.topologies.cluster as fabric
import clusterplan.topologies.library as library
from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context, host_tier, optimizer_state_bytes, param_counts
from clusterplan.cost.terms.dp import HOST_GRAD_BYTES
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.inputs import Request
from clusterplan.planner.search import reuse
from clusterplan.planner.search.exhaustive import any_feasible
from clusterplan.planner.search.offload import optimizer_offload_offered
from clusterplan.planner.search.space import Bounds, Space, build_space, divisors, split_spaces
from clusterplan.planner.search.tables import build_tables
from clusterplan.topologies.cluster import Cluster, size_step

MAX_DEVICES = 1 << 17  # 131,072: beyond the largest cluster anyone has described
TIME_LIMIT_S = 30.0
"""Seconds the size search may take by default (``clusterplan fit --time-limit``): each size builds
its cluster and the rules and memory tables (about 0.1 s at 100 devices, 1 s at 65,536 on 2 busy
cores), and ``fit`` then plans at the answer; past it the answer is "not found"."""
SIZES_PER_DOUBLING = 16  # a power of two
EXACT_STEPS = 2 * SIZES_PER_DOUBLING
"""Every size up to 32 steps (nodes, or segments) is checked; beyond, 16 per doubling of the device
count (at most 6% apart), so that the search from the memory bound to the answer is a few dozen
sizes at any scale: a scan of every 8-chip node of a Groq rack from 560 to 4,096 chips took 220 s."""


@dataclass
class FitAnswer:
    """The smallest size that fits, or why none did within the sizes tried."""

    num_devices: int | None
    device: str
    checked: list[tuple[int, bool]]  # (devices, fits) in the order tried
    reason: str = ""
    devices_tried: list[str] | None = None  # smallest_device: the device ids, in the order tried
    least_devices: int = 1  # below it no layout can fit (:func:`least_devices`)
    offloaded_bound: bool = False  # least_devices counts the optimizer states in host memory (optimizer offload)
    every_size: bool = True  # every size the fabric accepts from least_devices to the answer was checked
    stopped: bool = False  # the time limit (or max_checks) ended the search

    def sizes_text(self) -> str:
        """The sizes checked, as ranges (:func:`sizes_text`)."""
        return sizes_text([n for n, _ in self.checked])

    def bound_text(self) -> str:
        """Why no size below :attr:`least_devices` fits (:func:`least_devices`)."""
        if self.offloaded_bound:
            return ("the gradients alone exceed device memory, or the optimizer states and fp32 gradients host "
                    "memory, wherever the optimizer lives")
        return "the gradients and optimizer states alone exceed device memory"

    def notes(self) -> list[str]:
        """What the size search checked and ruled out, one line each, for the report of an answer."""
        lines = [f"sizes checked (the layout rules and memory, the test plan applies): {self.sizes_text()}"]
        if self.least_devices > 1:
            lines.append(f"below {self.least_devices:,} devices {self.bound_text()}")
        if self.num_devices is not None and self.every_size:
            lines.append(f"every size the fabric accepts from {self.least_devices:,} to {self.num_devices:,} was "
                         f"checked")
        elif self.num_devices is not None:
            lines.append(f"beyond {EXACT_STEPS} nodes (or segments) the search checks {SIZES_PER_DOUBLING} "
                         f"sizes per doubling: a size between those checked may fit too (plan --devices N checks one)")
        return lines


def layouts_fit(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds | None = None) -> bool:
    """Whether any layout of the space fits (the test ``plan`` applies before it solves), from the
    rules and memory tables alone: a layout's step time does not decide whether it fits."""
    return _fitting_space(model, job, cluster, bounds) is not None


def _fitting_space(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds | None) -> Space | None:
    """The first space of ``split_spaces`` (each pipeline split and offload mode, as plan tries them)
    in which some layout fits, or None."""
    b = bounds or Bounds()
    try:
        space = build_space(model, job, cluster, b)
    except SpecError:
        return None
    ctx, headroom = Context(model, job, cluster), b.headroom(job, cluster)
    for sub in split_spaces(space, model, job, cluster):
        if any_feasible(build_tables(ctx, sub, headroom, memory_only=True)):
            return sub
    return None


def fitting_offload(model: ModelSpec, request: Request, n: int, bounds: Bounds | None) -> str:
    """The offload mode of the first space in which some layout fits on ``n`` devices with host offload
    offered (``Bounds.offer_offload``; ``none`` first, so a mode only where nothing fits without it),
    or "" where none fits."""
    cluster = request.with_(num_devices=n, num_nodes=None).load_cluster()
    try:
        sub = _fitting_space(model, request.build_job(model, cluster)[0], cluster,
                             replace(bounds or Bounds(), offer_offload=True))
        return sub.offload[0] if sub is not None else ""
    finally:
        release_size_caches()


def least_devices(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds | None = None) -> int:
    """The fewest devices whose memory can hold the gradients and the optimizer states of every
    parameter spread over all of them (ZeRO-3 / FSDP sharding, the most any framework offers), a
    lower bound on every size that fits: each device holds at least its share of them
    (``cost.terms.static_memory``: ``grad_bytes`` and ``optimizer_state_bytes`` per parameter of
    the most loaded stage, over the data- and context-parallel ranks at most), and weights,
    activations and the runtime only add to it. Where the search may offload the optimizer
    (``planner.search.offload.optimizer_offload_offered``), the lesser of that and the fewest devices
    whose memory holds the gradients and whose share of the host memory the states and fp32 gradients
    (``cost.terms.host_optimizer_bytes``). 1 with weight streaming (Cerebras MemoryX holds the
    weights and their states off the wafer)."""
    if cluster.weight_streaming:
        return 1
    b = bounds or Bounds()
    capacity_bytes = cluster.device.memory_bytes * (1 - b.headroom(job, cluster))
    whole = param_counts(model, 1, 1, 1, 1)  # every parameter, as the cost model counts them
    params = whole.dense + whole.expert
    least = math.ceil(params * (job.grad_bytes + optimizer_state_bytes(job)) / capacity_bytes)
    if optimizer_offload_offered(job, cluster, b):
        host_bytes = host_tier(cluster.device).capacity_bytes
        least = min(least, max(math.ceil(params * job.grad_bytes / capacity_bytes),
                               math.ceil(params * (optimizer_state_bytes(job) + HOST_GRAD_BYTES) / host_bytes)))
    return max(1, least)


def offload_refusal(job: Job, cluster: Cluster, bounds: Bounds | None = None) -> str | None:
    """Why the size search cannot count host offload, of the layer inputs (``offload=activations``) or
    of the optimizer (``offload=optimizer``), searched where the framework and the device have it
    (``planner.search.offload``), or None where it can."""
    b = bounds or Bounds()
    if "offload" in b.fixed:
        return f"the bounds hold offload={b.fixed['offload']}"
    prof = job.profile
    if not (prof.has("offload_activations") or prof.has("offload_optimizer")):
        return f"{prof.profile.describe(prof.date)} has no activation or optimizer offload clusterplan prices"
    if host_tier(cluster.device) is None:
        return f"{cluster.device.name} has no host memory tier with a bandwidth (topologies/data/devices.yaml)"
    if not prof.has("offload_activations") and not optimizer_offload_offered(job, cluster, replace(b, offer_offload=True)):
        return (f"{prof.profile.describe(prof.date)} offloads the optimizer only, and {cluster.device.name}'s host "
                "memory has no bandwidth of its own to price its CPU Adam step (memory_tiers: host, dram_gbyte_per_s)")
    return None


def fewest_with_offload(model: ModelSpec, request: Request, bounds: Bounds | None, without: FitAnswer,
                        budget_s: float | None) -> FitAnswer:
    """The fewest devices with host offload offered, given the answer ``without`` it (found with
    ``offload=none`` held): offloading only adds layouts, so only the sizes below that answer are
    checked, from the same memory bound; none fitting there, the answer is the same."""
    below = (without.num_devices or MAX_DEVICES + 1) - 1
    offered = replace(bounds or Bounds(), offer_offload=True)  # also where plan does not search it by itself
    answer = fewest_devices(model, request, offered, max_devices=below, budget_s=budget_s)
    if answer.num_devices is None and not answer.stopped and without.num_devices is not None:
        answer.num_devices = without.num_devices
    return answer


def size_ladder(reference: Cluster, first: int, last: int) -> Iterator[tuple[int, bool]]:
    """The sizes the search checks from ``first`` to ``last``, ascending, each with whether it is the
    next size the fabric accepts (False once the ladder skips some: beyond ``EXACT_STEPS`` steps).

    Below one node, the node's divisors (part of a node, where the fabric takes it: a TPU host's
    chips, a trn2 instance); then multiples of :func:`~topologies.cluster.size_step`.

    >>> from clusterplan.topologies.library import build_cluster
    >>> [n for n, _ in size_ladder(build_cluster("gb200-nvl72", domain_devices=64), 56, 800)][:6]
    [56, 60, 64, 128, 192, 256]
    """
    node = reference.devices_per_node
    for d in divisors(node)[:-1]:
        if first <= d <= last:
            yield d, True
    n = max(first, node)
    while n <= last:
        unit = size_step(reference, n)
        m = -(-n // unit)  # the next size the fabric takes is m * unit
        stride = 1 << max(0, m.bit_length() - SIZES_PER_DOUBLING.bit_length())
        size = -(-m // stride) * stride * unit
        if size > last:
            return
        yield size, size == m * unit
        n = size + 1


def fewest_devices(model: ModelSpec, request: Request, bounds: Bounds | None = None, start: int | None = None,
                   max_devices: int = MAX_DEVICES, max_checks: int | None = None,
                   budget_s: float | None = TIME_LIMIT_S, reference: Cluster | None = None) -> FitAnswer:
    """The fewest devices on the size ladder (:func:`size_ladder`), from :func:`least_devices` (and
    ``start``) up to ``max_devices``, on which some layout fits.

    Each size is the request at that device count (its other options kept), built as ``plan``
    builds it; a size the fabric cannot take is skipped. ``max_checks`` sizes or ``budget_s``
    seconds (checked before each size) bound the search; past them the answer is "not found".
    ``reference``: the request's cluster at any size (the ladder and the bound do not depend on
    it; default: built at the request's reference size).
    """
    reference = reference or request.with_(num_devices=None, num_nodes=None).load_cluster()
    job = request.build_job(model, reference)[0]
    least = least_devices(model, job, reference, bounds)
    answer = FitAnswer(None, reference.device.id, [], least_devices=least,
                       offloaded_bound=optimizer_offload_offered(job, reference, bounds or Bounds()))
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    for n, exact in size_ladder(reference, max(least, start or 1), max_devices):
        answer.every_size &= exact
        if (max_checks is not None and len(answer.checked) >= max_checks) or \
                (deadline is not None and time.perf_counter() > deadline):
            answer.stopped, answer.every_size = True, False
            answer.reason = f"not found within the {len(answer.checked)} sizes checked"
            return answer
        ok = _size_fits(model, request, n, bounds)
        if ok is not None:
            answer.checked.append((n, ok))
        if ok:
            answer.num_devices = n
            return answer
    answer.reason = f"no layout fits on up to {max_devices:,} devices"
    return answer


def _size_fits(model: ModelSpec, request: Request, n: int, bounds: Bounds | None) -> bool | None:
    """Whether some layout fits on ``n`` devices (None: the fabric cannot take ``n``)."""
    try:
        cluster = request.with_(num_devices=n, num_nodes=None).load_cluster()
    except SpecError:
        return None
    try:
        return layouts_fit(model, request.build_job(model, cluster)[0], cluster, bounds)
    finally:
        release_size_caches()


def release_size_caches() -> None:
    """Forget the terms cached for the sizes checked so far.

    Every cost and fabric term is cached on its cluster (``cost.terms.Context`` keys on the cluster
    object; ``topologies.cluster``
    caches group profiles and views per cluster; ``build_cluster`` keeps 64 clusters), so each size
    a search checked kept its whole graph alive: 120 MB per size near 80,000 devices, 21.7 GB on a
    23 GB machine in issue 41. No size's terms serve another size, so dropping them between sizes
    costs nothing.
    """
    cost_terms.clear_caches()
    for value in list(vars(fabric).values()):
        if hasattr(value, "cache_clear") and getattr(value, "__module__", "") == fabric.__name__:
            value.cache_clear()
    library._build_bundled.cache_clear()  # the clusters themselves (build_cluster's cache)
    reuse.clear()  # the tables a batch sweep keeps per problem hold their Context, hence its cluster


def sizes_text(sizes: list[int], most: int = 4) -> str:
    """Sizes as ascending runs of one step, at most ``most`` of them shown (the first, then the last
    ones) with the count: ``"8-256 every 8, 272-512 every 16 (48 sizes)"``.

    >>> sizes_text([8, 16, 24, 32, 48, 64, 80, 96, 100])
    '8-32 every 8, 48-96 every 16, 100 (9 sizes)'
    """
    runs: list[list[int]] = []
    for n in sorted(set(sizes)):
        if runs and (len(runs[-1]) == 1 or n - runs[-1][-1] == runs[-1][1] - runs[-1][0]):
            runs[-1].append(n)
        else:
            runs.append([n])
    parts = [_run_text(r) for r in runs]
    if len(parts) > most:
        parts = [parts[0], "...", *parts[-(most - 1):]]
    count = len(set(sizes))
    return f"{', '.join(parts)} ({count:,} size{'s' if count != 1 else ''})" if parts else "none"


def _run_text(run: list[int]) -> str:
    if len(run) == 1:
        return f"{run[0]:,}"
    if len(run) == 2:
        return f"{run[0]:,}, {run[1]:,}"
    return f"{run[0]:,}-{run[-1]:,} every {run[1] - run[0]:,}"


def smallest_device(model: ModelSpec, request: Request, devices: list[str],
                    bounds: Bounds | None = None) -> FitAnswer:
    """The device of ``devices`` with the least memory on which some layout fits, at the request's size."""
    checked: list[tuple[int, bool]] = []
    sized = []
    for dev in devices:
        try:
            cluster = request.with_(device=dev).load_cluster()
        except ClusterplanError:
            continue
        sized.append((cluster.device.memory_bytes, dev, cluster))
    tried: list[str] = []
    for _, dev, cluster in sorted(sized, key=lambda t: (t[0], t[1])):
        ok = layouts_fit(model, request.build_job(model, cluster)[0], cluster, bounds)
        release_size_caches()
        checked.append((cluster.num_devices, ok))
        tried.append(dev)
        if ok:
            return FitAnswer(cluster.num_devices, dev, checked, devices_tried=tried)
    return FitAnswer(None, "", checked, f"no device of the family fits at this size (tried: {', '.join(tried)})",
                     devices_tried=tried)


def fit_hint(err: InfeasibleError, answer: FitAnswer, command: str) -> InfeasibleError:
    """``err`` with its hint replaced by the answer of ``command`` (``clusterplan fit``: the same
    search, :func:`fewest_devices`); without one (none within the sizes or the time tried), what the
    search ruled out, and ``command`` to search further."""
    if answer.num_devices is None:
        stop = "within the time limit" if answer.stopped else f"on up to {max(n for n, _ in answer.checked):,} devices" \
            if answer.checked else "in the sizes tried"
        bound = f" (below {answer.least_devices:,} devices {answer.bound_text()})" if answer.least_devices > 1 else ""
        hint = (f"no device count found on which a layout fits {stop}{bound}; `{command}` searches further "
                f"(--time-limit); or a device with more memory, or a smaller model/sequence")
        return InfeasibleError(str(err), err.rejections, hint)
    hint = (f"some layout fits on {answer.num_devices:,} x {answer.device} (the fewest devices `{command}` "
            f"finds); or a device with more memory, or a smaller model/sequence")
    return InfeasibleError(str(err), err.rejections, hint)
