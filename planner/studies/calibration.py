"""Calibration on a user's own measured runs: ``clusterplan calibrate`` and ``--calibration``.

No model built from published runs is right for every site's software stack. A calibration fits a
small, named set of site parameters (:data:`PARAMETERS`), never one per run, on the runs a user
measured: per device and framework, factors on the achieved matmul rate, the memory-bound rate and
the host time per kernel, and per fabric the bandwidth collectives achieve inside and across the
scale-up domains. Each factor multiplies the bundled figure it names, so a calibration moves every
prediction that rests on that figure, and nothing else; no factor takes a rate past the device's
peak or a link's nominal rate.

The fit (:func:`fit_entry`) is the most probable set of factors given the runs' log errors of
predicted step time (each run priced with its published layout and the knobs the search chose for
it, the way ``validate`` prices it) and a prior centred on the bundled figures: the prior's spread and
the runs' scatter, within a job and between jobs, are derived from the repository's runs
(``planner.studies.calibration_prior``), so one run of a job moves the factors only as far as runs
of other jobs share its error. It fits a parameter only where some run spends :data:`MIN_SENSITIVITY` of its step on it, where the
runs tell it apart from the parameters already fitted, and never more parameters than runs; the
others keep the bundled figure, with the kind of run that would tie them down. Its error is given
before, after, and leave-one-out (each run predicted by a fit without it), and the leave-one-out
errors give the 80% interval that plans quote where the calibration applies.

A calibration applies to the device and framework it was fitted on; its fabric factors only to the
cluster preset it was fitted on. Asked for elsewhere, a plan says so and prices without it.

Beside those factors (the *site-level* fit, shrunk toward the bundled figures by the prior), an
entry carries a *job-level* fit for each job its runs are of (:func:`job_of`: a job is a model's
shape on one device under one framework in one precision; its batch, sequence length, layout and
size may differ). The job-level fit takes the job's runs at their word (least squares, the bundled
figures only breaking ties): the repository's runs of one job share nearly all of their error
(``validate --calibrate-one``). Priced again, a job the file was fitted on gets its job-level
factors, any other job the site-level ones (:meth:`Calibration.apply`), and the report and the
Plan document say which.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from clusterplan.models.errors import SpecError, check_number, shown
from clusterplan.models.files import load_file
from clusterplan.planner.studies.uncertainty import LEVEL
from clusterplan.topologies.cluster import SCALE_OUT_LEVELS, SCALE_UP_LEVELS, Cluster
from clusterplan.topologies.devices import GemmEfficiency

FORMAT = "clusterplan-calibration/1"


@dataclass(frozen=True)
class Parameter:
    """One site parameter: a factor on a bundled figure, its allowed range, and what ties it down."""

    name: str
    what: str
    low: float
    high: float
    needs: str


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("compute", "achieved matmul and fused-attention rate (x the bundled figure, capped at the device's "
              "peak)", 0.2, 5.0, "runs whose step is mostly matrix math (long sequences, large micro-batches)"),
    Parameter("memory", "achieved rate of memory-bound kernels: norms, activations, casts, the optimizer (x the "
              "bundled figure, capped at the memory's nominal rate)", 0.2, 5.0,
              "runs where memory-bound kernels take a larger share (small hidden sizes, unfused kernels, few devices)"),
    Parameter("host", "launch and host time per kernel (x the bundled figure)", 0.05, 50.0,
              "runs of short steps with many small kernels (small models or micro-batches, MoE layers)"),
    Parameter("scale_up", "bandwidth collectives achieve inside a scale-up domain: NVLink, ICI, xGMI (x the bundled "
              "figure, capped at the links' nominal rate)", 0.1, 5.0,
              "runs whose tensor-, expert- or data-parallel traffic inside a domain is exposed"),
    Parameter("scale_out", "bandwidth collectives achieve across domains: the NICs (x the bundled figure, capped at "
              "the links' nominal rate)", 0.1, 5.0,
              "runs over several nodes whose data-parallel, pipeline or expert traffic crosses the network exposed"),
)
PARAMETER = {p.name: p for p in PARAMETERS}
NAMES = tuple(PARAMETER)
FABRIC = ("scale_up", "scale_out")

MIN_SENSITIVITY = 0.03
"""A parameter is fitted only where doubling it would move some run's step by at least about 2%
(d log step / d log factor of 0.03): below that the runs cannot see it."""

MIN_INDEPENDENCE = 0.1
"""Smallest over largest singular value of the runs' sensitivities (columns scaled to unit length)
for the parameters fitted together: below it the runs cannot tell them apart."""

STEP = 0.05  # log step of the finite differences
MAX_ITERATIONS = 12
HOST_CEILING_S = 1e-3  # topologies.entries: a kernel's overhead is at most 1 ms


# ---- applying factors to a cluster -------------------------------------------------------------------

GEMM_FIELDS = tuple(k for k in GemmEfficiency.model_fields if k.startswith("large"))  # every precision's fraction
ATTENTION_FIELDS = ("attention_efficiency", "attention_efficiency_fa2")


def with_factors(cluster: Cluster, values: Mapping[str, float], fabric: bool = True) -> Cluster:
    """``cluster`` with its device's figures and its collectives' bandwidth multiplied by ``values``
    (:data:`PARAMETERS`; missing ones 1), each capped at what the hardware's nominal rate allows;
    ``fabric=False`` leaves the bandwidths as built."""
    cluster = cluster.physical
    dev = cluster.device
    c = float(values.get("compute", 1.0))
    gemm = dev.gemm.model_copy(update={k: min(1.0, getattr(dev.gemm, k) * c)
                                       for k in GEMM_FIELDS if getattr(dev.gemm, k) is not None})
    update = {"gemm": gemm, "memory_efficiency": min(1.0, dev.memory_efficiency * float(values.get("memory", 1.0))),
              "kernel_overhead_s": min(HOST_CEILING_S, dev.kernel_overhead_s * float(values.get("host", 1.0)))}
    update.update({k: min(1.0, getattr(dev, k) * c) for k in ATTENTION_FIELDS if getattr(dev, k) is not None})
    scale = cluster.bandwidth_scale
    if fabric:
        caps = _bandwidth_caps(cluster)
        scale = (min(caps[0], scale[0] * float(values.get("scale_up", 1.0))),
                 min(caps[1], scale[1] * float(values.get("scale_out", 1.0))))
    return replace(cluster, device=dev.model_copy(update=update), bandwidth_scale=scale)


@functools.lru_cache(maxsize=64)
def _bandwidth_caps(cluster: Cluster) -> tuple[float, float]:
    """The largest factors on the achieved bandwidths that keep every link at or below its nominal
    rate: 1 over the highest achieved fraction of the scale-up and of the scale-out links."""
    best = {"up": 0.0, "out": 0.0}
    for _, _, d in cluster.graph.edges(data=True):
        kind = "up" if d.get("level") in SCALE_UP_LEVELS else "out" if d.get("level") in SCALE_OUT_LEVELS else None
        if kind:
            best[kind] = max(best[kind], float(d.get("achieved_fraction", 1.0)))
    return tuple(1.0 / best[k] if best[k] else 1.0 for k in ("up", "out"))


# ---- what a job is ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobId:
    """One job, as a calibration tells jobs apart (:func:`job_of`)."""

    model: str  # the model's name, for the reader: jobs are matched on model_shape
    model_shape: str
    device: str
    framework: str
    precision: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.model_shape, self.device, self.framework, self.precision

    def label(self) -> str:
        return f"{self.model} in {self.precision} on {self.device} under {self.framework}"


def job_of(model, device: str, framework: str, precision: str) -> JobId:
    """The job a run or a plan is of: the model's shape (what sets its work per token: layers, widths,
    heads, vocabulary, experts; not its name, sequence length or dropout) on ``device`` under
    ``framework`` in ``precision``. Its batch, sequence length, layout and device count may differ."""
    shape = (f"{model.num_layers} layers, hidden {model.hidden_size}, {model.num_attention_heads}/"
             f"{model.num_kv_heads_resolved} heads of {model.head_dim_resolved}, ffn {model.ffn_hidden_size} "
             f"{model.ffn_activation}, vocab {model.vocab_size}{', tied' if model.tied_embeddings else ''}")
    if model.moe is not None:
        m = model.moe
        shape += (f", {m.num_experts} experts top-{m.top_k} of {m.expert_ffn_hidden_size} + {m.num_shared_experts} "
                  f"shared, {m.num_dense_layers} dense layers")
    if model.mla is not None:
        shape += f", MLA {model.mla.q_lora_rank}/{model.mla.kv_lora_rank}"
    if model.sliding_window:
        shape += f", window {model.sliding_window} every {model.sliding_window_pattern or 1}"
    return JobId(model.name, shape, device, framework, precision)


# ---- the calibration file ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """The factors fitted for one device under one framework, on one fabric."""

    device: str
    framework: str
    cluster: str
    values: dict[str, float]
    fitted: dict[str, dict] = field(default_factory=dict)  # name -> {stderr}
    kept: dict[str, str] = field(default_factory=dict)  # name -> why the bundled figure is kept
    runs: tuple[str, ...] = ()
    interval: tuple[float, float] | None = None  # 80% bounds of measured / predicted, leave-one-out
    error: dict = field(default_factory=dict)
    prior: dict = field(default_factory=dict)  # the spreads the fit was weighed by (calibration_prior.Scatter)
    job: dict = field(default_factory=dict)  # a job-level fit's job: model, model_shape, precision (JobId)
    jobs: tuple[Entry, ...] = ()  # the job-level fit of each job the runs are of

    def as_dict(self) -> dict:
        out = {"device": self.device, "framework": self.framework, "cluster": self.cluster,
               "values": {k: round(v, 6) for k, v in self.values.items()},
               "fitted": self.fitted, "kept": self.kept, "runs": list(self.runs),
               "interval": None if self.interval is None else [round(x, 6) for x in self.interval],
               "error": self.error}
        if self.job:
            return {"job": self.job} | out
        return out | {"prior": self.prior, "jobs": [j.as_dict() for j in self.jobs]}

    def job_fit(self, job: JobId | None) -> Entry | None:
        """The job-level fit for ``job``, where this entry was fitted on runs of it."""
        return next((j for j in self.jobs if job is not None and (j.job.get("model_shape"), self.device,
                     self.framework, j.job.get("precision")) == job.key), None)


@dataclass(frozen=True)
class Calibration:
    """A calibration file: its entries, one per (device, framework)."""

    path: str
    entries: tuple[Entry, ...]

    def entry_for(self, device: str, framework: str) -> Entry | None:
        return next((e for e in self.entries if e.device == device and e.framework == framework), None)

    def apply(self, cluster: Cluster, framework: str, job: JobId | None = None) -> Cluster:
        """``cluster`` priced as calibrated for its device under ``framework``, carrying what was done
        (``Cluster.calibration``): the job-level factors where the entry was fitted on runs of ``job``,
        the site-level ones otherwise (``level``); the fabric factors only on the preset they were
        fitted on; nothing where the file has no entry for the device and framework (the note says so)."""
        entry = self.entry_for(cluster.device.id, framework)
        if entry is None:
            have = ", ".join(f"{e.device} under {e.framework}" for e in self.entries) or "nothing"
            note = (f"calibration {self.path} not applied: it was fitted for {have}, not {cluster.device.id} under "
                    f"{framework}")
            return replace(cluster, calibration={"applied": False, "note": note, "file": self.path})
        own = entry.job_fit(job)
        used = own or entry
        same_fabric = used.cluster == cluster.id
        out = with_factors(cluster, used.values, fabric=same_fabric)
        note = (f"calibrated: {self.path}, {_level_text(entry, own, job)}"
                f" (every figure uses it; the validated error above is the uncalibrated model's)"
                + ("" if same_fabric or not any(used.values.get(k, 1.0) != 1.0 for k in FABRIC)
                   else f"; its fabric factors were fitted on {used.cluster}, not applied on {cluster.id}"))
        return replace(out, calibration={"applied": True, "note": note, "file": self.path, "runs": len(used.runs),
                                         "level": "job" if own else "site", "values": dict(used.values),
                                         "interval": used.interval or entry.interval})


def _level_text(entry: Entry, own: Entry | None, job: JobId | None) -> str:
    """Which factors a calibration applied, and why: the job-level fit of the job priced, or the
    site-level one (the job was not among the runs, with the jobs that were)."""
    if own is not None:
        return (f"job-level fit for {own.job.get('model')} in {own.job.get('precision')} on {entry.device} under "
                f"{entry.framework} ({len(own.runs)} run(s) of this job)"
                + ("" if own.interval or not entry.interval else "; the interval is the site-level fit's"))
    if not entry.jobs:
        basis = f"fitted on {len(entry.runs)} run(s)" if entry.runs else "measured by clusterplan probe on"
        return f"{basis} {entry.device} under {entry.framework}"
    fitted = "; ".join(f"{j.job.get('model')} in {j.job.get('precision')}" for j in entry.jobs)
    asked = f"{job.model} in {job.precision}" if job else "this job"
    return (f"site-level fit for {entry.device} under {entry.framework} ({len(entry.runs)} run(s)): {asked} is not a "
            f"job it was fitted on ({fitted}), so only the factors every job shares apply")


def calibrated_interval(cluster: Cluster, step_time_s: float) -> dict | None:
    """The 80% interval of ``step_time_s`` that the calibration applied to ``cluster`` gives (from its
    fit's leave-one-out errors, ``planner.studies.calibrate``), in the form
    ``planner.studies.uncertainty.prediction_interval`` returns; None where none applies or it has none."""
    cal = cluster.calibration or {}
    if not cal.get("applied") or not cal.get("interval"):
        return None
    low, high = cal["interval"]
    return {"low_s": step_time_s * low, "high_s": step_time_s * high, "level": LEVEL, "runs": cal["runs"],
            "regime": f"the runs of calibration {cal['file']}", "sources": 1, "calibrated": True}


def save(calibration_entries: Sequence[Entry], path: str | Path) -> None:
    import yaml

    doc = {"format": FORMAT, "parameters": {p.name: p.what for p in PARAMETERS},
           "entries": [e.as_dict() for e in calibration_entries]}
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False, width=110))


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> Calibration:
    where = f"--calibration {path}"
    doc = load_file(path, where)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{where}: format: got {got!r}; allowed: {FORMAT} (written by clusterplan calibrate)")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{where}: entries: got {entries!r}; allowed: a non-empty list of fitted entries")
    return Calibration(path, tuple(_entry(e, f"{where}: entries[{i}]") for i, e in enumerate(entries)))


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file (:data:`FORMAT`); SpecError (exit 2) names what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"--calibration: got {str(path)!r}; allowed: the path of a file written by clusterplan calibrate")
    return _load_cached(str(p), p.stat().st_mtime_ns)


def _entry(raw, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: got {raw!r}; allowed: a mapping with device, framework, cluster and values")
    for key in ("device", "framework", "cluster"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            raise SpecError(f"{where}.{key}: got {raw.get(key)!r}; allowed: an id")
    values = raw.get("values")
    if not isinstance(values, dict):
        raise SpecError(f"{where}.values: got {values!r}; allowed: a mapping of {', '.join(NAMES)} to factors")
    for name, v in values.items():
        if name not in PARAMETER:
            raise SpecError(f"{where}.values.{name}: unknown parameter; allowed: {', '.join(NAMES)}")
        check_number(f"{where}.values.{name}", v, PARAMETER[name].low, PARAMETER[name].high)
    iv = raw.get("interval")
    if iv is not None and not (isinstance(iv, list) and len(iv) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 100 for x in iv) and iv[0] <= iv[1]):
        raise SpecError(f"{where}.interval: got {iv!r}; allowed: [low, high] ratios of measured to predicted, or null")
    fitted, kept, error, prior, job = (_optional(raw, key, dict, where)
                                       for key in ("fitted", "kept", "error", "prior", "job"))
    jobs = tuple(_job_entry(j, raw, f"{where}.jobs[{i}]") for i, j in enumerate(_optional(raw, "jobs", list, where)))
    return Entry(raw["device"], raw["framework"], raw["cluster"], {k: float(v) for k, v in values.items()},
                 fitted, kept, tuple(str(r) for r in _optional(raw, "runs", list, where)),
                 None if iv is None else (float(iv[0]), float(iv[1])), error, prior, job, jobs)


def _job_entry(raw, parent: dict, where: str) -> Entry:
    """A job-level fit of an entry: an entry of the same device and framework naming its job."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: got {shown(raw)}; allowed: a mapping with job, cluster and values")
    job = raw.get("job")
    for key in ("model", "model_shape", "precision"):
        if not isinstance(job, dict) or not isinstance(job.get(key), str) or not job.get(key):
            got = job.get(key) if isinstance(job, dict) else job
            raise SpecError(f"{where}.job.{key}: got {shown(got)}; allowed: text (clusterplan calibrate writes it)")
    out = _entry(raw | {"device": parent["device"], "framework": parent["framework"], "jobs": None}, where)
    return replace(out, job={k: job[k] for k in ("model", "model_shape", "precision")})


def _optional(raw: dict, key: str, kind: type, where: str):
    """An entry's informational field (what was fitted and kept, the error, the runs): absent or of
    ``kind`` (a mapping or a list), else a SpecError naming it."""
    value = raw.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise SpecError(f"{where}.{key}: got {shown(value)}; allowed: {'a mapping' if kind is dict else 'a list'}")
    return kind(value)
