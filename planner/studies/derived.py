"""Constants derived from published runs, derived by code, and the leave-one-source-out figure that
re-derives them without each source (``clusterplan validate``'s cross-validated headline).

Three constants of the catalogue come from runs rather than from a benchmark: the large-GEMM
fractions (``topologies/data/devices.yaml``, ``gemm.large``) of TPU v5e, TPU v5p and Trainium1. Each
is derived from the device's bundled runs (never from the frozen hold-out files) by one of two rules
(:class:`DerivedCeiling`), and a test holds the catalogue to what this code derives. The same runs are
then predicted with it, so their errors are not independent evidence: :func:`cross_validated` predicts
each source's runs with the constants derived without it (where nothing is left to derive from, the
device's stand-in).

Every other device whose ``gemm.large`` is not measured and that has bundled runs keeps a borrowed
benchmark of the same tensor-core silicon (:data:`NOT_DERIVED` says why).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from statistics import median

from clusterplan.cost.step import evaluate
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.runs import Priced, RunResult, evaluate_run
from clusterplan.planner.studies.uncertainty import error_figures
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.library import load_device
from clusterplan.topologies.precisions import low_precision


RULES = ("best_hfu", "step_match")


@dataclass(frozen=True)
class DerivedCeiling:
    """A device whose ``gemm.large`` is derived from its bundled runs with a measured step time.

    ``rule``: ``best_hfu``, the best whole-step hardware FLOP rate over peak that the runs reached
    (:func:`measured_hfu`), a lower bound on the matmul ceiling that is tight where matmuls fill the
    step (MaxText on TPU: the runs are GEMM-bound, and no other term is priced on top of the bound);
    ``step_match``, the median over the runs of the fraction at which the cost model reproduces each
    measured step (:func:`step_match_fraction`). Where a run spends a share of its step in
    communication, pipeline bubbles or memory-bound kernels, its whole-step rate understates the
    matmul rate, and pricing those terms on top of it counts them twice; the matched fraction is the
    matmul rate the rest of the model leaves room for, and the median keeps one run's other errors
    (host time, a mispriced collective) from setting the device's constant.
    ``framework``: runs of that framework only (None: every framework). ``fallback``: the device whose
    fraction stands in where no such run is left (under cross-validation), or the stand-in fraction."""

    device: str
    framework: str | None
    fallback: str | float
    rule: str = "best_hfu"


NKI_TRN1_FRACTION = 0.662
"""Trainium1's stand-in without its runs: one third-party NKI matmul kernel on one NeuronCore-v2,
62.9 of its 95 TFLOPS on one shape (devices.yaml source ``nki_autotuner_trn1``; unvalidated)."""

DERIVED_CEILINGS = (DerivedCeiling("tpu-v5e", "maxtext", "tpu-v6e"), DerivedCeiling("tpu-v5p", "maxtext", "tpu-v6e"),
                    # trn1's runs spend 10-25% of their predicted step in tensor-parallel communication
                    DerivedCeiling("trainium1", None, NKI_TRN1_FRACTION, "step_match"))

NOT_DERIVED = {
    "h100-sxm5-96gb": "the H100 SXM MAMF is a benchmark of the same GH100 die; its torchtitan runs' errors come "
                      "from other terms (their matched fractions spread 0.02-1.0)",
    "gb300": "GB200's measured MAMF fractions, the same Blackwell tensor cores for 16- and 8-bit; most of its "
             "runs are low-precision, which gemm.large does not price",
}
"""Devices whose ``gemm.large`` is not measured on the device itself and that have bundled runs, but
keep the borrowed benchmark: it measures the same tensor-core silicon, so a fraction matched to runs
would carry the runs' other errors into every job on the device."""

MATCH_BOUNDS = (0.02, 1.0)
MATCH_TOLERANCE = 1e-5


def measured_hfu(priced: Priced, measured_s: float) -> float:
    """The hardware FLOP rate a run reached over the whole step, over the device's bf16 peak: the
    FLOPs the cost model counts for its layout (recomputation included; no efficiency enters the
    count) over its measured step time."""
    ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
    return ev.hfu * ev.step_time_s / measured_s


def step_match_fraction(run: dict, device: str, options: SearchOptions) -> float | None:
    """The ``gemm.large`` of ``device`` at which the cost model predicts ``run``'s measured step (the
    run re-evaluated as ``validate`` prices it, its unpublished knobs searched again), by bisection
    on :data:`MATCH_BOUNDS`: a larger fraction never predicts a slower step. The bound where even it
    leaves the prediction on one side; None where the run cannot be evaluated."""
    def too_slow(fraction: float) -> bool | None:
        r = evaluate_run(run, options, False, CeilingOverride({device: fraction}))
        return None if r.error is None else r.error > 0

    lo, hi = MATCH_BOUNDS
    at_hi, at_lo = too_slow(hi), too_slow(lo)
    if at_hi is None or at_lo is None:
        return None
    if at_hi or not at_lo:
        return hi if at_hi else lo
    while hi - lo > MATCH_TOLERANCE:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if too_slow(mid) else (lo, mid)
    return (lo + hi) / 2


def derive_ceilings(rows: Sequence[tuple[RunResult, Priced]], options: SearchOptions | None = None,
                    ) -> dict[str, tuple[float, str, tuple[str, ...]] | None]:
    """Per derived device: ``(fraction, what set it, the sources it rests on)`` from the runs of
    ``rows`` on it (of its framework, with a measured step time, 16-bit: a low-precision run's GEMMs
    take other fractions), by its rule (:class:`DerivedCeiling`); None without such runs."""
    opts = options or SearchOptions(top_k=0)
    out: dict[str, tuple[float, str, tuple[str, ...]] | None] = {}
    for d in DERIVED_CEILINGS:
        mine = [(r, p) for r, p in rows if p.cluster.device.id == d.device and r.measured_step_time_s
                and (d.framework is None or r.framework.split("@")[0] == d.framework)
                and not low_precision(p.job.precision)]
        if d.rule == "best_hfu":
            best = max(((measured_hfu(p, r.measured_step_time_s), r.id, r.source) for r, p in mine), default=None)
            out[d.device] = best and (best[0], best[1], (best[2],))
            continue
        matched = [(f, r.source) for r, p in mine if (f := step_match_fraction(p.run, d.device, opts)) is not None]
        out[d.device] = (median(f for f, _ in matched), f"median of {len(matched)} runs",
                         tuple(sorted({s for _, s in matched}))) if matched else None
    return out


def stand_in(d: DerivedCeiling) -> float:
    """The fraction that stands in for ``d`` where none of its runs is left."""
    return d.fallback if isinstance(d.fallback, float) else load_device(d.fallback).gemm.large


class CeilingOverride:
    """Prices a run with other ``gemm.large`` fractions for some devices (the duck type of a
    ``planner.studies.calibration.Calibration`` that ``evaluate_run`` takes)."""

    def __init__(self, fractions: dict[str, float]):
        self.fractions = fractions

    def apply(self, cluster: Cluster, framework: str, job=None) -> Cluster:  # noqa: ARG002 (Calibration.apply's job)
        value = self.fractions.get(cluster.device.id)
        if value is None:
            return cluster
        dev = cluster.device
        return replace(cluster, device=dev.model_copy(update={"gemm": dev.gemm.model_copy(update={"large": value})}))


def cross_validated(runs: Sequence[dict], pairs: Sequence[tuple[RunResult, Priced | None]],
                    options: SearchOptions | None = None, frozen: Collection[str] = ()) -> dict:
    """Median, p90 and signed error of :func:`cross_validated_results`, overall, by family and by
    framework profile, and what each constant was re-derived to."""
    results, derived = cross_validated_results(runs, pairs, options, frozen)
    return {**_error_stats(results), "derived": derived}


def cross_validated_results(runs: Sequence[dict], pairs: Sequence[tuple[RunResult, Priced | None]],
                            options: SearchOptions | None = None, frozen: Collection[str] = ()
                            ) -> tuple[list[RunResult], dict]:
    """Every measured step time predicted with the constants derived without its own source: the
    results of ``pairs`` (``runs`` as ``planner.studies.runs.price_run`` priced them, in order)
    where no derived constant rests on the source, re-evaluated otherwise; and per derived device its
    value and what it was re-derived to without each source. The constants are derived from the runs
    not in ``frozen`` (the hold-out files' run ids: they count in every figure but set nothing)."""
    opts = options or SearchOptions(top_k=0)
    devices = {d.device for d in DERIVED_CEILINGS}
    device_of = {r.id: p.cluster.device.id for r, p in pairs if p is not None and p.cluster.device.id in devices}
    rows = [(r, p) for r, p in pairs if r.id in device_of and r.measured_step_time_s and r.id not in frozen]
    full = derive_ceilings(rows, opts)
    errors = {r.id: r for r, _ in pairs if r.sample() is not None}
    derived = {d.device: {"value": None if full[d.device] is None else round(full[d.device][0], 4),
                          "run": None if full[d.device] is None else full[d.device][1], "without": {}}
               for d in DERIVED_CEILINGS}
    for source in sorted({s for v in full.values() if v for s in v[2]}):
        without = derive_ceilings([(r, p) for r, p in rows if r.source != source], opts)
        fractions = {d.device: (without[d.device][0] if without[d.device] else stand_in(d))
                     for d in DERIVED_CEILINGS if (without[d.device] or (None,))[0] != (full[d.device] or (None,))[0]}
        for device, value in fractions.items():
            derived[device]["without"][source] = round(value, 4)
        held = CeilingOverride(fractions)
        for run, (r, _) in zip(runs, pairs):
            if r.source == source and r.id in errors and device_of.get(r.id) in fractions:
                errors[r.id] = evaluate_run(run, opts, False, held)
    return list(errors.values()), derived


def _error_stats(rows: list[RunResult]) -> dict:
    def stats(group: list[RunResult]) -> dict:
        return error_figures([r.error for r in group if r.error is not None])

    by = lambda key: {k: stats([r for r in rows if key(r) == k]) for k in sorted({key(r) for r in rows})}  # noqa: E731
    return {**stats(rows), "sources": len({r.source for r in rows}),
            "by_family": by(lambda r: r.family), "by_framework": by(lambda r: r.framework.split("@")[0])}
