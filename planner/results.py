"""The results of a plan or of one evaluated layout, every figure computed: what the Plan document
reports and nothing it must work out.

A search (:func:`planner.search.plan`) or :func:`cost.step.evaluate` prices step time and memory;
the figures the document adds around them are computed here, before the document is built: the
energy and rental cost of a step, time, energy and cost to train with failures and checkpoints
(``cost.goodput``), the share of compute each overlapped collective takes, the ZeRO-3 shard
copies, the host power, the caveats (:mod:`planner.caveats`) and the explanation of the winner,
which evaluates its one-step neighbours (:mod:`planner.explain`). :mod:`planner.report.plan` turns
a :class:`PlanResults` into the JSON-ready document without computing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from clusterplan.cost.energy import has_idle_power, host_power_w, step_cost_usd, step_energy_j
from clusterplan.cost.goodput import goodput
from clusterplan.cost.layout import Job, Layout, offloads_activations, offloads_optimizer
from clusterplan.cost.step import Evaluation, gemm_precision, offload_copies
from clusterplan.cost.terms.context import graphed_context
from clusterplan.cost.terms import (Context, cp_a2a_size, host_optimizer_bytes, host_optimizer_terms, host_tier, overlap_charge,
                                    shard_copies)
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.caveats import caveats
from clusterplan.planner.explain import explain, placement
from clusterplan.planner.search import SearchResult
from clusterplan.planner.studies.calibration import calibrated_interval
from clusterplan.planner.studies.uncertainty import prediction_interval
from clusterplan.planner.views import fabric_groups, schedule_figures, stage_memory_figures
from clusterplan.topologies.cluster import Cluster


@dataclass(frozen=True, kw_only=True)
class LayoutResults:
    """One evaluated layout (the winner or a runner-up) with every figure the document reports on it."""

    evaluation: Evaluation
    """Step time, its breakdown, memory and throughput (``cost.step.evaluate``)."""
    gemm_precision: str
    """The precision the layout's GEMMs run at on this device (``cost.step.gemm_precision``)."""
    overlap_charges: dict
    """Per overlap the layout turns on: ``{"share", "basis"}`` (:func:`overlap_charges`)."""
    energy_per_step_j: float | None
    """Energy of one step (None: no power figure for the device)."""
    cost_per_step_usd: float | None
    """Rental cost of one step (None: no price for the device)."""
    zero_shard_copies: int
    """Copies of the ZeRO-3 shards kept across scale-up domains (1: sharded over every rank)."""
    training: dict
    """Time, energy and cost to train the job's tokens, with goodput (:func:`training_totals`)."""
    step_time_interval: dict | None = None
    """The step time's 80% interval from the published runs of its regime
    (:func:`planner.studies.uncertainty.prediction_interval`): ``{low_s, high_s, level, regime, runs,
    sources}``; None without the interval table."""
    cp_hierarchy: tuple[int, int] | None = None
    """Under ``cp_comm=a2a+p2p``: the all-to-all group's and the ring's sizes as priced
    (``cost.terms.cp_a2a_size``; Megatron-Core's ``--hierarchical-context-parallel-sizes``); else None."""
    views: dict | None = None
    """The winner's figures the HTML page and the timeline draw (:mod:`planner.views`): ``schedule``,
    ``stage_memory`` and ``fabric_groups``; None for a runner-up."""


@dataclass(frozen=True, kw_only=True)
class PlanResults:
    """A plan's (or one evaluation's) results: the inputs, the winner and runners-up with their
    figures, the search that found them, and the explanation."""

    model: ModelSpec
    job: Job
    cluster: Cluster
    host_power_w: float
    """Host power per device (W), the preset's or the assumed share of board power."""
    host_power_assumed: bool
    """True where the host power is an assumption (no figure for the cluster)."""
    caveats: dict
    """What the prediction rests on (:func:`planner.caveats.caveats`)."""
    best: LayoutResults
    runners_up: tuple[LayoutResults, ...] = ()
    search: SearchResult | None = None
    """The search (status, counts, rejections); None for one given layout (``evaluate``)."""
    idle_power_known: bool = False
    """The device has an idle power figure (the energy objective can tell waiting from computing)."""
    explanation: dict | None = None
    """Why the winner won (:func:`planner.explain.explain`), or for one layout only its torus
    placement; None where there is nothing to say."""


def layout_results(ev: Evaluation, job: Job, cluster: Cluster, model: ModelSpec | None = None) -> LayoutResults:
    """The figures around one evaluation: energy and cost per step, overlap charges, shard copies, the
    step time's interval and the totals to train (with failures where the ``model`` is given)."""
    energy, cost = step_energy_j(cluster, ev.step_time_s, ev.busy_s), step_cost_usd(cluster, ev.step_time_s)
    L = ev.layout
    moe = model is not None and model.moe is not None
    interval = step_time_interval(ev, job, cluster, moe)
    figures = {"step_time_s": ev.step_time_s, "energy_per_step_j": energy, "cost_per_step_usd": cost,
               "step_time_interval": interval}
    return LayoutResults(
        evaluation=ev, gemm_precision=gemm_precision(job, cluster), overlap_charges=overlap_charges(ev, job, cluster, model),
        energy_per_step_j=energy, cost_per_step_usd=cost,
        zero_shard_copies=shard_copies(job.profile.profile, cluster, L.dp, L.pp, L.cp, L.ep, L.zero_stage,
                                       L.shard_across_domains, L.dp_shard),
        training=training_totals(figures, job, None if model is None else model.num_params, cluster.num_devices),
        step_time_interval=interval, cp_hierarchy=_cp_hierarchy(L, cluster))


def _cp_hierarchy(L: Layout, cluster: Cluster) -> tuple[int, int] | None:
    if L.cp == 1 or L.cp_comm != "a2a+p2p":
        return None
    inner = cp_a2a_size(L.cp_comm, L.cp, L.stride("cp"), cluster.domain_size)
    return inner, L.cp // inner


def with_views(figures: LayoutResults, model: ModelSpec, job: Job, cluster: Cluster) -> LayoutResults:
    """The winner's figures with those the page and the timeline draw (:mod:`planner.views`)."""
    ev = figures.evaluation
    return replace(figures, views={"schedule": schedule_figures(model, job, cluster, ev),
                                   "stage_memory": stage_memory_figures(model, job, cluster, ev),
                                   "fabric_groups": fabric_groups(cluster, ev.layout)})


def step_time_interval(ev: Evaluation, job: Job, cluster: Cluster, moe: bool) -> dict | None:
    """The 80% interval of the step time (:func:`planner.studies.uncertainty.prediction_interval`),
    its low end no faster than the device's matmul ceiling allows (every model FLOP at the large-GEMM
    rate: the MFU no layout exceeds), and the MFU interval that goes with it; None without a table."""
    interval = calibrated_interval(cluster, ev.step_time_s) or prediction_interval(
        cluster.device.family, moe, job.profile.profile.id, ev.step_time_s)
    if interval is None:
        return None
    fastest_s = ev.step_time_s * ev.mfu / cluster.device.matmul_ceiling(job.precision)
    interval["low_s"] = max(interval["low_s"], fastest_s)
    interval["mfu"] = [ev.mfu * ev.step_time_s / interval["high_s"], ev.mfu * ev.step_time_s / interval["low_s"]]
    return interval


def _inputs(model: ModelSpec, job: Job, cluster: Cluster) -> dict:
    """The figures the document's inputs carry beside the model, job and cluster themselves."""
    host_w, host_assumed = host_power_w(cluster)
    return {"model": model, "job": job, "cluster": cluster, "host_power_w": host_w, "host_power_assumed": host_assumed,
            "caveats": caveats(job, cluster, model)}


def plan_results(result: SearchResult, explained: bool = True) -> PlanResults:
    """The results of a search: the winner's and each runner-up's figures, and the explanation (which
    evaluates the winner's one-step neighbours; ``explained=False``: none, for a caller that reads
    no explanation: a sweep's or comparison's rows)."""
    m = result.model
    return PlanResults(
        **_inputs(result.model, result.job, result.cluster),
        best=with_views(layout_results(result.best, result.job, result.cluster, m), m, result.job, result.cluster),
        runners_up=tuple(layout_results(ev, result.job, result.cluster, m) for ev in result.runners_up),
        search=result, idle_power_known=has_idle_power(result.cluster),
        explanation=explain(result.model, result.job, result.cluster, result.best, result.runners_up, result.space)
        if explained else None)


def evaluation_results(model: ModelSpec, job: Job, cluster: Cluster, ev: Evaluation) -> PlanResults:
    """The results of one given layout (``clusterplan evaluate``): its figures and, on a torus, which
    torus axes each parallel axis spans."""
    torus = placement(cluster, ev.layout)
    return PlanResults(**_inputs(model, job, cluster),
                       best=with_views(layout_results(ev, job, cluster, model), model, job, cluster),
                       explanation={"placement": torus} if torus else None)


def overlap_charges(ev: Evaluation, job: Job, cluster: Cluster, model: ModelSpec | None = None) -> dict:
    """For each overlap the layout turns on: the share of the compute it hides behind that it takes,
    and the basis of that figure (``cost.terms.overlap_charge``); with the ``model``, host offload's
    copies too."""
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
    if offloads_activations(L.offload) and model is not None:
        out["offload"] = _offload_charge(ev, model, job, cluster)
    if offloads_optimizer(L.offload) and model is not None:
        out["optimizer_offload"] = _optimizer_offload_charge(ev, model, job, cluster)
    return out


def _optimizer_offload_charge(ev: Evaluation, model: ModelSpec, job: Job, cluster: Cluster) -> dict:
    """Optimizer offload's step (``cost.terms.host_optimizer_terms``): the gradient copies to the host,
    the CPU Adam step and the weights' copy back, on copy engines and the CPU (no SMs), all exposed."""
    ctx = Context(model, job, cluster)
    d2h_s, cpu_s, h2d_s = host_optimizer_terms(ctx, ev.layout)
    tier = host_tier(cluster.device)
    return {"share": 0.0, "basis": (
        f"optimizer offload: {host_optimizer_bytes(ctx, ev.layout) / 1e9:,.1f} GB of Adam states and fp32 gradients "
        f"in host memory; per step {d2h_s:.4f} s of gradient copies to the host and {h2d_s:.4f} s of weights back "
        f"over the {tier.bytes_per_s / 1e9:,.0f} GB/s host link, {cpu_s:.4f} s of CPU Adam at "
        f"{tier.dram_bytes_per_s / 1e9:,.1f} GB/s of host memory (nominal, unvalidated), all exposed")}


def _offload_charge(ev: Evaluation, model: ModelSpec, job: Job, cluster: Cluster) -> dict:
    """Host offload's copies (``cost.step.offload_copies``): they take no SMs (copy engines), and the
    basis says how long they run per micro-batch, beside how much compute, and whether they hide."""
    copies_s, window_s, link = offload_copies(graphed_context(Context(model, job, cluster), ev.layout.cuda_graph), ev.layout)
    if window_s == 0.0:
        verdict = f"on the compute stream ({job.framework} copies block it): all of it exposed"
    else:
        verdict = ("hidden" if copies_s <= window_s else f"{copies_s - window_s:.4f} s exposed") + \
                  f" beside {window_s:.4f} s of the micro-batch's compute"
    return {"share": 0.0, "basis": f"host offload: {copies_s:.4f} s of copies per micro-batch to host memory and "
                                   f"back over the {link / 1e9:,.0f} GB/s host link, {verdict}"}


def training_totals(figures: dict, job: Job, num_params: float | None = None, num_devices: int = 0) -> dict:
    """Time, energy and cost to train ``job.tokens_to_train`` tokens from the per-step ``figures``
    (None where unknown), with failures, checkpoints and restarts (``cost.goodput``) when the model
    size is given: ``time_to_train_s`` is then the effective time (failure-free time / goodput),
    ``time_to_train_ideal_s`` the failure-free one, and energy and cost scale with the effective
    time (devices stay allocated through restarts; energy so counted is an upper bound). Where the
    figures carry the step time's interval (``step_time_interval``), ``time_to_train_interval_s`` is
    its ``[low, high]`` scaled as the time to train is."""
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
    interval = figures.get("step_time_interval")
    if interval and out["time_to_train_s"] is not None:
        out["time_to_train_interval_s"] = [scale(interval["low_s"]), scale(interval["high_s"])]
        if figures["cost_per_step_usd"] is not None:  # rental cost is the step time times a rate
            rate = figures["cost_per_step_usd"] / figures["step_time_s"]
            out["cost_interval_usd"] = [scale(rate * interval["low_s"]), scale(rate * interval["high_s"])]
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
