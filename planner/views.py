"""The figures the HTML page and the timeline draw beyond the text report's, computed here (with the
other results, :mod:`planner.results`) so that ``planner.report`` only places them.

- :func:`schedule_figures`: one micro-batch on the pipeline stage whose time sets the step
  (``cost.step.slowest_stage``), split as the step prices it: forward and backward compute,
  recomputation, the exposed collectives of the layers, the LM head where it adds to the period, the
  stage sends, and the collectives the overlaps hide. ``m (forward + backward + head)`` is the
  breakdown's compute, ``(pp - 1) / vp`` times the stage's layer terms its bubble, and so on: the
  step is composed from these exactly as ``cost.step`` composes it.
- :func:`stage_memory_figures`: the memory peak of the first, second and last pipeline rank by
  category (``cost.step.rank_memories``): the ranks whose peaks bound every rank's.
- :func:`fabric_groups`: rank 0's group of each parallel axis on the devices, the nodes and scale-up
  domains it spans and the fabric tier its collective crosses.
"""

from __future__ import annotations

from dataclasses import asdict

import networkx as nx

from clusterplan.cost.layout import Job, Layout, order_axes
from clusterplan.cost.step import Evaluation, rank_memories, slowest_stage
from clusterplan.cost.terms import Context, dp_terms, regather_share
from clusterplan.cost.terms.context import graphed_context
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import SCALE_OUT_LEVELS, SCALE_UP_LEVELS, Cluster

MAX_GROUP_DEVICES = 1024
"""Device ids written per group: enough to draw every group of a few thousand devices; a larger
group (dp over 16,384 devices) keeps its first ones, its size and the domains it spans."""
TIER_ORDER = ("nic", "host", "leaf", "spine", "core", "dcn")
"""Scale-out tiers from the lowest: the highest a group's path climbs is the tier it crosses."""


def schedule_figures(model: ModelSpec, job: Job, cluster: Cluster, ev: Evaluation) -> dict:
    """One micro-batch on the stage that sets the step, per term (seconds), the per-step terms after
    the pipeline, and what the overlaps hide (module docstring)."""
    L, m = ev.layout, ev.num_microbatches
    ctx = graphed_context(Context(model, job, cluster), L.cuda_graph)  # the kernels as cost.step prices them
    stage, time = slowest_stage(ctx, L, m)
    bare, _ = slowest_stage(ctx, L.with_(tp_overlap=False, ep_overlap=False), m)
    dp = dp_terms(ctx.placed(L.order), L)
    dp_total_s = (m * (dp.per_microbatch_s + regather_share(ctx, L) * dp.regather_s) + dp.per_step_s
                  + dp.blocking_s + m * dp.copy_s)
    return {
        "pp": L.pp, "vp": L.vp, "num_microbatches": m,
        "microbatch_group": job.microbatch_group(m, L.pp, L.vp) or L.pp,
        "forward_s": stage.forward_s, "backward_s": stage.backward_s, "recompute_s": stage.recompute_s,
        "tp_comm_s": stage.tp_comm_s, "cp_comm_s": stage.cp_comm_s, "ep_comm_s": stage.ep_comm_s,
        "head_s": max(0.0, time.compute_s / m - stage.forward_s - stage.backward_s),
        "p2p_s": time.pp_p2p_s / m, "dp_comm_s": time.dp_comm_s, "optimizer_s": time.optimizer_s,
        "grad_accum_s": time.grad_accum_s,
        "hidden": {"tp_comm_s": max(0.0, bare.tp_comm_s - stage.tp_comm_s),
                   "ep_comm_s": max(0.0, bare.ep_comm_s - stage.ep_comm_s),
                   "dp_comm_s": max(0.0, dp_total_s - time.dp_comm_s)},
    }


def stage_memory_figures(model: ModelSpec, job: Job, cluster: Cluster, ev: Evaluation) -> dict:
    """``{rank: {"rank", category: bytes}}`` for the first, second and last pipeline rank (one rank
    without a pipeline, ``last``: it holds the logits)."""
    ranks = rank_memories(Context(model, job, cluster), ev.layout, ev.num_microbatches)
    index = {"first": 0, "second": 1, "last": ev.layout.pp - 1}
    return {name: {"rank": index[name], **{k.removesuffix("_bytes"): v for k, v in asdict(b).items()}}
            for name, b in ranks.items()}


def fabric_groups(cluster: Cluster, layout: Layout) -> list[dict]:
    """Rank 0's group of each parallel axis of degree > 1, innermost first: its devices (the first
    :data:`MAX_GROUP_DEVICES`), the nodes and scale-up domains it spans, and the fabric tier its
    collective crosses (``nvlink``, ``ici``, or the highest scale-out tier on its path)."""
    placed = cluster.placed(layout.traversal)
    axes = [a for a in order_axes(layout.order) if layout.degree(a) > 1]
    if layout.ep > 1:  # the expert group sits where dp does (carved from dp, or folded from tp x cp x dp)
        axes.insert(sum(1 for a in order_axes(layout.order)[:order_axes(layout.order).index("dp")]
                        if layout.degree(a) > 1), "ep")
    out = []
    for axis in axes:
        devices = placed.devices(layout.group(axis))
        # a stage sends to its neighbour only: the pair, not the whole pipeline, says what pp crosses
        members = (0, layout.stride("pp")) if axis == "pp" else layout.group(axis)
        profile = placed.group_profile(members)
        out.append({
            "axis": axis, "degree": len(devices), "devices": list(devices[:MAX_GROUP_DEVICES]),
            "num_nodes": len({d // cluster.devices_per_node for d in devices}),
            "num_domains": len({d // cluster.domain_size for d in devices}),
            "tier": group_tier(cluster, placed.devices(members)),
            "bytes_per_s": profile.inter_bytes_per_s if profile.num_domains > 1 else profile.intra_bytes_per_s,
        })
    return out


def group_tier(cluster: Cluster, devices: tuple[int, ...]) -> str:
    """The fabric tier a collective over ``devices`` crosses: the scale-up level of its domain
    (``nvlink``, ``xgmi``, ``ici``, ...) where it stays in one, else the highest scale-out switch
    tier on the path from its first device to its last (``leaf``, ``spine``, ``core``, ``dcn``)."""
    graph = cluster.physical.graph
    first, last = devices[0], devices[-1]
    if graph.nodes[first]["domain"] == graph.nodes[last]["domain"] and all(
            graph.nodes[d]["domain"] == graph.nodes[first]["domain"] for d in devices):
        levels = sorted({d["level"] for _, d in graph.adj[first].items() if d["level"] in SCALE_UP_LEVELS})
        return "ici" if any(level.startswith("ici") for level in levels) else (levels[0] if levels else "device")
    view = nx.subgraph_view(graph, filter_edge=lambda u, v: graph.edges[u, v]["level"] in SCALE_OUT_LEVELS)
    far = next(d for d in reversed(devices) if graph.nodes[d]["domain"] != graph.nodes[first]["domain"])
    try:
        path = nx.shortest_path(view, first, far)
    except nx.NetworkXNoPath:
        return "scale-out"
    tiers = [graph.nodes[n].get("level") for n in path[1:-1]] + [graph.edges[u, v]["level"] for u, v in zip(path, path[1:])]
    known = [t for t in tiers if t in TIER_ORDER]
    return max(known, key=TIER_ORDER.index) if known else "scale-out"
