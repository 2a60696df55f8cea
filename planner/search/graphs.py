"""The CUDA graph scope the search chooses (``Layout.cuda_graph``, issue 38 item 5).

A graph changes one figure of the step: the per-kernel launch cost each op pays
(``cost.compute.graphed_device``), the same share for both scopes, and no memory term
(``cost.terms.memory`` prices none). A layout the framework may graph is therefore searched graphed,
on tables built from the graphed context; the others eager. Whether a framework may graph a layout
is its profile's rules on the scope, each refusing one knob's values (Megatron's per-layer graphs:
full recomputation; torchtitan's: pp > 1, ep > 1): so the space is cut into boxes over those knobs
(recompute, pp, ep), the graphed ones and the eager rest, each searched as a split of its own
(``engine.search``), as the pipeline splits are. Of the scopes a graphed layout may take, it takes
the first the framework offers (per-layer before full: Megatron's full-iteration graph drops the
NaN check of the loss and gradients, ``export.megatron``); a tie in price, not a choice of speed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clusterplan.cost.checks import etp_dispatchers, full_graph_problem
from clusterplan.cost.layout import Layout
from clusterplan.cost.profile import ProfileAt
from clusterplan.cost.terms import Context, dispatcher_choice, ep_ranks
from clusterplan.cost.terms.context import graphs_skip_moe
from clusterplan.models.errors import SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster

if TYPE_CHECKING:  # space.py imports this module
    from clusterplan.planner.search.space import Bounds, Space

# a rule's condition -> (the knob it reads, whether a value of it is refused)
_SPLITTABLE = {
    "recompute_in": ("recompute", lambda want: lambda rc: rc in want),
    "pp_min": ("pp", lambda want: lambda pp: pp >= want),
    "ep_min": ("ep", lambda want: lambda ep: ep >= want),
}


def searched_scopes(cluster: Cluster, bounds: Bounds, offered: tuple[str, ...], model: ModelSpec,
                    prof: ProfileAt) -> tuple[str, ...]:
    """The CUDA graph scopes the search may give a layout: the one ``--fix`` holds (graphs on a device
    without CUDA are bad input), else none and the scopes the framework offers at its date on NVIDIA
    GPUs (:func:`graph_spaces` cuts the space by the framework's rules on them). For a dropless MoE
    model where the framework's graphs capture only its attention (``semantics.cuda_graph_dropless_moe``)
    none: ``--fix cuda_graph=layer`` prices that capture (the MLP blocks eager,
    ``cost.terms.context.graphs_skip_moe``), but searching it splits the space in two (its rule on full
    recomputation) and measured 4-5x the CPU time of DeepSeek-V3's search on 256 H100 or 576 GB200,
    for a saving of the attention's launches alone. Validation holds none unless a run says otherwise
    (``studies.runs``)."""
    fixed = bounds.fixed.get("cuda_graph")
    if fixed not in (None, "none") and not cluster.device.family.startswith("nvidia-"):
        raise SpecError(f"--fix cuda_graph={fixed}: CUDA graphs run on NVIDIA GPUs only, not on "
                        f"{cluster.device.name}; drop it")
    if fixed is not None:
        if full_graph_problem(model, prof.profile, fixed):
            raise SpecError(f"--fix {full_graph_problem(model, prof.profile, fixed)}")
        return (fixed,)
    if bounds.allow_unavailable or not cluster.device.family.startswith("nvidia-"):
        return ("none",)
    if graphs_skip_moe(model, prof.profile):  # priced under --fix; searching it costs 4x the search time
        return ("none",)
    return offered


def scope_box(prof: ProfileAt, scope: str) -> list | None:
    """The layouts ``prof`` graphs with ``scope``: ``(knob, allowed)`` conditions that must all hold,
    one per profile rule refusing the scope at the profile's date; None where a rule reads more than
    one other knob (the box cannot express it: the scope is then not searched, and ``--fix`` of it refused)."""
    box = []
    for rule in prof.profile.rules:
        when = dict(rule.when)
        if (rule.until is not None and prof.date >= rule.until) or scope not in when.get("cuda_graph_in", ()):
            continue
        others = [(k, v) for k, v in rule.when if k != "cuda_graph_in"]
        if len(others) != 1 or others[0][0] not in _SPLITTABLE:
            return None
        knob, refused = _SPLITTABLE[others[0][0]]
        box.append((knob, lambda v, r=refused(others[0][1]): not r(v)))
    return box


def graph_spaces(space: Space, prof: ProfileAt) -> list[Space]:
    """``space`` cut into disjoint spaces, each priced with one CUDA graph setting: the layouts some
    scope of ``space.cuda_graph`` graphs (``cuda_graph`` those scopes, priced graphed) and the rest
    (``("none",)``, priced eager); ``space`` itself where it offers no graphed scope."""
    pairs = [(s, scope_box(prof, s)) for s in space.cuda_graph if s != "none"]
    scopes, boxes = tuple(s for s, b in pairs if b is not None), [b for _, b in pairs if b is not None]
    if not boxes and "none" not in space.cuda_graph:  # no rule refusing it is one this module can cut on
        raise SpecError(f"--fix cuda_graph={space.cuda_graph[0]}: the framework's rules on it are not searched; "
                        f"price a layout with it by `clusterplan evaluate --layout ...,cuda_graph={space.cuda_graph[0]}`")
    if not boxes:
        return [replace(space, cuda_graph=("none",))]
    graphed: list[list] = [[]] if [] in boxes else []  # a scope every layout may take: one graphed space
    for k, box in enumerate(boxes if not graphed else []):  # each box less the ones before it: disjoint pieces
        graphed += _minus_all([box], boxes[:k])
    eager = _minus_all([[]], boxes) if "none" in space.cuda_graph else []
    out = [_narrow(space, piece, scopes) for piece in graphed] + [_narrow(space, piece, ("none",)) for piece in eager]
    return [s for s in out if s is not None]


def graph_scope(prof: ProfileAt, scopes: tuple[str, ...], layout: Layout) -> str:
    """The scope a layout takes among ``scopes`` (those of a space, or those the framework offers):
    the first whose box holds it (the search's choice), else none."""
    values = {"recompute": layout.recompute, "pp": layout.pp, "ep": layout.ep}
    for scope in (s for s in scopes if s != "none"):
        box = scope_box(prof, scope)
        if box is not None and all(ok(values[knob]) for knob, ok in box):
            return scope
    return "none"


def _minus_all(pieces: list[list], boxes: list[list]) -> list[list]:
    for box in boxes:
        pieces = [q for p in pieces for q in _minus(p, box)]
    return pieces


def _minus(piece: list, box: list) -> list[list]:
    """``piece`` less ``box`` as disjoint pieces: outside the box on its first condition, or inside
    on it and outside on the second, and so on (empty where the box holds no condition)."""
    out, inside = [], list(piece)
    for knob, ok in box:
        out.append(inside + [(knob, lambda v, ok=ok: not ok(v))])
        inside = inside + [(knob, ok)]
    return out


def _narrow(space: Space, piece: list, scopes: tuple[str, ...]) -> Space | None:
    def keep(knob, value):
        return all(ok(value) for k, ok in piece if k == knob)
    recompute = tuple(r for r in space.recompute if keep("recompute", r))
    facts = tuple(f for f in space.factorizations if keep("pp", f[1]))
    experts = [(e, t) for e, t in zip(space.ep, space.expert_tp) if keep("ep", e)]
    if not recompute or not facts or not experts:
        return None
    return replace(space, recompute=recompute, factorizations=facts, ep=tuple(e for e, _ in experts),
                   expert_tp=tuple(t for _, t in experts), cuda_graph=scopes)


def searched_choices(S: "Space", lay: Layout, ctx: Context | None) -> Layout:
    """``lay`` with what the tables chose for it: in a space priced graphed (:func:`graph_spaces`) the
    scope its rules allow (:func:`graph_scope`), and where the space offers several MoE dispatchers the
    one its expert table priced (``cost.terms.dispatcher_choice``)."""
    if S.cuda_graph[0] != "none":
        lay = lay.with_(cuda_graph=graph_scope(ctx.job.profile, S.cuda_graph, lay) if ctx else S.cuda_graph[0])
    if ctx is not None and lay.ep > 1 and len(S.moe_dispatcher) > 1:
        lay = lay.with_(moe_dispatcher=dispatcher_choice(
            ctx.placed(lay.order), lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute,
            ep_ranks(lay), etp_dispatchers(ctx.job, S.moe_dispatcher, lay.tp, lay.expert_tp))[0])
    return lay
