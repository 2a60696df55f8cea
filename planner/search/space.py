"""The search space: a domain per knob, constraints that return a reason, user bounds.

The space is declared as data: :class:`Space` holds the candidate values of every knob; the
structural constraints are predicates on small groups of knobs, each with a named reason, so that
CP-SAT (as allowed-assignment tables) and the exhaustive enumerator (as masks) apply exactly the
same rules and report the same rejection counts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from clusterplan.cost.framework import (ProfileAt, framework_domains, framework_refusal, knob_text, model_code_domains,
                                        model_domains, unoffered)
from clusterplan.cost.checks import dispatcher_problem, head_slot_problem, param_gather_problem, placement_problem
from clusterplan.cost.terms import Context, stage_slots
from clusterplan.cost.layout import CP_COMM_KINDS, ORDERS, PIPELINE_SCHEDULES, RECOMPUTE_MODES, Job, Layout, join_order, order_axes, split_order
from clusterplan.models.errors import SpecError
from clusterplan.planner.search.graphs import searched_scopes
from clusterplan.planner.search.hsdp import layout_shard, searched_shards
from clusterplan.planner.search.offload import offload_modes, offload_spaces
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster

KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size", "sequence_parallel", "recompute",
         "zero_stage", "order", "dp_overlap", "tp_overlap", "ep_overlap", "head_slots", "offload", "cp_comm",
         "moe_dispatcher", "param_gather",
         "dp_shard", "schedule", "cuda_graph")
KNOB_ALIASES = {"mbs": "micro_batch_size", "sp": "sequence_parallel", "zero": "zero_stage",
                "placement": "order", "expert_tp": "etp"}
KNOB_TEXT = {"micro_batch_size": "mbs", "sequence_parallel": "sp", "zero_stage": "zero"}
"""The name the command line shows for a knob (Layout field name -> --fix name; others are as they are)."""
MBS_CANDIDATES = (1, 2, 4, 8)
VP_CANDIDATES = (1, 2, 4, 8)
CP_MAX = 32

REASONS = {
    "heads": "attention heads not divisible by tp",
    "batch": "global batch not divisible by dp * micro_batch_size (or not equal, without grad accumulation)",
    "layers": "pp * vp exceeds the number of layers (with head_slots: or an uneven split the framework refuses)",
    "interleave": "interleaving needs pp > 1 and a micro-batch count its schedule takes",
    "context": "seq_len not divisible by 2 * cp",
    "cp_comm": "no context-parallel kind of --fix cp_comm splits the heads (all-to-all over the cp ranks)",
    "experts": "ep does not divide the experts or dp/cp*dp (with etp=1: not a multiple of tp*cp dividing tp*cp*dp, or no sp)",
    "placement": "rank order the rank generators refuse (pp not last)",
    "sequence_parallel": "sequence parallelism without tp, or with a sequence tp does not split",
    "memory": "does not fit in device memory",
}


@dataclass(frozen=True)
class Bounds:
    """User constraints: ``fixed`` values, inclusive ``minimum``/``maximum`` on numeric knobs,
    and a memory headroom (fraction of capacity kept free)."""

    fixed: dict = field(default_factory=dict)
    minimum: dict = field(default_factory=dict)
    maximum: dict = field(default_factory=dict)
    memory_headroom: float | None = None  # None: the framework's default (:meth:`headroom`)
    ignore_memory: bool = False  # evaluate layouts that overflow (validation of published layouts)
    # fixed values the framework profile lacks are kept (validation: the run used them) instead of refused
    allow_unavailable: bool = False
    # offer host offload where the framework has it even if its profile does not search it by itself
    # (semantics.offload_searched false: no published run measures it): fit's with-offload answer
    offer_offload: bool = False

    def headroom(self, job: Job, cluster: Cluster) -> float:
        """The share of device memory a plan keeps free: as given, else the job's framework's
        ``plan_headroom`` (the caching allocator's measured reserve, 8.4% for the PyTorch
        frameworks) on a device with a runtime heap (HBM), else none."""
        if self.memory_headroom is not None:
            return self.memory_headroom
        return job.profile.profile.plan_headroom if cluster.device.memory_kind == "hbm" else 0.0

    def allows(self, knob: str, value) -> bool:
        if knob in self.fixed and self.fixed[knob] != value:
            return False
        if knob in self.minimum and value < self.minimum[knob]:
            return False
        if knob in self.maximum and value > self.maximum[knob]:
            return False
        return True


@dataclass(frozen=True)
class Space:
    """Candidate values per knob; ``factorizations`` are the (tp, pp, dp, cp) tuples."""

    factorizations: tuple[tuple[int, int, int, int], ...]
    ep: tuple[int, ...]
    expert_tp: tuple[bool, ...]  # one per ep entry: the expert axis holds (ep, expert_tp) pairs
    vp: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    sequence_parallel: tuple[bool, ...]
    recompute: tuple[str, ...]
    zero_stage: tuple[int, ...]
    order: tuple[str, ...]
    dp_overlap: tuple[bool, ...]
    tp_overlap: tuple[bool, ...]
    ep_overlap: tuple[bool, ...] = (False,)
    # the pipeline splits the framework offers, its own first (torchtitan counts the embedding and
    # the head as layers); each is searched on its own (split_spaces); Layout.head_slots
    head_slots: tuple[bool, ...] = (False,)
    # where the layers keep their inputs (cost.layout.OFFLOAD_MODES): host offload where the framework
    # and the device have it; each mode is searched on its own (split_spaces); Layout.offload
    offload: tuple[str, ...] = ("none",)
    # the context-parallel communication kinds (cost.layout.CP_COMM_KINDS) the framework offers: not a
    # dimension, each factorization takes the fastest that splits its heads (cost.terms.cp_comm_choice;
    # the kind changes no memory term); Layout.cp_comm
    cp_comm: tuple[str, ...] = ("p2p",)
    # the MoE dispatchers (Layout.moe_dispatcher): the one --fix holds, else the implicit one and the fused
    # ones the job can run (_moe_dispatchers): not a dimension, each expert group's EP table row takes the
    # fastest (cost.terms.dispatcher_choice; no memory term reads it), the first on a tie
    moe_dispatcher: tuple[str, ...] = ("auto",)
    # the CUDA graph scopes (Layout.cuda_graph) its layouts may take: "none" first, priced eager, or the
    # graphed scopes of one of graphs.graph_spaces' pieces, priced graphed (each layout the first its
    # framework's rules allow)
    cuda_graph: tuple[str, ...] = ("none",)
    # the dtypes of the parameter all-gathers (cost.layout.PARAM_GATHERS): what --fix holds, else bf16
    # and, where the job can gather in fp8, fp8 too: not a dimension, each (f, o, v, e, z) cell of the
    # data-parallel tables takes fp8 where it is no slower and needs no more memory (gathers.gather_pick);
    # Layout.param_gather
    param_gather: tuple[str, ...] = ("bf16",)
    # hybrid sharding's group (Layout.dp_shard): 0, the framework's own, unless --fix holds one
    # (hybrid_space); else searched through the ZeRO axis: zero_shard, one per zero_stage entry, its
    # shard group (0 the framework's own, k the k-th of hsdp.candidate_group over shard_domain devices
    # a scale-up domain); empty: every entry the framework's own (planner.search.hsdp)
    dp_shard: tuple[int, ...] = (0,)
    zero_shard: tuple[int, ...] = ()
    shard_domain: int = 0
    # the pipeline schedules searched besides the one vp implies ("", Layout.schedule): not a dimension,
    # each (pp, vp) with pp > 1 takes the one of them it runs (cell_schedule); schedule_vp1: whether
    # they run at vp = 1 (torchtitan's zero bubble runs interleaved only: no ZB-H1)
    schedule: tuple[str, ...] = ("",)
    schedule_vp1: bool = True
    framework_rules: bool = True  # apply the profile's combination rules (off: validation of published layouts)

    @property
    def size(self) -> int:
        n = len(self.factorizations)
        for name in ("ep", "vp", "micro_batch_size", "sequence_parallel", "recompute", "zero_stage",
                     "order", "dp_overlap", "tp_overlap", "ep_overlap"):
            n *= len(getattr(self, name))
        return n


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (a user's number may be large)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def build_space(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds | None = None) -> Space:
    """Every knob's candidate values for this problem, narrowed by the user's bounds.

    tp is kept inside what a scale-up domain can serve well (at most the larger of the domain and
    8, as Megatron practice) and at most the head count; pp at most the layer count; cp at most 32.
    """
    b = bounds or Bounds()
    prof = job.profile
    offered = {**framework_domains(prof, cluster.device.family), **model_code_domains(job), **model_domains(prof, model)}
    _check_fixed(prof, cluster, job, b, model)
    facts = _factorizations(model, cluster, offered, b)

    def pick(knob: str, values) -> tuple:
        if knob in offered and not (b.allow_unavailable and knob in b.fixed):
            values = tuple(v for v in values if v in offered[knob])
        fixed = b.fixed.get(knob)
        if fixed is not None and fixed not in values:
            values = tuple(values) + (fixed,)
        return tuple(v for v in values if b.allows(knob, v))

    # The expert axis: every ep with experts sharded like the dense MLP, then every ep > 1 folded
    # (expert tensor parallelism 1, Megatron-Core's MoE parallel folding).
    ep_values = (1,) if model.moe is None else tuple(divisors(model.moe.num_experts))
    fold = prof.has("etp1") or b.allow_unavailable and b.fixed.get("expert_tp") is False
    experts = [(e, True) for e in pick("ep", ep_values)] + [(e, False) for e in pick("ep", ep_values) if e > 1 and fold]
    experts = [(e, t) for e, t in experts if "expert_tp" not in b.fixed or b.fixed["expert_tp"] == t or e == 1]
    experts = [(e, t) for e, t in experts if e == 1 or not t or prof.ep_splits_experts_over_tp() or b.allow_unavailable]
    space = hybrid_space(Space(
        factorizations=tuple(facts),
        ep=tuple(e for e, _ in experts),
        expert_tp=tuple(t for _, t in experts),
        vp=tuple(v for v in pick("vp", VP_CANDIDATES) if _schedule_vp_ok(b.fixed.get("schedule"), v)),
        micro_batch_size=pick("micro_batch_size", _micro_batch_candidates(job, facts)),
        sequence_parallel=pick("sequence_parallel", (False, True)),
        recompute=pick("recompute", RECOMPUTE_MODES),
        zero_stage=pick("zero_stage", (0, 1, 2, 3) if b.fixed.get("param_gather", "bf16") == "bf16" else (1, 2, 3)),
        order=_orders(cluster, b, offered.get("order")),
        dp_overlap=pick("dp_overlap", (True, False)),
        tp_overlap=pick("tp_overlap", (False, True)),
        ep_overlap=pick("ep_overlap", (False, True)) if model.moe is not None else pick("ep_overlap", (False,)),
        head_slots=pick("head_slots", _pipeline_splits(prof)),
        offload=pick("offload", offload_modes(cluster, b, prof)), cp_comm=pick("cp_comm", CP_COMM_KINDS),
        moe_dispatcher=_moe_dispatchers(model, job, cluster, b, offered.get("moe_dispatcher")),
        cuda_graph=searched_scopes(cluster, b, offered["cuda_graph"], model, prof), param_gather=_param_gathers(job, cluster, b),
        dp_shard=pick("dp_shard", (0,)), schedule=_searched_schedules(prof, b),
        schedule_vp1=prof.has("schedule_zbh1"), framework_rules=not b.allow_unavailable,
    ), prof)
    _check_nonempty(space, b, cluster.num_devices, prof, offered)
    _check_fixed_shape(model, b, prof)
    return searched_shards(space, prof, cluster.domain_size, b)


def _check_fixed(prof, cluster: Cluster, job: Job, b: Bounds, model: ModelSpec) -> None:
    """What ``--fix`` holds: offered by the framework, its model code, consistent with the model and
    itself, and overlaps the framework runs."""
    _check_fixed_offered(prof, cluster.device.family, b, model)
    _check_fixed_model_code(job, b)
    _check_fixed_consistent(model, b)
    _check_fixed_overlap(prof, b)
    _check_fixed_schedule(prof, b)


def _pipeline_splits(prof) -> tuple[bool, ...]:
    """The pipeline splits the framework runs, its default first: the layers alone, and, where it
    offers it at its date, the embedding and the head each in a layer's slot (``head_slots``)."""
    default = prof.own_split_has_head_slots()
    return (default, not default) if prof.has("head_slots") else (default,)


def hybrid_space(space: Space, prof) -> Space:
    """``space`` narrowed to what a held ``dp_shard`` N runs with (``cost.step`` refuses the rest):
    factorizations whose dp N divides with cp = 1, no expert parallelism, and the ZeRO stages of the
    framework's hybrid sharding (``semantics.dp_shard_stages``)."""
    n = space.dp_shard[0]
    if not n:
        return space
    experts = [(e, t) for e, t in zip(space.ep, space.expert_tp) if e == 1]
    return replace(space, factorizations=tuple(f for f in space.factorizations if f[3] == 1 and f[2] % n == 0
                                               and f[2] >= n >= 2),
                   ep=tuple(e for e, _ in experts), expert_tp=tuple(t for _, t in experts),
                   zero_stage=tuple(z for z in space.zero_stage if z in prof.profile.dp_shard_stages))


def split_spaces(space: Space, model: ModelSpec, job: Job, cluster: Cluster) -> list[Space]:
    """One space per pipeline split (:func:`head_slot_spaces`) and per offload mode of ``space.offload``,
    each narrowed to what the search's tables price exactly with it (``planner.search.offload``:
    activation offload with the framework's recompute mode on the factorizations whose transfers hide,
    optimizer offload at the ZeRO stages whose host copies are one a step, in host memory that holds
    them); ``evaluate`` prices the others."""
    return offload_spaces(head_slot_spaces(space, model, job), space, Context(model, job, cluster))


def head_slot_spaces(space: Space, model: ModelSpec, job: Job) -> list[Space]:
    """One space per pipeline split of ``space.head_slots``, searched one after the other (the split
    sets which layers each rank holds, which every pipeline table depends on): the first split over
    every factorization, the others over those with a pipeline (without one the split changes
    nothing, and the first search has those layouts already) that the split can divide at some vp
    of the space (``cost.step.head_slot_problem``: Megatron's needs ``num_layers + 2`` divisible by
    pp)."""
    first, *others = space.head_slots
    out = [replace(space, head_slots=(first,))]
    for hs in others:
        facts = tuple(f for f in space.factorizations if f[1] > 1 and (not hs or any(
            head_slot_problem(model, job, f[1], v) is None for v in space.vp)))
        if facts:
            out.append(replace(space, head_slots=(hs,), factorizations=facts))
    return out


def _micro_batch_candidates(job: Job, facts: list[tuple[int, int, int, int]]) -> tuple[int, ...]:
    """:data:`MBS_CANDIDATES`, and where a step is one micro-batch without a pipeline
    (:meth:`Job.one_microbatch`) each pipeline-free factorization's whole per-replica batch
    ``global / dp``: the only micro-batch that framework can run there."""
    whole = {job.global_batch_size // dp for tp, pp, dp, cp in facts
             if job.one_microbatch(pp) and job.global_batch_size % dp == 0}
    return tuple(sorted(set(MBS_CANDIDATES) | whole))


def _factorizations(model: ModelSpec, cluster: Cluster, offered: dict, b: Bounds) -> list[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, cp) that multiplies to the device count, inside the limits of
    :func:`build_space` and the knobs the framework offers, and allowed by the bounds."""
    n = cluster.num_devices
    tp_max = min(max(cluster.domain_size, 8), model.num_attention_heads)
    pp_max = model.num_layers if "pp" not in offered or b.allow_unavailable and "pp" in b.fixed else 1
    tp_max = tp_max if "tp" not in offered or b.allow_unavailable and "tp" in b.fixed else 1
    cp_max = CP_MAX if "cp" not in offered or b.allow_unavailable and "cp" in b.fixed else 1
    facts = []
    for tp, pp, cp in itertools.product(divisors(n), repeat=3):
        if n % (tp * pp * cp) or tp > tp_max or pp > pp_max or cp > cp_max:
            continue
        dp = n // (tp * pp * cp)
        if all(b.allows(k, v) for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp))):
            facts.append((tp, pp, dp, cp))
    return sorted(facts)


def _check_fixed_model_code(job: Job, bounds: Bounds) -> None:
    """A --fix value a Hugging Face transformers model class cannot run is bad input."""
    if bounds.allow_unavailable:
        return
    held = model_code_domains(job)
    bad = [f"{k}={v}" for k, v in bounds.fixed.items() if k in held and v not in held[k]]
    if bad:
        raise SpecError(f"--fix {', '.join(bad)}: a Hugging Face transformers model class runs data-parallel only "
                        "(DeepSpeed ZeRO or FSDP); drop the fix or use --model-code native")


SEARCHED_SCHEDULES = ("zb1p",)
"""The pipeline schedules the search offers (Space.schedule): those no slower than the one vp implies
and holding no more memory, at every layout, with a bubble linear in the tables. Zero bubble (ZB-H1,
interleaved at vp >= 2) keeps 1F1B's and interleaving's activations in flight (Qi et al. 2024 sec.
2.1) and shrinks their bubble by ``(pp - 1) / vp`` backward's worth. ZB-V is as fast or faster but
holds more than interleaving on some rank of most layouts, and its bubble ``(t - 3W)`` clamps at 0
on some; DualPipeV and looped hold more too: ``evaluate`` prices them (checked over seeded layouts
with ``evaluate``: tests/test_search.py)."""


def _searched_schedules(prof, b: Bounds) -> tuple[str, ...]:
    """The schedules the search offers (:data:`SEARCHED_SCHEDULES`) where the framework runs them;
    with ``--fix schedule`` the one held ("" for the one vp implies: 1f1b, interleaved)."""
    fixed = b.fixed.get("schedule")
    if fixed is not None:
        return (fixed,) if fixed in SEARCHED_SCHEDULES else ("",)  # others: refused (_check_fixed_schedule)
    return ("", *(s for s in SEARCHED_SCHEDULES if prof.has(f"schedule_{s}")))


def _schedule_vp_ok(fixed: str | None, vp: int) -> bool:
    """Whether a held schedule runs at ``vp``: 1F1B at 1, interleaving above (others: cell_schedule)."""
    return fixed not in ("1f1b", "interleaved") or (vp == 1) == (fixed == "1f1b")


def cell_schedule(S: Space, pp: int, vp: int) -> str:
    """The schedule a layout of ``(pp, vp)`` runs in the search: the searched one where it runs there
    (a pipeline; at vp = 1 only where ``S.schedule_vp1``), else "" (the one vp implies)."""
    searched = [s for s in S.schedule if s]
    return searched[0] if searched and pp > 1 and (vp > 1 or S.schedule_vp1) else ""


def _check_fixed_schedule(prof, b: Bounds) -> None:
    """--fix schedule: a schedule the framework runs (checked by _check_fixed_offered) that the search
    prices (:data:`SEARCHED_SCHEDULES`, or the one vp implies); the others are priced by evaluate."""
    fixed = b.fixed.get("schedule")
    if fixed is None or fixed in ("", "1f1b", "interleaved", *SEARCHED_SCHEDULES) or b.allow_unavailable:
        return
    raise SpecError(f"--fix schedule={fixed}: the search offers only "
                    f"{', '.join(('1f1b', 'interleaved', *SEARCHED_SCHEDULES))} (the others hold more memory than "
                    f"1F1B or interleaving on some layouts); price a layout with it by "
                    f"`clusterplan evaluate --layout ...,schedule={fixed}`")


def _moe_dispatchers(model: ModelSpec, job: Job, cluster: Cluster, bounds: Bounds, offered) -> tuple[str, ...]:
    """The MoE dispatchers: the one ``--fix`` holds, else ``auto`` and the first fused one (DeepEP, else
    Hybrid-EP) the framework offers at its date, for the tables to choose per expert group
    (``Space.moe_dispatcher``): on Hopper and Blackwell GPUs only (DeepEP's kernels are written for
    SM90 and its README's rates are H800's; Hybrid-EP uses TMA, SM90 on, and Megatron-Bridge applies
    it on GB200/GB300: megatron.yaml); none the job's framework refuses for its MoE layers
    (``cost.checks.dispatcher_problem``: DeepEP with a capacity factor under Megatron, with float8/MXFP8
    experts under torchtitan 0.3), and a ``--fix`` of one is bad input. Validation
    (``allow_unavailable``) holds ``auto``: a run's published dispatcher is applied after the search
    (``studies.runs``)."""
    if "moe_dispatcher" in bounds.fixed:
        fixed = bounds.fixed["moe_dispatcher"]
        problem = None if bounds.allow_unavailable else dispatcher_problem(model, job, fixed)
        if problem:
            raise SpecError(f"--fix {problem}")
        return (fixed,)
    family = cluster.device.family
    if (model.moe is None or bounds.allow_unavailable
            or not family.startswith("nvidia-") or family in ("nvidia-a100", "nvidia-v100")):
        return ("auto",)
    fused = [d for d in ("deepep", "hybridep")
             if (offered is None or d in offered) and dispatcher_problem(model, job, d) is None]
    return ("auto",) + tuple(fused[:1])  # Hybrid-EP is priced as DeepEP (_dispatch_s): it wins no tie


def _param_gathers(job: Job, cluster: Cluster, bounds: Bounds) -> tuple[str, ...]:
    """The parameter gathers' dtypes: the one ``--fix`` holds (one the job cannot run is bad input:
    ``cost.checks.param_gather_problem``), else bf16 and, where the job can gather in its 8-bit
    format (an FP8 or MXFP8 precision the device runs, the framework's gather at its date), fp8 for
    the tables to choose (``Space.param_gather``). Validation (``allow_unavailable``) holds bf16: a
    run's published dtype is applied after the search (``studies.runs``)."""
    value = bounds.fixed.get("param_gather")
    if value is None:
        offered = not bounds.allow_unavailable and bounds.fixed.get("zero_stage") != 0
        return ("bf16", "fp8") if offered and param_gather_problem(job, cluster, "fp8") is None else ("bf16",)
    problem = None if bounds.allow_unavailable else param_gather_problem(job, cluster, value)
    if problem:
        raise SpecError(f"--fix param_gather={value}: {problem}")
    if value != "bf16" and bounds.fixed.get("zero_stage") == 0:
        raise SpecError(f"--fix param_gather={value} needs a parameter all-gather (zero >= 1); --fix zero=0 has none")
    return (value,)


def _check_fixed_consistent(model: ModelSpec, bounds: Bounds) -> None:
    """--fix values no layout of this model can have are bad input (exit 2), not "nothing fits"."""
    fixed = bounds.fixed
    if model.moe is None:
        moe_only = [f"ep={fixed['ep']}"] if fixed.get("ep", 1) != 1 else []
        moe_only += ["etp=1"] if fixed.get("expert_tp") is False else []
        moe_only += ["ep_overlap=on"] if fixed.get("ep_overlap") else []
        moe_only += [f"moe_dispatcher={fixed['moe_dispatcher']}"] if fixed.get("moe_dispatcher", "auto") != "auto" else []
        if moe_only:
            raise SpecError(f"--fix {moe_only[0]}: {model.name} is dense (no experts); drop it or plan an MoE model")
    vp, pp = fixed.get("vp"), fixed.get("pp", bounds.maximum.get("pp"))
    if vp is not None and vp > 1 and pp == 1:
        raise SpecError(f"--fix vp={vp}: interleaving needs pp > 1, and pp is held at 1; drop one of them")


def _check_fixed_shape(model: ModelSpec, bounds: Bounds, prof) -> None:
    """--fix values the model's shape rules out (ep not dividing the experts, tp not splitting the
    heads) are bad input naming the rule, not "no layout passes the structural rules"."""
    ep, tp = bounds.fixed.get("ep", 1), bounds.fixed.get("tp")
    if model.moe is not None and model.moe.num_experts % ep:
        allowed = ", ".join(map(str, divisors(model.moe.num_experts)))
        raise SpecError(f"--fix ep={ep}: ep must divide {model.name}'s {model.moe.num_experts} experts (allowed: {allowed})")
    if tp is not None and not heads_split(model, tp):
        raise SpecError(f"--fix tp={tp}: tp must divide {model.name}'s {model.num_attention_heads} attention heads and "
                        f"divide or be a multiple of its {model.num_kv_heads_resolved} key/value heads")
    problem = tp is not None and not bounds.allow_unavailable and prof.kv_heads_problem(model, tp)
    if problem:
        raise SpecError(f"--fix {problem}; pick another --framework or drop the --fix")


def _check_fixed_overlap(prof, bounds: Bounds) -> None:
    """--fix tp_overlap=on that no layout can honour (tp held at 1, or sp held off where the framework
    needs it for TP overlap) would leave a plan at tp = 1 where the knob means nothing: bad input."""
    fixed = bounds.fixed
    if not fixed.get("tp_overlap") or bounds.allow_unavailable:
        return
    if fixed.get("tp", bounds.maximum.get("tp")) == 1:
        raise SpecError("--fix tp_overlap=on: TP overlap needs tp > 1, and tp is held at 1; drop one of them")
    if fixed.get("sequence_parallel") is False:
        refused = framework_refusal(prof, 2, 1, 1, 1, 1, 1, "none", False, tp_overlap=True)
        if refused:
            raise SpecError(f"--fix tp_overlap=on with sp=off: {refused}")


def _check_fixed_offered(prof, family: str, bounds: Bounds, model: ModelSpec) -> None:
    """A --fix value the framework does not offer is bad input, named with the framework (context
    parallelism too where the framework has none for this model's attention)."""
    if bounds.allow_unavailable:
        return
    if bounds.fixed.get("cp", 1) > 1 and prof.cp_problem(model):
        raise SpecError(f"--fix {prof.cp_problem(model)}; pick another --framework or drop the --fix")
    fixed = {**bounds.fixed, **({"schedule": ""} if bounds.fixed.get("schedule") in ("1f1b", "interleaved") else {})}
    problems = unoffered(prof, family, fixed, bounds.fixed.get("expert_tp") is False)
    if problems:
        raise SpecError(f"--fix {problems[0]}; pick another --framework or drop the --fix")


def _orders(cluster: Cluster, bounds: Bounds, offered: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Rank orders (those the framework lays out, ``offered``; None: all) times the cluster's
    distinct torus traversals, the device-id traversal first.

    A fixed order without ``@`` holds the rank order and leaves the traversal free; with it, both
    (checked against the cluster, and written without the suffix when it is the default).
    """
    orders = ORDERS if offered is None or bounds.allow_unavailable and "order" in bounds.fixed else \
        tuple(o for o in ORDERS if o in offered)
    if cluster.torus_shape is not None:
        orders = tuple(join_order(o, t) for t in ("",) + cluster.traversals()[1:] for o in orders)
    fixed = bounds.fixed.get("order")
    if fixed is None:
        return orders
    axes, traversal = split_order(fixed)
    if "@" not in fixed:
        return tuple(o for o in orders if split_order(o)[0] == axes) or (fixed,)
    problem = cluster.traversal_problem(traversal)
    if problem:
        raise SpecError(f"--fix order: got {fixed!r}; {problem} (allowed, e.g.: {', '.join(orders[:6])})")
    return (join_order(axes, "" if traversal == cluster.default_traversal else traversal),)


def _check_nonempty(space: Space, bounds: Bounds, num_devices: int, prof, offered: dict[str, tuple]) -> None:
    if not space.factorizations:
        raise SpecError(_no_factorization(bounds, num_devices))
    for name in ("ep", "vp", "micro_batch_size", "sequence_parallel", "recompute", "zero_stage", "order",
                 "dp_overlap", "tp_overlap", "ep_overlap"):
        if getattr(space, name):
            continue
        held = any(name in d for d in (bounds.fixed, bounds.minimum, bounds.maximum))
        if not held and offered.get(name) == ():
            # nothing the user held: the framework has no value of this knob at its date
            raise SpecError(f"{prof.profile.describe(prof.date)} offers no {name} at that date (its code "
                            f"is later than the job's framework date {prof.date}); give a later framework date")
        raise SpecError(f"--fix/--min/--max leave no value for {name}")


def _no_factorization(b: Bounds, n: int) -> str:
    """Why no (tp, pp, dp, cp) is left: the first bound that contradicts another or the device count."""
    for k in sorted(set(b.minimum) & set(b.maximum)):
        if b.minimum[k] > b.maximum[k]:
            return f"--min {k}={b.minimum[k]} is above --max {k}={b.maximum[k]}"
    for k, v in b.fixed.items():
        if k in b.minimum and isinstance(v, int) and v < b.minimum[k]:
            return f"--fix {k}={v} is below --min {k}={b.minimum[k]}"
        if k in b.maximum and isinstance(v, int) and v > b.maximum[k]:
            return f"--fix {k}={v} is above --max {k}={b.maximum[k]}"
        if k in ("tp", "pp", "dp", "cp") and n % v:
            return f"--fix {k}={v}: {k} must divide the {n:,} devices (tp x pp x dp x cp = devices)"
    given = " ".join([*(f"--fix {k}={v}" for k, v in b.fixed.items() if k in ("tp", "pp", "dp", "cp")),
                      *(f"--min {k}={v}" for k, v in b.minimum.items()), *(f"--max {k}={v}" for k, v in b.maximum.items())])
    return (f"no (tp, pp, dp, cp) with tp x pp x dp x cp = {n:,} devices is left by {given or 'the searched degrees'} "
            f"(tp at most the larger of the scale-up domain and 8, and the head count; cp at most {CP_MAX})")


# ---- structural rules on small groups of knobs (shared by CP-SAT and exhaustive) --------------

def heads_split(model: ModelSpec, tp: int, replicate_kv: bool = True) -> bool:
    """tp divides the attention heads, and divides the key/value heads or (``replicate_kv``) is a
    multiple of them (Megatron-Core replicates a group's K/V over the ranks that share it)."""
    g = model.num_kv_heads_resolved
    return not (model.num_attention_heads % tp or (g % tp and (tp % g or not replicate_kv)))


def factor_ok(model: ModelSpec, job: Job, tp: int, pp: int, dp: int, cp: int) -> str | None:
    """Rules on the degrees alone (a framework that does not replicate K/V heads over TP ranks,
    ``requires.kv_heads_divisible_by_tp``, needs tp to divide them)."""
    if not heads_split(model, tp, not job.profile.profile.kv_heads_divisible_by_tp):
        return "heads"
    if cp > 1 and job.seq_len % (2 * cp):
        return "context"
    return None


def batch_ok(model: ModelSpec, job: Job, pp: int, dp: int, mbs: int, vp: int, head_slots: bool = False) -> str | None:
    """Rules on the degrees, micro-batch and interleaving (``head_slots``: the embedding and the head
    take a stage slot each, so pp x vp may reach num_layers + 2: ``cost.step.head_slot_problem``)."""
    if job.global_batch_size % (dp * mbs) or (job.one_microbatch(pp) and job.global_batch_size != dp * mbs):
        return "batch"
    dense = model.moe.num_dense_layers if model.moe else 0
    if pp * vp > stage_slots(model.num_layers, pp, head_slots) or job.profile.pipeline_split_problem(
            model.num_layers, dense, pp, vp):
        return "layers"
    m = job.global_batch_size // (dp * mbs)
    if vp > 1 and (pp == 1 or job.microbatch_group(m, pp, vp) is None) or job.profile.pipeline_microbatch_problem(pp, m):
        return "interleave"
    return None


def expert_ok(model: ModelSpec, tp: int, dp: int, cp: int, ep: int, expert_tp: bool = True,
              profile: "ProfileAt | None" = None) -> str | None:
    """ep divides the experts and is carved from dp (from cp x dp where the framework ``profile``
    lets it: ``ProfileAt.ep_carve_problem``), or (folded) from the tp x cp block and dp."""
    if ep == 1:
        return None
    if model.moe is None or model.moe.num_experts % ep:
        return "experts"
    if expert_tp:
        carve = profile.ep_carve_problem(cp, dp, ep) if profile is not None else dp % ep
        return "experts" if carve else None
    inner = tp * cp
    return "experts" if ep % inner or dp % (ep // inner) else None


def folding_ok(tp: int, ep: int, expert_tp: bool, sp: bool) -> str | None:
    """Folded experts with tensor parallelism need sequence parallelism (each rank dispatches its
    own tokens; Megatron-Core requires sp for MoE with tp > 1)."""
    return "experts" if ep > 1 and not expert_tp and tp > 1 and not sp else None


def placement_ok(tp: int, pp: int, cp: int, ep: int, expert_tp: bool, order: str, dense: bool = False) -> str | None:
    """Megatron-Core's rank-order checks on pp inside another axis (``cost.checks.placement_problem``,
    the rule ``evaluate``'s layouts are held to; ``dense``: held at ep = 1 too)."""
    return "placement" if placement_problem(tp, pp, cp, ep, expert_tp, order, dense) else None


def _representative(domain, preferred):
    return preferred if preferred in domain else domain[0]


def canonical(tp: int, pp: int, dp: int, cp: int, ep: int, sp: bool, zero: int, order: str,
              dp_overlap: bool, tp_overlap: bool, space: "Space | None" = None, expert_tp: bool = True,
              ep_overlap: bool = False) -> bool:
    """True for the one representative of layouts that differ only in knobs without effect.

    tp_overlap means nothing at tp=1, ep_overlap nothing at ep=1; ZeRO and DP overlap nothing without data parallelism; orders
    that differ only in the position of degree-1 axes are the same placement (under one torus
    traversal: across traversals see :func:`traversal_duplicates`). These are symmetries, not
    rejections: the duplicates are not counted. The representative is taken from the values the
    space (after the user's bounds) still holds, so fixing a knob never empties a class.
    """
    orders = space.order if space else ORDERS
    if tp == 1 and tp_overlap != _representative(space.tp_overlap if space else (False, True), False):
        return False
    if ep == 1 and ep_overlap != _representative(space.ep_overlap if space else (False, True), False):
        return False
    unfolded = space is None or any(e == ep and t for e, t in zip(space.ep, space.expert_tp))
    if not expert_tp and tp * cp == 1 and unfolded:  # folding over a block of one rank: the unfolded layout
        return False
    if dp * cp == 1:
        if zero != _representative(space.zero_stage if space else (0, 1, 2, 3), 0):
            return False
        if dp_overlap != _representative(space.dp_overlap if space else (True, False), True):
            return False
    degrees = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    effective = [a for a in order_axes(order) if degrees[a] > 1]
    traversal = split_order(order)[1]
    first = next((o for o in orders if split_order(o)[1] == traversal
                  and [a for a in order_axes(o) if degrees[a] > 1] == effective), order)
    return order == first


def traversal_duplicates(orders: tuple[str, ...], keep: list[bool], fingerprints: list) -> list[bool]:
    """Which orders of one factorization repeat an earlier order under another torus traversal.

    ``fingerprints[k]`` is everything order ``k`` changes for this factorization (its cost terms
    and rejection codes, from ``planner.search.tables``): an order whose fingerprint an earlier order
    under a different traversal already has (both representatives by :func:`canonical`) changes
    nothing, so it counts once, like the orders of :func:`canonical`. The default traversal comes
    first in the space, so ties keep it.
    """
    out = [False] * len(orders)
    for k, (order, fp) in enumerate(zip(orders, fingerprints)):
        if not keep[k]:
            continue
        traversal = split_order(order)[1]
        out[k] = any(keep[j] and fingerprints[j] == fp and split_order(orders[j])[1] != traversal for j in range(k))
    return out


def sequence_parallel_ok(tp: int, sp: bool, seq_len: int = 0, cp: int = 1) -> str | None:
    """Sequence parallelism splits each (context-parallel) sequence over the tensor-parallel ranks:
    it needs tp > 1 and ``seq_len / cp`` divisible by tp (Megatron-Core's scatter to the sequence-
    parallel region asserts it)."""
    if sp and (tp == 1 or (seq_len and (seq_len // cp) % tp)):
        return "sequence_parallel"
    return None


def layout_of(f: tuple[int, int, int, int], ep: int, vp: int, mbs: int, sp: bool, recompute: str,
              zero: int, order: str, dp_overlap: bool, tp_overlap: bool, expert_tp: bool = True,
              ep_overlap: bool = False, head_slots: bool = False, offload: str = "none",
              moe_dispatcher: str = "auto", param_gather: str = "bf16",
              dp_shard: int = 0) -> Layout:
    tp, pp, dp, cp = f
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vp=vp, micro_batch_size=mbs, sequence_parallel=sp,
                  recompute=recompute, zero_stage=zero, order=order, dp_overlap=dp_overlap,
                  tp_overlap=tp_overlap, expert_tp=expert_tp, ep_overlap=ep_overlap,
                  head_slots=head_slots and f[1] > 1, offload=offload, moe_dispatcher=moe_dispatcher,
                  param_gather=param_gather, dp_shard=dp_shard)


def _once(out: dict, key: str, value, flag: str) -> None:
    """A knob given twice in one option with different values is ambiguous: bad input."""
    if key in out and out[key] != value:
        raise SpecError(f"{flag}: {key} is given twice ({knob_text(out[key])} and {knob_text(value)}); give it once")
    out[key] = value


def parse_bounds(fix: tuple[str, ...] = (), minimum: tuple[str, ...] = (), maximum: tuple[str, ...] = (),
                 memory_headroom: float | None = None) -> Bounds:
    """Parse ``--fix tp=8``, ``--min dp=4``, ``--max pp=16`` options into :class:`Bounds`."""
    from clusterplan.cost.layout import parse_layout  # one parser for layout values

    def parse(items: tuple[str, ...], flag: str, numeric_only: bool) -> dict:
        out = {}
        for item in items:
            for part in filter(None, item.split(",")):
                if "=" not in part:
                    raise SpecError(f"{flag}: {part!r} is not knob=value (e.g. {flag} tp=8)")
                key = KNOB_ALIASES.get(part.split("=")[0].strip(), part.split("=")[0].strip())
                if key not in KNOBS:
                    raise SpecError(f"{flag}: unknown knob {key!r}; allowed: {', '.join(KNOBS)}")
                raw = part.split("=", 1)[1].strip()
                if key == "etp":  # expert tensor parallelism: 1 (folded) or tp, held as Layout.expert_tp
                    if numeric_only:
                        raise SpecError(f"{flag}: etp takes 1 or tp; use --fix etp=1 (folded) or --fix etp=<tp>")
                    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
                        raise SpecError(f"{flag} etp={raw}: expert tensor parallelism is a degree: 1 (whole experts, "
                                        "ep carved from tp x cp x dp) or the tp degree")
                    etp = parse_layout(f"ep=1,etp={raw}")
                    _once(out, "expert_tp", etp.expert_tp, flag)
                    out["_etp"] = int(raw)
                    continue
                if key == "dp_shard" and numeric_only:  # searched over a few groups (planner.search.hsdp), not a range
                    raise SpecError(f"{flag}: dp_shard is not searched over a range; use --fix dp_shard=N "
                                    "(0: the framework's own grouping)")
                if key == "schedule":  # kept as named: a Layout writes the one vp implies as ""
                    if raw not in PIPELINE_SCHEDULES:
                        raise SpecError(f"{flag} schedule={raw}: allowed: {', '.join(PIPELINE_SCHEDULES)}")
                    if numeric_only:
                        raise SpecError(f"{flag}: schedule is not numeric; use --fix for it")
                    _once(out, key, raw, flag)
                    continue
                value = getattr(parse_layout(f"{key}={raw}"), key)  # knob aliases too
                if numeric_only and not isinstance(value, int) or isinstance(value, bool) and numeric_only:
                    raise SpecError(f"{flag}: {key} is not numeric; use --fix for it")
                _once(out, key, value, flag)
        return out

    if memory_headroom is not None and not 0 <= memory_headroom < 1:
        raise SpecError(f"--memory-headroom: got {memory_headroom:.0%}; allowed: 0% to 99%")
    fixed = parse(fix, "--fix", False)
    etp = fixed.pop("_etp", None)
    if etp is not None and etp != 1 and fixed.get("tp") != etp:
        raise SpecError(f"--fix etp={etp}: allowed 1 (whole experts, ep carved from tp*cp*dp) or the tp degree; "
                        f"fix tp too (--fix tp={etp},etp={etp}) or use etp=1")
    return Bounds(fixed, parse(minimum, "--min", True), parse(maximum, "--max", True), memory_headroom)

