"""The Plan document: a JSON-ready dict built from a search result or a single evaluation.

Export and report code read this document; nothing here recomputes a cost. Schema
``clusterplan-plan/1``:

``schema, planner_version, inputs{model, cluster, job}, layout{tp, pp, dp, cp, ep, vp,
micro_batch_size, sequence_parallel, recompute, zero_stage, order, dp_overlap, tp_overlap,
num_microbatches}, num_devices, step_time_s, tokens_per_s, mfu, hfu, model_flops_per_s_per_device,
peak_memory_bytes (reserved), allocated_memory_bytes, fit_memory_bytes (allocated + runtime: what must fit),
device_memory_bytes, fits, overflow_bytes, memory{...}, breakdown{...},
energy_per_step_j, cost_per_step_usd, time_to_train_s, energy_j, cost_usd, runners_up[...],
rejections{...}, search{objective, ...}``.
"""

from __future__ import annotations

import math


from dataclasses import asdict


from clusterplan.cost.compute import UNMEASURED_ATTENTION_OVER_MAMF
from clusterplan.cost.goodput import goodput
from clusterplan.cost.energy import (ASSUMED_HOST_OVER_BOARD, has_idle_power, host_power_w, step_cost_usd,
                                     step_energy_j)
from clusterplan.cost.layout import Job
from clusterplan.cost.step import Evaluation, gemm_precision
from clusterplan.cost.terms import UNMEASURED_OVERLAP_SHARE, overlap_charge, shard_copies
from clusterplan.models.errors import SpecError
from clusterplan.models.files import bundled_yaml, parse_json, read_text
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.report.explain import explain, placement
from clusterplan.planner.search.space import REASONS
from clusterplan.topologies.cluster import Cluster

SCHEMA = "clusterplan-plan/1"
PLANNER_VERSION = "0.1.0"


def layout_dict(ev: Evaluation) -> dict:
    d = ev.layout.as_dict()
    d["num_microbatches"] = ev.num_microbatches
    return d


def evaluation_dict(ev: Evaluation, job: Job, cluster: Cluster, num_params: float | None = None) -> dict:
    """The figures of one evaluated layout (used for the winner and each runner-up)."""
    breakdown = {k.removesuffix("_s"): v for k, v in asdict(ev.time).items()}
    memory = {k.removesuffix("_bytes"): v for k, v in asdict(ev.memory).items()}
    out = {
        "layout": layout_dict(ev),
        "num_devices": cluster.num_devices,
        "step_time_s": ev.step_time_s,
        "tokens_per_s": ev.tokens_per_s,
        "mfu": ev.mfu,
        "mfu_palm_count": ev.mfu_palm_count,
        "mfu_precision_peak": ev.mfu_precision_peak,
        "gemm_precision": gemm_precision(job, cluster),
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
        "overlap_charges": overlap_charges(ev, job, cluster),
        "energy_per_step_j": step_energy_j(cluster, ev.time),
        "cost_per_step_usd": step_cost_usd(cluster, ev.step_time_s),
        "zero_shard_copies": shard_copies(job.profile.profile, cluster, ev.layout.dp, ev.layout.pp, ev.layout.cp,
                                          ev.layout.ep, ev.layout.zero_stage),
    }
    out.update(training_totals(out, job, num_params, cluster.num_devices))
    return out


def overlap_charges(ev: Evaluation, job: Job, cluster: Cluster) -> dict:
    """For each overlap the layout turns on: the share of the compute it hides behind that it takes,
    and the basis of that figure (``cost.terms.overlap_charge``)."""
    L, prof, dev = ev.layout, job.profile.profile, cluster.device
    streams = []
    if L.tp_overlap and L.tp > 1:
        streams.append(("tp", "tp", "gemm"))
    if L.dp_overlap and L.dp * L.cp > 1:
        streams.append(("dp", "dp", "gemm"))
    if L.cp > 1:
        streams.append(("cp", "dp", "attention"))
    if L.ep_overlap and L.ep > 1:
        streams.append(("ep", "ep", "gemm"))
    out = {}
    for name, stream, beside in streams:
        share, basis = overlap_charge(prof, dev, stream, beside)
        out[name] = {"share": share, "basis": basis}
    return out


def training_totals(figures: dict, job: Job, num_params: float | None = None, num_devices: int = 0) -> dict:
    """Time, energy and cost to train ``job.tokens_to_train`` tokens from the per-step ``figures``
    (None where unknown), with failures, checkpoints and restarts (``cost.goodput``) when the model
    size is given: ``time_to_train_s`` is then the effective time (failure-free time / goodput),
    ``time_to_train_ideal_s`` the failure-free one, and energy and cost scale with the effective
    time (devices stay allocated through restarts; energy so counted is an upper bound)."""
    if not job.tokens_to_train:
        return {"time_to_train_s": None, "energy_j": None, "cost_usd": None, "goodput": None}
    steps = job.tokens_to_train / job.tokens_per_step
    gp = goodput(num_params, num_devices, job.reliability) if num_params and num_devices else None
    # a job that fails faster than it checkpoints never finishes: no time, energy or cost (None), and
    # the document stays valid JSON (no Infinity)
    factor = 1.0 if gp is None else (None if gp.goodput <= 0 else 1.0 / gp.goodput)
    scale = lambda value: None if value is None or factor is None else steps * value * factor
    ideal_s = steps * figures["step_time_s"]
    out = {"time_to_train_s": scale(figures["step_time_s"]), "time_to_train_ideal_s": ideal_s,
           "energy_j": scale(figures["energy_per_step_j"]), "cost_usd": scale(figures["cost_per_step_usd"]),
           "goodput": None}
    if gp is not None:
        out["device_hours"] = None if factor is None else num_devices * ideal_s * factor / 3600.0
        finite = lambda value: value if math.isfinite(value) else None  # no failures: null, not Infinity
        out["goodput"] = {"goodput": gp.goodput, "mtbf_s": finite(gp.mtbf_s), "checkpoint_write_s": gp.checkpoint_write_s,
                          "checkpoint_interval_s": finite(gp.checkpoint_interval_s),
                          "failure_rate_per_device_hour": job.reliability.failure_rate_per_device_hour,
                          "checkpoint_bytes_per_s_per_device": job.reliability.checkpoint_bytes_per_s_per_device,
                          "restart_s": job.reliability.restart_s,
                          "restart_unvalidated": job.reliability.restart_is_default}
    return out


def inputs_dict(model: ModelSpec, job: Job, cluster: Cluster) -> dict:
    host_w, host_assumed = host_power_w(cluster)
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
                    "host_power_w_per_device": host_w, "host_power_assumed": host_assumed},
        "job": {**asdict(job), "gemm_format": job.gemm_format},
        "framework": framework_dict(job),
        "caveats": caveats(job, cluster, model),
    }


def caveats(job: Job, cluster: Cluster, model: ModelSpec | None = None) -> dict:
    """Where the prediction rests on a placeholder rather than a measurement of this hardware or
    framework: ``unvalidated`` lines, printed by every report and carried in the JSON, and the
    device's matmul ceiling (no MFU can exceed it)."""
    dev, prof = cluster.device, job.profile.profile
    lines = [] if dev.efficiency_validated else [dev.efficiency_note]
    lines += [note] if (note := dev.low_precision_note(job.precision)) else []
    lines += shape_caveats(model) if model is not None else []
    lines += moe_caveats(model, cluster)
    if dev.family in NO_PUBLISHED_TRAINING:
        lines.append(f"unvalidated: no training run on {dev.name} has been published; this plan is hypothetical")
    if cluster.platform == "gpu" and dev.vendor.lower() not in GPU_FRAMEWORK_VENDORS:
        lines.append(f"unvalidated: {dev.vendor}'s own software stack runs {dev.name}; no profile describes it, so the "
                     f"search used {prof.id}'s as a stand-in")
    if host_power_w(cluster)[1]:
        lines.append(f"unvalidated: no host power figure for {cluster.id}: energy counts {ASSUMED_HOST_OVER_BOARD:g} x "
                     f"board power per device for the host (the DGX systems' ratio; --host-power-w to set it)")
    validated = family_error(dev.family, None if model is None else model.moe is not None)
    if validated is None:
        lines.append(f"{NO_PUBLISHED_RUN} ({dev.family}) in clusterplan's validation data")
    if dev.attention_efficiency is None:
        lines.append(f"unvalidated: no measured fused-attention efficiency for {dev.name}; attention runs at "
                     f"{UNMEASURED_ATTENTION_OVER_MAMF:.0%} of the matmul efficiency (assumed, docs/cost-model.md)")
    if dev.comm_kernel_slowdown and not dev.comm_kernel_slowdown_measured:
        lines.append(f"unvalidated: the slowdown overlapped NCCL kernels cause the compute on {dev.name} is the H100's "
                     f"measured curve (the tail effect of GEMMs sized for every SM), not measured on this family")
    elif dev.gemm.sm_count and not dev.comm_kernel_slowdown and prof.dp_comm_sms:
        lines.append(f"unvalidated: overlapped communication on {dev.name} is charged the share of the SMs its kernels "
                     f"hold; the tail effect measured on H100 (2-3x that share) is not measured here")
    if not dev.gemm.sm_count or not prof.dp_comm_sms:
        lines.append(f"unvalidated: overlapped communication on {dev.name} under {prof.id} is charged an assumed "
                     f"{UNMEASURED_OVERLAP_SHARE:.0%} of the compute it overlaps (no SM-count figure)")
    return {"matmul_ceiling": dev.matmul_ceiling(job.precision), "unvalidated": lines,
            "validated_error": validated}


def moe_caveats(model: ModelSpec | None, cluster: Cluster) -> list[str]:
    """An MoE model on GPUs: its layers are priced at their device time, and what eager MoE execution
    adds on the host (a launch per kernel; Megatron's dropless all-to-all dispatcher waits for the
    host in every MoE layer) is not priced. The evidence (docs/cost-model.md, "Hold-out runs"):
    gpt-oss 120B in Megatron-Bridge 26.02-26.06 ran 1.5x to 2.2x the priced time with partial or no
    CUDA graphs, on H100 and on Blackwell, and 1.25x to 1.29x with the whole step in one graph. TPUs
    run a compiled step (XLA), with no host launch per kernel."""
    if model is None or model.moe is None or cluster.platform != "gpu":
        return []
    return ["unvalidated: MoE layers are priced at their device time; the host launches and host-device "
            "synchronizations of eager MoE layers are not (published gpt-oss runs under Megatron took 1.5x to 2.2x "
            "the priced time without full-iteration CUDA graphs, 1.25x to 1.29x with them; docs/cost-model.md)"]


def shape_caveats(model: ModelSpec) -> list[str]:
    """Model widths off the 8-element (16-byte) alignment tensor-core GEMM kernels want: the model
    prices every GEMM as aligned, and BigScience's head-size-225 trials ran 30-37% slower than
    predicted where their aligned siblings ran 9-21% slower (docs/cost-model.md)."""
    widths = {"attention head size": model.attention_dims[0], "hidden size": model.hidden_size,
              "FFN size": model.ffn_hidden_size}
    odd = [f"{name} {value}" for name, value in widths.items() if value and value % 8]
    if not odd:
        return []
    return [f"unvalidated: {', '.join(odd)} not a multiple of 8: its GEMMs leave the tensor cores' aligned "
            f"kernels, which the model does not price (predictions for such shapes ran up to 37% fast)"]


def _family_errors() -> dict:
    return (bundled_yaml("clusterplan.planner", "data", "validated_error.yaml") or {}).get("families", {})


def family_error(family: str, moe: bool | None = None) -> dict | None:
    """The validated step-time error of a hardware family: ``{runs, median_abs_error, p90_abs_error,
    median_signed_error, kind, line}`` from ``planner/data/validated_error.yaml`` (written by
    ``benchmarks/update_docs.py`` from ``clusterplan validate`` over the bundled and hold-out runs),
    or None where no published run of the family was evaluated. With the model's kind (``moe``) and
    at least :data:`KIND_MIN_RUNS` runs of that kind on the family, the figure is that kind's (its MoE
    runs can be off where its dense runs are not), the family's whole figure named beside it
    (``kind``: ``"MoE"`` or ``"dense"``; None: the family's). Where the median signed error is
    :data:`BIAS_SHOWN` or more, the line says which way the predictions ran."""
    family_entry = _family_errors().get(family)
    if not family_entry:
        return None
    kind = None if moe is None else ("moe" if moe else "dense")
    entry = family_entry.get(kind) if kind else None
    whole = f"{family_entry['runs']} published runs on {family}"
    label = None
    if entry and entry["runs"] >= KIND_MIN_RUNS:
        label = "MoE" if moe else "dense"
        line = (f"validated: median |step-time error| {entry['median_abs_error']:.0%} over {entry['runs']} published "
                f"{label} runs on {family} ({_bias(entry)}p90 {entry['p90_abs_error']:.0%}; all {whole}: "
                f"{family_entry['median_abs_error']:.0%}; clusterplan validate)")
    else:
        entry = family_entry
        moe_runs = family_entry.get("moe_runs", 0)
        none_of_kind = kind and moe_runs == (0 if moe else family_entry["runs"])
        line = (f"validated: median |step-time error| {entry['median_abs_error']:.0%} over {whole}"
                + (f", none of them {'MoE' if moe else 'dense'}" if none_of_kind else "")
                + f" ({_bias(entry)}p90 {entry['p90_abs_error']:.0%}; clusterplan validate)")
    return {"runs": entry["runs"], "median_abs_error": entry["median_abs_error"],
            "p90_abs_error": entry["p90_abs_error"], "median_signed_error": entry.get("median_signed_error"),
            "kind": label, "line": line}


BIAS_SHOWN = 0.05
"""Median signed step-time error from which a plan's validated-error line says the predictions ran
fast (or slow): a plan on such hardware is likely optimistic (or pessimistic) by about that much."""


def prediction_bias(entry: dict) -> str | None:
    """``"fast"`` or ``"slow"``: which way a validated-error entry's predictions ran, where its median
    signed error is :data:`BIAS_SHOWN` or more; None otherwise (the plan line and the what-if rows)."""
    signed = entry.get("median_signed_error")
    if signed is None or abs(signed) < BIAS_SHOWN:
        return None
    return "fast" if signed < 0 else "slow"


def _bias(entry: dict) -> str:
    way = prediction_bias(entry)
    return f"predicted too {way}: median signed {entry['median_signed_error']:+.0%}; " if way else ""


KIND_MIN_RUNS = 2
"""Runs of one model kind on a family before a plan quotes that kind's validated error."""


NO_PUBLISHED_RUN = "unvalidated: no published run on this hardware"
"""The label of a prediction whose hardware family no validated run covers (plan's caveats, the
what-if rows' ``validated_error``)."""
NO_PUBLISHED_TRAINING = ("groq-lpu",)  # Groq publishes inference only (issue 10)
GPU_FRAMEWORK_VENDORS = ("nvidia", "amd", "intel")  # vendors whose parts Megatron/torchtitan/DeepSpeed run on


def framework_dict(job: Job) -> dict:
    """The framework profile the plan runs under: id, name, version, and the date it is taken at."""
    prof = job.profile
    return {"id": prof.profile.id, "name": prof.profile.name, "version": prof.profile.version,
            "date": prof.date, "as_of": prof.date != prof.profile.date,
            "compile_switch": prof.has("compile"), "compiled": job.compiled}


def plan_document(result) -> dict:
    """The document for a :class:`planner.search.SearchResult`."""
    doc = {"schema": SCHEMA, "planner_version": PLANNER_VERSION,
           "inputs": inputs_dict(result.model, result.job, result.cluster)}
    n = result.model.num_params
    doc.update(evaluation_dict(result.best, result.job, result.cluster, n))
    doc["runners_up"] = [evaluation_dict(ev, result.job, result.cluster, n) for ev in result.runners_up]
    doc["rejections"] = dict(result.rejections)
    doc["rejection_reasons"] = {k: REASONS[k] for k in result.rejections}
    doc["search"] = {"objective": result.objective, "idle_power_known": has_idle_power(result.cluster),
                     "engine": result.engine, "status": result.status, "gap": result.gap,
                     "wall_s": result.wall_s, "layouts_considered": result.num_considered,
                     "layouts_feasible": result.num_feasible, "memory_headroom": result.memory_headroom,
                     "hints": list(result.hints)}
    doc["explanation"] = explain(result.model, result.job, result.cluster, result.best, result.runners_up,
                                 result.space)
    return doc


def evaluation_document(model: ModelSpec, job: Job, cluster: Cluster, ev: Evaluation) -> dict:
    """The document for ``clusterplan evaluate`` (one given layout, no search)."""
    doc = {"schema": SCHEMA, "planner_version": PLANNER_VERSION, "inputs": inputs_dict(model, job, cluster)}
    doc.update(evaluation_dict(ev, job, cluster, model.num_params))
    doc["runners_up"] = []
    doc["rejections"] = {}
    torus = placement(cluster, ev.layout)
    if torus:
        doc["explanation"] = {"placement": torus}
    return doc


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
    runners = doc.get("runners_up", [])
    if not isinstance(runners, list) or not all(isinstance(r, dict) and _number_in(r.get("step_time_s"), 0.0,
                                                                                   MAX_FIGURE, False) for r in runners):
        return "runners_up: allowed: a list of layouts as plan writes them, each with its step_time_s > 0"
    return _rejections_problem(doc)


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
