"""Constants derived from published runs, derived by code, and the leave-one-source-out figure that
re-derives them without each source (``clusterplan validate``'s cross-validated headline).

Two constants of the catalogue come from runs rather than from a benchmark: the large-GEMM
fractions of TPU v5e and v5p (``topologies/data/devices.yaml``, ``gemm.large``). No matmul benchmark
of either chip was found; the hardware FLOP rate MaxText's published runs reached, averaged over
whole steps (recomputation counted), is a lower bound on the matmul ceiling, and the best of those
runs sets it (:func:`derive_ceilings`; a test holds the catalogue to what this code derives from the
bundled runs). The same runs are then predicted with it, so their errors are not independent
evidence: :func:`cross_validated` predicts each source's runs with the constants derived without it
(where nothing is left to derive from, the family's stand-in: TPU v6e's measured fraction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from clusterplan.cost.step import evaluate
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.runs import Priced, RunResult, evaluate_run
from clusterplan.planner.studies.uncertainty import error_figures
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.library import load_device


@dataclass(frozen=True)
class DerivedCeiling:
    """A device whose ``gemm.large`` is the best whole-step hardware FLOP rate over peak that runs of
    ``framework`` reached on it; ``fallback``: the device whose fraction stands in without such runs."""

    device: str
    framework: str
    fallback: str


DERIVED_CEILINGS = (DerivedCeiling("tpu-v5e", "maxtext", "tpu-v6e"), DerivedCeiling("tpu-v5p", "maxtext", "tpu-v6e"))


def measured_hfu(priced: Priced, measured_s: float) -> float:
    """The hardware FLOP rate a run reached over the whole step, over the device's bf16 peak: the
    FLOPs the cost model counts for its layout (recomputation included; no efficiency enters the
    count) over its measured step time."""
    ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
    return ev.hfu * ev.step_time_s / measured_s


def derive_ceilings(rows: Sequence[tuple[RunResult, Priced]]) -> dict[str, tuple[float, str, str] | None]:
    """Per derived device: ``(fraction, run id, source)`` of the run with the highest whole-step
    hardware FLOP rate among ``rows`` of its framework with a measured step time, or None."""
    out: dict[str, tuple[float, str, str] | None] = {}
    for d in DERIVED_CEILINGS:
        cands = [(measured_hfu(p, r.measured_step_time_s), r.id, r.source) for r, p in rows
                 if p.cluster.device.id == d.device and r.framework.split("@")[0] == d.framework
                 and r.measured_step_time_s]
        out[d.device] = max(cands) if cands else None
    return out


class CeilingOverride:
    """Prices a run with other ``gemm.large`` fractions for some devices (the duck type of a
    ``planner.studies.calibration.Calibration`` that ``evaluate_run`` takes)."""

    def __init__(self, fractions: dict[str, float]):
        self.fractions = fractions

    def apply(self, cluster: Cluster, framework: str) -> Cluster:
        value = self.fractions.get(cluster.device.id)
        if value is None:
            return cluster
        dev = cluster.device
        return replace(cluster, device=dev.model_copy(update={"gemm": dev.gemm.model_copy(update={"large": value})}))


def cross_validated(runs: Sequence[dict], pairs: Sequence[tuple[RunResult, Priced | None]],
                    options: SearchOptions | None = None) -> dict:
    """Every measured step time predicted with the constants derived without its own source: the
    plain errors of ``pairs`` (``runs`` as ``planner.studies.runs.price_run`` priced them, in order)
    where no derived constant rests on the source, re-evaluated otherwise. Median, p90 and signed
    error, overall, by family and by framework profile, and what each constant was re-derived to."""
    opts = options or SearchOptions(top_k=0)
    devices = {d.device for d in DERIVED_CEILINGS}
    rows = [(r, p) for r, p in pairs if p is not None and r.measured_step_time_s and p.cluster.device.id in devices]
    device_of = {r.id: p.cluster.device.id for r, p in rows}
    full = derive_ceilings(rows)
    errors = {r.id: r for r, _ in pairs if r.sample() is not None}
    derived = {d.device: {"value": None if full[d.device] is None else round(full[d.device][0], 4),
                          "run": None if full[d.device] is None else full[d.device][1], "without": {}}
               for d in DERIVED_CEILINGS}
    for source in sorted({v[2] for v in full.values() if v}):
        without = derive_ceilings([(r, p) for r, p in rows if r.source != source])
        fractions = {d.device: (without[d.device][0] if without[d.device] else load_device(d.fallback).gemm.large)
                     for d in DERIVED_CEILINGS if without[d.device] != full[d.device]}
        for device, value in fractions.items():
            derived[device]["without"][source] = round(value, 4)
        held = CeilingOverride(fractions)
        for run, (r, _) in zip(runs, pairs):
            if r.source == source and r.id in errors and device_of.get(r.id) in fractions:
                errors[r.id] = evaluate_run(run, opts, False, held)
    return {**_error_stats(list(errors.values())), "derived": derived}


def _error_stats(rows: list[RunResult]) -> dict:
    def stats(group: list[RunResult]) -> dict:
        return error_figures([r.error for r in group if r.error is not None])

    by = lambda key: {k: stats([r for r in rows if key(r) == k]) for k in sorted({key(r) for r in rows})}  # noqa: E731
    return {**stats(rows), "sources": len({r.source for r in rows}),
            "by_family": by(lambda r: r.family), "by_framework": by(lambda r: r.framework.split("@")[0])}
