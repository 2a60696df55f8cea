"""Fitting a calibration on measured runs (``clusterplan calibrate``) and the calibrate-on-one study
(``clusterplan validate --calibrate-one``). The parameters, the file and how a calibration is applied
are in ``planner.studies.calibration``; its docstring gives the method.
"""

from __future__ import annotations

import functools
import math
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from clusterplan.models.errors import SpecError
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies import calibration_prior
from clusterplan.planner.studies.calibration import (
    FABRIC, MAX_ITERATIONS, MIN_INDEPENDENCE, MIN_SENSITIVITY, NAMES, PARAMETER, PARAMETERS, STEP, Calibration, Entry,
    JobId, job_of, load_calibration, save, with_factors,
)
from clusterplan.planner.studies.calibration_prior import Scatter
from clusterplan.planner.studies.runs import Priced, RunResult, load_runs_and_groups, price_run
from clusterplan.planner.studies.validate import STEP_TIME_FILES, bundled_data_path, repository_holdouts, run_groups
from clusterplan.planner.studies.uncertainty import _t90, error_figures

BOUNDS = {p.name: (math.log(p.low), math.log(p.high)) for p in PARAMETERS}
MAX_LOO_RUNS = 20  # beyond, ten folds instead of one run left out at a time


@dataclass(frozen=True)
class Point:
    """One measured run, priced, ready to price again under other factors."""

    id: str
    priced: Priced
    measured_s: float
    framework: str
    family: str
    source: str = ""  # the publication (planner.studies.uncertainty.source_key)
    group: str = ""  # runs published together of one job share it (the runs file's group), else the run's id

    @property
    def device(self) -> str:
        return self.priced.cluster.device.id

    @property
    def job(self) -> JobId:
        """The job the run is of (``planner.studies.calibration.job_of``)."""
        return job_of(self.priced.model, self.device, self.framework, self.priced.job.precision)

    @property
    def cluster(self) -> str:
        return self.priced.cluster.id

    def log_error(self, values: dict[str, float], fabric: bool = True) -> float:
        """log(predicted / measured) with the factors ``values`` (``fabric=False``: not the bandwidths)."""
        return math.log(self.priced.step_s(with_factors(self.priced.cluster, values, fabric)) / self.measured_s)


def points_from_runs(runs: Sequence[dict], options: SearchOptions | None = None,
                     progress: Callable[[int, int], None] | None = None) -> tuple[list[Point], list[RunResult]]:
    """The runs with a measured step time that could be priced, and every run's result (the others
    say why they were left out)."""
    points, results = [], []
    for i, run in enumerate(runs):
        result, priced = price_run(run, options or SearchOptions())
        results.append(result)
        if priced is not None and result.measured_step_time_s and result.predicted_step_time_s:
            points.append(Point(result.id, priced, float(result.measured_step_time_s),
                                result.framework.split("@")[0], result.family, result.source,
                                str(run.get("group") or result.id)))
        if progress:
            progress(i + 1, len(runs))
    return points, results


def residuals(points: Sequence[Point], names: Sequence[str], x: np.ndarray) -> np.ndarray:
    values = {n: math.exp(v) for n, v in zip(names, x)}
    return np.array([p.log_error(values) for p in points])


def jacobian(points: Sequence[Point], names: Sequence[str], x: np.ndarray, r0: np.ndarray) -> np.ndarray:
    """d log(predicted) / d log(factor), by forward differences (backward at a parameter's upper bound)."""
    J = np.zeros((len(points), len(names)))
    for j, name in enumerate(names):
        h = STEP if x[j] + STEP <= BOUNDS[name][1] else -STEP
        xj = x.copy()
        xj[j] += h
        J[:, j] = (residuals(points, names, xj) - r0) / h
    return J


def select(J: np.ndarray, names: Sequence[str], kept: dict[str, str]) -> list[str]:
    """The parameters the runs determine, most visible first (module docstring of
    ``planner.studies.calibration``); why each other one keeps the bundled figure goes into ``kept``."""
    sens = np.abs(J).max(axis=0) if len(J) else np.zeros(len(names))
    chosen: list[int] = []
    for j in np.argsort(-sens, kind="stable"):
        name = names[j]
        if name in kept:
            continue
        if sens[j] < MIN_SENSITIVITY:
            kept[name] = (f"doubling it would move no run's step time by more than {sens[j] * math.log(2):.1%}; "
                          f"needs {PARAMETER[name].needs}")
        elif len(chosen) >= len(J):
            kept[name] = f"no more parameters than runs ({len(J)}); needs {PARAMETER[name].needs}"
        elif _independent(J[:, chosen + [j]]):
            chosen.append(int(j))
        else:
            kept[name] = (f"the runs do not tell it apart from {', '.join(names[c] for c in chosen)}; needs "
                          f"{PARAMETER[name].needs}")
    return [names[j] for j in sorted(chosen)]


def _independent(A: np.ndarray) -> bool:
    norms = np.linalg.norm(A, axis=0)
    s = np.linalg.svd(A / np.where(norms > 0, norms, 1.0), compute_uv=False)
    return bool(s[-1] >= MIN_INDEPENDENCE * s[0])


def solve(points: Sequence[Point], names: Sequence[str], x0: np.ndarray | None = None,
          iterations: int = MAX_ITERATIONS, scatter: Scatter | None = None,
          job_level: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The most probable log factors (Levenberg-Marquardt within each parameter's range) under
    :func:`weights`: ``(log factors, residuals, posterior covariance of the log factors)``."""
    x = np.zeros(len(names)) if x0 is None else np.array(x0, dtype=float)
    r = residuals(points, names, x)
    if not names:
        return x, r, np.zeros((0, 0))
    J = jacobian(points, names, x, r)
    W, prior = weights(points, names, scatter or calibration_prior.stored(), job_level,
                       J if x0 is None else None)
    lo, hi = np.array([BOUNDS[n][0] for n in names]), np.array([BOUNDS[n][1] for n in names])
    cost_of = lambda res, xs: float((W @ res) @ (W @ res) + xs @ (prior * xs))  # noqa: E731
    mu, cost = 1e-3, cost_of(r, x)
    for _ in range(iterations):
        Jw = W @ J
        A, g = Jw.T @ Jw + np.diag(prior), Jw.T @ (W @ r) + prior * x
        x_new = np.clip(x + np.linalg.solve(A + mu * np.diag(np.diag(A)), -g), lo, hi)
        r_new = residuals(points, names, x_new)
        cost_new = cost_of(r_new, x_new)
        if cost_new < cost:
            converged = cost - cost_new < 1e-10 + 1e-6 * cost
            x, r, cost, mu = x_new, r_new, cost_new, mu / 10
            J = jacobian(points, names, x, r)
            if converged:
                break
        else:
            mu *= 10
            if mu > 1e6:
                break
    Jw = W @ J
    return x, r, np.linalg.inv(Jw.T @ Jw + np.diag(prior))


MIN_VARIANCE = 1e-6  # (0.1% in log step time)^2: keeps a derived spread of zero from dividing by it

TIE_WEIGHT = 1e-3
"""A job-level fit's pull toward the bundled figures, per squared log factor, against the runs'
squared log errors: a factor of 2 costs what a 2.2% error on one run costs. It picks one answer where
the runs leave a direction nearly flat, and does not move a fit the runs determine."""


def weights(points: Sequence[Point], names: Sequence[str], scatter: Scatter, job_level: bool,
            J0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the fit minimises, ``|W r|^2 + sum_j prior_j x_j^2``. The site-level fit (a Gaussian
    posterior, ``planner.studies.calibration_prior``): ``W`` whitens the runs' log errors ``r`` by their
    covariance (:meth:`Scatter.covariance`: runs of one group share their job's error), and each log
    factor ``x_j`` has a prior centred on the bundled figure whose effect on a step has the spread
    ``t``: ``prior_j`` is the runs' mean squared sensitivity to it (``J0``, at the bundled figures) over
    ``t^2``. ``job_level``: the runs are of one job and the fit is for that job (least squares, each
    run scattering ``s_w`` about its job, the pull :data:`TIE_WEIGHT` only breaking ties)."""
    if job_level:
        s_w2 = max(scatter.within_job_log ** 2, MIN_VARIANCE)
        return np.eye(len(points)) / math.sqrt(s_w2), np.full(len(names), TIE_WEIGHT / s_w2)
    if J0 is None:
        zero = np.zeros(len(names))
        J0 = jacobian(points, names, zero, residuals(points, names, zero))
    cov = scatter.covariance([p.group for p in points]) + MIN_VARIANCE * np.eye(len(points))
    W = np.linalg.cholesky(np.linalg.inv(cov)).T
    return W, np.mean(J0 ** 2, axis=0) / max(scatter.site_log ** 2, MIN_VARIANCE)


def fit_chosen(points: Sequence[Point], kept: dict[str, str], scatter: Scatter | None = None,
               job_level: bool = False) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The parameters ``points`` determine (:func:`select`, at the bundled figures) fitted
    (:func:`solve`): ``(residuals at the bundled figures, chosen names, log factors, residuals,
    posterior covariance)``; why each other parameter is kept goes into ``kept``."""
    zero = np.zeros(len(NAMES))
    r0 = residuals(points, NAMES, zero)
    J0 = jacobian(points, NAMES, zero, r0)
    chosen = select(J0, NAMES, kept)
    x, r, cov = solve(points, chosen, scatter=scatter, job_level=job_level)
    return r0, chosen, x, r, cov


def stats(log_errors: Sequence[float]) -> dict:
    """Median, 90th percentile and median signed of the relative errors behind ``log_errors``."""
    return error_figures([math.exp(e) - 1 for e in log_errors], 4)


def fit_entry(points: Sequence[Point], scatter: Scatter | None = None) -> Entry:
    """The factors for one device under one framework (``points`` share both): the site-level fit,
    the most probable under the prior and scatter ``scatter`` (the stored ones by default), and the
    job-level fit of each job the runs are of (``planner.studies.calibration.job_of``), each factor
    with its posterior standard error and 80% interval."""
    scatter = scatter or calibration_prior.stored()
    jobs: dict[tuple, list[Point]] = {}
    for p in points:
        jobs.setdefault(p.job.key, []).append(p)
    prior = scatter.as_dict() | {"moves_other_job": round(scatter.fraction(False), 3)}
    job_fits = tuple(_fitted(rows, scatter, True) for _, rows in sorted(jobs.items()))
    return replace(_fitted(points, scatter, False), prior=prior, jobs=job_fits)


def _fitted(points: Sequence[Point], scatter: Scatter, job_level: bool) -> Entry:
    """The site-level fit of ``points`` (or, ``job_level``, the job-level fit of runs of one job)."""
    fabrics = Counter(p.cluster for p in points)
    kept: dict[str, str] = {}
    if len(fabrics) > 1:
        kept.update({k: f"the runs are on several fabrics ({', '.join(sorted(fabrics))}); fabric factors need runs "
                        f"on one" for k in FABRIC})
    r0, chosen, x, r, cov = fit_chosen(points, kept, scatter, job_level)
    fitted = {}
    for j, name in enumerate(chosen):
        se = math.sqrt(max(0.0, cov[j, j]))
        fitted[name] = {"stderr_log": round(se, 4),
                        "interval": [round(math.exp(x[j] + k * Z80 * se), 4) for k in (-1, 1)]}
    loo = leave_one_out(points, chosen, x, scatter, job_level)
    values = {name: 1.0 for name in NAMES} | {n: math.exp(v) for n, v in zip(chosen, x)}
    error = {"before": stats(r0), "after": stats(r), "leave_one_out": stats(loo)}
    job = points[0].job
    return Entry(job.device, job.framework, fabrics.most_common(1)[0][0], values, fitted, kept,
                 tuple(p.id for p in points), interval_from(loo), error,
                 job={"model": job.model, "model_shape": job.model_shape, "precision": job.precision} if job_level else {})


Z80 = 1.2816  # the normal distribution's 90th percentile: a fitted factor's 80% interval


def leave_one_out(points: Sequence[Point], chosen: Sequence[str], x: np.ndarray,
                  scatter: Scatter | None = None, job_level: bool = False) -> list[float]:
    """Each run's log error from a fit without it (ten folds beyond :data:`MAX_LOO_RUNS` runs), the
    same parameters (no more than the runs left): empty for one run."""
    n = len(points)
    if n < 2:
        return []
    folds = [[i] for i in range(n)] if n <= MAX_LOO_RUNS else [list(range(k, n, 10)) for k in range(10)]
    out = [0.0] * n
    for held in folds:
        train = [p for i, p in enumerate(points) if i not in held]
        names = [c for c in chosen][:len(train)]
        start = np.array([x[list(chosen).index(c)] for c in names])
        xf, _, _ = solve(train, names, start, iterations=6, scatter=scatter, job_level=job_level)
        values = {c: math.exp(v) for c, v in zip(names, xf)}
        for i in held:
            out[i] = points[i].log_error(values)
    return out


def interval_from(loo: Sequence[float]) -> tuple[float, float] | None:
    """80% bounds of measured / predicted for the next run, from the leave-one-out log errors: their
    mean and spread with Student's t (as ``planner.studies.uncertainty.predictive_bounds`` does for
    sources); None below three runs."""
    k = len(loo)
    if k < 3:
        return None
    ratios = [-e for e in loo]
    mean, sd = statistics.fmean(ratios), statistics.stdev(ratios)
    half = _t90(k - 1) * sd * math.sqrt(1 + 1 / k)
    return math.exp(mean - half), math.exp(mean + half)


def fit(points: Sequence[Point], results: Sequence[RunResult] = (), scatter: Scatter | None = None) -> list[Entry]:
    """One entry per (device, framework) among ``points``; SpecError (exit 2) where there is none,
    with why each run (``results``) was left out."""
    if not points:
        why = "; ".join(f"{r.id}: {r.reason or 'no measured step time'}" for r in list(results)[:5])
        raise SpecError(f"calibrate: none of the {len(results)} runs given has a measured step time that could be "
                        f"priced{': ' + why if why else ''}")
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.device, p.framework), []).append(p)
    return [fit_entry(groups[key], scatter) for key in sorted(groups)]


# ---- calibrating on one run, predicting the others (validate --calibrate-one) ------------------------------

MAX_CALIBRATION_RUNS = 8  # per group or family, evenly spaced through it: each is fitted alone
MIN_FAMILY_RUNS = 3


def calibrate_one(points: Sequence[Point], groups: dict[str, list[str]]) -> dict:
    """For every group of runs of one job (``groups``: name -> run ids) and every hardware family
    under one framework with :data:`MIN_FAMILY_RUNS` or more runs: fit on one run (the parameters one
    run determines), predict the others, and compare their |error| with the uncalibrated one. Up to
    :data:`MAX_CALIBRATION_RUNS` runs of each take the calibrating turn. Each turn is what a user
    does: ``calibrate`` on the one run, the CAL.yaml written, and the others priced through
    ``Calibration.apply`` as ``--calibration`` prices them (the job-level fit for runs of the
    calibrating run's job, the site-level one for the others of its device and framework, the fabric
    factors on its cluster preset only). The fit's prior and scatter
    (``planner.studies.calibration_prior``) are derived from the runs of the other sources than the
    calibrating run's (the stored ones where those cannot determine them). ``{"cells": [...],
    "summary": {...}, "scatter": {...}}``, the last derived from every run."""
    points = with_groups(points, groups)
    by_id = {p.id: p for p in points}
    cells = [("job", name, [by_id[i] for i in dict.fromkeys(ids) if i in by_id]) for name, ids in sorted(groups.items())]
    families: dict[str, list[Point]] = {}
    for p in points:  # a calibration applies to a device under one framework: families are split by it
        families.setdefault(f"{p.family} under {p.framework}", []).append(p)
    cells += [("family", f, rows) for f, rows in sorted(families.items()) if len(rows) >= MIN_FAMILY_RUNS]
    table = error_rows(points)
    errors = {p.id: r[0] for p, r in zip(points, table)}
    without = functools.lru_cache(maxsize=None)(
        lambda source: calibration_prior.derive([r for r in table if r[3] != source], calibration_prior.stored()))
    before = {i: abs(math.exp(e) - 1) for i, e in errors.items()}
    cals: dict[str, Calibration] = {}  # a run calibrates in its group's cell and in its family's alike
    with tempfile.TemporaryDirectory(prefix="calibrate-one-") as folder:
        def calibrated(one: Point) -> Calibration:
            if one.id not in cals:
                cals[one.id] = _calibrated_on(one, without(one.source), Path(folder) / f"{len(cals)}.yaml")
            return cals[one.id]
        out = [_one_cell(kind, name, rows, before, calibrated) for kind, name, rows in cells if len(rows) >= 2]
    summary = {kind: _cells_summary([c for c in out if c["kind"] == kind]) for kind in ("job", "family")}
    scatter = calibration_prior.derive(table, calibration_prior.stored())
    return {"cells": out, "summary": summary, "scatter": scatter.as_dict()}


def with_groups(points: Sequence[Point], groups: dict[str, list[str]]) -> list[Point]:
    """``points`` with the group of each run in ``groups`` (name -> run ids; the first name in order)."""
    group = {i: name for name, ids in sorted(groups.items(), reverse=True) for i in ids}
    return [replace(p, group=group.get(p.id, p.group)) for p in points]


def error_rows(points: Sequence[Point]) -> list[tuple[float, str, str, str]]:
    """What ``calibration_prior.derive`` reads: each run's log error at the bundled figures, its
    family under its framework, its group (runs of one job published together) and its source."""
    return [(p.log_error({}), f"{p.family} under {p.framework}", p.group, p.source) for p in points]


def repository_scatter(holdouts: Sequence[Path] | None = None) -> Scatter:
    """The prior and scatter derived from every measured step time in the repository (the runs
    ``validate --calibrate-one`` studies): what ``planner/data/calibration_prior.yaml`` stores.
    ``holdouts``: the hold-out files (default: the repository's, none from an installed package)."""
    runs, groups = study_runs(holdouts=holdouts)
    points, _ = points_from_runs(runs)
    return calibration_prior.derive(error_rows(with_groups(points, groups)))


def _calibrated_on(one: Point, scatter: Scatter, path: Path) -> Calibration:
    """What ``clusterplan calibrate`` on the run ``one`` alone writes to ``path``, read back as
    ``--calibration`` reads it."""
    save(fit([one], scatter=scatter), path)
    return load_calibration(path)


def _one_cell(kind: str, name: str, rows: list[Point], before: dict[str, float],
              calibrated: Callable[[Point], Calibration]) -> dict:
    """A cell's runs each calibrated on in turn (``calibrated``), the others priced with that
    calibration as ``--calibration`` prices them: the job-level fit for runs of the calibrating run's
    job, the site-level fit for the others (``levels`` counts the predictions by which)."""
    picks = sorted({round(i * (len(rows) - 1) / max(1, MAX_CALIBRATION_RUNS - 1))
                    for i in range(min(len(rows), MAX_CALIBRATION_RUNS))})
    after, base, fitted, levels = [], [], Counter(), Counter()
    for k in picks:
        cal = calibrated(rows[k])
        fitted.update(list(cal.entries[0].fitted))
        for j, p in enumerate(rows):
            if j != k:
                cluster = cal.apply(p.priced.cluster, p.framework, p.job)
                levels[cluster.calibration.get("level", "not applied")] += 1
                after.append(abs(p.priced.step_s(cluster) / p.measured_s - 1))
                base.append(before[p.id])
    return {"kind": kind, "name": name, "runs": len(rows), "calibrated_on": len(picks),
            "predictions": len(after), "fitted": dict(fitted), "levels": dict(levels),
            "median_abs_error_before": round(statistics.median(base), 4),
            "median_abs_error_after": round(statistics.median(after), 4)}


def _cells_summary(cells: list[dict]) -> dict:
    if not cells:
        return {"cells": 0}
    levels = sum((Counter(c["levels"]) for c in cells), Counter())
    return {"cells": len(cells), "median_before": round(statistics.median(c["median_abs_error_before"] for c in cells), 4),
            "median_after": round(statistics.median(c["median_abs_error_after"] for c in cells), 4),
            "within_6pct": sum(c["median_abs_error_after"] <= 0.06 for c in cells), "levels": dict(levels)}


def calibration_inputs(paths: Sequence[str], cluster: str | None = None, **given) -> list[dict]:
    """The runs of ``paths``: ``clusterplan-runs/1`` files (``.yaml``, ``.yml``, ``.json``) as they are,
    and training logs (``planner.studies.logs``: ``LOG`` or ``LOG::CONFIG``) read on ``cluster`` with
    the other hardware and job facts ``given`` (device, model, devices, seq_len) that logs lack."""
    from clusterplan.planner.studies.logs import RUN_FILE_SUFFIXES, load_inputs

    logs = [p for p in paths if "::" in str(p) or not str(p).lower().endswith(RUN_FILE_SUFFIXES)]
    if logs and not cluster:
        raise SpecError(f"--cluster: a training log ({logs[0]}) does not say which cluster it ran on; give the preset "
                        "id or cluster file (and --device where the preset has several)")
    return load_inputs(paths, cluster=cluster, **{k: v for k, v in given.items() if v is not None})


def study_runs(path: str | None = None, holdouts: Sequence[Path] | None = None
               ) -> tuple[list[dict], dict[str, list[str]]]:
    """The runs and groups of runs of one job of ``path``, or of every bundled file with measured step
    times and the hold-outs (``holdouts``, default the repository's: what ``validate`` counts in its headline)."""
    extra = list(repository_holdouts() if holdouts is None else holdouts)
    paths = [path] if path else [bundled_data_path(n) for n in STEP_TIME_FILES] + extra
    runs: list[dict] = []
    groups: dict[str, list[str]] = {}
    for p in paths:
        file_runs, extra = load_runs_and_groups(p)
        runs += file_runs
        for name, ids in run_groups(file_runs, extra).items():
            groups.setdefault(name, []).extend(ids)
    return runs, groups


def save_runs_file(runs: Sequence[dict], path: str) -> None:
    """``runs`` as a ``clusterplan-runs/1`` file (what ``validate FILE`` reads)."""
    import yaml

    from clusterplan.planner.studies.runs import FORMAT

    with open(path, "w") as out:
        yaml.safe_dump({"format": FORMAT, "runs": list(runs)}, out, sort_keys=False, width=110)
