"""How far a calibration may trust a few runs: the prior spread of the site parameters and the
scatter of runs about them, derived from the repository's runs (``clusterplan calibrate`` and
``validate --calibrate-one``).

A run's log error ``log(predicted / measured)`` at the bundled figures is read as three parts: what
every run of its hardware family under its framework shares (what a site's parameters can move: the
*site* part), what the runs of its job share besides (the same model, batch and software at one
place, other layouts), and the run's own scatter. "Job" in this module's names is a group: the runs
of one job published together (a runs file's ``group``, else the run alone), a part of one job as
``planner.studies.calibration.job_of`` defines it. The spreads weigh the site-level fit; the
job-level fit does not shrink (``planner.studies.calibrate.weights``). Their spreads, all in log step time:

- ``t`` (:attr:`Scatter.site_log`): of the site part about the uncalibrated model (zero);
- ``s_b`` (:attr:`Scatter.between_jobs_log`): of a run about it, for runs of other jobs;
- ``t_job`` (:attr:`Scatter.job_log`): of what the runs of one job share, about zero;
- ``s_w`` (:attr:`Scatter.within_job_log`): of a run about the other runs of its job.

A calibration on one run then moves a run of another job the fraction ``t^2 / (t^2 + s_b^2)`` of
the way to what that run measured (its job's own error does not transfer), a run of the same job
``t_job^2 / (t_job^2 + s_w^2)`` (:meth:`Scatter.fraction`). What two runs share is the mean product
of their log errors (of two runs of different jobs of one family under one framework: ``t^2``; of
two runs of one job: ``t_job^2``), and what each has of its own its mean square less that. Each is
the median over the families (over the jobs), not the mean: the errors have heavy tails (a few
families 40-60% off, a few rows of one publication 3-8x off) and the mean, set by those few, would
make a run of every other family move as far. :func:`derive` computes them;
``benchmarks/update_docs.py`` stores them for ``calibrate`` (``planner/data/calibration_prior.yaml``,
a test recomputes it) and ``validate --calibrate-one`` re-derives them without each calibrating
run's source.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Scatter:
    """The prior spread of what a site's parameters do to a step, and the scatter of runs about it
    (module docstring), in log step time, with what it was derived from."""

    site_log: float
    within_job_log: float
    between_jobs_log: float
    job_log: float
    runs: int = 0
    jobs: int = 0
    cells: int = 0
    sources: int = 0

    def fraction(self, same_job: bool) -> float:
        """How far one run moves another's predicted log step time toward its own measurement."""
        shared, own = (self.job_log, self.within_job_log) if same_job else (self.site_log, self.between_jobs_log)
        return shared ** 2 / (shared ** 2 + own ** 2) if shared else 0.0

    def covariance(self, jobs: Sequence[str]) -> np.ndarray:
        """Of the log errors of runs of ``jobs`` (one name per run: a group of runs of one job) about the
        site's parameters: ``s_w^2`` for each, and between two runs of one group the part of ``s_b^2``
        they share."""
        within = self.within_job_log ** 2
        shared = max(0.0, self.between_jobs_log ** 2 - within)
        names = np.array(list(jobs), dtype=object)
        return within * np.eye(len(names)) + shared * (names[:, None] == names[None, :])

    def as_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _moments(groups: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Over the groups of two or more values, the median of the mean product of two different
    members (what they share, about zero) and the median of the mean square less it (each's own)."""
    shared, own = [], []
    for xs in groups:
        if len(xs) > 1:
            total, square = sum(xs), sum(x * x for x in xs)
            pair = (total * total - square) / (len(xs) * (len(xs) - 1))
            shared.append(pair)
            own.append(square / len(xs) - pair)
    return (statistics.median(shared), statistics.median(own)) if shared else (0.0, 0.0)


def derive(rows: Sequence[tuple[float, str, str, str]], fallback: Scatter | None = None) -> Scatter:
    """The spreads (module docstring) from ``rows``: ``(log error, cell, job, source)`` per run, a cell
    being a hardware family under one framework, a job's error the median of its runs'. What two runs
    of different jobs of one cell share (the mean product of their errors: ``t^2``) and what each
    has of its own (the mean square less that: ``s_b^2``), the median over the cells; what two runs of
    one job share besides and each has of its own (``s_w^2``), the median over the jobs. Where no
    family has runs of two jobs or no job two runs, ``fallback`` (where given)."""
    jobs: dict[tuple[str, str], list[float]] = {}
    for error, cell, job, _ in rows:
        jobs.setdefault((cell, job), []).append(error)
    cells: dict[str, list[float]] = {}
    for (cell, _), errs in jobs.items():
        cells.setdefault(cell, []).append(statistics.median(errs))
    site, between = _moments(list(cells.values()))
    job, within = _moments(list(jobs.values()))
    if fallback and not (any(len(c) > 1 for c in cells.values()) and any(len(j) > 1 for j in jobs.values())):
        return fallback
    s_w = math.sqrt(max(0.0, within))
    return Scatter(math.sqrt(max(0.0, site)), s_w, max(s_w, math.sqrt(max(0.0, between))),
                   math.sqrt(max(0.0, job)), len(rows), len(jobs), len(cells), len({r[3] for r in rows}))


@functools.lru_cache(maxsize=1)
def stored() -> Scatter:
    """The spreads derived from every measured step time in the repository, as
    ``planner/data/calibration_prior.yaml`` holds them (written by ``benchmarks/update_docs.py``)."""
    from clusterplan.models.files import bundled_yaml

    doc = bundled_yaml("clusterplan.planner", "data", "calibration_prior.yaml") or {}
    return Scatter(**doc["scatter"])
