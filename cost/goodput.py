"""Goodput: time to train with failures, checkpoints and restarts, not just step time x steps.

A job on ``N`` devices fails at ``N x failure_rate`` per hour (the mean time between failures of
the job, ``M``). It writes a checkpoint every ``tau`` seconds, each taking ``delta`` (the state
each device holds, written at the storage bandwidth it gets); a failure costs a restart ``R``, the
restore of the last checkpoint (read back at the same bandwidth: ``delta`` again) and the work
since that checkpoint, half an interval on average. With Young's interval ``tau = sqrt(2 delta M)``
(Young 1974; Daly 2006 to first order) the share of wall time lost is

    waste = delta / tau + (tau / 2 + R + delta) / M

and ``goodput = 1 - waste``: the effective time to train is the failure-free time over goodput.

Defaults, each from a published large run (and each overridable on the command line):

- failures: Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4): 419
  unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs, i.e. 1.97e-5 per device-hour;
- storage: the same paper's Tectonic cluster, 2 TB/s sustained for 16,384 GPUs, 122 MB/s per device;
- checkpoint: bf16 weights and fp32 master weights and Adam moments, 14 bytes per parameter,
  written in parallel by all devices (distributed checkpointing);
- restart: 10 minutes, an assumption (no sourced figure): labelled ``unvalidated`` in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LLAMA3_FAILURES_PER_DEVICE_HOUR = 419 / (54 * 24 * 16384)  # Dubey et al. 2024, section 3.3.4
LLAMA3_STORAGE_BYTES_PER_S_PER_DEVICE = 2e12 / 16384  # Tectonic, 2 TB/s sustained (ibid., section 3.3.1)
CHECKPOINT_BYTES_PER_PARAM = 14.0  # bf16 weights (2) + fp32 master (4) + Adam moments (8)
DEFAULT_RESTART_S = 600.0  # assumption: no published restart time retrieved (unvalidated)


@dataclass(frozen=True)
class Reliability:
    """What failures cost: the per-device failure rate, the storage bandwidth a device writes its
    checkpoint shard at, and the time to restart after a failure."""

    failure_rate_per_device_hour: float = LLAMA3_FAILURES_PER_DEVICE_HOUR
    checkpoint_bytes_per_s_per_device: float = LLAMA3_STORAGE_BYTES_PER_S_PER_DEVICE
    restart_s: float = DEFAULT_RESTART_S

    @property
    def restart_is_default(self) -> bool:
        return self.restart_s == DEFAULT_RESTART_S


@dataclass(frozen=True)
class Goodput:
    goodput: float  # share of wall time that advances training (0 when the job cannot progress)
    mtbf_s: float  # mean time between failures of the whole job (inf without failures)
    checkpoint_write_s: float
    checkpoint_interval_s: float  # Young's optimum (inf without failures)


def goodput(num_params: float, num_devices: int, rel: Reliability) -> Goodput:
    """The goodput of a job of ``num_params`` parameters on ``num_devices`` devices."""
    delta = CHECKPOINT_BYTES_PER_PARAM * num_params / num_devices / rel.checkpoint_bytes_per_s_per_device
    if rel.failure_rate_per_device_hour <= 0:
        return Goodput(1.0, math.inf, delta, math.inf)
    mtbf = 3600.0 / (num_devices * rel.failure_rate_per_device_hour)
    tau = math.sqrt(2.0 * delta * mtbf)
    waste = delta / tau + (tau / 2.0 + rel.restart_s + delta) / mtbf  # restore reads the checkpoint back
    return Goodput(max(0.0, 1.0 - waste), mtbf, delta, tau)
