"""Answers to a user's request, the layer the command line calls: ``plan`` (a search, and on exit 3
a device count on which a layout fits, found by search), ``evaluate`` (one layout) and ``fit``
(the fewest devices, or the smallest device). Each takes a :class:`~planner.inputs.Request` and
returns documents; printing them is the caller's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from clusterplan.cost.framework import framework_defaults
from clusterplan.cost.layout import given_keys, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import InfeasibleError, SolverError
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.inputs import Request
from clusterplan.planner.report.plan import results_document
from clusterplan.planner.results import evaluation_results, plan_results
from clusterplan.planner.search import SearchOptions, SearchResult, check_layout, plan
from clusterplan.planner.search.space import Bounds
from clusterplan.planner.studies.fit import (
    TIME_LIMIT_S, FitAnswer, fewest_devices, fewest_with_offload, fit_hint, fitting_offload, offload_refusal, smallest_device,
)
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.library import list_devices

HINT_BUDGET_S = TIME_LIMIT_S / 2
"""Seconds the exit-3 hint may spend: the hint is the answer of ``clusterplan fit`` (the same search,
from the same memory bound, over the same sizes), so it names the size ``fit`` names; past half of
fit's time limit it names none and points at ``clusterplan fit``, so that a plan that exits 3 waits
at most 15 s more where no size is in reach (every model on the Dojo tiles: 30 s each in
tests/test_cli.py with fit's whole limit), while fit's slowest answers on the bundled models take
about 10 s of search (DeepSeek-V3 on Graphcore, GPT-3 13B on Groq; 2 cores)."""


@dataclass
class Planned:
    """A search's result with the cluster it ran on and where each job figure came from."""

    result: SearchResult
    cluster: Cluster
    origin: dict[str, str]

    def document(self) -> dict:
        """The Plan document: the search's results computed (:func:`planner.results.plan_results`),
        then written (:func:`planner.report.plan.results_document`)."""
        return results_document(plan_results(self.result))


def plan_request(request: Request, options: SearchOptions, model: ModelSpec | None = None) -> Planned:
    """Search the request's layouts. When none fits, the :class:`InfeasibleError` carries a device
    count on which some layout does fit, found by a bounded search (so that its number works)."""
    model = model or request.load_model()
    cluster = request.load_cluster()
    job, origin = request.build_job(model, cluster)
    try:
        result = plan(model, job, cluster, options)
    except InfeasibleError as err:
        if not err.rejections.get("memory"):
            raise  # no layout passed the structural rules: more devices is not the answer
        answer = fewest_devices(model, request, options.bounds, budget_s=HINT_BUDGET_S, reference=cluster)
        raise fit_hint(err, answer, f"clusterplan fit --model {request.model} --cluster {request.cluster}") from None
    return Planned(result, cluster, origin)


def evaluate_request(request: Request, layout_text: str) -> tuple[dict, Cluster, dict[str, str]]:
    """The evaluation document of one layout given as text (``tp=8,pp=4,...``): degrees left out
    are 1, dp takes the devices left over, the knobs left out take a value the framework offers."""
    model = request.load_model()
    cluster = request.load_cluster()
    job, origin = request.build_job(model, cluster)
    layout = parse_layout(layout_text, num_devices=cluster.num_devices)
    layout = framework_defaults(layout, given_keys(layout_text), job.profile, cluster.device.family)
    check_layout(model, job, cluster, layout)
    results = evaluation_results(model, job, cluster, evaluate(model, job, cluster, layout))
    return results_document(results), cluster, origin


@dataclass
class FitResult:
    """The answer of ``fit``: the question asked, the answer found, and the plan at the answer."""

    question: str
    answer: FitAnswer
    planned: Planned
    # the fewest devices with host offload offered, of the layer inputs or the optimizer (None: not
    # offered, or not found within the time limit), and why it is not offered (empty where it is)
    num_devices_with_offload: int | None = None
    offload_note: str = ""
    # the offload mode of the first space (split_spaces' order) that fits at that count ("": none fits there)
    offload_mode: str = ""

    def document(self) -> dict:
        return {"question": self.question, "num_devices": self.answer.num_devices,
                "num_devices_with_offload": self.num_devices_with_offload, "offload_note": self.offload_note,
                "offload_mode": self.offload_mode,
                "device": self.answer.device,
                "checked": [{"num_devices": n, "fits": ok} for n, ok in self.answer.checked],
                "least_devices": self.answer.least_devices, "every_size": self.answer.every_size,
                "plan": self.planned.document()}


def fit_request(request: Request, bounds: Bounds, time_limit_s: float | None = TIME_LIMIT_S) -> FitResult:
    """The fewest devices on which some layout fits (or, with a size in the request, the device of
    the family with the least memory that fits at that size), and the best plan there. The size
    search stops after ``time_limit_s`` seconds (:class:`SolverError`, exit 4, when it found none)."""
    model = request.load_model()
    if request.num_devices or request.num_nodes:
        here = request.load_cluster()
        family = [d.id for d in list_devices()]
        answer = smallest_device(model, request.with_(num_devices=here.num_devices, num_nodes=None), family, bounds)
        question = f"the smallest device for {model.name} on {here.num_devices:,} devices of {request.cluster}"
    else:
        return _fewest(model, request, bounds, time_limit_s)
    if answer.num_devices is None:
        _not_found(question, answer, time_limit_s)
    return FitResult(question, answer, _plan_there(model, request, answer, bounds, time_limit_s))


def _plan_there(model: ModelSpec, request: Request, answer: FitAnswer, bounds: Bounds,
                time_limit_s: float | None) -> Planned:
    """The plan at the answer: its solve bounded by the same limit (CP-SAT then answers its best with the gap)."""
    there = request.with_(num_devices=answer.num_devices, num_nodes=None, device=answer.device)
    return plan_request(there, SearchOptions(top_k=0, bounds=bounds, time_limit_s=time_limit_s), model)


def _fewest(model: ModelSpec, request: Request, bounds: Bounds, time_limit_s: float | None) -> FitResult:
    """The fewest devices with the layer inputs on the device and, where the framework and the device
    offer host offload (``offload_refusal``), with it too, in what is left of the time limit."""
    question = f"the fewest devices for {model.name} on {request.cluster}"
    reference = request.with_(num_devices=None, num_nodes=None).load_cluster()
    refusal = offload_refusal(request.build_job(model, reference)[0], reference, bounds)
    start = time.perf_counter()
    held = bounds if refusal else replace(bounds, fixed={**bounds.fixed, "offload": "none"})
    answer = fewest_devices(model, request, held, budget_s=time_limit_s, reference=reference)
    if refusal:
        return _fit_result(model, request, question, answer, bounds, time_limit_s, None, f"not offered: {refusal}")
    left_s = None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - start))
    offload = fewest_with_offload(model, request, bounds, answer, left_s)
    if answer.num_devices is None and offload.num_devices is None:
        _not_found(question, answer, time_limit_s)
    note = ("" if answer.num_devices and offload.num_devices else "not found within the time limit"
            if answer.num_devices else "no size fits without offload: the answer offloads")
    result = _fit_result(model, request, question, answer if answer.num_devices else offload, bounds,
                         time_limit_s, offload.num_devices, note)
    if offload.num_devices not in (None, answer.num_devices):  # the mode that lowers the count
        result.offload_mode = fitting_offload(model, request, offload.num_devices, bounds)
    return result


def _fit_result(model: ModelSpec, request: Request, question: str, answer: FitAnswer, bounds: Bounds,
                time_limit_s: float | None, with_offload: int | None, note: str) -> FitResult:
    if answer.num_devices is None:
        _not_found(question, answer, time_limit_s)
    return FitResult(question, answer, _plan_there(model, request, answer, bounds, time_limit_s), with_offload, note)


def _not_found(question: str, answer: FitAnswer, time_limit_s: float | None) -> None:
    """Raise why no size (or device) was found: exit 4 where the time limit stopped the search, else 3."""
    if answer.devices_tried is not None:
        raise InfeasibleError(f"{question}: {answer.reason}")
    below = f"; below {answer.least_devices:,} devices {answer.bound_text()}" if answer.least_devices > 1 else ""
    tried = f" (sizes tried: {answer.sizes_text()}{below})"
    if answer.stopped:
        raise SolverError(f"{question}: no size found within the {time_limit_s:g} s time limit{tried}; "
                          f"raise --time-limit to search further")
    raise InfeasibleError(f"{question}: {answer.reason}{tried}")
