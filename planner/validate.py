"""Validation against published training runs (format ``clusterplan-runs/1``).

Each run is evaluated with its published layout held fixed; knobs the source did not publish
(``null``) are chosen by the search, as are the ones the format has no field for (rank order, DP
and TP overlap). The prediction is then compared with the measured step time. A run that cannot
be evaluated says why and does not stop the others.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from cost.layout import Job
from models.errors import ClusterplanError, InfeasibleError, SpecError
from models.library import list_models, load_model, model_from_mapping
from planner.explain import changed_knobs
from planner.search import SearchOptions, SearchResult, plan
from planner.space import Bounds
from topologies.library import build_cluster

FORMAT = "clusterplan-runs/1"
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "vp", "sequence_parallel", "zero_stage", "recompute")
GIB = 2**30


@dataclass
class RunResult:
    """The outcome for one run; ``reason`` is set when it could not be evaluated."""

    id: str
    family: str = ""
    device: str = ""
    cluster: str = ""
    count: int = 0
    confidence: str = ""
    measured_step_time_s: float | None = None
    predicted_step_time_s: float | None = None
    error: float | None = None
    fits: bool | None = None
    predicted_peak_memory_bytes: float | None = None
    measured_peak_memory_bytes: float | None = None
    memory_error: float | None = None
    layout: dict | None = None
    mfu: float | None = None
    breakdown: dict | None = None
    best_layout: dict | None = None
    best_step_time_s: float | None = None
    best_note: str | None = None
    notes: list[str] = field(default_factory=list)
    reason: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def bundled_runs_path() -> Path:
    """The published runs shipped with clusterplan (a copy of shared/validation/runs.yaml)."""
    return Path(str(resources.files("planner") / "data" / "runs.yaml"))


def load_runs(path: str | Path) -> list[dict]:
    """Read a ``clusterplan-runs/1`` file; raise :class:`SpecError` if it is not one."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"validate FILE: {str(p)!r} does not exist or is not a file")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"validate FILE: {p} is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"validate FILE: {p}: format is {got!r}; expected {FORMAT!r} (see shared/validation/README.md)")
    runs = doc.get("runs")
    if not isinstance(runs, list):
        raise SpecError(f"validate FILE: {p}: 'runs' must be a list of runs")
    return runs


def _model(run: dict, notes: list[str]):
    fields = {k: v for k, v in dict(run.get("model") or {}).items() if v is not None or k == "moe"}
    if "vocab_size" not in fields:
        twin = _bundled_twin(fields)
        if twin is None:
            raise SpecError("model.vocab_size is not published and no bundled model has the same shape")
        fields["vocab_size"] = twin.vocab_size
        notes.append(f"vocab_size {twin.vocab_size} taken from the bundled model of the same shape ({twin.name})")
    fields["seq_len"] = run.get("seq_len") or fields.get("seq_len", 2048)
    dropout = fields.pop("dropout", None)
    spec = model_from_mapping(fields, name=fields.get("name") or run.get("id"), where=f"run {run.get('id')}: model")
    return spec if dropout is None else spec.model_copy(update={"dropout": bool(dropout)})


def _bundled_twin(fields: dict):
    for entry in list_models():
        spec = load_model(entry.id)
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (
                fields.get("num_layers"), fields.get("hidden_size"), fields.get("num_attention_heads")):
            return spec
    return None


def _bounds(run: dict) -> Bounds:
    layout = dict(run.get("layout") or {})
    fixed = {k: layout[k] for k in LAYOUT_KEYS if layout.get(k) is not None}
    # The format has no field for communication overlap: assume the frameworks' defaults, the same for
    # every run (Megatron-LM and torch FSDP overlap the data-parallel traffic; TP overlap is opt-in).
    fixed.setdefault("dp_overlap", True)
    fixed.setdefault("tp_overlap", False)
    if run.get("micro_batch_size") is not None:
        fixed["micro_batch_size"] = run["micro_batch_size"]
    return Bounds(fixed=fixed)


def evaluate_run(run: dict, options: SearchOptions, best: bool = True) -> RunResult:
    """Evaluate one run with its published layout; never raises for a bad run."""
    result = RunResult(id=str(run.get("id", "?")), confidence=str(run.get("confidence", "")))
    try:
        _evaluate(run, options, result, best)
    except ClusterplanError as err:
        result.reason = str(err).splitlines()[0]
    except (KeyError, TypeError, ValueError) as err:
        result.reason = f"malformed run: {err}"
    return result


def _evaluate(run: dict, options: SearchOptions, result: RunResult, best: bool) -> None:
    hw = run.get("hardware") or {}
    result.cluster, result.device, result.count = hw.get("cluster", ""), hw.get("device", ""), int(hw.get("count") or 0)
    measured = run.get("measured") or {}
    result.measured_step_time_s = measured.get("step_time_s")
    if measured.get("peak_memory_gib") is not None:
        result.measured_peak_memory_bytes = measured["peak_memory_gib"] * GIB
    model = _model(run, result.notes)
    cluster = build_cluster(hw["cluster"], num_devices=hw.get("count"), device=hw.get("device"),
                            scale_out_gbit_per_s=hw.get("scale_out_gbit_per_s_per_device"))
    result.family = cluster.device.family
    if not run.get("global_batch_size"):
        raise SpecError("global_batch_size is not published")
    job = Job(global_batch_size=int(run["global_batch_size"]), seq_len=int(run["seq_len"]),
              precision=str(run.get("precision") or "bf16"), attention=str(run.get("attention") or "flash"))
    fixed = _bounds(run)
    opts = SearchOptions(engine=options.engine, top_k=0, time_limit_s=options.time_limit_s, bounds=fixed)
    try:
        res = plan(model, job, cluster, opts)
    except InfeasibleError:
        ignore = Bounds(fixed=fixed.fixed, ignore_memory=True)
        res = plan(model, job, cluster, SearchOptions(engine=options.engine, top_k=0, bounds=ignore))
    _record(result, res)
    if best:
        _record_best(result, model, job, cluster, options)


def _record(result: RunResult, res: SearchResult) -> None:
    ev = res.best
    result.predicted_step_time_s = ev.step_time_s
    result.fits = ev.fits
    result.predicted_peak_memory_bytes = ev.peak_memory_bytes
    result.layout = ev.layout.as_dict()
    result.mfu = ev.mfu
    result.breakdown = {k: v for k, v in ev.time.__dict__.items()}
    if result.measured_step_time_s:
        result.error = (ev.step_time_s - result.measured_step_time_s) / result.measured_step_time_s
    if result.measured_peak_memory_bytes:
        result.memory_error = (ev.peak_memory_bytes - result.measured_peak_memory_bytes) / result.measured_peak_memory_bytes


def _record_best(result: RunResult, model, job: Job, cluster, options: SearchOptions) -> None:
    """The planner's own best layout for the same model, devices, batch and precision."""
    try:
        res = plan(model, job, cluster, SearchOptions(engine=options.engine, top_k=0, time_limit_s=options.time_limit_s))
    except ClusterplanError as err:
        result.best_note = f"no free search result: {str(err).splitlines()[0]}"
        return
    ev = res.best
    result.best_layout = ev.layout.as_dict()
    result.best_step_time_s = ev.step_time_s
    if result.predicted_step_time_s and ev.step_time_s < result.predicted_step_time_s:
        result.best_note = _why_faster(result.layout or {}, ev.layout.as_dict(), result.predicted_step_time_s,
                                       ev.step_time_s)


def _why_faster(published: dict, best: dict, published_s: float, best_s: float) -> str:
    changed = [f"{k} {published.get(k)}->{v}" for k, v in changed_knobs(published, best).items()]
    return f"{published_s / best_s:.2f}x faster by changing " + ", ".join(changed)


def summarize(results: list[RunResult]) -> dict:
    """Median, 90th percentile and max |error| overall and by hardware family."""
    def stats(rows: list[RunResult]) -> dict:
        errors = sorted(abs(r.error) for r in rows if r.error is not None)
        if not errors:
            return {"runs": 0}
        return {"runs": len(errors), "median_abs_error": statistics.median(errors),
                "p90_abs_error": _percentile(errors, 0.9), "max_abs_error": errors[-1],
                "within_2x": sum(1 for r in rows if r.error is not None and 0.5 <= 1 + r.error <= 2.0),
                "fits": sum(1 for r in rows if r.fits), "evaluated": len(rows)}

    evaluated = [r for r in results if r.reason is None]
    families = sorted({r.family for r in evaluated})
    mem = sorted(abs(r.memory_error) for r in evaluated if r.memory_error is not None)
    summary = {"overall": stats(evaluated), "by_family": {f: stats([r for r in evaluated if r.family == f]) for f in families},
               "not_evaluated": len(results) - len(evaluated)}
    if mem:
        summary["memory"] = {"runs": len(mem), "median_abs_error": statistics.median(mem), "max_abs_error": mem[-1]}
    return summary


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def validate(path: str | Path | None = None, options: SearchOptions | None = None, best: bool = True) -> dict:
    """Evaluate every run of ``path`` (the bundled runs by default); ``{"runs": [...], "summary": {...}}``."""
    opts = options or SearchOptions()
    runs = load_runs(path or bundled_runs_path())
    results = [evaluate_run(run, opts, best) for run in runs]
    return {"file": str(path or bundled_runs_path()), "runs": [r.as_dict() for r in results],
            "summary": summarize(results)}


def markdown_report(result: dict) -> str:
    """The validation table as Markdown (what docs/cost-model.md embeds)."""
    lines = ["| run | device x count | layout | predicted s | measured s | error | fits |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in result["runs"]:
        if r["reason"]:
            lines.append(f"| {r['id']} | {r['device']} x {r['count']} | not evaluated: {r['reason']} | | | | |")
            continue
        L = r["layout"]
        lay = (f"tp{L['tp']} pp{L['pp']} dp{L['dp']} cp{L['cp']} ep{L['ep']} vp{L['vp']} mbs{L['micro_batch_size']} "
               f"{L['recompute']} z{L['zero_stage']}")
        meas = f"{r['measured_step_time_s']:.3f}" if r["measured_step_time_s"] else "-"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        lines.append(f"| {r['id']} | {r['device']} x {r['count']} | {lay} | {r['predicted_step_time_s']:.3f} | "
                     f"{meas} | {err} | {'yes' if r['fits'] else 'NO'} |")
    s = result["summary"]
    lines += ["", "| hardware family | runs | median abs error | p90 abs error | max abs error |",
              "|---|---:|---:|---:|---:|"]
    rows = [("all", s["overall"])] + sorted(s["by_family"].items())
    for name, st in rows:
        if st.get("runs"):
            lines.append(f"| {name} | {st['runs']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
                         f"{st['max_abs_error']:.1%} |")
    return "\n".join(lines)
