"""Validation against published training runs (format ``clusterplan-runs/1``).

Each run is evaluated with its published layout held fixed; knobs the source did not publish
(``null``) are chosen by the search, as are the ones the format has no field for (rank order, DP
and TP overlap). The prediction is then compared with the measured step time. A run that cannot
be evaluated says why and does not stop the others.
"""

from __future__ import annotations

import math

from collections.abc import Callable

import re
import statistics
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path


from clusterplan.cost.framework import (
    default_framework, load_profile, parse_date, refuses_dp_overlap, resolve_name as resolve_framework,
)
from clusterplan.cost.layout import MODEL_CODES, Job, parse_recompute_modules, recompute_text
from clusterplan.cost.step import Evaluation, evaluate, layout_problems
from clusterplan.cost.terms import Context, layer_terms
from clusterplan.models.files import load_file
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.library import list_models, load_model
from clusterplan.models.spec import model_from_mapping
from clusterplan.planner.report.explain import changed_knobs
from clusterplan.planner.inputs import check_device_precision, check_model_code, check_precision_framework, load_cluster
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.planner.search.space import MBS_CANDIDATES, VP_CANDIDATES, Bounds

SPACE_CANDIDATES = {"vp": VP_CANDIDATES, "micro_batch_size": MBS_CANDIDATES}

FORMAT = "clusterplan-runs/1"
# The one rule that sets a run's framework when the run has no ``framework`` field (RUNS_FORMAT.md):
# the first keyword found in the run's id, else in its source, names it; none: the platform's
# default (megatron on GPUs, maxtext on TPUs). Its date is the run's ``framework.date``, else the
# last month of the latest year the source names (the newest code that year could run; capped at
# the profile's own release), else the profile's release.
FRAMEWORK_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("torchtitan", "torchtitan"), ("automodel", "torchtitan"), ("llmfoundry", "torchtitan"),
    ("llm-foundry", "torchtitan"), ("maxtext", "maxtext"), ("deepspeed", "deepspeed"), ("zero3", "deepspeed"),
    ("zero-3", "deepspeed"), ("bloom", "deepspeed"), ("neox", "deepspeed"), ("megatron", "megatron"),
    ("mbridge", "megatron"), ("nemo", "megatron"),
)
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "vp", "sequence_parallel", "zero_stage", "recompute")
GIB = 2**30


@dataclass
class RunResult:
    """The outcome for one run; ``reason`` is set when it could not be evaluated."""

    id: str
    family: str = ""
    moe: bool = False  # the run's model routes tokens to experts (the validated error is kept by kind too)
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
    memory_kind: str | None = None  # what the measured peak counts (MEMORY_KINDS)
    measured_fits: bool | None = None  # a published fit/OOM fact (measured.fits)
    layout_published: bool = True  # the run published its tp, pp and dp degrees
    layout: dict | None = None
    mfu: float | None = None
    breakdown: dict | None = None
    best_layout: dict | None = None
    best_step_time_s: float | None = None
    best_note: str | None = None
    framework: str = ""  # profile id @ date, and where it came from
    framework_problems: list[str] = field(default_factory=list)  # published knobs the profile lacks
    group: str | None = None
    zero_stage: int | None = None
    notes: list[str] = field(default_factory=list)
    reason: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def bundled_runs_path() -> Path:
    """The published runs shipped with clusterplan (a copy of shared/validation/runs.yaml)."""
    return Path(str(resources.files("clusterplan.planner") / "data" / "runs.yaml"))


def load_runs(path: str | Path) -> list[dict]:
    """Read a ``clusterplan-runs/1`` file; raise :class:`SpecError` if it is not one."""
    return _load_doc(path)["runs"]


def _load_doc(path: str | Path) -> dict:
    """The document of a ``clusterplan-runs/1`` file, checked: a mapping whose ``runs`` is a list."""
    p = Path(path)
    doc = load_file(p, f"validate FILE {str(p)!r}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"validate FILE: {p}: format is {got!r}; expected {FORMAT!r} (the format: RUNS_FORMAT.md beside the bundled runs, clusterplan/planner/data/)")
    if not isinstance(doc.get("runs"), list):
        raise SpecError(f"validate FILE: {p}: 'runs' must be a list of runs")
    seen: set[str] = set()
    for k, run in enumerate(doc["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("id"), str) or not run["id"].strip():
            got = run.get("id") if isinstance(run, dict) else run
            raise SpecError(f"validate FILE: {p}: runs[{k}]: id: got {got!r}; each run is a mapping with a "
                            "non-empty text id (the format: RUNS_FORMAT.md beside the bundled runs, clusterplan/planner/data/)")
        if run["id"] in seen:
            raise SpecError(f"validate FILE: {p}: runs[{k}]: id {run['id']!r} appears twice; ids must be unique")
        seen.add(run["id"])
    return doc


# what a run's layout may name (RUNS_FORMAT.md); anything else is a typo the run would be priced without
RUN_LAYOUT_KEYS = LAYOUT_KEYS + ("tp_overlap", "dp_overlap", "ep_overlap", "recompute_layers", "recompute_modules",
                                 "expert_tp", "order", "head_slots")


def _check_measured(run: dict) -> None:
    """A run's layout keys and measured figures, as RUNS_FORMAT.md defines them: a typo or an
    impossible figure (0, negative, not finite) is the run's bad input, not a prediction error."""
    layout = run.get("layout") or {}
    if not isinstance(layout, dict):
        raise SpecError(f"layout: got {type(layout).__name__}; expected a mapping of knobs")
    unknown = sorted(str(k) for k in layout if k not in RUN_LAYOUT_KEYS)
    if unknown:
        raise SpecError(f"layout.{unknown[0]}: unknown key; allowed: {', '.join(RUN_LAYOUT_KEYS)}")
    measured = run.get("measured") or {}
    if not isinstance(measured, dict):
        raise SpecError(f"measured: got {type(measured).__name__}; expected a mapping")
    for key in ("step_time_s", "peak_memory_gib", "tokens_per_s_per_device", "tflops_per_device", "mfu"):
        value = measured.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise SpecError(f"measured.{key}: got {value!r}; allowed: a finite number > 0 (or null: not published)")


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


def _bounds(run: dict, prof) -> Bounds:
    """The published knobs, held; the rest are searched within what the run's framework offers.

    Overlap, when the run does not say (``layout.tp_overlap`` / ``dp_overlap`` / ``ep_overlap``), follows one
    rule for every run: data-parallel overlap where the framework has it at the run's date and can
    overlap the published layout's traffic (no profile rule refuses it, e.g. DeepSpeed's ZeRO-3
    before v0.6.0), TP and EP overlap off (opt-in in every framework profile). The pipeline split
    (``layout.head_slots``), when the run does not say, is the framework's own
    (``ProfileAt.own_split_has_head_slots``: torchtitan's counts the embedding and the head as layers
    from 2025-04). Published values the
    framework profile lacks are kept: the run used them."""
    layout = dict(run.get("layout") or {})
    fixed = {k: layout[k] for k in LAYOUT_KEYS + ("tp_overlap", "dp_overlap", "ep_overlap", "head_slots")
             if layout.get(k) is not None}
    fixed.setdefault("dp_overlap", prof.has("dp_overlap") and not _dp_overlap_refused(fixed, prof))
    fixed.setdefault("tp_overlap", False)
    fixed.setdefault("ep_overlap", False)
    fixed.setdefault("head_slots", prof.own_split_has_head_slots())
    if run.get("micro_batch_size") is not None:
        fixed["micro_batch_size"] = run["micro_batch_size"]
    # the run ran: its unpublished knobs are chosen by what fits, without a plan's headroom
    return Bounds(fixed=fixed, allow_unavailable=True, memory_headroom=0.0)


def _one_microbatch_rule(run: dict, job: Job, bounds: Bounds, notes: list[str]) -> None:
    """A run without pipeline parallelism under a release that does not accumulate gradients
    (``Job.one_microbatch``: torchtitan before 2025-06, MaxText before 2024-08) ran one micro-batch
    a step: its micro-batch is the whole per-replica batch, ``global_batch_size / dp``, whatever the
    file says (MaxText's per-chip ``per_device_batch_size`` is often written there). One rule for
    every run it applies to (RUNS_FORMAT.md)."""
    layout = run.get("layout") or {}
    dp, given = layout.get("dp"), bounds.fixed.get("micro_batch_size")
    if not dp or not job.one_microbatch(int(layout.get("pp") or 1)) or job.global_batch_size % int(dp):
        return
    whole = job.global_batch_size // int(dp)
    if given is not None and given != whole:
        notes.append(f"micro_batch_size {given} read as {whole} = global_batch_size / dp: "
                     f"{job.framework} at {job.framework_date} runs one micro-batch a step without a pipeline")
    bounds.fixed["micro_batch_size"] = whole


def _dp_overlap_refused(fixed: dict, prof) -> bool:
    """A profile rule refuses DP overlap for these published knobs (unpublished ones at 1 / none)
    and not without it (``cost.framework.refuses_dp_overlap``)."""
    return refuses_dp_overlap(prof, int(fixed.get("tp") or 1), int(fixed.get("pp") or 1), int(fixed.get("cp") or 1),
                              int(fixed.get("ep") or 1), int(fixed.get("vp") or 1), int(fixed.get("zero_stage") or 0),
                              str(fixed.get("recompute") or "none"), bool(fixed.get("sequence_parallel")),
                              bool(fixed.get("tp_overlap")))


def run_framework(run: dict, platform: str) -> tuple[str, str, str]:
    """``(profile id, YYYY-MM, origin)`` of a run: its ``framework`` field, else the rule of
    :data:`FRAMEWORK_KEYWORDS`."""
    raw = run.get("framework")
    given = raw if isinstance(raw, dict) else ({"name": raw} if raw else {})
    if given.get("name"):
        fw, origin = resolve_framework(str(given["name"])), "run"
    else:
        text_id, text_src = str(run.get("id", "")).lower(), str(run.get("source", "")).lower()
        fw = next((f for text in (text_id, text_src) for key, f in FRAMEWORK_KEYWORDS if key in text), None)
        origin = "inferred from the run's id or source" if fw else "inferred: platform default"
        fw = fw or default_framework(platform)
    prof = load_profile(fw)
    date = parse_date(given.get("date"), f"run {run.get('id')}: framework.date") or _source_date(run, prof.date)
    return fw, date, origin


# A NeMo container tag in a source ("NeMo 24.07", "container NeMo 24.07", "25.11 NeMo Container",
# "26.04.01 NeMo container"): NVIDIA names its NeMo and Megatron-Bridge releases YY.MM.
NEMO_TAG = re.compile(r"\bnemo(?:\s+framework)?(?:\s+container)?\s+(\d{2})\.(\d{2})\b"
                      r"|\b(\d{2})\.(\d{2})(?:\.\d{2})?\s+nemo\s+container\b")


def _source_date(run: dict, latest: str) -> str:
    """The date of a run's code when its ``framework.date`` is not given: the release month of the
    NeMo container its source names (``NeMo 24.07``, ``25.11 NeMo Container``: :data:`NEMO_TAG`),
    else the month of the arXiv preprint its source cites (``arXiv:YYMM.NNNNN``: the measured code
    predates the preprint's first version), else December of the latest year its source names,
    never past the profile's date."""
    source = str(run.get("source", ""))
    tags = [(a or c, b or d) for a, b, c, d in NEMO_TAG.findall(source.lower())]
    if tags:
        return min(max(f"20{yy}-{mm}" for yy, mm in tags), latest)
    preprints = re.findall(r"arxiv[:./a-z]*\s*(\d{2})(\d{2})\.\d{4,5}", source.lower())
    if preprints:
        return min(max(f"20{yy}-{mm}" for yy, mm in preprints), latest)
    years = [int(y) for y in re.findall(r"\b(20[0-3]\d)\b", source)]
    return min(f"{max(years)}-12", latest) if years else latest


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
    _check_measured(run)
    measured = run.get("measured") or {}
    result.measured_step_time_s = measured.get("step_time_s")
    if measured.get("peak_memory_gib") is not None:
        result.measured_peak_memory_bytes = measured["peak_memory_gib"] * GIB
        result.memory_kind = _memory_kind(measured.get("peak_memory_kind"))
    if measured.get("fits") is not None:
        result.measured_fits = bool(measured["fits"])
    model = _model(run, result.notes)
    cluster = load_cluster(str(hw["cluster"]), num_devices=hw.get("count"), device=hw.get("device"),
                            scale_out_gbit_per_s=hw.get("scale_out_gbit_per_s_per_device"),
                            domain_devices=hw.get("devices_per_domain"))
    result.family, result.moe = cluster.device.family, model.moe is not None
    if not run.get("global_batch_size"):
        raise SpecError("global_batch_size is not published")
    fw, date, origin = run_framework(run, cluster.platform)
    compiled = _compiled(run)
    prof = load_profile(fw).at(date, compiled)
    result.framework = f"{fw}@{date} ({origin})"
    result.group = run.get("group")
    result.layout_published = all((run.get("layout") or {}).get(k) is not None for k in ("tp", "pp", "dp"))
    code = _model_code(run)
    check_model_code(code, fw, ("model_code", "framework.name"))
    if "dropout" not in (run.get("model") or {}) and code == "native":  # the framework's default dropout
        model = model.model_copy(update={"dropout": prof.profile.dropout > 0})
    job = Job(global_batch_size=int(run["global_batch_size"]), seq_len=int(run["seq_len"]),
              precision=str(run.get("precision") or "bf16"), attention=str(run.get("attention") or prof.attention),
              framework=fw, framework_date=date, grad_bytes=_grad_bytes(run, prof.profile.grad_bytes),
              compiled=compiled, model_code=code, fp8_all_gather=_flag(run, "fp8_all_gather"),
              fp8_scaling=str(run.get("fp8_scaling") or ""))
    check_precision_framework(job.precision, prof, "precision")
    check_device_precision(job.precision, cluster.device, "precision")
    fixed = _bounds(run, prof)
    _one_microbatch_rule(run, job, fixed, result.notes)
    opts = SearchOptions(engine=options.engine, top_k=0, time_limit_s=options.time_limit_s, bounds=fixed)
    try:
        res = plan(model, job, cluster, opts)
    except InfeasibleError:
        # the published layout does not fit: price it anyway, with the same held knobs
        ignore = replace(fixed, ignore_memory=True)
        res = plan(model, job, cluster, SearchOptions(engine=options.engine, top_k=0, bounds=ignore))
    ev = _with_partial_recompute(run, model, job, cluster, res.best)
    _record(result, ev, _scoped_step_s(run, model, job, cluster, ev))
    result.framework_problems = [msg for key, msg in layout_problems(model, job, cluster, res.best.layout)
                                 if key == "framework"]
    if best and (run.get("measured") or {}).get("step_scope", "step") == "step":  # a whole step to compare with
        _record_best(result, model, job, cluster, options)


MEMORY_KINDS = ("allocated", "reserved", "device", "unspecified")


GRAD_REDUCE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _grad_bytes(run: dict, framework_default: int) -> int:
    """``grad_reduce_dtype``: the dtype the run kept and reduced its gradients in, where its source
    or its release's config says (RUNS_FORMAT.md, the Megatron-Bridge config rule); else the
    framework's ``semantics.grad_bytes``."""
    value = run.get("grad_reduce_dtype")
    if value is None:
        return framework_default
    if value not in GRAD_REDUCE_BYTES:
        raise SpecError(f"grad_reduce_dtype: got {value!r}; allowed: {', '.join(GRAD_REDUCE_BYTES)}")
    return GRAD_REDUCE_BYTES[value]


def _model_code(run: dict) -> str:
    """``model_code``: ``huggingface`` where the run trained a Hugging Face transformers model class
    under its framework (RUNS_FORMAT.md; its dropout is then the model class's own, none for Llama),
    ``fused`` where it ran Transformer Engine layers under the torchtitan profile (the fused-model-code
    rule), ``llmfoundry`` on llm-foundry's MPT runs (the llm-foundry model-code rule), else
    ``native``: the framework's own modules."""
    value = run.get("model_code", "native")
    if value not in MODEL_CODES:
        raise SpecError(f"model_code: got {value!r}; allowed: {', '.join(MODEL_CODES)}")
    return value


def _compiled(run: dict) -> bool:
    """``compile``: true where the run's source says the model ran under ``torch.compile``
    (RUNS_FORMAT.md); absent or false otherwise."""
    return _flag(run, "compile")


def _flag(run: dict, key: str) -> bool:
    """A run's true/false field (``compile``, ``fp8_all_gather``: RUNS_FORMAT.md); absent: false."""
    value = run.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(f"{key}: got {value!r}; allowed: true, false")
    return value


def _memory_kind(value) -> str:
    """``measured.peak_memory_kind``: allocated (``torch.cuda.max_memory_allocated``), reserved
    (``max_memory_reserved``: the caching allocator's blocks), device (nvidia-smi, NVML or
    ``mem_get_info``: the allocator's blocks and the runtime outside it, CUDA context and NCCL
    buffers) or unspecified (compared as device: what the process holds of the device)."""
    kind = "unspecified" if value is None else str(value)
    if kind not in MEMORY_KINDS:
        raise SpecError(f"measured.peak_memory_kind: got {value!r}; allowed: {', '.join(MEMORY_KINDS)}")
    return kind


def predicted_peak(ev: Evaluation, kind: str | None) -> float:
    """The predicted peak a measurement of ``kind`` (MEMORY_KINDS) is compared with."""
    if kind == "allocated":
        return ev.memory.allocated_bytes
    if kind == "reserved":
        return ev.memory.allocated_bytes + ev.memory.allocator_bytes
    return ev.peak_memory_bytes


def _with_partial_recompute(run: dict, model, job: Job, cluster, ev: Evaluation) -> Evaluation:
    """The searched layout with the run's published ``layout.recompute_layers`` and
    ``layout.recompute_modules`` (knobs the search does not offer: the other knobs were chosen
    without them), priced by the cost model."""
    published = run.get("layout") or {}
    k, mods = published.get("recompute_layers"), published.get("recompute_modules")
    if not k and not mods:
        return ev
    changes = {}
    if k:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise SpecError(f"layout.recompute_layers: got {k!r}; must be an integer >= 0")
        changes["recompute_layers"] = k
    if mods:
        changes["recompute_modules"] = parse_recompute_modules(mods, "layout.recompute_modules")
    return evaluate(model, job, cluster, ev.layout.with_(**changes))


STEP_SCOPES = ("step", "layers")


def _scoped_step_s(run: dict, model, job: Job, cluster, ev: Evaluation) -> float:
    """The predicted time of what the run measured (``measured.step_scope``): the whole step, or
    (``layers``) the forward and backward of its transformer layers alone, without the embedding,
    the loss, the optimizer and the data-parallel step (a per-layer timing such as Korthikanti et
    al. 2022's Table 4; pipeline-free layouts only)."""
    scope = (run.get("measured") or {}).get("step_scope", "step")
    if scope not in STEP_SCOPES:
        raise SpecError(f"measured.step_scope: got {scope!r}; allowed: {', '.join(STEP_SCOPES)}")
    if scope == "step":
        return ev.step_time_s
    if ev.layout.pp > 1:
        raise SpecError("measured.step_scope: layers needs pp = 1 (a pipeline's layers do not run one after another)")
    ctx = Context(model, job, cluster).placed(ev.layout.order)
    return ev.num_microbatches * model.num_layers * layer_terms(ctx, ev.layout, ev.num_microbatches).total_s


def _record(result: RunResult, ev: Evaluation, step_s: float | None = None) -> None:
    result.predicted_step_time_s = ev.step_time_s if step_s is None else step_s
    result.fits = ev.fits
    # the allocated peak (live tensors), the allocator's reserved peak (max_memory_reserved), or
    # what the process holds of the device with its runtime (nvidia-smi, or unstated), as published
    result.predicted_peak_memory_bytes = predicted_peak(ev, result.memory_kind)
    result.layout = ev.layout.as_dict()
    result.zero_stage = ev.layout.zero_stage
    result.mfu = ev.mfu
    result.breakdown = {k: v for k, v in ev.time.__dict__.items()}
    if result.measured_step_time_s:
        result.error = (result.predicted_step_time_s - result.measured_step_time_s) / result.measured_step_time_s
    if result.measured_peak_memory_bytes:
        result.memory_error = ((result.predicted_peak_memory_bytes - result.measured_peak_memory_bytes)
                               / result.measured_peak_memory_bytes)


def _record_best(result: RunResult, model, job: Job, cluster, options: SearchOptions) -> None:
    """The planner's own best layout for the same model, devices, batch and precision."""
    try:
        res = plan(model, job, cluster, SearchOptions(engine=options.engine, top_k=0, time_limit_s=options.time_limit_s))
    except ClusterplanError as err:
        result.best_note = f"no free search result: {str(err).splitlines()[0]}"
        return
    ev = res.best
    if result.predicted_step_time_s and ev.step_time_s > result.predicted_step_time_s and result.fits:
        # The published layout is outside the searched candidates (e.g. vp=3 against 1, 2, 4, 8) or
        # uses knobs the framework profile lacks: it is then the best layout known.
        outside = [f"{k}={v}" for k, v in (result.layout or {}).items()
                   if k in SPACE_CANDIDATES and v not in SPACE_CANDIDATES[k]] + result.framework_problems
        result.best_layout, result.best_step_time_s = result.layout, result.predicted_step_time_s
        result.best_note = ("the published layout is faster than any the search offers"
                            + (f" ({'; '.join(outside)})" if outside else ""))
        return
    result.best_layout = ev.layout.as_dict()
    result.best_step_time_s = ev.step_time_s
    if result.predicted_step_time_s and ev.step_time_s < result.predicted_step_time_s:
        result.best_note = _why_faster(result.layout or {}, ev.layout.as_dict(), result.predicted_step_time_s,
                                       ev.step_time_s)


def _why_faster(published: dict, best: dict, published_s: float, best_s: float) -> str:
    changed = [f"{k} {published.get(k)}->{v}" for k, v in changed_knobs(published, best).items()]
    return f"{published_s / best_s:.2f}x faster by changing " + ", ".join(changed)


def summarize(results: list[RunResult], groups: dict[str, list[str]] | None = None) -> dict:
    """Median, 90th percentile and max |error| overall, by hardware family and by framework; the
    signed error of the ZeRO-3/FSDP runs; pairwise order agreement inside groups of runs of one job;
    and the planner's best against each published layout."""
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
    frameworks = sorted({r.framework.split("@")[0] for r in evaluated})
    mem = sorted(abs(r.memory_error) for r in evaluated if r.memory_error is not None)
    summary = {"overall": stats(evaluated), "by_family": {f: stats([r for r in evaluated if r.family == f]) for f in families},
               "by_framework": {f: stats([r for r in evaluated if r.framework.split("@")[0] == f]) for f in frameworks},
               "not_evaluated": len(results) - len(evaluated)}
    zero3 = [r.error for r in evaluated if r.zero_stage == 3 and r.error is not None]
    if zero3:
        summary["zero3"] = {"runs": len(zero3), "median_signed_error": statistics.median(zero3)}
    if mem:
        summary["memory"] = {"runs": len(mem), "median_abs_error": statistics.median(mem),
                             "p90_abs_error": _percentile(mem, 0.9), "max_abs_error": mem[-1]}
    facts = [r for r in evaluated if r.measured_fits is not None]
    if facts:
        summary["fit_facts"] = {"facts": len(facts), "agreed": sum(1 for r in facts if r.fits == r.measured_fits),
                                "wrong": [r.id for r in facts if r.fits != r.measured_fits]}
    summary["ranking"] = ranking(results, groups or {})
    summary.update(_best_vs_published(evaluated))
    return summary


def _best_vs_published(evaluated: list[RunResult]) -> dict:
    """The planner's best against the published layout, over the runs that published one (tp, pp and
    dp given); a run without one is compared with the layout ``validate`` itself chose under its few
    published knobs, which says nothing of the run's authors: those are listed apart
    (``unpublished_layout``) and counted in ``all_runs_median_speedup`` only."""
    every = sorted((r.predicted_step_time_s / r.best_step_time_s, r.id, r.layout_published) for r in evaluated
                   if r.best_step_time_s and r.predicted_step_time_s)
    ratios = [(x, i) for x, i, published in every if published]
    if not ratios:
        return {}
    return {"best_vs_published": {
        "runs": len(ratios), "median_speedup": statistics.median(x for x, _ in ratios),
        "max_speedup": ratios[-1][0], "above_1_3": [i for x, i in ratios if x > 1.3],
        "all_runs_median_speedup": statistics.median(x for x, _, _ in every),
        "unpublished_layout": {i: x for x, i, published in every if not published}}}


def unpublished_rows(best: dict) -> str:
    """The runs :func:`_best_vs_published` leaves out, as printed: ``id 1.11x, id 1.15x``."""
    return ", ".join(f"{i} {x:.2f}x" for i, x in best["unpublished_layout"].items())


def run_groups(runs: list[dict], extra: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Group name -> run ids: each run's ``group`` field, plus groups listed by id (``extra``)."""
    out: dict[str, list[str]] = {}
    for run in runs:
        if run.get("group"):
            out.setdefault(str(run["group"]), []).append(str(run.get("id")))
    for name, ids in (extra or {}).items():
        out.setdefault(str(name), []).extend(str(i) for i in ids)
    return out


# Two measurements of one job closer than this are a tie: the spread of repeated measurements of one
# configuration (BigScience's tr11 prequel lists DP8/TP4/PP12/MBS2 twice, 110.48 and 113.54 s: 2.8%).
RANKING_TIE = 0.03


def ranking(results: list[RunResult], groups: dict[str, list[str]]) -> dict:
    """Pairwise order agreement inside each group: a pair agrees when the predicted cost per step
    (step time x devices: the inverse of throughput per device, so runs at different sizes of one
    job compare too) orders the two runs as the measurement does. Pairs measured within
    :data:`RANKING_TIE` of each other are ties and skipped (counted in ``ties``)."""
    by_id = {r.id: r for r in results}
    rows, agreed, pairs, ties = [], 0, 0, 0
    for name, ids in sorted(groups.items()):
        members = [by_id[i] for i in ids if i in by_id and by_id[i].reason is None and by_id[i].measured_step_time_s]
        g_pairs = g_agreed = 0
        wrong = []
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                x, y = members[a], members[b]
                mx, my = x.measured_step_time_s * x.count, y.measured_step_time_s * y.count
                px, py = x.predicted_step_time_s * x.count, y.predicted_step_time_s * y.count
                if abs(mx - my) <= RANKING_TIE * min(mx, my):
                    ties += 1
                    continue
                g_pairs += 1
                if (mx < my) == (px < py):
                    g_agreed += 1
                else:
                    wrong.append(f"{x.id} vs {y.id}")
        if g_pairs:
            rows.append({"group": name, "runs": len(members), "pairs": g_pairs, "agreed": g_agreed, "wrong": wrong})
        pairs, agreed = pairs + g_pairs, agreed + g_agreed
    by_source: dict[str, list[int]] = {}
    for row in rows:
        key = row["group"].split("-")[0]
        tally = by_source.setdefault(key, [0, 0])
        tally[0], tally[1] = tally[0] + row["agreed"], tally[1] + row["pairs"]
    return {"groups": len(rows), "pairs": pairs, "agreed": agreed, "ties": ties, "tie_threshold": RANKING_TIE,
            "agreement": agreed / pairs if pairs else None, "by_group": rows,
            "by_source": {k: {"agreed": a, "pairs": n} for k, (a, n) in sorted(by_source.items())}}


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


BUNDLED_EXTRAS = {
    "sweeps": ("sweeps.yaml", "published layout sweeps: groups of runs of one job, for the ranking measure"),
    "memory": ("memory_runs.yaml", "measured peak memory per device and published fit/OOM facts"),
    "families": ("family_runs.yaml", "runs beyond NVIDIA A100/H100, for the per-family error"),
}


def bundled_data_path(name: str) -> Path:
    return Path(str(resources.files("clusterplan.planner") / "data" / name))


def validate(path: str | Path | None = None, options: SearchOptions | None = None, best: bool = True,
             progress: Callable[[int, int], None] | None = None) -> dict:
    """Evaluate every run of ``path`` (the bundled runs by default); ``{"runs": [...], "summary": {...}}``.

    Without ``path`` the other bundled files are evaluated too, each under its own key with its own
    summary (:data:`BUNDLED_EXTRAS`): layout sweeps (their runs count for the ranking measure),
    memory ground truth and runs beyond A100/H100. The bundled runs' summary stays the one the
    project's step-time targets are stated on. ``progress(done, total)`` is called after each run."""
    opts = options or SearchOptions()
    main_path = path or bundled_runs_path()
    runs, extra = load_runs_and_groups(main_path)
    extras = [] if path is not None else [
        (key, name, what, load_runs_and_groups(bundled_data_path(name)))
        for key, (name, what) in BUNDLED_EXTRAS.items() if bundled_data_path(name).is_file()]
    total, done = len(runs) + sum(len(e[3][0]) for e in extras), 0

    def tick(result):
        nonlocal done
        done += 1
        if progress:
            progress(done, total)
        return result

    results = [tick(evaluate_run(run, opts, best)) for run in runs]
    out = {"file": str(main_path), "runs": [r.as_dict() for r in results]}
    groups = run_groups(runs, extra)
    ranked = list(results)
    for key, name, what, (extra_runs, extra_groups) in extras:
        file = bundled_data_path(name)
        extra_results = [tick(evaluate_run(run, opts, best=False)) for run in extra_runs]
        for g, ids in run_groups(extra_runs, extra_groups).items():
            groups.setdefault(g, []).extend(ids)
        ranked += extra_results
        out[key] = {"file": str(file), "what": what, "runs": [r.as_dict() for r in extra_results],
                    "summary": summarize(extra_results)}
    out["summary"] = summarize(results)
    out["summary"]["ranking"] = ranking(ranked, groups)
    return out


STEP_TIME_FILES = ("runs.yaml", "sweeps.yaml", "family_runs.yaml")
LABEL_HOLDOUT_FILES = ("benchmarks/holdout_runs.yaml", "benchmarks/holdout_family_runs.yaml")
"""The repository's hold-out files (paths from its root; the installed package does not ship them)
whose runs join the bundled ones in the validated error every plan quotes: the individually sourced
hold-outs. llm-foundry's 193-row benchmark grid (benchmarks/holdout_llmfoundry.yaml, one framework's
table of MPT models on 8 to 64 GPUs) is reported in docs/cost-model.md on its own: in the label it
would be 136 of 326 A100 runs and outweigh every other source."""


def error_by_family(options: SearchOptions | None = None, extra_files: tuple[Path, ...] = ()) -> dict[str, dict]:
    """Per hardware family: runs, median and p90 |step-time error| and the median signed error (negative:
    predicted too fast) over every bundled published run with a measured step time
    (:data:`STEP_TIME_FILES`) and the runs of ``extra_files`` (the repository's
    :data:`LABEL_HOLDOUT_FILES`, which ``benchmarks/update_docs.py`` passes), rounded to 0.1%, and the same for its dense and its MoE runs
    (``dense``, ``moe``) where the family has runs of both kinds, and how many of its runs are MoE
    (``moe_runs``): what ``planner/data/validated_error.yaml`` holds (a test recomputes it)."""
    opts = options or SearchOptions(engine="exhaustive", top_k=0)
    paths = [bundled_data_path(name) for name in STEP_TIME_FILES] + [Path(f) for f in extra_files]
    results = [evaluate_run(run, opts, best=False) for path in paths for run in load_runs(path)]

    def entry(rows: list[RunResult]) -> dict:
        errors = sorted(abs(r.error) for r in rows)
        return {"runs": len(errors), "median_abs_error": round(statistics.median(errors), 3),
                "p90_abs_error": round(_percentile(errors, 0.9), 3),
                "median_signed_error": round(statistics.median(r.error for r in rows), 3)}

    out = {}
    for family in sorted({r.family for r in results if r.error is not None}):
        rows = [r for r in results if r.family == family and r.error is not None]
        out[family] = {**entry(rows), "moe_runs": sum(r.moe for r in rows)}
        for kind, moe in (("dense", False), ("moe", True)):  # by model kind, where the family has both
            kind_rows = [r for r in rows if r.moe is moe]
            if kind_rows and len(kind_rows) < len(rows):
                out[family][kind] = entry(kind_rows)
    return out


def load_runs_and_groups(path: str | Path) -> tuple[list[dict], dict[str, list[str]]]:
    """The runs of a file and its ``groups_of_bundled_runs`` (groups named by run id)."""
    doc = _load_doc(path)
    runs = doc["runs"]
    extra = doc.get("groups_of_bundled_runs") or {}
    if not isinstance(extra, dict):
        raise SpecError(f"validate FILE: {path}: groups_of_bundled_runs must map a group name to run ids")
    return runs, extra


def markdown_report(result: dict) -> str:
    """The validation tables as Markdown (what docs/cost-model.md embeds): runs, families,
    frameworks, the ZeRO-3 signed error, the planner's best against the published layouts, and
    ranking agreement by source; with the bundled file, the layout sweeps, the memory facts, and the
    runs beyond A100/H100 with their own per-family table."""
    lines = _markdown_runs(result["runs"]) + [""] + _markdown_stats(result["summary"])
    rk = result["summary"].get("ranking") or {}
    if rk.get("pairs"):
        lines.append(f"- ranking: {rk['agreed']} of {rk['pairs']} pairs ordered as measured ({rk['agreement']:.1%}) in "
                     f"{rk['groups']} groups; {rk['ties']} pairs within {rk['tie_threshold']:.0%} are ties; by source: "
                     + ", ".join(f"{k} {v['agreed']}/{v['pairs']}" for k, v in rk["by_source"].items()))
    if result.get("sweeps"):
        st = result["sweeps"]["summary"]["overall"]
        lines.append(f"- layout sweeps (`planner/data/sweeps.yaml`): {st['runs']} runs, median |error| "
                     f"{st['median_abs_error']:.1%}, p90 {st['p90_abs_error']:.1%}")
    if result.get("memory"):
        m, facts = result["memory"]["summary"].get("memory") or {}, result["memory"]["summary"].get("fit_facts") or {}
        if m:
            lines.append(f"- memory (`planner/data/memory_runs.yaml`): {m['runs']} measured peaks, median |error| "
                         f"{m['median_abs_error']:.1%}, p90 {m['p90_abs_error']:.1%}")
        if facts:
            lines.append(f"- fit/OOM facts: {facts['agreed']} of {facts['facts']} reproduced"
                         + (f"; wrong: {', '.join(facts['wrong'])}" if facts["wrong"] else ""))
    if result.get("families"):
        lines += ["", "Runs beyond NVIDIA A100/H100 (`planner/data/family_runs.yaml`):", ""]
        lines += _markdown_runs(result["families"]["runs"]) + [""] + _markdown_stats(result["families"]["summary"])
    return "\n".join(lines)


def _markdown_runs(runs: list[dict]) -> list[str]:
    lines = ["| run | device x count | framework | layout | predicted s | measured s | error | fits |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in runs:
        if r["reason"]:
            lines.append(f"| {r['id']} | {r['device']} x {r['count']} | | not evaluated: {r['reason']} | | | | |")
            continue
        L = r["layout"]
        lay = (f"tp{L['tp']} pp{L['pp']} dp{L['dp']} cp{L['cp']} ep{L['ep']} vp{L['vp']} mbs{L['micro_batch_size']} "
               f"{recompute_text(L)} z{L['zero_stage']}" + (" tpo" if L.get("tp_overlap") and L["tp"] > 1 else "")
               + (" epo" if L.get("ep_overlap") and L["ep"] > 1 else ""))
        meas = f"{r['measured_step_time_s']:.3f}" if r["measured_step_time_s"] else "-"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        lines.append(f"| {r['id']} | {r['device']} x {r['count']} | {r['framework'].split(' ')[0]} | {lay} | "
                     f"{r['predicted_step_time_s']:.3f} | {meas} | {err} | {'yes' if r['fits'] else 'NO'} |")
    return lines


def _markdown_stats(s: dict) -> list[str]:
    """Per family and framework, the ZeRO-3 signed error, measured peaks and best-vs-published."""
    lines = ["| hardware family or framework | runs | median abs error | p90 abs error | max abs error |",
             "|---|---:|---:|---:|---:|"]
    rows = ([("all", s["overall"])] + sorted(s["by_family"].items())
            + [(f"framework {k}", v) for k, v in sorted(s.get("by_framework", {}).items())])
    for name, st in rows:
        if st.get("runs"):
            lines.append(f"| {name} | {st['runs']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
                         f"{st['max_abs_error']:.1%} |")
    lines.append("")
    if s.get("zero3"):
        lines.append(f"- ZeRO-3 / FSDP runs: {s['zero3']['runs']}, median signed error "
                     f"{s['zero3']['median_signed_error']:+.1%}")
    if s.get("memory"):
        lines.append(f"- peak memory: {s['memory']['runs']} runs measured, median |error| "
                     f"{s['memory']['median_abs_error']:.1%}, max {s['memory']['max_abs_error']:.1%}")
    if s.get("best_vs_published"):
        b = s["best_vs_published"]
        lines.append(f"- planner's best against the published layout: median {b['median_speedup']:.2f}x, max "
                     f"{b['max_speedup']:.2f}x over {b['runs']} runs; above 1.3x: {', '.join(b['above_1_3']) or 'none'}")
        if b.get("unpublished_layout"):
            lines.append(f"  ({len(b['unpublished_layout'])} runs published no tp/pp/dp and are left out: "
                         f"{unpublished_rows(b)}; with them the median is {b['all_runs_median_speedup']:.2f}x)")
    return lines
