"""Planning: build the space and tables, solve, evaluate the winners in floats, explain failure."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

from clusterplan.cost.energy import OBJECTIVES, objective_weights
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import Evaluation, evaluate_ctx
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import Context
from clusterplan.cost.terms.context import graphed_context
from clusterplan.cost.framework import framework_refusal, knob_text
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SolverError, SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.search.cpsat import solve_cpsat
from clusterplan.planner.search.exhaustive import count_rejections, smallest_memory, solve_exhaustive
from clusterplan.planner.search.offload import host_memory_refusal
from clusterplan.planner.search.graphs import graph_spaces
from clusterplan.planner.search.space import KNOB_TEXT, REASONS, Bounds, Space, build_space, split_spaces
from clusterplan.planner.search.tables import TIME_QUANTUM_S, SLOT_QUANTUM, build_tables, layout_from_indices
from clusterplan.topologies.cluster import Cluster

ENGINES = ("cpsat", "exhaustive")
MAX_TOP_K = 20
"""Runners-up one search may report: each is one more solve, so the cost of --top is linear in it
(--top 100 takes half a minute on a small model); twenty cover any report a person reads."""
GIB = 2**30


@dataclass(frozen=True)
class SearchOptions:
    """How to search: engine, runners-up, time limit (s), user bounds, solver threads, and what to
    minimise (``time`` per step, rental ``cost`` or ``energy`` per step: ``cost.energy``)."""

    engine: str = "cpsat"
    top_k: int = 3
    time_limit_s: float | None = None
    bounds: Bounds = field(default_factory=Bounds)
    workers: int = 0
    objective: str = "time"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecError(f"--search: got {self.engine!r}; allowed: {', '.join(ENGINES)}")
        if self.objective not in OBJECTIVES:
            raise SpecError(f"--objective: got {self.objective!r}; allowed: {', '.join(OBJECTIVES)}")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise SpecError(f"--top: got {self.top_k}; must be 0 to {MAX_TOP_K} runners-up")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise SpecError(f"--time-limit: got {self.time_limit_s}; must be > 0 seconds")


@dataclass
class SearchResult:
    """What a search returns: the best layout evaluated in floats, runners-up, and the bookkeeping."""

    model: ModelSpec
    job: Job
    cluster: Cluster
    best: Evaluation
    runners_up: list[Evaluation]
    rejections: dict[str, int]
    num_feasible: int
    num_considered: int
    engine: str
    status: str
    gap: float
    wall_s: float
    objective_units: list[int]  # the integer objective: time in 1e-10 s (objective_seconds); energy in
    # (watts / gcd of the weights) x 1e-10 s per device
    space: Space | None = None
    objective: str = "time"
    memory_headroom: float = 0.0  # the share of device memory the search kept free
    hints: list[str] = field(default_factory=list)  # what the user may change for a better answer


def plan(model: ModelSpec, job: Job, cluster: Cluster, options: SearchOptions | None = None) -> SearchResult:
    """Search the layout space for the layout that fits and minimises ``options.objective`` (step
    time by default; ties at the optimum go to the least memory). Each pipeline split the framework
    offers (``Space.head_slots``) is searched on its own and the winners merged, so the result is the
    optimum over both splits (the framework's own split wins a tie).

    Raises
    ------
    InfeasibleError
        No layout fits; the message gives the smallest shortfall and what would fix it.
    SolverError
        The solver stopped (time limit) before finding any layout.
    """
    opts = options or SearchOptions()
    start = time.perf_counter()
    ctx = Context(model, job, cluster)
    weights = objective_weights(cluster, opts.objective)
    scale = math.gcd(*weights)  # the same ranking with the smallest integers (board power alone: time)
    weights = (weights[0] // scale, weights[1] // scale)
    space = build_space(model, job, cluster, opts.bounds)
    headroom = opts.bounds.headroom(job, cluster)
    subs = searched_spaces(ctx, space)
    if not subs:  # --fix cuda_graph=S with knobs its framework's rules refuse it with
        raise _graph_refusal(job, space.cuda_graph[0], opts.bounds)
    limit_s = opts.time_limit_s / len(subs) if opts.time_limit_s else None  # --time-limit shared by the splits
    parts: list[_SplitSearch] = []
    for sub in subs:  # each later split only has to beat the answers already kept (their worst)
        kept = sorted(o for p in parts for o, _ in p.solutions)
        ceiling = kept[opts.top_k] if len(kept) > opts.top_k else None
        parts.append(_SplitSearch(sub_context(ctx, sub), sub, headroom, weights, opts, limit_s, ceiling))
    rejections: dict[str, int] = {}
    for part in parts:
        for key, count in part.rejections.items():
            rejections[key] = rejections.get(key, 0) + count
    feasible = sum(p.feasible for p in parts)
    if feasible == 0:
        raise _infeasible(ctx, [p.tables.space for p in parts], rejections, headroom, opts.bounds)
    # the splits' winners merged by objective (a stable sort: the framework's own split wins ties)
    ranked = sorted(((obj, part.tables, idx) for part in parts for obj, idx in part.solutions),
                    key=lambda row: row[0])[:opts.top_k + 1]
    if not ranked:  # every split's solve stopped before a layout (the time limit)
        raise next((p.error for p in parts if p.error), SolverError("CP-SAT found no layout in any pipeline split"))
    evaluations = [evaluate_ctx(ctx, layout_from_indices(T.space, idx, sub_context(ctx, T.space), T.PG)) for _, T, idx in ranked]
    done = [p for p in parts if p.feasible]
    status = next((p.status for p in done if p.status != "OPTIMAL"), done[0].status)
    return SearchResult(model, job, cluster, evaluations[0], evaluations[1:], rejections, feasible,
                        feasible + sum(rejections.values()), opts.engine, status, max(p.gap for p in done),
                        time.perf_counter() - start, [o for o, _, _ in ranked], space, opts.objective, headroom)



def _graph_refusal(job: Job, scope: str, bounds: Bounds) -> SpecError:
    rules = "; ".join(r.message for r in job.profile.profile.rules if scope in dict(r.when).get("cuda_graph_in", ()))
    return SpecError(f"{_bounds_text(bounds)}: no layout left runs cuda_graph={scope}: {rules}; drop or change the bound")


def searched_spaces(ctx: Context, space: Space) -> list[Space]:
    """The spaces searched one after the other (each with its own tables): one per pipeline split and
    offload mode (``split_spaces``), each cut by the CUDA graph scopes its framework may run
    (``graphs.graph_spaces``)."""
    subs = split_spaces(space, ctx.model, ctx.job, ctx._base.cluster)
    return [g for sub in subs for g in graph_spaces(sub, ctx.job.profile)]


def sub_context(ctx: Context, space: Space) -> Context:
    """The problem as a searched space's tables price it: graphed where its layouts run CUDA graphs."""
    return graphed_context(ctx, space.cuda_graph[0])


class _SplitSearch:
    """The search over one pipeline split's space (``split_spaces``): its tables, rejection counts,
    and, where some layout is feasible, the engine's best ``top_k + 1`` solutions."""

    def __init__(self, ctx: Context, space: Space, headroom: float, weights: tuple[int, int], opts: SearchOptions,
                 limit_s: float | None, ceiling: int | None = None):
        self.tables = build_tables(ctx, space, headroom, opts.bounds.ignore_memory, weights)
        self.rejections, self.feasible = count_rejections(self.tables)
        self.solutions, self.status, self.gap, self.error = [], "OPTIMAL", 0.0, None
        if not self.feasible:
            return
        if opts.engine == "exhaustive":
            self.solutions, _ = solve_exhaustive(self.tables, opts.top_k)
            return
        try:
            result = solve_cpsat(self.tables, opts.top_k, limit_s, opts.workers, ceiling)
            self.solutions, self.status, self.gap = result.solutions, result.status, result.gap
            if ceiling is not None and result.status == "INFEASIBLE":
                self.status = "OPTIMAL"  # proven: no layout of this split beats the answers already kept
        except SolverError as exc:  # the time limit came before any layout: another split may answer
            self.error, self.status = exc, "FEASIBLE"
        except MemoryError:
            # CP-SAT gave up on memory (its limit, CPSAT_MAX_MEMORY_MB): the exhaustive engine
            # scores the same tables (the tests hold the two engines equal) and proves the optimum
            self.solutions, _ = solve_exhaustive(self.tables, opts.top_k)
            self.status = "OPTIMAL (exhaustive: CP-SAT ran out of memory)"


def objective_seconds(units: int) -> float:
    """Convert the integer objective of a time (or cost) search back to seconds."""
    return units * TIME_QUANTUM_S / SLOT_QUANTUM



def _infeasible(ctx: Context, spaces: list[Space], rejections: dict[str, int], headroom: float,
                bounds: Bounds | None = None) -> ClusterplanError:
    """Why no layout is left: the framework refuses every layout the user's bounds leave (exit 2,
    the rule named), the bounds leave none that passes the structural rules (exit 2, the rules
    named), none passes them at all (exit 3), or the least memory a layout the framework runs needs
    against the device (exit 3, with what would fit)."""
    cluster, model = ctx.cluster, ctx.model
    given = _bounds_text(bounds)
    if not rejections:  # every layout left is one the framework refuses: outside the space
        return SpecError(_refusal_message(ctx, spaces, given))
    reasons = "; ".join(f"{REASONS[r]}: {n:,}" for r, n in sorted(rejections.items(), key=lambda kv: -kv[1]))
    least = _least_memory(ctx, spaces)
    if least is None and given:
        return SpecError(f"{given} leaves no layout of {model.name} on {cluster.num_devices:,} x {cluster.device.id} "
                         f"that passes the rules ({reasons}); drop or change the bound")
    if least is None:
        msg = (f"no layout of {model.name} on {cluster.num_devices} x {cluster.device.id} passes the structural "
               f"rules ({reasons})")
        return InfeasibleError(msg, rejections, "change the batch size, sequence length or device count")
    need_bytes, layout = least
    host = host_memory_refusal(ctx, layout)
    if host:
        return InfeasibleError(host, rejections, "use more devices (each then holds a smaller share of the "
                               "offloaded states), or drop --fix offload")
    have = cluster.device.memory_bytes * (1 - headroom)
    factor = need_bytes / have
    devices = cluster.num_devices * max(2, int(factor + 1))
    over = f"{factor:.2f}x" if factor < 10 else f"{factor:,.0f}x"
    msg = (f"{model.name} does not fit on {cluster.num_devices} x {cluster.device.id}: the least memory any valid "
           f"layout needs is {need_bytes / GIB:,.1f} GiB per device ({layout.short()}), "
           f"against {have / GIB:.1f} GiB available ({over} over)")
    hint = (f"use about {devices} or more devices (more pipeline/tensor/ZeRO sharding), a device with at least "
            f"{math.ceil(need_bytes / (1 - headroom) / GIB):,} GiB, or a smaller model/sequence")
    return InfeasibleError(msg, rejections, hint)


def _bounds_text(bounds: Bounds | None) -> str:
    """The user's bounds as they were given (``--fix pp=2 --fix zero=3``), or "" without any."""
    if bounds is None:
        return ""
    def text(knob: str, value) -> str:
        if knob == "expert_tp":  # held as a switch: etp=1 folds the experts, etp=<tp> splits them like the MLP
            return "etp=1" if value is False else "etp=tp"
        return f"{KNOB_TEXT.get(knob, knob)}={knob_text(value)}"
    parts = [f"--{flag} {text(k, v)}" for flag, held in
             (("fix", bounds.fixed), ("min", bounds.minimum), ("max", bounds.maximum)) for k, v in held.items()]
    return " ".join(parts)


def _refusal_message(ctx: Context, spaces: list[Space], given: str) -> str:
    """The rules of the job's framework that refuse every layout of ``spaces`` (each space's
    layouts pass no combination rule: ``planner.search.masks.framework_mask``), named."""
    prof = ctx.job.profile
    rules: list[str] = []
    for space in spaces:
        overlaps = sorted(itertools.product(space.dp_overlap, space.tp_overlap))  # off first: a rule on an
        # overlap binds only where the layout is refused with the overlap off too
        for tp, pp, dp, cp in space.factorizations:
            for ep, sp, zero in itertools.product(space.ep, space.sequence_parallel, space.zero_stage):
                do, to = overlaps[0]
                rule = framework_refusal(prof, tp, pp, cp, ep, 1, zero, "none", sp, to, do and dp * cp > 1,
                                         data_parallel=dp * cp > 1)
                if rule and rule not in rules:
                    rules.append(rule)
    name = prof.profile.describe(prof.date)
    why = "; ".join(rules) if rules else "its combination rules"
    head = f"{given}: " if given else ""
    return (f"{head}{name} runs no layout of {ctx.model.name} on {ctx.cluster.num_devices:,} devices that is left: "
            f"{why}; drop or change {'the bound' if given else 'an option'}, or pick another --framework")


def _least_memory(ctx: Context, spaces: list[Space]) -> tuple[float, Layout] | None:
    """The structurally valid layout whose allocated peak with the runtime is the least, and that
    peak. The search's tables clamp every memory term at the device's capacity (a layout beyond it
    is out whatever its size), so the least is looked for in unclamped memory tables and its bytes
    come from the layout's own evaluation."""
    best = None
    for space in spaces:
        T = build_tables(ctx, space, ignore_memory=True, memory_only=True)
        found = smallest_memory(T)
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], layout_from_indices(space, found[1], ctx, T.PG))
    if best is None:
        return None
    return evaluate_ctx(ctx, best[1]).memory.fit_bytes, best[1]


def check_layout(model: ModelSpec, job: Job, cluster: Cluster, layout: Layout) -> None:
    """Raise :class:`SpecError` listing every structural problem of a user-given layout."""
    problems = layout_problems(model, job, cluster, layout)
    if problems:
        raise SpecError("invalid layout: " + "; ".join(msg for _, msg in problems))
