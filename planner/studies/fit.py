"""The fewest devices (or the smallest device) on which some layout of a job fits, found by search.

A size fits when the search space at that size (the job's framework, the user's bounds) holds at
least one layout that passes every structural rule and fits in memory: the same test ``plan``
applies, so the answer is a size on which ``plan`` succeeds. Memory does not fall monotonically
with the device count (the batch must divide by ``dp x micro-batch``, layers split unevenly), so
the search doubles until a size fits and then scans every size the fabric accepts below it, from
the smallest up: the first that fits is the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.inputs import Request
from clusterplan.planner.search.exhaustive import any_feasible, smallest_memory
from clusterplan.planner.search.space import Bounds, build_space, split_spaces
from clusterplan.planner.search.tables import build_tables
from clusterplan.topologies.cluster import Cluster

MAX_DEVICES = 1 << 17  # 131,072: beyond the largest cluster anyone has described


@dataclass
class FitAnswer:
    """The smallest size that fits, or why none did within the sizes tried."""

    num_devices: int | None
    device: str
    checked: list[tuple[int, bool]]  # (devices, fits) in the order tried
    reason: str = ""
    devices_tried: list[str] | None = None  # smallest_device: the device ids, in the order tried


def layouts_fit(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds | None = None) -> bool:
    """Whether any layout of the space fits (the test ``plan`` applies before it solves), from the
    rules and memory tables alone: a layout's step time does not decide whether it fits."""
    b = bounds or Bounds()
    try:
        space = build_space(model, job, cluster, b)
    except SpecError:
        return False
    ctx, headroom = Context(model, job, cluster), b.headroom(job, cluster)
    for sub in split_spaces(space, model, job):  # each pipeline split the framework offers, as plan tries them
        tables = build_tables(ctx, sub, headroom, memory_only=True)
        least = smallest_memory(tables)  # over the structurally valid layouts: a quick no
        if least is not None and least[0] <= tables.capacity and any_feasible(tables):
            return True
    return False


def fewest_devices(model: ModelSpec, request: Request, bounds: Bounds | None = None, start: int | None = None,
                   max_devices: int = MAX_DEVICES, max_checks: int | None = None, step: int | None = None,
                   budget_s: float | None = None) -> FitAnswer:
    """The smallest multiple of ``step`` devices (default: the cluster's node size), from ``start``,
    on which some layout fits; where one ``step`` fits and no ``start`` is given, the fewest devices
    of it that fit (divisors of ``step`` the fabric accepts: part of a node or board).

    Each size is the request at that device count (its other options kept), built as ``plan``
    builds it; a size the fabric cannot take is skipped. ``max_checks`` sizes or ``budget_s``
    seconds (checked before each size) bound the search; past them the answer is "not found".
    """
    step = step or request.with_(num_devices=None, num_nodes=None).load_cluster().devices_per_node
    checked: list[tuple[int, bool]] = []
    device = ""
    deadline = None if budget_s is None else time.perf_counter() + budget_s

    def fits(n: int) -> bool | None:
        nonlocal device
        if (max_checks is not None and len(checked) >= max_checks) or \
                (deadline is not None and time.perf_counter() > deadline):
            raise _Budget
        try:
            cluster = request.with_(num_devices=n, num_nodes=None).load_cluster()
        except SpecError:
            return None
        device = cluster.device.id
        ok = layouts_fit(model, request.build_job(model, cluster)[0], cluster, bounds)
        checked.append((n, ok))
        return ok

    try:
        n, low = _first_fit_by_doubling(fits, step, start, max_devices)
        if n is None:
            return FitAnswer(None, device, checked, f"no layout fits on up to {max_devices:,} devices")
        below = [d for d in range(1, step) if step % d == 0] if n == step and not start else []
        for m in [*below, *range(low + step, n, step)]:  # every accepted size under n, smallest first
            if fits(m):
                return FitAnswer(m, device, checked)
    except _Budget:
        return FitAnswer(None, device, checked, f"not found within the {len(checked)} sizes checked")
    return FitAnswer(n, device, checked)


def _first_fit_by_doubling(fits: Callable[[int], bool | None], step: int, start: int | None,
                           max_devices: int) -> tuple[int | None, int]:
    """(the first size that fits, doubling from ``start``; the largest size seen not to fit)."""
    n = max(step, start or step)
    n -= n % step
    low = 0
    while n <= max_devices:
        result = fits(n)
        if result:
            return n, low
        if result is False:
            low = n
        n *= 2
    return None, low


class _Budget(Exception):
    """The number of sizes a caller allowed has been checked."""


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
        checked.append((cluster.num_devices, ok))
        tried.append(dev)
        if ok:
            return FitAnswer(cluster.num_devices, dev, checked, devices_tried=tried)
    return FitAnswer(None, "", checked, f"no device of the family fits at this size (tried: {', '.join(tried)})",
                     devices_tried=tried)


def fit_hint(err: InfeasibleError, answer: FitAnswer, command: str) -> InfeasibleError:
    """``err`` with its hint replaced by a size that fits (found by :func:`fewest_devices`); without
    one (none within the sizes tried), the hint points at ``command``."""
    if answer.num_devices is None:
        return InfeasibleError(str(err), err.rejections, f"{err.hint}; `{command}` searches for the fewest devices")
    hint = (f"some layout fits on {answer.num_devices:,} x {answer.device} (found by search: {command}); "
            f"or a device with more memory, or a smaller model/sequence")
    return InfeasibleError(str(err), err.rejections, hint)
