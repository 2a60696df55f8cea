"""The step of one pipeline stage assembled from its terms: written once, for a scalar or for arrays.

``cost.step`` calls these functions with the float terms of one layout (:class:`ScalarOps`:
seconds); the exhaustive engine (``planner.search.exhaustive``) with the search's integer tables
broadcast over every layout of a block (:class:`IntegerOps`: the tables' quanta, the overlap shares
in parts rounded so that an integer is never cheaper than the floats). What differs between the two
is in the ``ops`` argument alone: how a share of compute is taken of a time (a float product, or a
product rounded up or down in parts) and whether a sum may be written in place (an array the
assembly made itself). CP-SAT (``planner.search.cpsat``) builds its constraints for
:func:`exposed_traffic` (each term a lower bound) and :func:`ep_hidden` (each operation a variable)
from these same functions; the rest of its model is the linearization of the others.

The structure the three share, per candidate slowest stage (``cost.terms.stage_kind_shares``; one
for a model of one kind, the stage with the most and the one with the fewest dense layers for a
model of both), with ``m`` micro-batches a step:

- **layer time** ``X = C + TP + CP + EP`` of one micro-batch through all layers (compute forward,
  backward and recompute; the exposed tensor-, context- and expert-parallel traffic), and each kind's
  share of it on the stage (:func:`stage_share`, :func:`mix`: the stage's dense share of the dense
  layers' terms plus its MoE share of the MoE layers');
- **slots** ``U = (m + (pp - 1) / vp) x`` the stage's share: the pipeline is ``U X``
  (:func:`pipeline`), the bubble ``(pp - 1) / vp`` slots (Narayanan et al. 2021 section 2.2); in the
  floats the same as ``m X`` by cause plus ``cost.terms.bubble_s`` (which also prices the schedules the
  search does not offer);
- **EP overlap** takes off, in its steady-state slots (``cost.terms.ep_overlap_steady_share``), per
  slot what the all-to-all kernels' SM share leaves of the open all-to-alls, at most the compute
  window (:func:`ep_hidden`); **zero bubble** takes off its slots times the stage's backward;
- **per micro-batch** the LM head (where it adds to the period) and the pipeline sends;
- **data-parallel traffic**, per step (the gradient reduction, hidden behind the last micro-batch's
  backward less that micro-batch's own ZeRO-2/3 traffic) and per micro-batch (ZeRO-2/3 collectives,
  hidden behind the stage's compute), each exposed beyond its window by :func:`exposed_traffic` with
  DP overlap on, in full with it off (:func:`dp_exposed`); plus the never-overlapped traffic
  (ZeRO-2's weight gather, FSDP2's copies);
- **per step** the optimizer step and the gradient accumulation (``m`` adds, less the first where
  autograd takes it as it comes and the only one where a one-micro-batch step adds none); host
  offload copies beyond the compute they overlap (the search offers offload only where they add
  nothing: ``cost.step.offload_hidden``).

The step is the slowest candidate stage's (:func:`slowest_step`): each stage has its own windows,
so with DP overlap on the stages are compared with their traffic; with it off the traffic is the same
on every stage and is added once to the slower pipeline.

Still encoded apart, each because one form would change the other's results (float bits, or the
integers' rounding): the pipeline itself (the floats price ``m X`` by cause and the bubble by schedule,
``cost.terms.bubble_s``; the tables ``U X`` with ``U`` rounded once, less ``ZU x BK`` for zero bubble);
EP overlap's saving (folded per micro-batch into ``cost.terms.ep_comm_terms`` in the floats); the
gradient accumulation (``adds x add`` against ``M GA - GAW - [M = 1] GA1``); ZeRO-3's third gathers
(``regather_share`` against the full-recompute switch).

The step's additive terms (what each micro-batch adds beside the pipeline: the LM head, the pipeline
sends, FSDP2's copies; what each step adds: the optimizer, the never-overlapped data-parallel
traffic) are declared once, in :data:`STEP_TERMS`: ``cost.step`` adds their seconds to its breakdown
(:func:`breakdown_fields`), ``planner.search.tables`` tabulates them, the exhaustive engine and CP-SAT
add them to the objective, each from the list. A new term of that kind is its function in
``cost.terms`` and an entry there (``planner.search.cells`` builds its table from the function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from clusterplan.cost.terms import dp_terms, head_terms, optimizer_s, p2p_s, period_layers
from clusterplan.cost.terms.dp import NUM_GRAD_BUCKETS


@dataclass(frozen=True, slots=True)
class ScalarOps:
    """Seconds of one layout (``cost.step``). ``dp_share``, ``ep_share``: the share of compute that
    overlapped data-parallel and expert-parallel traffic takes (``cost.terms.overlap_share``)."""

    dp_share: float = 0.0
    ep_share: float = 0.0

    def bucket(self, traffic: float) -> float:
        """The last gradient bucket of ``traffic``, which nothing hides."""
        return traffic / NUM_GRAD_BUCKETS

    def slowdown(self, traffic: float) -> float:
        """What the compute beside ``traffic`` loses to the SMs its kernels hold."""
        return self.dp_share * traffic

    def unshared(self, traffic: float) -> float:
        """What EP overlap's all-to-all kernels leave of ``traffic`` to hide."""
        return (1.0 - self.ep_share) * traffic

    @staticmethod
    def clamp0(value: float) -> float:
        return max(0.0, value)

    @staticmethod
    def maximum(a: float, b: float) -> float:
        return max(a, b)

    @staticmethod
    def minimum(a: float, b: float) -> float:
        return min(a, b)

    imax = maximum  # a float has no place to write into: the in-place forms are the plain ones

    @staticmethod
    def iadd(a: float, b: float) -> float:
        return a + b

    @staticmethod
    def imul(a: float, b: float) -> float:
        return a * b


@dataclass(frozen=True, slots=True)
class IntegerOps:
    """The search's integer tables (``planner.search.tables``), broadcast with numpy. ``dp_share``,
    ``ep_share``: the overlap shares in ``parts`` (rounded up there); a share of a time rounds up where
    it costs (the last bucket, the slowdown) and down where it saves (what EP overlap hides), so the
    integers are never cheaper than the floats. The ``i``-methods write into their first argument,
    which must be an array the assembly computed itself, where it has the result's shape: the
    exhaustive engine's speed rests on it (a third of the array passes of a score)."""

    dp_share: int
    ep_share: int
    parts: int

    @staticmethod
    def bucket(traffic: np.ndarray) -> np.ndarray:
        return -(-traffic // NUM_GRAD_BUCKETS)

    def slowdown(self, traffic: np.ndarray) -> np.ndarray:
        return -(-traffic * self.dp_share // self.parts)

    def unshared(self, traffic: np.ndarray) -> np.ndarray:
        return (self.parts - self.ep_share) * traffic // self.parts

    @staticmethod
    def clamp0(value: np.ndarray) -> np.ndarray:
        return np.maximum(value, 0, out=value) if isinstance(value, np.ndarray) else np.maximum(value, 0)

    maximum, minimum = staticmethod(np.maximum), staticmethod(np.minimum)

    @staticmethod
    def imax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _into(np.maximum, a, b)

    @staticmethod
    def iadd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _into(np.add, a, b)

    @staticmethod
    def imul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _into(np.multiply, a, b)


def _into(op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``op(a, b)`` into ``a`` (an array of the caller's own) where ``a`` has the result's shape (a
    numpy scalar, what arithmetic on 0-d arrays gives, has no place to write into)."""
    if isinstance(a, np.ndarray) and a.shape == np.broadcast_shapes(a.shape, np.shape(b)):
        return op(a, b, out=a)
    return op(a, b)


def exposed_traffic(ops, traffic, window):
    """What ``traffic`` overlapped with ``window`` of compute adds to the step: the last of its
    buckets, which nothing hides (PyTorch DDP, Megatron-Core DDP), or the compute slowed by the SMs
    its kernels take, or what the window cannot hide (``cost.terms.overlapped_exposed_s``), the
    largest of the three."""
    return ops.imax(traffic - window, ops.maximum(ops.bucket(traffic), ops.slowdown(traffic)))


def dp_exposed(ops, per_step, per_mb, step_window, mb_window, m, overlap: bool = True):
    """The data-parallel traffic a stage's step exposes: ``m`` times the per-micro-batch traffic
    beyond ``mb_window``, and the per-step traffic beyond the last micro-batch's backward
    ``step_window`` less that micro-batch's own traffic (one stretch of compute hides one stream);
    all of it with DP overlap off."""
    if not overlap:
        return per_mb * m + per_step
    exposed = ops.imul(exposed_traffic(ops, per_mb, mb_window), m)
    return ops.iadd(exposed, exposed_traffic(ops, per_step, ops.clamp0(step_window - per_mb)))


def stage_share(share, whole):
    """A stage's part of a term of all layers of one kind: its ``share`` of them times the whole."""
    return share * whole


def mix(dense_share, dense, moe_share, moe):
    """A stage's part of a term on a model of dense and MoE layers both: its share of each kind's."""
    return dense_share * dense + moe_share * moe


def ep_hidden(ops, open_comm, window):
    """Per micro-batch slot in EP overlap's steady state, the all-to-all time it hides: what the
    kernels' SM share leaves of the open all-to-alls ``open_comm``, at most the ``window`` of compute
    (``cost.terms.ep_comm_parts``). The floats fold it into ``cost.terms.ep_comm_terms`` per
    micro-batch (``steady x overlapped + (1 - steady) x open``, the same quantity in another order of
    operations); the tables take it off per step here (:func:`pipeline`)."""
    return ops.minimum(ops.unshared(open_comm), window)


def pipeline(slot_time, ep_slots, hidden, zero_bubble=0):
    """The stage's pipeline over a step: ``slot_time``, its slots times the layer time (per kind on a
    stage of both: :func:`mix`), less what EP overlap hides in its ``ep_slots`` steady-state slots
    (``hidden`` per slot, :func:`ep_hidden`) and what zero bubble takes off the bubble (its slots times
    the backward; 0 where no layout runs it: nothing to take off)."""
    saved = slot_time - ep_slots * hidden
    return saved if isinstance(zero_bubble, int) and zero_bubble == 0 else saved - zero_bubble


def slowest_step(ops, stages, per_step, per_mb, m, overlap: bool):
    """The pipeline and the exposed data-parallel traffic of the slowest candidate stage: ``stages``
    is a list of (pipeline, a callable giving its (per-step, per-micro-batch) windows). With DP
    overlap on each stage's traffic hides behind its own windows; with it off the traffic is the same
    on every stage, added once to the slower pipeline (the windows never asked)."""
    if not overlap:
        best = stages[0][0]
        for pipe, _ in stages[1:]:
            best = ops.maximum(best, pipe)
        return best + dp_exposed(ops, per_step, per_mb, None, None, m, overlap=False)
    best = None
    for pipe, windows in stages:
        step_window, mb_window = windows()
        total = ops.iadd(dp_exposed(ops, per_step, per_mb, step_window, mb_window, m), pipe)
        best = total if best is None else ops.imax(best, total)
    return best


@dataclass(frozen=True, slots=True)
class StepTerm:
    """One additive term of the step, paid once a step or by each of its ``m`` micro-batches."""

    name: str  # its name, and its variable's in the CP-SAT model
    table: str  # the search's integer table of it (an attribute of planner.search.tables.Tables)
    field: str  # the cost.step.TimeBreakdown field it adds to
    per_microbatch: bool  # paid by each micro-batch (times m), else once a step
    # the table's axes: knobs of planner.search.exhaustive.DIMS, or first the index map of a group key
    # ("tpg_of_fo": the LM head's TP group over (f, o)) whose rows the table holds
    dims: tuple[str, ...]
    seconds: Callable  # (context, layout) -> its seconds for one micro-batch or one step (cost.terms)
    busy: bool = False  # compute on the device: in the energy objective's busy time as well
    # most spaces pay none: CP-SAT reads it only where some cell is not 0, and its lower bounds leave
    # it out (planner.search.bounds: a bound without a term stays a bound)
    sparse: bool = False
    # "": planner.search.cells prices each cell with ``seconds``; else the builder of
    # planner.search.tables that prices it with other terms (shared work: a group key, the DP traffic)
    priced_by: str = ""


def lm_head_s(ctx, layout) -> float:
    """The LM head's forward and backward where it adds to the pipeline's period (else the last
    rank's spare slot hides it: ``cost.terms.period_layers``)."""
    if not period_layers(ctx, layout.pp, layout.vp, layout.head_slots)[1]:
        return 0.0
    return head_terms(ctx, layout.tp, layout.cp, layout.micro_batch_size, layout.sequence_parallel,
                      layout.stride("tp")).time_s


def layout_dp_terms(ctx, layout):
    """``cost.terms.dp_terms`` of the layout, priced once for the several questions one evaluation
    asks of the same (context, layout) objects (``cost.step`` and two additive terms: a third of an
    evaluation's time); the last answer is kept, keyed by the objects' identity."""
    global _LAST_DP
    last = _LAST_DP  # one reference read: another thread's evaluation replaces the tuple, never edits it
    if last[0] is ctx and last[1] is layout:
        return last[2]
    terms = dp_terms(ctx, layout)
    _LAST_DP = (ctx, layout, terms)
    return terms


_LAST_DP: tuple = (None, None, None)


def fsdp_copies_s(ctx, layout) -> float:
    """FSDP2's copies per micro-batch on the compute stream (``cost.terms.fsdp_copy_s``)."""
    return layout_dp_terms(ctx, layout).copy_s


def dp_blocking_s(ctx, layout) -> float:
    """The data-parallel traffic of a step that nothing overlaps (ZeRO-2's weight gather, FSDP2's
    per-step copies: ``DataParallelTerms.blocking_s``)."""
    return layout_dp_terms(ctx, layout).blocking_s


STEP_TERMS = (
    StepTerm("head", "H", "compute_s", True, ("tpg_of_fo", "mb", "s"), lm_head_s, busy=True,
             priced_by="_comm_tables"),
    StepTerm("p2p", "P2P", "pp_p2p_s", True, ("f", "o", "mb", "s"), p2p_s),
    StepTerm("fsdp_copies", "DPC", "dp_comm_s", True, ("f", "o", "v", "e", "z"), fsdp_copies_s, sparse=True,
             priced_by="_dp_tables"),
    StepTerm("optimizer", "OPT", "optimizer_s", False, ("f", "v", "e", "z"), optimizer_s, busy=True,
             priced_by="_dp_tables"),
    StepTerm("dp_blocking", "DPX", "dp_comm_s", False, ("f", "o", "v", "e", "z"), dp_blocking_s,
             priced_by="_dp_tables"),
)
"""The step's additive terms, in the order each engine adds them (a float sum's bits depend on it)."""


def breakdown_fields(step_base: dict, mb_base: dict, m: int, seconds: dict) -> dict:
    """The breakdown's fields of one stage's step: each field's per-step part plus its additive terms'
    per-step seconds plus ``m`` times its per-micro-batch part and terms' (``seconds`` by term name),
    ``step + (terms + m (part + terms))`` as ``cost.step`` has always summed them (float bits)."""
    per = ({}, {})  # per-step, per-micro-batch sums of the terms by field
    for term in STEP_TERMS:
        into = per[term.per_microbatch]
        value = seconds[term.name]
        into[term.field] = into[term.field] + value if term.field in into else value
    out = {}
    for name in dict.fromkeys((*step_base, *mb_base, *per[1], *per[0])):
        parts = [p[name] for p in (mb_base, per[1]) if name in p]
        value = m * (parts[0] + parts[1] if len(parts) == 2 else parts[0]) if parts else None
        for extra in (per[0], step_base):
            if name in extra:
                value = extra[name] if value is None else extra[name] + value
        out[name] = value
    return out
