"""The fixed inputs of one planning problem, and what every term asks of them: tokens per rank, the model's layer kinds.

Part of ``cost.terms`` (its docstring); imports go down the package: context -> activations -> compute -> comm -> pipeline -> memory -> dp -> layer.
"""

from __future__ import annotations
from dataclasses import dataclass, replace
from functools import lru_cache

from clusterplan.cost.compute import graphed_device
from clusterplan.cost.layout import Job, split_order
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster


HF_MODEL_CODE = "huggingface"
"""``Job.model_code`` of a Hugging Face transformers model class (transformers 4.36 to 4.45, read at
``models/llama/modeling_llama.py``): eager modules, so autograd keeps what each op saves
(``activation_bytes``): SwiGLU keeps ``gate``, its SiLU, ``up`` and their product (``eager``);
``repeat_kv`` materialises K and V per query head (``kv_repeat``); ``LlamaRMSNorm`` upcasts to fp32
(``fp32_norms``); the rotary embedding keeps nothing large (its multiplies save only cos and sin,
which need no gradient) and the attention output's ``transpose(1, 2).contiguous()`` copies nothing.
The loss holds ``HF_LOGIT_BYTES`` per logit."""


FUSED_MODEL_CODE = "fused"  # a model of fused kernels (Transformer Engine layers) under any framework


LLMFOUNDRY_MODEL_CODE = "llmfoundry"  # llm-foundry's MPT modules (Composer FSDP, priced with the torchtitan profile)


@dataclass(frozen=True, eq=False)
class Context:
    """The fixed inputs of one planning problem.

    Every term is cached on (context, knobs); hashing the pydantic model each time would dominate,
    so the hash is computed once. Two contexts are equal when they ask the same terms: the same
    model, the same job up to its global batch, tokens to train and reliability (no cached term
    reads those: the number of micro-batches is passed in), and the same cluster object. So the
    points of a sweep over the batch share every term.

    The context also fixes the placement: terms that take a stride ask ``cluster`` as given, so
    their caller passes ``placed(layout.order)``; terms that take a layout or an order place it
    themselves. Compute and memory ignore placement and are cached on the unplaced context.
    """

    model: ModelSpec
    job: Job
    cluster: Cluster

    def __post_init__(self) -> None:
        key = (self.model, self.job.term_key, id(self.cluster))
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))
        # the same problem with ranks as device ids (see placed)
        base = self if self.cluster.base is None else Context(self.model, self.job, self.cluster.base)
        object.__setattr__(self, "_base", base)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self._key == other._key

    def placed(self, order: str) -> "Context":
        """This problem with ranks laid on the chips as ``order``'s torus traversal says (itself for
        the default traversal). Fabric questions then answer for that placement; memory and compute
        do not depend on it. One object per traversal, so the term caches hit."""
        traversal = split_order(order)[1]
        if traversal == self.cluster.traversal:
            return self
        return _placed_context(self._base, traversal)


@lru_cache(maxsize=64)
def _placed_context(base: Context, traversal: str) -> Context:
    cluster = base.cluster.placed(traversal)
    if cluster is base.cluster:
        return base
    ctx = Context(base.model, base.job, cluster)
    object.__setattr__(ctx, "_base", base)
    return ctx


def graphed_context(ctx: Context, scope: str) -> Context:
    """The problem with its kernels replayed from CUDA graphs of ``scope`` (``Layout.cuda_graph``;
    ``cost.compute.graphed_device``): ``ctx`` itself for none. The graphed cluster is one object per
    (cluster, scope), so the term caches hit; the context is built around the caller's own job
    (contexts that differ only in the global batch compare equal, so they cannot be cached)."""
    if scope == "none":
        return ctx
    eager_moe = graphs_skip_moe(ctx.model, ctx.job.profile.profile)
    return Context(ctx.model, ctx.job, _graphed_cluster(ctx._base.cluster, scope, eager_moe))


def graphs_skip_moe(model: ModelSpec, profile) -> bool:
    """Whether the framework's CUDA graphs leave this model's MoE blocks eager: a dropless MoE model
    (no capacity factor: data-dependent shapes) under a framework whose graphs then capture only the
    attention (``semantics.cuda_graph_dropless_moe`` false: Megatron's ``--cuda-graph-modules attn``)."""
    return model.moe is not None and model.moe.capacity_factor is None and not profile.cuda_graph_dropless_moe


@lru_cache(maxsize=64)
def _graphed_cluster(cluster: Cluster, scope: str, eager_moe: bool = False) -> Cluster:
    return replace(cluster, device=graphed_device(cluster.device, scope, eager_moe))


def _tokens(ctx: Context, cp: int, mbs: int) -> float:
    return mbs * ctx.job.seq_len / cp


def _kind_total(model: ModelSpec, per_layer: tuple[float, float]) -> float:
    """A per-layer figure of each kind ``(dense, moe)`` summed over the model's layers."""
    return model.num_dense_layers * per_layer[0] + model.num_moe_layers * per_layer[1]


def _layer_kinds(model: ModelSpec, kind: bool | None = None) -> list[tuple[bool, int]]:
    """``(moe, count)`` of each layer kind the model has (``kind``: that kind alone)."""
    return [(moe, count) for moe, count in ((False, model.num_dense_layers), (True, model.num_moe_layers))
            if count and kind in (None, moe)]


def mixed_kinds(model: ModelSpec) -> bool:
    """The model has dense and MoE layers both (DeepSeek-V3's first three layers are dense): a
    pipeline stage's time then depends on which of them it holds (``cost.stages``)."""
    return model.num_dense_layers > 0 and model.num_moe_layers > 0


_COMPUTE_CONTEXTS: dict = {}


@lru_cache(maxsize=32)
def _compute_context(ctx: Context) -> Context:
    """One context per (model, job terms, device): compute and activation memory depend on the
    device alone, not on the cluster's size or fabric, so clusters of one device share them (a
    sweep over device counts computes each layer's terms once). The device is keyed by value: each
    cluster build copies its device, and keyed by identity every size kept a context (and its
    cluster graph) of its own, which took ``fit`` to 21.7 GB (issue 41); the cache of contexts
    asked for is small for the same reason."""
    key = (ctx.model, ctx._key[1], ctx.cluster.device.model_dump_json())
    if len(_COMPUTE_CONTEXTS) > 256:
        _COMPUTE_CONTEXTS.clear()
    return _COMPUTE_CONTEXTS.setdefault(key, ctx)


def _local_experts(model: ModelSpec, ep: int) -> int | None:
    return None if model.moe is None else max(1, model.moe.num_experts // ep)


def _comm_multiplier(recompute: str) -> float:
    """Full recomputation repeats the forward collectives: 3 passes of traffic instead of 2."""
    return 1.5 if recompute == "full" else 1.0
