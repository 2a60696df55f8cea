"""The layer terms of one micro-batch assembled from compute and communication (``LayerTerms``).

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from dataclasses import dataclass, replace

from clusterplan.cost.layout import Layout
from clusterplan.cost.terms.comm import cp_comm_terms, ep_comm_terms, ep_overlap_steady_share, ep_ranks, tp_comm_terms
from clusterplan.cost.terms.compute import compute_terms, recompute_module_terms
from clusterplan.cost.terms.context import Context, _kind_total
from clusterplan.cost.terms.pipeline import layers_on_stage


@dataclass(frozen=True, slots=True)
class LayerTerms:
    """All transformer layers, one micro-batch, one device (as if the whole model sat on it)."""

    forward_s: float  # compute of the forward pass
    backward_s: float  # compute of the backward pass
    recompute_s: float  # forward recomputed during backward
    tp_comm_s: float  # exposed tensor-parallel collectives
    cp_comm_s: float  # exposed context-parallel ring traffic
    ep_comm_s: float  # expert-parallel all-to-all (dispatch + combine)
    act_bytes_per_layer: float  # stored activations per layer (average over layers)
    act_transient_bytes: float  # extra working memory of one layer's backward
    act_kind_bytes: tuple[float, float] = (0.0, 0.0)  # stored activations of one dense and one MoE layer

    @property
    def total_s(self) -> float:
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_comm_s
                + self.cp_comm_s + self.ep_comm_s)


def layer_terms(ctx: Context, layout: Layout, m: int = 1, kind: bool | None = None) -> LayerTerms:
    """Per-micro-batch layer terms; depends on tp, cp, ep, mbs, sp, recompute, placement, the
    overlaps, and (EP overlap only) the ``m`` micro-batches per step and the pipeline. ``kind``:
    the model's dense layers alone (False) or its MoE layers alone (True); None: all of them."""
    if layout.recompute_layers and layout.recompute == "full":
        return _partial_recompute_terms(ctx, layout, m, kind)
    if layout.recompute_modules and layout.recompute == "selective":
        return _module_recompute_terms(ctx, layout, m, kind)
    ctx = ctx.placed(layout.order)
    tp, cp, mbs, sp, rc = layout.tp, layout.cp, layout.micro_batch_size, layout.sequence_parallel, layout.recompute
    c = compute_terms(ctx._base, tp, cp, mbs, sp, rc, layout.ep, layout.expert_tp, kind)
    steady = (ep_overlap_steady_share(layout.pp, layout.vp, m, rc, ctx.job.microbatch_group(m, layout.pp, layout.vp),
                                      layout.schedule) if layout.ep_overlap else 0.0)
    ep_s = 0.0 if kind is False else ep_comm_terms(ctx, tp, cp, layout.ep, mbs, sp, rc, ep_ranks(layout),
                                                   layout.tp_overlap and tp > 1, steady, layout.expert_tp,
                                                   layout.moe_dispatcher)
    return LayerTerms(
        forward_s=c.forward_s, backward_s=c.backward_s, recompute_s=c.recompute_s,
        tp_comm_s=tp_comm_terms(ctx, tp, cp, mbs, sp, rc, layout.stride("tp"), layout.tp_overlap,
                                layout.expert_tp or layout.ep == 1, layout.ep, layout.expert_tp, kind),
        cp_comm_s=cp_comm_terms(ctx, tp, cp, mbs, sp, layout.stride("cp"), kind, layout.cp_comm),
        ep_comm_s=ep_s, act_bytes_per_layer=c.act_bytes_per_layer, act_transient_bytes=c.act_transient_bytes,
        act_kind_bytes=c.act_kind_bytes,
    )


def _module_recompute_terms(ctx: Context, layout: Layout, m: int, kind: bool | None = None) -> LayerTerms:
    """Megatron-Core's selective recomputation of the named submodules (``layout.recompute_modules``):
    the layer as without recomputation, less what those modules no longer keep, plus their forward
    run again in backward (:func:`recompute_module_terms`). The tensor-parallel collectives of a
    recomputed dense MLP are not priced again (the recomputed ops are local to a rank otherwise)."""
    none = layer_terms(ctx, layout.with_(recompute="none", recompute_modules=()), m, kind)
    rec_s, dropped = recompute_module_terms(ctx._base, layout.tp, layout.cp, layout.micro_batch_size,
                                            layout.sequence_parallel, layout.ep, layout.expert_tp,
                                            tuple(layout.recompute_modules), kind)
    kinds = tuple(kept - gone for kept, gone in zip(none.act_kind_bytes, dropped))
    return replace(none, recompute_s=rec_s, act_kind_bytes=kinds,
                   act_bytes_per_layer=none.act_bytes_per_layer - _kind_total(ctx.model, dropped) / ctx.model.num_layers)


def _partial_recompute_terms(ctx: Context, layout: Layout, m: int, kind: bool | None = None) -> LayerTerms:
    """``recompute_layers`` of a stage's layers recompute whole and the rest keep every activation:
    each per-layer term is the share-weighted mean of full recomputation and none (a stage's time and
    stored activations are sums over its layers); one layer being recomputed still needs its working
    memory."""
    share = min(1.0, layout.recompute_layers / layers_on_stage(ctx.model.num_layers, layout.pp, layout.vp))
    full = layer_terms(ctx, layout.with_(recompute_layers=0), m, kind)
    none = layer_terms(ctx, layout.with_(recompute="none", recompute_layers=0), m, kind)

    def mix(name: str) -> float:
        return share * getattr(full, name) + (1.0 - share) * getattr(none, name)
    kinds = tuple(share * f + (1.0 - share) * n for f, n in zip(full.act_kind_bytes, none.act_kind_bytes))
    return LayerTerms(forward_s=full.forward_s, backward_s=full.backward_s, recompute_s=mix("recompute_s"),
                      tp_comm_s=mix("tp_comm_s"), cp_comm_s=mix("cp_comm_s"), ep_comm_s=mix("ep_comm_s"),
                      act_bytes_per_layer=mix("act_bytes_per_layer"), act_transient_bytes=full.act_transient_bytes,
                      act_kind_bytes=kinds)
