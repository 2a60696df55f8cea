"""Why a plan won: the term that separates it from each runner-up, what binds, and sensitivities.

Every figure comes from ``cost.step.evaluate``; nothing is re-derived here.
"""

from __future__ import annotations

from dataclasses import asdict

from clusterplan.cost.framework import framework_domains, knob_text
from clusterplan.cost.layout import (CP_COMM_KINDS, MOE_DISPATCHERS, RECOMPUTE_MODES, SCHEDULE_CHUNKS, Job, Layout, default_schedule,
                                      offloads_optimizer, order_axes, split_order)
from clusterplan.cost.step import Evaluation, evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.search.graphs import graph_scope
from clusterplan.planner.search.space import Space
from clusterplan.topologies.cluster import Cluster

GIB = 2**30


def _moves(lay: Layout, moe: bool, offload: bool = False, cp_kinds: tuple[str, ...] = (),
           offload_recompute: str = "full") -> list[tuple[str, Layout]]:
    """One step up and down in each knob, keeping tp*pp*dp*cp fixed by trading with dp.

    Knobs that cannot apply (interleaving without a pipeline, expert parallelism on a dense model,
    host offload where the search does not offer it: ``offload`` False) are left out rather than
    reported as blocked. A recompute move keeps the layer inputs on the device (offload goes with
    the framework's ``offload_recompute``: full recomputation, none under Megatron-Core). With cp > 1,
    each other context-parallel communication kind of ``cp_kinds`` (those the framework offers).
    """
    out: list[tuple[str, Layout]] = []
    for axis in ("tp", "pp", "cp"):
        d = lay.degree(axis)
        if lay.dp % 2 == 0:
            out.append((f"{axis} x2", lay.with_(**{axis: d * 2, "dp": lay.dp // 2})))
        if d % 2 == 0:
            out.append((f"{axis} /2", lay.with_(**{axis: d // 2, "dp": lay.dp * 2})))
    out.append(("mbs x2", lay.with_(micro_batch_size=lay.micro_batch_size * 2)))
    if lay.micro_batch_size % 2 == 0:
        out.append(("mbs /2", lay.with_(micro_batch_size=lay.micro_batch_size // 2)))
    if lay.pp > 1:
        out.append(("vp x2", lay.with_(vp=lay.vp * 2)))
    if lay.vp % 2 == 0:
        out.append(("vp /2", lay.with_(vp=lay.vp // 2)))
    if moe and lay.dp % (lay.ep * 2) == 0:
        out.append(("ep x2", lay.with_(ep=lay.ep * 2)))
    if lay.ep % 2 == 0:
        out.append(("ep /2", lay.with_(ep=lay.ep // 2)))
    if moe and lay.ep > 1 and lay.tp * lay.cp > 1:  # expert tensor parallelism: tp <-> 1 (MoE parallel folding)
        out.append(("etp 1" if lay.expert_tp else f"etp {lay.tp}", lay.with_(expert_tp=not lay.expert_tp)))
    i = RECOMPUTE_MODES.index(lay.recompute)
    for j in (i - 1, i + 1):
        if 0 <= j < len(RECOMPUTE_MODES):
            kept = "optimizer" if offloads_optimizer(lay.offload) else "none"  # the optimizer's place is no recompute's
            out.append((f"recompute {RECOMPUTE_MODES[j]}", lay.with_(recompute=RECOMPUTE_MODES[j], offload=kept)))
    if offload and lay.recompute == offload_recompute:  # the activations' part of the offload mode, toggled
        other = {"none": "activations", "activations": "none", "optimizer": "activations+optimizer",
                 "activations+optimizer": "optimizer"}.get(lay.offload, "none")
        out.append((f"offload {other}", lay.with_(offload=other)))
    for z in (lay.zero_stage - 1, lay.zero_stage + 1):
        if 0 <= z <= 3:
            out.append((f"zero {z}", lay.with_(zero_stage=z)))
    out += _switch_moves(lay, moe) + _kind_moves(lay, moe, cp_kinds)
    if lay.pp > 1:  # the embedding and the head in layer slots (searched where the framework offers it)
        out.append((f"head_slots {'off' if lay.head_slots else 'on'}", lay.with_(head_slots=not lay.head_slots)))
    if lay.traversal:
        out.append(("default torus traversal", lay.with_(order=split_order(lay.order)[0])))
    return out + _hybrid_moves(lay)


def _hybrid_moves(lay: Layout) -> list[tuple[str, Layout]]:
    """Where the layout holds a hybrid sharding group (searched, ``planner.search.hsdp``, or held by
    ``--fix dp_shard=N``; not checked against the space): the group halved and doubled (each dividing dp, at least 2) and off
    (the framework's own group), priced like any move: what the knob does to this plan."""
    if not lay.dp_shard:
        return []
    out = [(f"dp_shard {n}", lay.with_(dp_shard=n)) for n in (lay.dp_shard // 2, lay.dp_shard * 2)
           if 2 <= n <= lay.dp and lay.dp % n == 0]
    return out + [("dp_shard off", lay.with_(dp_shard=0))]


def _kind_moves(lay: Layout, moe: bool, cp_kinds: tuple[str, ...]) -> list[tuple[str, Layout]]:
    """The other values of the knobs that name a kind: the MoE dispatcher and, with cp > 1, each
    context-parallel communication kind the framework offers; and, where ``--layout``/``--fix`` set
    them (the search does not offer them), the 8-bit parameter gathers and CUDA graphs turned off, to
    show what they save (or cost in memory)."""
    out = _dispatcher_moves(lay, moe) + [(f"cp_comm {k}", lay.with_(cp_comm=k)) for k in cp_kinds
                                         if lay.cp > 1 and k != lay.cp_comm]
    if lay.param_gather != "bf16":
        out.append(("param_gather bf16", lay.with_(param_gather="bf16")))
    if lay.cuda_graph != "none":
        out.append(("cuda_graph none", lay.with_(cuda_graph="none")))
    return out


def _switch_moves(lay: Layout, moe: bool) -> list[tuple[str, Layout]]:
    """Each on/off knob turned over: sequence parallelism and the overlaps (EP overlap on MoE layouts
    with expert parallelism)."""
    names = ["sequence_parallel", "dp_overlap", "tp_overlap"] + (["ep_overlap"] if moe and lay.ep > 1 else [])
    labels = {"sequence_parallel": "sp"}
    return [(f"{labels.get(n, n)} {'off' if getattr(lay, n) else 'on'}", lay.with_(**{n: not getattr(lay, n)}))
            for n in names]


def _schedule_moves(lay: Layout, offered: tuple[str, ...], zbh1: bool = False) -> list[tuple[str, Layout]]:
    """With a pipeline, each schedule the framework runs (``offered``, "" the one vp implies) in
    place of the layout's, with the chunks per rank it needs (``cost.layout.SCHEDULE_CHUNKS``; zero bubble
    with one where the framework has ZB-H1, ``zbh1``)."""
    if lay.pp == 1:
        return []
    out = []
    for name in offered:
        several = name == "looped" or name == "zb1p" and not zbh1  # interleaved zero bubble needs vp > 1
        vp = SCHEDULE_CHUNKS.get(name) or (1 if name == "dualpipe" else max(2, lay.vp) if several else lay.vp)
        if name == lay.schedule or not name and not lay.schedule:
            continue
        label = f"schedule {name or default_schedule(vp)}" + (f" (vp {vp})" if vp != lay.vp else "")
        out.append((label, lay.with_(vp=vp, schedule=name)))
    return out
def _dispatcher_moves(lay: Layout, moe: bool) -> list[tuple[str, Layout]]:
    """Where a layout names its MoE dispatcher (the search chose it, or ``--fix`` held it): each other one, to
    show what the all-to-alls cost under it (``cost.terms.comm._dispatch_s``), or why the framework
    refuses it."""
    if not moe or lay.ep == 1 or lay.moe_dispatcher == "auto":
        return []
    return [(f"moe_dispatcher {d}", lay.with_(moe_dispatcher=d)) for d in MOE_DISPATCHERS if d != lay.moe_dispatcher]


def _outside(space: Space | None, lay: Layout) -> str | None:
    """Why ``lay`` lies outside the searched space, if it does."""
    if space is None:
        return None
    if (lay.tp, lay.pp, lay.dp, lay.cp) not in space.factorizations:
        return f"tp={lay.tp}, pp={lay.pp}, cp={lay.cp} is outside the searched degrees (bounds or tp/cp caps)"
    if lay.ep > 1 and (lay.ep, lay.expert_tp) not in zip(space.ep, space.expert_tp):
        return f"ep={lay.ep} with etp={'tp' if lay.expert_tp else 1} is outside the searched expert layouts"
    for knob, value in (("ep", lay.ep), ("vp", lay.vp), ("micro_batch_size", lay.micro_batch_size),
                        ("zero_stage", lay.zero_stage), ("recompute", lay.recompute),
                        ("sequence_parallel", lay.sequence_parallel), ("dp_overlap", lay.dp_overlap),
                        ("tp_overlap", lay.tp_overlap), ("ep_overlap", lay.ep_overlap),
                        ("head_slots", lay.head_slots and lay.pp > 1), ("offload", lay.offload)):
        if value not in getattr(space, knob):
            searched = ", ".join(knob_text(v) for v in dict.fromkeys(getattr(space, knob)))  # a ZeRO stage per shard group
            return f"{knob}={knob_text(value)} is outside the searched values [{searched}]"
    return None


def sensitivities(model: ModelSpec, job: Job, cluster: Cluster, best: Evaluation,
                  space: Space | None = None) -> list[dict]:
    """For each one-step move: the new step time and its change, or why the move is not allowed."""
    rows = []
    offload = best.layout.offload != "none" or space is not None and len(space.offload) > 1
    domains = framework_domains(job.profile, cluster.device.family)
    schedules, cp_kinds = domains["schedule"], domains.get("cp_comm", CP_COMM_KINDS)
    moves = _moves(best.layout, model.is_moe, offload, cp_kinds, job.profile.profile.offload_recompute)
    moves += _schedule_moves(best.layout, schedules, job.profile.has("schedule_zbh1"))
    if cluster.device.family.startswith("nvidia-"):  # each other graph scope the framework has: saved, or refused by
        moves += [(f"cuda_graph {s}", best.layout.with_(cuda_graph=s))  # which rule (why a plan runs eager)
                  for s in domains["cuda_graph"] if s not in ("none", best.layout.cuda_graph)]
    scopes = space.cuda_graph if space is not None else domains["cuda_graph"] if best.layout.cuda_graph != "none" else ()
    for name, lay in moves:
        if not name.startswith("cuda_graph"):  # the scope the search gives the moved layout
            lay = lay.with_(cuda_graph=graph_scope(job.profile, scopes, lay))
        outside = _outside(space, lay)
        if outside:
            rows.append({"move": name, "allowed": False, "reason": outside})
            continue
        problems = layout_problems(model, job, cluster, lay)
        if problems:
            rows.append({"move": name, "allowed": False, "reason": problems[0][1]})
            continue
        ev = evaluate(model, job, cluster, lay)
        row = {"move": name, "allowed": ev.fits, "step_time_s": ev.step_time_s,
               "delta": ev.step_time_s / best.step_time_s - 1, "peak_memory_bytes": ev.peak_memory_bytes,
               "fit_memory_bytes": ev.memory.fit_bytes}
        if not ev.fits:
            row["reason"] = (f"needs {ev.memory.fit_bytes / GIB:.1f} GiB of {ev.capacity_bytes / GIB:.1f} GiB")
        rows.append(row)
    return rows


def binding(best: Evaluation, sens: list[dict]) -> list[str]:
    """Constraints that stop a faster neighbour: memory, divisibility, batch."""
    out = []
    for row in sens:
        faster = row.get("step_time_s") is not None and row["step_time_s"] < best.step_time_s
        if faster and not row["allowed"]:
            out.append(f"memory binds: {row['move']} would be {-row['delta']:.1%} faster but {row['reason']}")
        elif not row["allowed"] and row.get("step_time_s") is None:
            out.append(f"{row['move']} is not allowed: {row['reason']}")
    headroom = 1 - best.memory.fit_bytes / best.capacity_bytes
    out.append(f"memory headroom of the winner: {headroom:.1%} of {best.capacity_bytes / GIB:.1f} GiB")
    return out


def changed_knobs(base: dict, other: dict) -> dict:
    """The knobs of layout ``other`` that differ from ``base`` (both as ``Layout.as_dict()``)."""
    return {k: v for k, v in other.items() if base.get(k) != v}


def versus(best: Evaluation, other: Evaluation) -> dict:
    """The term of the breakdown that differs most between the winner and ``other``."""
    a, b = asdict(best.time), asdict(other.time)
    term = max(a, key=lambda k: abs(b[k] - a[k]))
    diff = changed_knobs(best.layout.as_dict(), other.layout.as_dict())
    tie = abs(b[term] - a[term]) < 1e-9  # same time: the winner was chosen for its lower memory
    return {"layout": other.layout.short(), "changed": diff, "term": "tie" if tie else term.removesuffix("_s"),
            "delta_s": 0.0 if tie else b[term] - a[term], "step_time_delta_s": other.step_time_s - best.step_time_s,
            "memory_delta_bytes": other.memory.fit_bytes - best.memory.fit_bytes}  # what must fit, not the cache


def placement(cluster: Cluster, layout: Layout) -> list[str]:
    """Which torus axes each parallel axis of degree > 1 uses, innermost first; empty off a torus.

    Each entry reads like ``"dp: x (4, wraparound) x z (2 of 8)"``: the torus axes one group spans
    in its slice, its extent on each (``of`` the axis length when it covers only part), whether it
    closes the axis's ring, and the slices it spans over the data-center network.

    Examples
    --------
    >>> from clusterplan.topologies.library import build_cluster
    >>> placement(build_cluster("tpu-v5p-pod", num_devices=128), Layout(tp=4, dp=32, order="tp-cp-dp-pp@xyz"))
    ['tp: x (4, wraparound)', 'dp: y (4, wraparound) x z (8, wraparound)']
    """
    if cluster.torus_shape is None:
        return []
    placed = cluster.placed(layout.traversal)
    full = order_axes(layout.order)
    axes = [a for a in full if layout.degree(a) > 1]
    if layout.ep > 1:  # the expert group sits where dp does (carved from dp, or folded from tp x cp x dp)
        axes.insert(sum(1 for a in full[:full.index("dp")] if layout.degree(a) > 1), "ep")
    out = []
    for axis in axes:
        ranks = layout.group(axis)
        parts = [f"{name} ({extent}{'' if extent == length else f' of {length}'}{', wraparound' if wraps else ''})"
                 for name, extent, length, wraps in placed.torus_span(ranks)]
        slices = len({d // cluster.domain_size for d in placed.devices(ranks)})
        if slices > 1:
            parts.append(f"{slices} slices over DCN")
        out.append(f"{axis}: {' x '.join(parts)}")
    return out


def explain(model: ModelSpec, job: Job, cluster: Cluster, best: Evaluation, runners_up: list[Evaluation],
            space: Space | None = None) -> dict:
    """The explanation block of a plan document."""
    sens = sensitivities(model, job, cluster, best, space)
    return {"versus_runners_up": [versus(best, ev) for ev in runners_up],
            "binding": binding(best, sens), "sensitivity": sens,
            "placement": placement(cluster, best.layout)}
