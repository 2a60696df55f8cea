"""Energy and cost of a step: what the ``--objective`` of the search weighs.

A device draws its board power (``power_w``) while it computes: sustained matmuls run at power-
saturated clocks (ml-engineering MSMF measurements, ``devices.yaml: mleng_bench``), and the
optimizer step streams HBM. While it waits on exposed communication or a pipeline bubble it draws
its idle power (``idle_power_w``, public nvidia-smi logs); this is a lower bound for the waiting
phases, since NCCL kernels and link traffic draw more than an idle board. The host (CPUs, NICs,
switches, fans) adds the cluster's ``power_overhead_w_per_device`` for the whole step (where a preset
states none, ``ASSUMED_HOST_OVER_BOARD`` of the board power, labelled unvalidated). So, per
device::

    E = (P_idle + P_host) * T_step + (P_board - P_idle) * T_busy,    T_busy = compute + recompute + optimizer + gradient accumulation

where ``T_busy`` is the device's own pipeline stage's: summed over devices, each layer's compute counts
once per pipeline, so the mean device is busy for 1/pp of all layers' (``cost.step.device_busy_s``).

The facility's power usage effectiveness (``Cluster.pue``, ``--pue``) multiplies the whole.
On one cluster, layouts with the same step time can differ in energy (recomputation burns power for
no progress; a bubble does not), which is what ``--objective energy`` trades. Rental cost is the
price per device-hour times the step time, so ``--objective cost`` ranks layouts exactly as time
does on one cluster; it differs across clusters (``clusterplan compare``).
"""

from __future__ import annotations

from clusterplan.models.errors import SpecError
from clusterplan.topologies.cluster import Cluster

OBJECTIVES: tuple[str, ...] = ("time", "cost", "energy")

ASSUMED_HOST_OVER_BOARD = 0.8
"""Host power (CPUs, NICs, switches, fans) per device as a share of its board power, where a preset
states none: the DGX systems' figures give 0.82 (H100: 575 W for a 700 W GPU) and 0.79 (B200:
787.5 W for 1,000 W; clusters.yaml, flashgenius_dgx). An assumption for every other system, so that
energy compares on one basis across presets; labelled unvalidated, overridable (--host-power-w)."""


def host_power_w(cluster: Cluster) -> tuple[float, bool]:
    """Host power per device and whether it is assumed (the preset states none and none was given)."""
    if cluster.power_overhead_w_per_device > 0 or cluster.host_power_given:
        return cluster.power_overhead_w_per_device, False
    board = cluster.device.power_w
    return (0.0, False) if board is None else (ASSUMED_HOST_OVER_BOARD * board, True)


def busy_s(time) -> float:
    """Seconds of a step the device spends computing (a :class:`cost.step.TimeBreakdown`); the
    memory-bound passes (optimizer, gradient accumulation) included."""
    return time.compute_s + time.recompute_s + time.optimizer_s + time.grad_accum_s


def has_idle_power(cluster: Cluster) -> bool:
    return cluster.device.idle_power_w is not None


def power_w(cluster: Cluster) -> tuple[float, float] | None:
    """``(waiting, busy - waiting)`` power per device in watts, host share included; None when the
    device has no board power figure. Without an idle figure the device draws board power throughout."""
    dev = cluster.device
    if dev.power_w is None:
        return None
    idle = dev.power_w if dev.idle_power_w is None else min(dev.idle_power_w, dev.power_w)
    return idle + host_power_w(cluster)[0], dev.power_w - idle


def step_energy_j(cluster: Cluster, step_s: float, device_busy_s: float) -> float | None:
    """Energy of one step on the whole cluster (joules), or None without a power figure: every
    device waits through the ``step_s`` and computes for ``device_busy_s`` on average, its own
    stage's compute (``cost.step.Evaluation.busy_s``), not the slowest stage's."""
    watts = power_w(cluster)
    if watts is None:
        return None
    waiting, extra = watts
    return cluster.pue * cluster.num_devices * (waiting * step_s + extra * device_busy_s)


def step_cost_usd(cluster: Cluster, step_s: float) -> float | None:
    """Rental cost of one step (all devices for its duration), or None without a price."""
    price = cluster.device.price_per_hour_usd
    return None if price is None else price * cluster.num_devices * step_s / 3600.0


# The device figure each objective needs (time needs none), and how the error names it.
_NEEDS = {"cost": ("price_per_hour_usd", "give --price-per-device-hour USD, or price_per_device_hour_usd in a cluster "
                                         "file"),
          "energy": ("power_w", "give a cluster file whose device has power_w")}


def objective_available(cluster: Cluster, objective: str) -> bool:
    """Whether the device has the figure ``objective`` needs (a price for cost, a power for energy)."""
    need = _NEEDS.get(objective)
    return need is None or getattr(cluster.device, need[0]) is not None


def objective_weights(cluster: Cluster, objective: str) -> tuple[int, int]:
    """Integer weights ``(a, b)`` of the search objective ``a * T_step + b * T_busy``.

    time and cost: ``(1, 0)`` (cost is proportional to time on one cluster). energy: the waiting
    and the extra busy power per device in whole watts. Raises :class:`SpecError` when the device
    lacks the figure the objective needs.
    """
    if objective not in OBJECTIVES:
        raise SpecError(f"--objective: got {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if not objective_available(cluster, objective):
        field, fix = _NEEDS[objective]
        raise SpecError(f"--objective {objective}: device {cluster.device.id} has no {field} in the catalogue "
                        f"(cluster {cluster.id}); {fix}, or use --objective time")
    if objective != "energy":
        return 1, 0
    waiting, extra = power_w(cluster)
    return max(1, round(waiting)), round(extra)
