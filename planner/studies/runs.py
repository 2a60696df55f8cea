"""Published runs, one at a time: read a ``clusterplan-runs/1`` file, and predict each run with its
published layout held fixed under its framework at its date (``evaluate_run``); ``validate``
(``planner.studies.validate``) measures the predictions.

Each run is evaluated with its published layout held fixed; knobs the source did not publish
(``null``) are chosen by the search, as are the ones the format has no field for (rank order, DP
and TP overlap). A run that cannot be evaluated says why and does not stop the others.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from clusterplan.cost.framework import (
    default_framework, load_profile, parse_date, refuses_dp_overlap, resolve_name as resolve_framework,
)
from clusterplan.cost.layout import Job, MODEL_CODES, parse_layout, parse_recompute_modules
from clusterplan.cost.step import Evaluation, evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import Context, layer_terms
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.files import load_file
from clusterplan.models.library import list_models, load_model
from clusterplan.models.spec import model_from_mapping
from clusterplan.planner.inputs import (
    check_device_precision, check_model_code, check_precision_framework, load_cluster,
)
from clusterplan.planner.report.explain import changed_knobs
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.planner.search.space import Bounds, MBS_CANDIDATES, VP_CANDIDATES
from clusterplan.planner.studies.calibration import calibrated_interval, job_of
from clusterplan.planner.studies.uncertainty import Sample, source_key


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
    ("zero-3", "deepspeed"), ("bloom", "deepspeed"), ("neox", "deepspeed"), ("nanotron", "nanotron"),
    ("megatron", "megatron"),
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
    settings: dict = field(default_factory=dict)  # what the run publishes of its job and layout (run_settings)
    zero_stage: int | None = None
    notes: list[str] = field(default_factory=list)
    reason: str | None = None
    source: str = ""  # the publication it comes from (planner.studies.uncertainty.source_key)
    step_time_interval_s: list[float] | None = None  # the 80% interval from the other sources' runs

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def sample(self) -> Sample | None:
        """The run as a measured-against-predicted sample (None without both step times)."""
        if self.error is None or not self.predicted_step_time_s or not self.measured_step_time_s:
            return None
        return Sample(self.family, self.moe, self.framework.split("@")[0], self.predicted_step_time_s,
                      self.measured_step_time_s, self.source)


def bundled_runs_path() -> Path:
    """The published runs shipped with clusterplan (a copy of shared/validation/runs.yaml)."""
    return Path(str(resources.files("clusterplan.planner") / "data" / "runs.yaml"))


def load_runs(path: str | Path, label: str = "validate FILE") -> list[dict]:
    """Read a ``clusterplan-runs/1`` file; raise :class:`SpecError` if it is not one (naming the file
    as the command's ``label`` for it)."""
    return _load_doc(path, label)["runs"]


def _load_doc(path: str | Path, label: str = "validate FILE") -> dict:
    """The document of a ``clusterplan-runs/1`` file, checked: a mapping whose ``runs`` is a list."""
    p = Path(path)
    doc = load_file(p, f"{label} {str(p)!r}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{label}: {p}: format is {got!r}; expected {FORMAT!r} (the format: RUNS_FORMAT.md beside the bundled runs, clusterplan/planner/data/)")
    if not isinstance(doc.get("runs"), list):
        raise SpecError(f"{label}: {p}: 'runs' must be a list of runs")
    seen: set[str] = set()
    for k, run in enumerate(doc["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("id"), str) or not run["id"].strip():
            got = run.get("id") if isinstance(run, dict) else run
            raise SpecError(f"{label}: {p}: runs[{k}]: id: got {got!r}; each run is a mapping with a "
                            "non-empty text id (the format: RUNS_FORMAT.md beside the bundled runs, clusterplan/planner/data/)")
        if run["id"] in seen:
            raise SpecError(f"{label}: {p}: runs[{k}]: id {run['id']!r} appears twice; ids must be unique")
        seen.add(run["id"])
    return doc


# what a run's layout may name (RUNS_FORMAT.md); anything else is a typo the run would be priced without
RUN_LAYOUT_KEYS = LAYOUT_KEYS + ("tp_overlap", "dp_overlap", "ep_overlap", "recompute_layers", "recompute_modules",
                                 "expert_tp", "order", "head_slots", "offload", "shard_across_domains", "schedule", "cp_comm",
                                 "moe_dispatcher", "param_gather",
                                 "dp_shard")


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
    fixed = {k: layout[k] for k in LAYOUT_KEYS + ("tp_overlap", "dp_overlap", "ep_overlap", "head_slots", "cp_comm", "moe_dispatcher")
             if layout.get(k) is not None}
    fixed.setdefault("dp_overlap", prof.has("dp_overlap") and not _dp_overlap_refused(fixed, prof))
    fixed.setdefault("tp_overlap", False)
    fixed.setdefault("ep_overlap", False)
    fixed.setdefault("head_slots", prof.own_split_has_head_slots())
    fixed.setdefault("cp_comm", "p2p")  # a run that does not say ran the ring, every framework's default kind priced
    # the search would graph and pick a fused dispatcher where the framework offers them; a run is priced
    # eager with the implicit dispatcher unless it publishes its dispatcher (RUNS_FORMAT.md has no graph key)
    fixed.setdefault("moe_dispatcher", "auto")
    fixed["cuda_graph"] = "none"
    # the search keeps the layer inputs on the device; a published offload is applied after it, with
    # the run's other knobs the search does not choose (_with_partial_recompute)
    fixed["offload"] = "none"
    fixed["schedule"] = ""  # the one vp implies: a published schedule is applied after it, as offload
    if layout.get("schedule") not in (None, "") and fixed["ep_overlap"]:
        # the named schedule carries its own EP overlap (DualPipe pairs a forward and a backward chunk
        # at vp 1, which the framework's interleaving rule refuses): applied after the search with it
        fixed["ep_overlap"] = False
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


def evaluate_run(run: dict, options: SearchOptions, best: bool = True, calibration=None) -> RunResult:
    """Evaluate one run with its published layout; never raises for a bad run. ``calibration``
    (``planner.studies.calibration.Calibration``): the run is priced on its cluster as calibrated
    for its device and framework, where the calibration has them."""
    return price_run(run, options, best, calibration)[0]


@dataclass(frozen=True)
class Priced:
    """A run as evaluated: its model, job, cluster and the layout priced (the published knobs and the
    search's choice of the others), to price again on another cluster (``calibrate``)."""

    run: dict
    model: object
    job: Job
    cluster: object
    layout: object

    def step_s(self, cluster=None) -> float:
        """The predicted time of what the run measured, on ``cluster`` (default: its own)."""
        cl = self.cluster if cluster is None else cluster
        ev = _with_partial_recompute(self.run, self.model, self.job, cl, evaluate(self.model, self.job, cl, self.layout))
        return _scoped_step_s(self.run, self.model, self.job, cl, ev)


def price_run(run: dict, options: SearchOptions, best: bool = False,
              calibration=None) -> tuple[RunResult, Priced | None]:
    """:func:`evaluate_run` and what it priced (None where the run could not be evaluated)."""
    result = RunResult(id=str(run.get("id", "?")), confidence=str(run.get("confidence", "")), source=source_key(run))
    priced = None
    try:
        priced = _evaluate(run, options, result, best, calibration)
    except ClusterplanError as err:
        result.reason = str(err).splitlines()[0]
    except (KeyError, TypeError, ValueError) as err:
        result.reason = f"malformed run: {err}"
    return result, priced


def _evaluate(run: dict, options: SearchOptions, result: RunResult, best: bool, calibration=None) -> Priced:
    hw = run.get("hardware") or {}
    result.cluster, result.device, result.count = hw.get("cluster", ""), hw.get("device", ""), int(hw.get("count") or 0)
    _check_measured(run)
    _record_measured(run, result)
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
    result.settings = run_settings(run)
    result.layout_published = all((run.get("layout") or {}).get(k) is not None for k in ("tp", "pp", "dp"))
    code = _model_code(run)
    check_model_code(code, fw, ("model_code", "framework.name"))
    if "dropout" not in (run.get("model") or {}) and code == "native":  # the framework's default dropout
        model = model.model_copy(update={"dropout": prof.profile.dropout > 0})
    job = Job(global_batch_size=int(run["global_batch_size"]), seq_len=int(run["seq_len"]),
              precision=str(run.get("precision") or "bf16"), attention=str(run.get("attention") or prof.attention),
              framework=fw, framework_date=date, grad_bytes=_grad_bytes(run, prof.profile.grad_bytes_for(str(run.get("precision") or "bf16"))),
              weight_bytes=_weight_bytes(run), moment_bytes=_moment_bytes(run), compiled=compiled,
              activation_func_fp8_input_store=_fp8_act_store(run, fw, date), model_code=code, fp8_all_gather=_flag(run, "fp8_all_gather"),
              fp8_scaling=str(run.get("fp8_scaling") or ""))
    check_precision_framework(job.precision, prof, "precision")
    check_device_precision(job.precision, cluster.device, "precision")
    if calibration is not None:  # the job-level fit where the calibration has one for this job, else the site-level
        cluster = calibration.apply(cluster, fw, job_of(model, cluster.device.id, fw, job.precision))
        if cluster.calibration and not cluster.calibration.get("applied"):
            result.notes.append(cluster.calibration["note"])
    ev = _published_layout(run, model, job, cluster, options, prof, result)
    iv = calibrated_interval(cluster, result.predicted_step_time_s)  # a calibration's own interval, where one applies
    if iv:
        result.step_time_interval_s = [iv["low_s"], iv["high_s"]]
    if best and (run.get("measured") or {}).get("step_scope", "step") == "step":  # a whole step to compare with
        _record_best(result, model, job, cluster, options)
    return Priced(run, model, job, cluster, ev.layout)


# What describes a run rather than setting it: free text, the measurement and its bookkeeping.
DESCRIPTIVE_KEYS = frozenset({"id", "group", "source", "confidence", "notes", "measured", "model.name",
                              "hardware.fabric", "framework.version"})


def run_settings(run: dict, prefix: str = "") -> dict:
    """The run's published settings flattened to dotted keys (``layout.cp_comm``, ``precision``,
    ``hardware.count``), without :data:`DESCRIPTIVE_KEYS`: what two runs of one group may differ in,
    so a group's knob is read from the file, not kept by hand (``validate.group_knob``)."""
    out: dict = {}
    for key, value in run.items():
        name = f"{prefix}{key}"
        if name in DESCRIPTIVE_KEYS:
            continue
        if isinstance(value, dict):
            out.update(run_settings(value, f"{name}."))
        else:
            out[name] = value
    return out


def _record_measured(run: dict, result: RunResult) -> None:
    measured = run.get("measured") or {}
    result.measured_step_time_s = measured.get("step_time_s")
    if measured.get("peak_memory_gib") is not None:
        result.measured_peak_memory_bytes = measured["peak_memory_gib"] * GIB
        result.memory_kind = _memory_kind(measured.get("peak_memory_kind"))
    if measured.get("fits") is not None:
        result.measured_fits = bool(measured["fits"])


def _published_layout(run: dict, model, job: Job, cluster, options: SearchOptions, prof, result: RunResult) -> Evaluation:
    """The run's published layout, its unpublished knobs chosen by the search, priced (and recorded)."""
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
    return ev


MEMORY_KINDS = ("allocated", "reserved", "device", "unspecified")


GRAD_REDUCE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _grad_bytes(run: dict, framework_default: int) -> int:
    """``grad_reduce_dtype``: the dtype the run kept and reduced its gradients in, where its source
    or its release's config says (RUNS_FORMAT.md, the Megatron-Bridge config rule); else, where the
    run names MaxText's ``weight_dtype``, that dtype (the gradients of its parameters take it); else
    the framework's ``semantics.grad_bytes``."""
    value = run.get("grad_reduce_dtype")
    if value is None and run.get("weight_dtype") is not None:
        return _weight_bytes(run)
    if value is None:
        return framework_default
    if value not in GRAD_REDUCE_BYTES:
        raise SpecError(f"grad_reduce_dtype: got {value!r}; allowed: {', '.join(GRAD_REDUCE_BYTES)}")
    return GRAD_REDUCE_BYTES[value]


WEIGHT_DTYPE_BYTES = {"bf16": 2, "fp32": 4}


def _weight_bytes(run: dict) -> int:
    """``weight_dtype``: the dtype of the parameters the optimizer updates, with its Adam moments
    (MaxText's ``weight_dtype``, RUNS_FORMAT.md: the MaxText weight-dtype rule); absent: fp32."""
    value = run.get("weight_dtype", "fp32")
    if value not in WEIGHT_DTYPE_BYTES:
        raise SpecError(f"weight_dtype: got {value!r}; allowed: {', '.join(WEIGHT_DTYPE_BYTES)}")
    return WEIGHT_DTYPE_BYTES[value]


MOMENT_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _moment_bytes(run: dict) -> int:
    """``optimizer_moment_dtype``: the dtype of Adam's two moments where the run kept them in another
    dtype than its master weights (RUNS_FORMAT.md: the optimizer-moment rule; DeepSeek-V3's BF16
    AdamW moments, Megatron-Core's ``--exp-avg-dtype``/``--exp-avg-sq-dtype``); absent: 0, the
    weights' dtype."""
    value = run.get("optimizer_moment_dtype")
    if value is None:
        return 0
    if value not in MOMENT_DTYPE_BYTES:
        raise SpecError(f"optimizer_moment_dtype: got {value!r}; allowed: {', '.join(MOMENT_DTYPE_BYTES)}")
    return MOMENT_DTYPE_BYTES[value]


FP8_ACT_STORE_SINCE = "2024-04"
"""Megatron-Core's ``--activation-func-fp8-input-store`` (21648b5ab0, 2024-04-12)."""


def _fp8_act_store(run: dict, framework: str, date: str) -> bool:
    """``activation_func_fp8_input_store``: the run kept SwiGLU's inputs in FP8 (RUNS_FORMAT.md: the
    FP8 SwiGLU-input rule); only under the megatron profile, from the release that has the flag."""
    value = _flag(run, "activation_func_fp8_input_store")
    if value and (framework != "megatron" or date < FP8_ACT_STORE_SINCE):
        raise SpecError(f"activation_func_fp8_input_store: true needs megatron from {FP8_ACT_STORE_SINCE} "
                        f"(Megatron-Core's --activation-func-fp8-input-store); the run is {framework}@{date}")
    return value


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


# published knobs the search does not choose for a run (or, offload, holds off): each applied after
# the search, checked against its allowed values (a layout text value, parsed as ``parse_layout`` does)
_AFTER_SEARCH_KNOBS = ("offload", "schedule", "moe_dispatcher", "param_gather", "dp_shard")
_AFTER_SEARCH_DEFAULTS = {"offload": "none", "schedule": "", "moe_dispatcher": "auto", "param_gather": "bf16",
                          "dp_shard": 0}


def _with_partial_recompute(run: dict, model, job: Job, cluster, ev: Evaluation) -> Evaluation:
    """The searched layout with the run's published ``layout.recompute_layers``,
    ``layout.recompute_modules``, ``layout.shard_across_domains`` and the knobs of
    ``_AFTER_SEARCH_KNOBS`` (knobs the search does not offer, or, offload, is held off for validation:
    the other knobs were chosen without them), priced by the cost model."""
    published = run.get("layout") or {}
    k, mods, across = published.get("recompute_layers"), published.get("recompute_modules"), published.get("shard_across_domains")
    changes = {key: parse_layout(f"{key}={published[key]}").degree(key) for key in _AFTER_SEARCH_KNOBS
               if published.get(key) not in (None, _AFTER_SEARCH_DEFAULTS[key])}
    if not k and not mods and not across and not changes:
        return ev
    if across is not None:
        if not isinstance(across, bool):
            raise SpecError(f"layout.shard_across_domains: got {across!r}; allowed: true, false")
        changes["shard_across_domains"] = across
    if k:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise SpecError(f"layout.recompute_layers: got {k!r}; must be an integer >= 0")
        changes["recompute_layers"] = k
    if mods:
        changes["recompute_modules"] = parse_recompute_modules(mods, "layout.recompute_modules")
    if changes.get("schedule") and published.get("ep_overlap"):  # held off in the search (_bounds)
        changes["ep_overlap"] = True
    layout = ev.layout.with_(**changes)
    problems = [msg for key, msg in layout_problems(model, job, cluster, layout)
                if key in ("offload", "schedule", "dp_shard")
                or msg.startswith(("offload=", "shard_across_domains=", "param_gather=", "dp_shard="))]
    if problems:
        raise SpecError(f"layout: {problems[0]}")
    return evaluate(model, job, cluster, layout)


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


def bundled_data_path(name: str) -> Path:
    return Path(str(resources.files("clusterplan.planner") / "data" / name))


def load_runs_and_groups(path: str | Path) -> tuple[list[dict], dict[str, list[str]]]:
    """The runs of a file and its ``groups_of_bundled_runs`` (groups named by run id)."""
    doc = _load_doc(path)
    runs = doc["runs"]
    extra = doc.get("groups_of_bundled_runs") or {}
    if not isinstance(extra, dict):
        raise SpecError(f"validate FILE: {path}: groups_of_bundled_runs must map a group name to run ids")
    return runs, extra
