"""The fewest devices (or the smallest device) on which some layout of a job fits, found by search.

A size fits when the search space at that size (the job's framework, the user's bounds) holds at
least one layout that passes every structural rule and fits in memory: the same test ``plan``
applies, so the answer is a size on which ``plan`` succeeds. Memory does not fall monotonically
with the device count (the batch must divide by ``dp x micro-batch``, layers split unevenly), so
the search doubles until a size fits and then scans every size the fabric accepts below it, from
the smallest up: the first that fits is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.search.exhaustive import any_feasible, smallest_memory
from clusterplan.planner.search.space import Bounds, build_space
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
    """Whether any layout of the space fits (the test ``plan`` applies before it solves)."""
    b = bounds or Bounds()
    try:
        space = build_space(model, job, cluster, b)
    except SpecError:
        return False
    tables = build_tables(Context(model, job, cluster), space, b.memory_headroom)
    least = smallest_memory(tables)  # over the structurally valid layouts: a quick no
    if least is None or least[0] > tables.capacity:
        return False
    return any_feasible(tables)


def fewest_devices(model: ModelSpec, make_job: Callable[[Cluster], Job], make_cluster: Callable[[int], Cluster],
                   step: int, bounds: Bounds | None = None, start: int | None = None,
                   max_devices: int = MAX_DEVICES, max_checks: int | None = None) -> FitAnswer:
    """The smallest multiple of ``step`` devices (from ``start``) on which some layout fits.

    ``make_cluster(n)`` builds the cluster at ``n`` devices (raising :class:`SpecError` for a size
    the fabric cannot take, which is skipped); ``make_job(cluster)`` the job on it.
    """
    checked: list[tuple[int, bool]] = []
    device = ""

    def fits(n: int) -> bool | None:
        nonlocal device
        if max_checks is not None and len(checked) >= max_checks:
            raise _Budget
        try:
            cluster = make_cluster(n)
        except SpecError:
            return None
        device = cluster.device.id
        ok = layouts_fit(model, make_job(cluster), cluster, bounds)
        checked.append((n, ok))
        return ok

    n = max(step, start or step)
    n -= n % step
    low = 0  # the largest size known not to fit
    try:
        while n <= max_devices:
            result = fits(n)
            if result:
                break
            if result is False:
                low = n
            n *= 2
        else:
            return FitAnswer(None, device, checked, f"no layout fits on up to {max_devices:,} devices")
        for m in range(low + step, n, step):  # every accepted size between, smallest first
            if fits(m):
                return FitAnswer(m, device, checked)
    except _Budget:
        return FitAnswer(None, device, checked, f"not found within {max_checks} sizes")
    return FitAnswer(n, device, checked)


class _Budget(Exception):
    """The number of sizes a caller allowed has been checked."""


def smallest_device(model: ModelSpec, make_job: Callable[[Cluster], Job], make_cluster: Callable[[str], Cluster],
                    devices: list[str], bounds: Bounds | None = None) -> FitAnswer:
    """The device of ``devices`` with the least memory on which some layout fits, at a fixed size."""
    checked: list[tuple[int, bool]] = []
    sized = []
    for dev in devices:
        try:
            cluster = make_cluster(dev)
        except ClusterplanError:
            continue
        sized.append((cluster.device.memory_bytes, dev, cluster))
    tried: list[str] = []
    for _, dev, cluster in sorted(sized, key=lambda t: (t[0], t[1])):
        ok = layouts_fit(model, make_job(cluster), cluster, bounds)
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
