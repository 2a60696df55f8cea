"""The Plan document: a JSON-ready dict built from a search result or a single evaluation.

Export and report code read this document. It holds results only: every figure is computed before
it is built (:mod:`planner.results`: energy, cost and time to train, goodput, overlap charges, the
explanation's re-evaluations); this module turns a :class:`~planner.results.PlanResults` into JSON-ready
dicts and computes nothing. Schema ``clusterplan-plan/1``:

``schema, planner_version, inputs{model, cluster, job}, layout{tp, pp, dp, cp, ep, vp,
micro_batch_size, sequence_parallel, recompute, zero_stage, order, dp_overlap, tp_overlap,
num_microbatches}, num_devices, step_time_s, tokens_per_s, mfu, hfu, model_flops_per_s_per_device,
peak_memory_bytes (reserved), allocated_memory_bytes, fit_memory_bytes (allocated + runtime: what must fit),
device_memory_bytes, fits, overflow_bytes, memory{...}, breakdown{...},
energy_per_step_j, cost_per_step_usd, time_to_train_s, energy_j, cost_usd, runners_up[...],
rejections{...}, search{objective, ...}``; the winner also carries ``schedule{...}`` (one micro-batch
on the stage that sets the step, per term), ``stage_memory{first, second, last}`` (each rank's
peak by category) and ``fabric_groups[...]`` (rank 0's group of each axis on the fabric), which
the HTML page and the timeline draw (:mod:`planner.views`; a document from before them has none).
"""

from __future__ import annotations

import math
from dataclasses import asdict

from clusterplan.cost.layout import Job
from clusterplan.cost.step import Evaluation
from clusterplan.models.errors import SpecError
from clusterplan.models.files import parse_json, read_text
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.caveats import (  # noqa: F401 (re-exported: their import path before planner.caveats)
    BIAS_SHOWN, GPU_FRAMEWORK_VENDORS, KIND_MIN_RUNS, NO_PUBLISHED_RUN, NO_PUBLISHED_TRAINING, caveats, family_error,
    moe_caveats, prediction_bias, shape_caveats)
from clusterplan.planner.results import (  # noqa: F401 (overlap_charges, training_totals: re-exported, as above)
    LayoutResults, PlanResults, evaluation_results, overlap_charges, plan_results, training_totals)
from clusterplan.planner.search.space import REASONS
from clusterplan.topologies.cluster import Cluster

SCHEMA = "clusterplan-plan/1"
PLANNER_VERSION = "0.1.0"


def layout_dict(ev: Evaluation) -> dict:
    d = ev.layout.as_dict()
    d["num_microbatches"] = ev.num_microbatches
    return d


def evaluation_dict(figures: LayoutResults, num_devices: int) -> dict:
    """The figures of one evaluated layout (used for the winner and each runner-up)."""
    ev = figures.evaluation
    breakdown = {k.removesuffix("_s"): v for k, v in asdict(ev.time).items()}
    memory = {k.removesuffix("_bytes"): v for k, v in asdict(ev.memory).items()}
    out = {
        "layout": layout_dict(ev),
        "num_devices": num_devices,
        "step_time_s": ev.step_time_s,
        "tokens_per_s": ev.tokens_per_s,
        "mfu": ev.mfu,
        "mfu_palm_count": ev.mfu_palm_count,
        "mfu_precision_peak": ev.mfu_precision_peak,
        "gemm_precision": figures.gemm_precision,
        "hfu": ev.hfu,
        "model_flops_per_s_per_device": ev.model_flops_per_s_per_device,
        "peak_memory_bytes": ev.peak_memory_bytes,
        "allocated_memory_bytes": ev.memory.allocated_bytes,
        "fit_memory_bytes": ev.memory.fit_bytes,
        "stage_memory_bytes": None if ev.stage_memory_bytes is None else
        {"first_stage": ev.stage_memory_bytes[0], "last_stage": ev.stage_memory_bytes[1]},
        "device_memory_bytes": ev.capacity_bytes,
        "fits": ev.fits,
        "overflow_bytes": ev.overflow_bytes,
        "memory": memory,
        "breakdown": breakdown,
        "overlap_charges": figures.overlap_charges,
        "energy_per_step_j": figures.energy_per_step_j,
        "cost_per_step_usd": figures.cost_per_step_usd,
        "zero_shard_copies": figures.zero_shard_copies,
    }
    if figures.cp_hierarchy:  # the all-to-all and ring sizes of hierarchical context parallelism, as priced
        out["cp_hierarchy"] = list(figures.cp_hierarchy)
    iv = figures.step_time_interval
    if iv is not None:  # how sure: the 80% interval from the published runs of the prediction's regime
        out["step_time_interval_s"] = [iv["low_s"], iv["high_s"]]
        out["mfu_interval"] = iv["mfu"]
        out["interval"] = {"level": iv["level"], "regime": iv["regime"], "runs": iv["runs"], "sources": iv["sources"],
                           "calibrated": bool(iv.get("calibrated"))}
    out.update(figures.training)
    out.update(figures.views or {})  # the winner's schedule, memory per stage and groups on the fabric
    return out


def inputs_dict(results: PlanResults) -> dict:
    model, job, cluster = results.model, results.job, results.cluster
    return {
        "model": {"name": model.name, "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "num_params": model.num_params, "num_active_params": model.num_active_params,
                  "moe_routing": None if model.moe is None else {
                      "capacity_factor": model.moe.capacity_factor, "load_imbalance": model.moe.load_imbalance,
                      "load_factor": model.moe.load_factor}},
        "cluster": {"id": cluster.id, "name": cluster.name, "family": cluster.family,
                    "device": cluster.device.id, "device_family": cluster.device.family, "num_devices": cluster.num_devices,
                    "devices_per_node": cluster.devices_per_node, "domain_size": cluster.domain_size,
                    "device_name": cluster.device.name, "torus_shape": cluster.torus_shape,
                    "device_memory_kind": cluster.device.memory_kind,
                    "price_per_device_hour_usd": cluster.device.price_per_hour_usd, "pue": cluster.pue,
                    "host_power_w_per_device": results.host_power_w, "host_power_assumed": results.host_power_assumed},
        "job": {**asdict(job), "gemm_format": job.gemm_format},
        "framework": framework_dict(job),
        "caveats": results.caveats,
    }


def framework_dict(job: Job) -> dict:
    """The framework profile the plan runs under: id, name, version, and the date it is taken at."""
    prof = job.profile
    return {"id": prof.profile.id, "name": prof.profile.name, "version": prof.profile.version,
            "date": prof.date, "as_of": prof.date != prof.profile.date,
            "compile_switch": prof.has("compile"), "compiled": job.compiled}


def search_dict(results: PlanResults) -> dict:
    """How the search ran: objective, engine, status and gap, wall time, layouts counted, headroom, hints."""
    s = results.search
    return {"objective": s.objective, "idle_power_known": results.idle_power_known,
            "engine": s.engine, "status": s.status, "gap": s.gap,
            "wall_s": s.wall_s, "layouts_considered": s.num_considered,
            "layouts_feasible": s.num_feasible, "memory_headroom": s.memory_headroom,
            "hints": list(s.hints)}


def results_document(results: PlanResults) -> dict:
    """The document of a plan's (or one evaluation's) results, which hold every figure it reports."""
    n = results.cluster.num_devices
    doc = {"schema": SCHEMA, "planner_version": PLANNER_VERSION, "inputs": inputs_dict(results)}
    doc.update(evaluation_dict(results.best, n))
    doc["runners_up"] = [evaluation_dict(r, n) for r in results.runners_up]
    rejections = results.search.rejections if results.search is not None else {}
    doc["rejections"] = dict(rejections)
    if results.search is not None:
        doc["rejection_reasons"] = {k: REASONS[k] for k in rejections}
        doc["search"] = search_dict(results)
    if results.explanation is not None:
        doc["explanation"] = results.explanation
    return doc


def plan_document(result) -> dict:
    """The document of a search: a :class:`~planner.results.PlanResults`, or a
    :class:`planner.search.SearchResult`, whose results :func:`planner.results.plan_results`
    computes first."""
    return results_document(result if isinstance(result, PlanResults) else plan_results(result))


def evaluation_document(model: ModelSpec, job: Job, cluster: Cluster, ev: Evaluation) -> dict:
    """The document for ``clusterplan evaluate`` (one given layout, no search): its results computed
    (:func:`planner.results.evaluation_results`), then written."""
    return results_document(evaluation_results(model, job, cluster, ev))


# ---- a saved Plan document, read back (clusterplan render) ---------------------------------------
PLAN_FILE_MAX_BYTES = 16 * 2**20  # a Plan document is a few KB; anything near this is not one
MAX_FIGURE = 1e30  # beyond any step time, throughput or byte count a plan writes
# MFU and HFU are over the dense 16-bit peak: an FP8 job may exceed 1 there (its peak is 2x), never
# this (no device's low-precision dense peak is more than 4x its 16-bit one); over the peak of the
# precision its GEMMs run in (``mfu_precision_peak``) at most 1
MAX_MFU_OVER_16BIT = 4.0

REPORT_KEYS = ("inputs", "layout", "num_devices", "step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes",
               "device_memory_bytes", "fits", "overflow_bytes", "memory", "breakdown")


def read_plan_document(path_text: str) -> dict:
    """A Plan document from a file, checked: a regular file, of bounded size, JSON, schema
    ``clusterplan-plan/1`` with the keys the report reads; else SpecError (exit 2)."""
    doc = parse_json(read_text(path_text, "PLAN.json", PLAN_FILE_MAX_BYTES), f"PLAN.json {path_text!r}")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"PLAN.json: schema: got {got!r}; expected {SCHEMA!r} (the output of plan/evaluate --json)")
    missing = [k for k in REPORT_KEYS if k not in doc]
    cluster = doc["inputs"].get("cluster") if isinstance(doc.get("inputs"), dict) else None
    if not missing and not (isinstance(cluster, dict) and "device_name" in cluster):
        missing = ["inputs.cluster.device_name"]
    if missing:
        raise SpecError(f"PLAN.json: missing {', '.join(missing)}; write it with this version's plan/evaluate --json")
    problem = plan_document_problem(doc)
    if problem:
        raise SpecError(f"PLAN.json: {problem}; write it with plan/evaluate --json and do not edit it")
    return doc


# (field, lowest, highest, lowest allowed itself): the figures the report prints, as a plan writes them
_PLAN_FIGURES = (("step_time_s", 0.0, MAX_FIGURE, False), ("tokens_per_s", 0.0, MAX_FIGURE, False),
                 ("mfu", 0.0, MAX_MFU_OVER_16BIT, True), ("hfu", 0.0, MAX_MFU_OVER_16BIT, True),
                 ("peak_memory_bytes", 0.0, MAX_FIGURE, True),
                 ("device_memory_bytes", 0.0, MAX_FIGURE, False), ("overflow_bytes", 0.0, MAX_FIGURE, True))


def plan_document_problem(doc: dict) -> str | None:
    """What in a Plan document no plan or evaluation writes (a wrong type, a non-finite or
    impossible figure), named with its field and value; None if the figures the report reads hold."""
    for key, low, high, closed in _PLAN_FIGURES:
        value = doc.get(key)
        if not _number_in(value, low, high, closed):
            return f"{key}: got {value!r}; allowed: a number {'>=' if closed else '>'} {low:g} and <= {high:g}"
    if "mfu_precision_peak" in doc and not _number_in(doc["mfu_precision_peak"], 0.0, 1.0, True):
        return f"mfu_precision_peak: got {doc['mfu_precision_peak']!r}; allowed: a number >= 0 and <= 1"
    if not (isinstance(doc["num_devices"], int) and not isinstance(doc["num_devices"], bool) and doc["num_devices"] >= 1):
        return f"num_devices: got {doc['num_devices']!r}; allowed: a whole number >= 1"
    if not isinstance(doc["fits"], bool):
        return f"fits: got {doc['fits']!r}; allowed: true or false"
    for name in ("inputs", "layout", "memory", "breakdown"):
        if not isinstance(doc[name], dict):
            return f"{name}: got {type(doc[name]).__name__}; allowed: an object"
    for name in ("model", "cluster", "job"):
        if not isinstance(doc["inputs"].get(name), dict):
            return f"inputs.{name}: got {doc['inputs'].get(name)!r}; allowed: an object"
    bad = next(((k, v) for k, v in doc["layout"].items() if k in ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch_size")
                and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1)), None)
    if bad:
        return f"layout.{bad[0]}: got {bad[1]!r}; allowed: a whole number >= 1"
    bad = next(((k, v) for k, v in doc["breakdown"].items() if not _number_in(v, 0.0, MAX_FIGURE, True)), None)
    if bad:
        return f"breakdown.{bad[0]}: got {bad[1]!r}; allowed: seconds >= 0"
    problem = _interval_problem(doc)
    if problem:
        return problem
    runners = doc.get("runners_up", [])
    if not isinstance(runners, list) or not all(isinstance(r, dict) and _number_in(r.get("step_time_s"), 0.0,
                                                                                   MAX_FIGURE, False) for r in runners):
        return "runners_up: allowed: a list of layouts as plan writes them, each with its step_time_s > 0"
    return _rejections_problem(doc)


def _interval_problem(doc: dict) -> str | None:
    """The interval fields the report prints, where the document has them (a plan before them has none)."""
    for key in ("step_time_interval_s", "mfu_interval", "time_to_train_interval_s"):
        pair = doc.get(key)
        if pair is not None and not (isinstance(pair, list) and len(pair) == 2
                                     and all(_number_in(v, 0.0, MAX_FIGURE, True) for v in pair) and pair[0] <= pair[1]):
            return f"{key}: got {pair!r:.80}; allowed: [low, high], two numbers >= 0 with low <= high"
    basis = doc.get("interval")
    if basis is not None and not (isinstance(basis, dict) and _number_in(basis.get("level"), 0.0, 1.0, False)
                                  and isinstance(basis.get("regime"), str)
                                  and all(isinstance(basis.get(k), int) and not isinstance(basis.get(k), bool)
                                          for k in ("runs", "sources"))):
        return (f"interval: got {basis!r:.80}; allowed: an object with level (a number in (0, 1]), regime (text), "
                "runs and sources (whole numbers)")
    return None


def _rejections_problem(doc: dict) -> str | None:
    """The rejection table's cells: counts (whole numbers >= 0) and reason texts (strings), which the
    report's table prints as they are (a number or a list there stopped the render with exit 1)."""
    counts, reasons = doc.get("rejections", {}), doc.get("rejection_reasons", {})
    if not isinstance(counts, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                               for n in counts.values()):
        return "rejections: allowed: an object of layout counts, each a whole number >= 0"
    if not isinstance(reasons, dict):
        return f"rejection_reasons: got {reasons!r:.80}; allowed: an object of reason texts"
    bad = next(((k, v) for k, v in reasons.items() if not isinstance(v, str)), None)
    if bad:
        return f"rejection_reasons.{bad[0]}: got {bad[1]!r:.80}; allowed: a reason's text"
    return None


def _number_in(value, low: float, high: float, closed: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value >= low if closed else value > low) and value <= high
