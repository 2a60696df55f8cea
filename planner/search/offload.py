"""Host offload in the search: the modes a job offers, the space each mode is searched in, and the
host memory each offloaded layout must fit.

Each offload mode (``cost.layout.OFFLOAD_MODES``) is searched in a space of its own
(``planner.search.space.split_spaces``), narrowed so that the search's tables price it exactly:

* activation offload (``offloads_activations``): the framework's offload recompute mode alone, and
  the factorizations whose host copies hide behind the compute (``cost.step.offload_hidden``), so the
  tables need no transfer term;
* optimizer offload (``offloads_optimizer``: DeepSpeed's ZeRO-Offload, Megatron-Core's
  ``--optimizer-cpu-offload``): a sharded optimizer (ZeRO 1-3) with 16-bit parameter gathers (what
  ``cost.checks`` allows), without the ZeRO stages at which the framework accumulates the gradients in
  host memory (``semantics.optimizer_offload_host_accumulation``: DeepSpeed ZeRO-2, whose copies grow
  with the micro-batch count, a term over the micro-batch axis the tables do not have). The tables'
  static memory then lacks the optimizer states and their optimizer-time table holds the copies and
  the CPU Adam step (``cost.terms.optimizer_s``), and :func:`host_refused_statics` rules out the cells
  whose host memory would not hold what is offloaded (``cost.step.host_offload_problem``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from clusterplan.cost.layout import OFFLOAD_MODES, Layout, offloads_activations, offloads_optimizer
from clusterplan.cost.step import host_offload_problem, offload_hidden, offload_host_bound_bytes
from clusterplan.cost.terms import Context, chunks_fit, host_optimizer_bytes, host_tier
from clusterplan.planner.search.hsdp import narrowed_stages, priced_shard
from clusterplan.models.errors import SpecError

if TYPE_CHECKING:  # planner.search.space imports this module
    from clusterplan.planner.search.space import Bounds, Space

ACTIVATION_MODES = ("none", "activations")
"""The modes of a device whose host tier has no bandwidth of its own for the CPU optimizer step."""


def offload_modes(cluster, bounds: Bounds, prof) -> tuple[str, ...]:
    """The offload modes the device allows (a host memory tier with a bandwidth: ``cost.terms.host_tier``;
    for the optimizer modes, the host memory's own bandwidth too, which prices the CPU Adam step),
    where the framework's profile searches its offload (``semantics.offload_searched``), ``--fix`` holds
    it or the bounds ask for it (``Bounds.offer_offload``); ``build_space`` keeps those the framework
    offers at its date. ``--fix`` of a mode the device cannot take is bad input."""
    mode = bounds.fixed.get("offload", "none")
    tier = host_tier(cluster.device)
    if tier is None:
        if mode != "none" and not bounds.allow_unavailable:
            raise SpecError(f"--fix offload={mode}: {cluster.device.name} has no host memory tier with a bandwidth "
                            "to offload to; drop the --fix")
        return ("none",)
    searched = cluster.device.family.startswith(prof.profile.offload_searched)
    if not (searched or bounds.offer_offload or mode != "none"):
        return ("none",)
    if tier.dram_bytes_per_s:
        return OFFLOAD_MODES
    if offloads_optimizer(mode) and not bounds.allow_unavailable:
        raise SpecError(f"--fix offload={mode}: {cluster.device.name}'s host memory tier has no bandwidth of its own "
                        "(memory_tiers: host, dram_gbyte_per_s) to price the CPU optimizer step; allowed: "
                        + ", ".join(ACTIVATION_MODES))
    return ACTIVATION_MODES


def optimizer_offload_offered(job, cluster, bounds: Bounds) -> bool:
    """Whether the search for ``job`` on ``cluster`` may offload the optimizer: an optimizer mode of
    :func:`offload_modes` that the framework runs at its date (``features.offload_optimizer``) and the
    bounds allow (``clusterplan fit``'s memory bound counts the states in host memory there)."""
    try:
        modes = offload_modes(cluster, bounds, job.profile)
    except SpecError:  # a --fix the device cannot take: build_space refuses it
        return False
    return job.profile.has("offload_optimizer") and any(offloads_optimizer(m) and bounds.allows("offload", m)
                                                        for m in modes)


def offload_spaces(splits: list[Space], space: Space, ctx: Context) -> list[Space]:
    """One space per pipeline split of ``splits`` and per offload mode of ``space.offload``: the
    splits with no offload first (so they win a tie: the merge is a stable sort), then each split's
    offloaded spaces (:func:`offloaded_space`). A mode held by ``--fix`` that leaves no space is
    bad input, with the reason."""
    out = [replace(sub, offload=("none",)) for sub in splits if "none" in space.offload]
    reasons = []
    for sub in splits:
        for mode in (m for m in space.offload if m != "none"):
            narrowed, why = offloaded_space(ctx, sub, mode)
            if narrowed is not None:
                out.extend(_host_memory_splits(narrowed))
            reasons.append(why)
    if not out:
        raise SpecError(next(r for r in reasons if r))
    return out


def offloaded_space(ctx: Context, S: Space, mode: str) -> tuple[Space | None, str]:
    """``S`` narrowed to what the search prices with ``mode`` (the module docstring), or None and why
    nothing is left."""
    job = ctx.job
    if offloads_activations(mode):
        recompute = job.profile.profile.offload_recompute
        if recompute not in S.recompute:
            return None, (f"--fix offload={mode}: {job.framework}'s activation offload needs recompute={recompute} "
                          f"(semantics.offload_recompute); the bounds leave recompute {', '.join(S.recompute)}")
        facts = tuple(f for f in S.factorizations if _offload_hides(ctx, S, f))
        if not facts:
            return None, (f"--fix offload={mode}: no layout's host transfers hide behind its compute; drop the --fix "
                          "(clusterplan evaluate prices one layout's exposed transfers)")
        S = replace(S, recompute=(recompute,), factorizations=facts)
    if offloads_optimizer(mode):
        S, why = _optimizer_offload_space(ctx, S, mode)
        if S is None:
            return None, why
    return replace(S, offload=(mode,)), ""


def _optimizer_offload_space(ctx: Context, S: Space, mode: str) -> tuple[Space | None, str]:
    """``S`` with the ZeRO stages and parameter-gather dtype the search prices optimizer offload at."""
    accumulated = ctx.job.profile.profile.optimizer_offload_host_accumulation
    stages = tuple(z for z in S.zero_stage if z >= 1 and z not in accumulated)
    if "bf16" not in S.param_gather:
        return None, (f"--fix offload={mode} with param_gather={S.param_gather[0]} is not priced (Megatron-Core runs "
                      "it with --fp8-recipe delayed only); use param_gather=bf16")
    if not stages:
        held = ", ".join(str(z) for z in S.zero_stage)
        why = (f"--fix offload={mode} needs a sharded optimizer (zero 1, 2 or 3); the bounds leave zero {held}"
               if all(z == 0 for z in S.zero_stage) else
               f"--fix offload={mode}: the search does not price {ctx.job.framework}'s optimizer offload at zero {held}, "
               f"where the gradients accumulate in host memory and their copies grow with the micro-batch count "
               f"(semantics.optimizer_offload_host_accumulation); `clusterplan evaluate --layout "
               f"'...,zero={S.zero_stage[0]},offload={mode}'` prices one layout, or drop --fix zero")
        return None, why
    return replace(S, **narrowed_stages(S, lambda z: z in stages), param_gather=("bf16",)), ""


def _host_memory_splits(S: Space) -> list[Space]:
    """``S``, or with both offloads one space per micro-batch size and sp: host memory then holds the
    activations in flight as well as the optimizer states, and the activations depend on those knobs,
    which the static-memory cells (:func:`host_refused_statics`) do not have."""
    if not (offloads_activations(S.offload[0]) and offloads_optimizer(S.offload[0])):
        return [S]
    return [replace(S, micro_batch_size=(mb,), sequence_parallel=(sp,))
            for mb in S.micro_batch_size for sp in S.sequence_parallel]


def _offload_hides(ctx: Context, S: Space, f: tuple[int, int, int, int]) -> bool:
    """Offload's transfers hide at every (ep, mbs, sp, vp) of the space with factorization ``f``."""
    tp, pp, dp, cp = f
    return all(offload_hidden(ctx, tp, pp, cp, e, et, v, mb, sp, S.head_slots[0])
               for e, et in zip(S.ep, S.expert_tp) for v in S.vp for mb in S.micro_batch_size
               for sp in S.sequence_parallel if (v == 1 or pp > 1) and not (sp and tp == 1))


def host_refused_statics(ctx: Context, S: Space, statics: dict, refused: int) -> dict:
    """The tables' static memory per rank (``tables.memory_rows``' input: (static, at the activation
    peak, at the optimizer step) over (f, v, e, z), in memory quanta) with ``refused`` (more than the capacity) in the cells
    whose host memory cannot hold what the layout offloads (:func:`host_overflow`): the memory rows then
    rule them out in both engines. Unchanged without optimizer offload."""
    if not offloads_optimizer(S.offload[0]):
        return statics
    over = host_overflow(ctx, S)
    if not over.any():
        return statics
    return {rank: tuple(np.where(over, refused, a) for a in arrays) for rank, arrays in statics.items()}


def host_overflow(ctx: Context, S: Space) -> np.ndarray:
    """Over (f, v, e, z): True where the rank's offloaded optimizer states and fp32 gradients
    (``cost.terms.host_optimizer_bytes``), with activation offload also the bound on its activations
    in flight at any micro-batch size and sp of the space (``cost.step.offload_host_bound_bytes``),
    exceed the device's share of the host memory: the check ``cost.step.host_offload_problem`` makes."""
    from clusterplan.planner.search.space import expert_ok  # (space imports this module)
    F, V, E, Z = len(S.factorizations), len(S.vp), len(S.ep), len(S.zero_stage)
    over = np.zeros((F, V, E, Z), bool)
    capacity, L, mode = host_tier(ctx.cluster.device).capacity_bytes, ctx.model.num_layers, S.offload[0]
    for i, (tp, pp, dp, cp) in enumerate(S.factorizations):
        hs = S.head_slots[0] and pp > 1
        for ei, (e, et) in enumerate(zip(S.ep, S.expert_tp)):
            if expert_ok(ctx.model, tp, dp, cp, e, et, ctx.job.profile) is not None:
                continue  # masked before memory (tables.ok_fe)
            for vi, v in enumerate(S.vp):
                if not chunks_fit(L, pp, v, hs):
                    continue
                acts = max((offload_host_bound_bytes(ctx, tp, pp, cp, e, et, v, mb, sp, hs)
                            for mb in S.micro_batch_size for sp in S.sequence_parallel
                            if not (sp and tp == 1)), default=0.0) if offloads_activations(mode) else 0.0
                for zi, z in enumerate(S.zero_stage):
                    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=e, vp=v, zero_stage=z, expert_tp=et, head_slots=hs,
                                 offload=mode, dp_shard=priced_shard(ctx, S, (tp, pp, dp, cp), e, zi))
                    over[i, vi, ei, zi] = acts + host_optimizer_bytes(ctx, lay) > capacity
    return over


def host_memory_refusal(ctx: Context, layout: Layout) -> str:
    """Why nothing fits, where the layout that needs the least device memory (``engine._least_memory``)
    offloads more than host memory holds: its cells rank last (:func:`host_refused_statics`), so every
    layout left does; "" otherwise (device memory is what binds)."""
    problem = host_offload_problem(ctx, layout) if offloads_optimizer(layout.offload) else None
    if not problem:
        return ""
    return (f"{ctx.model.name} does not fit on {ctx.cluster.num_devices:,} x {ctx.cluster.device.id}: no layout the "
            f"bounds leave holds what it offloads in host memory ({layout.short()}: {problem})")
