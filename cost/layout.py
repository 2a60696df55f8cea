"""The parallel layout and the job: the knobs the search chooses and the work it must do.

The layout type lives in ``cost`` rather than ``planner`` because every cost function takes it and
imports only go down the DESIGN.md table (``planner`` re-exports it).

Ranks are laid out by ``order``: a permutation of the parallel axes from the fastest-varying
(innermost, adjacent device ids) to the slowest, in Megatron-Core's notation
(``"tp-cp-ep-dp-pp"`` is its default). Expert parallelism is carved out of the context x data
block, innermost first (``Layout.group``): out of ``dp`` alone where ``ep`` divides it and cp = 1.

On a TPU torus the order may end in ``@`` and a traversal: the torus axes from the fastest- to the
slowest-varying as consecutive ranks are laid on a slice's chips (``"tp-cp-dp-pp@xzy"``: ranks walk
x first, then z, then y). Without it ranks follow the device ids, row-major over the torus
coordinates (``@zyx`` in 3D, ``@yx`` in 2D).
Strides, groups and every rule on the order read the parallel part only; which chips a group lands
on is the cluster's question (``topologies.cluster.Cluster.placed``).
"""

from __future__ import annotations

from functools import lru_cache
from dataclasses import asdict, dataclass, field, replace

from clusterplan.cost.framework import FRAMEWORKS, ProfileAt, knob_text, load_profile, parse_date
from clusterplan.cost.goodput import Reliability
from clusterplan.cost.orders import DEFAULT_ORDER, ORDERS, TRAVERSAL_SEP, join_order, split_order  # noqa: F401 (re-exported)

_DEFAULT_RELIABILITY = Reliability()
from clusterplan.models.errors import SpecError, check_number, shown
from clusterplan.models.ops import ATTENTION_KINDS
from clusterplan.topologies.cluster import TORUS_AXES
from clusterplan.topologies.precisions import FP8_CURRENT, FP8_SCALINGS, PRECISIONS  # noqa: F401 (PRECISIONS re-exported)

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts")
"""Megatron-Core's selective recomputation submodules (``--recompute-modules``, TransformerConfig
``recompute_modules``) that clusterplan prices: core attention, the two layer norms, MLA's up
projections with their RoPE, the dense MLP, the experts' activation and the shared experts. ``moe``
(the whole MoE layer, all-to-alls included) is not priced."""
OFFLOAD_MODES: tuple[str, ...] = ("none", "activations", "optimizer", "activations+optimizer")
"""What lives in host memory: nothing, the activations a layer keeps for its backward (``activations``:
MaxText's ``remat_policy: custom`` with ``decoder_layer_input: offload``, which moves what the recompute
mode keeps to pinned host memory; ``features.offload_activations``), Adam's fp32 master weights and
moments with the fp32 gradients, stepped by the CPU (``optimizer``: DeepSpeed's ZeRO-Offload
``offload_optimizer``, Megatron-Core's ``--optimizer-cpu-offload``; ``features.offload_optimizer``), or both."""


def offloads_activations(offload: str) -> bool:
    """Whether the offload mode (:data:`OFFLOAD_MODES`) puts the kept activations in host memory."""
    return offload in ("activations", "activations+optimizer")


def offloads_optimizer(offload: str) -> bool:
    """Whether the offload mode (:data:`OFFLOAD_MODES`) puts the optimizer states in host memory."""
    return offload in ("optimizer", "activations+optimizer")
PIPELINE_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "zb1p", "zbv", "dualpipe", "dualpipev", "looped")
"""The pipeline schedules ``Layout.schedule`` names (priced in ``cost.terms.pipeline.bubble_s``):
1F1B (Narayanan et al. 2021), Megatron-Core's interleaved 1F1B (vp > 1), zero bubble ZB-H1 with the
backward split into its input and weight halves (Qi et al. 2024, ICLR, arXiv 2401.10241; torchtitan's
``InterleavedZeroBubble`` with vp > 1), ZB-V (two chunks per rank in a V, ``ZBVZeroBubble``),
DeepSeek-V3's DualPipe (two mirrored stages per rank, twice the weights) and DualPipeV (its V-shaped
half, ``DualPipeV``), and the looped breadth-first schedule (MaxText's circular pipeline, torchtitan's
``LoopedBFS``: every micro-batch through a chunk before the next chunk)."""
SCHEDULE_CHUNKS: dict[str, int] = {"zbv": 2, "dualpipev": 2}
"""The schedules whose chunk count per rank is fixed: the V shapes hold two (rank r: chunks r and 2 pp - 1 - r)."""
CP_COMM_KINDS: tuple[str, ...] = ("p2p", "allgather", "a2a", "a2a+p2p")
"""How context-parallel attention exchanges the sequence (Megatron-Core's ``cp_comm_type``): a ring of
key/value blocks (``p2p``), one all-gather of keys and values (``allgather``), all-to-alls of the
heads (``a2a``, DeepSpeed-Ulysses), or all-to-alls inside the scale-up domain and a ring across
(``a2a+p2p``); priced in ``cost.terms.comm.cp_comm_terms``."""
MOE_DISPATCHERS: tuple[str, ...] = ("auto", "alltoall", "deepep", "hybridep")
"""How the expert-parallel all-to-alls move the routed tokens (``Layout.moe_dispatcher``): ``auto`` what
the framework runs when the plan names none (priced as ``alltoall``: the Megatron export writes the alltoall
dispatcher for it, torchtitan's standard backend), ``alltoall`` NCCL all-to-all of every routed copy, ``deepep`` / ``hybridep`` the fused
dispatch and combine kernels of DeepEP and NVIDIA's Hybrid-EP (one copy per destination rank and node)."""
CUDA_GRAPH_SCOPES: tuple[str, ...] = ("none", "layer", "full")
"""What of a step is captured in CUDA graphs and replayed: nothing (every kernel launched from Python),
each transformer layer's forward and backward (Megatron-Core's ``--cuda-graph-impl transformer_engine``),
or the whole forward and backward (Megatron-Core's ``--cuda-graph-impl full_iteration``, torchtitan 0.3's
trainer unless ``training.disable_cuda_graphs``); ``features.cuda_graph_layer`` / ``cuda_graph_full``."""
PARAM_GATHERS: tuple[str, ...] = ("bf16", "fp8")
"""The dtype data parallelism all-gathers the parameters in (``Layout.param_gather``): 16-bit, or the
job's 8-bit GEMM format (FP8 or MXFP8 with its scales)."""
MODEL_CODES: tuple[str, ...] = ("native", "huggingface", "fused", "llmfoundry")
AXES: tuple[str, ...] = ("tp", "cp", "dp", "pp")
MAX_JOB_INT = 2**31 - 1  # sequences per step and tokens per sequence: the command line's bound
MAX_TOKENS_TO_TRAIN = 1e18  # a quintillion tokens: 10,000 times the largest published runs (36 T)


def order_axes(order: str) -> list[str]:
    """The parallel axes of ``order``, innermost first."""
    return split_order(order)[0].split("-")


@dataclass(frozen=True, slots=True)
class Layout:
    """One parallel layout.

    Attributes
    ----------
    tp, pp, dp, cp : tensor, pipeline, data and context parallel degrees.
    ep : expert-parallel degree; 1 for dense models. With ``expert_tp`` (Megatron-Core's default
        expert tensor parallelism = tp) experts are sharded over the tensor-parallel group like the
        dense MLP and ``ep`` is carved from ``dp`` or, where the framework lets it span context
        parallelism, from ``cp x dp`` (``ProfileAt.ep_carve_problem``). Without it (expert tensor
        parallelism 1, Megatron-Core's "MoE parallel folding") each expert is whole on its rank and
        ``ep`` is carved from ``tp * cp * dp``: the expert group is the first ``ep`` ranks of that
        block (a multiple of ``tp * cp``), and MoE layers need no tensor-parallel collectives.
    vp : virtual pipeline stages per rank (interleaved 1F1B when > 1).
    micro_batch_size : sequences per micro-batch per data-parallel rank.
    sequence_parallel : Megatron sequence parallelism inside the tensor-parallel group.
    recompute : activation recomputation, none | selective (attention core) | full (whole layer).
    recompute_layers : with ``recompute="full"``, how many layers of each pipeline stage recompute
        (Megatron's ``--recompute-method block --recompute-num-layers``, torchtitan's layer SAC
        every k-th layer); the others keep all their activations. 0: every layer. Priced by
        ``evaluate`` and ``validate``; the search does not offer it.
    recompute_modules : with ``recompute="selective"``, the Megatron-Core submodules recomputed
        (``--recompute-modules``, from ``RECOMPUTE_MODULES``) in place of the default core attention;
        empty: the framework's own selective recomputation. Priced by ``evaluate`` and ``validate``;
        the search does not offer it.
    zero_stage : 0 plain data parallel, 1 optimizer states, 2 + gradients, 3 + parameters (FSDP).
    order : rank order from innermost to outermost axis, e.g. ``"tp-cp-dp-pp"``, with an optional
        torus traversal after ``@`` (module docstring).
    dp_overlap : overlap the gradient reduction (and ZeRO-3 gathers) with compute.
    tp_overlap : overlap tensor-parallel collectives with the GEMMs (Transformer Engine style).
    ep_overlap : overlap the expert-parallel all-to-alls of one micro-batch with the compute of
        another (Megatron-Core's ``--overlap-moe-expert-parallel-comm``, its combined 1F1B schedule).
    expert_tp : experts sharded over the tensor-parallel group (True) or whole (False, ``etp=1``).
    schedule : the pipeline schedule (:data:`PIPELINE_SCHEDULES`); "" for the one ``vp`` implies
        (:func:`default_schedule`: 1f1b at vp = 1, interleaved above), which is how every layout
        without the key runs. A schedule given equal to that default is stored as "". Priced by
        ``evaluate`` and ``validate``; the search does not offer it (``--fix`` refuses it).
    moe_dispatcher : how the expert-parallel all-to-alls move the routed tokens (:data:`MOE_DISPATCHERS`,
        ``cost.terms.comm``): ``auto`` (the default) prices a flat all-to-all inside one scale-up domain
        and DeepEP-style per-node deduplication across domains; ``alltoall`` is an NCCL all-to-all of
        every routed copy everywhere (Megatron-Core's ``--moe-token-dispatcher-type alltoall``,
        torchtitan's standard backend); ``deepep`` and ``hybridep`` send each token once to every rank
        and node that holds any of its experts (Megatron-Core's flex dispatcher with
        ``--moe-flex-dispatcher-backend deepep|hybridep``, torchtitan 0.2's ``expert_parallel_comm_backend
        deepep``, 0.3's ``moe_comm_backend`` deepep|hybridep). Priced by ``evaluate`` and ``validate``; the
        search gives each expert group the fastest the job can run (``planner.search.space``).
    offload : ``none``, ``activations``, ``optimizer`` or ``activations+optimizer`` (:data:`OFFLOAD_MODES`).
        ``activations``: what the recompute mode keeps of each layer for its backward (with ``full``, the
        layer's input) is copied to host memory in the forward and back in the backward, so device memory
        holds none of it; the copies cross the host link (``cost.terms.offload_s``). MaxText's
        ``remat_policy: custom`` with ``decoder_layer_input: offload``. Priced by ``evaluate`` and
        ``validate``; the search offers it with full recomputation where its transfers hide
        (``planner.search.space.split_spaces``). ``optimizer``: the rank's fp32 master weights, Adam
        moments and fp32 gradients live in host memory and the Adam step runs on the CPU; each step
        copies the rank's gradient shard to the host and its updated 16-bit weights back
        (``cost.terms.dp.host_optimizer_terms``). Priced by ``evaluate`` and ``validate``; the search
        offers it where ``--fix`` holds it or ``fit`` counts it, at the ZeRO stages whose copies are one
        a step (``planner.search.offload``).
    cp_comm : with cp > 1, how attention exchanges the sequence (:data:`CP_COMM_KINDS`; ``p2p``, the ring,
        by default). Priced by ``evaluate`` and ``validate``; refused where the framework lacks the kind.
    shard_across_domains : with ZeRO-3 under a framework that by default shards inside each scale-up
        domain and replicates the shards between domains (``semantics.zero3_across_domains: replicate``:
        MaxText's ICI fsdp axis and DCN data axis), shard over every data-parallel rank instead
        (MaxText's ``dcn_fsdp_parallelism``). Priced by ``evaluate`` and ``validate``; the search
        does not offer it.
    cuda_graph : ``none``, ``layer`` or ``full`` (:data:`CUDA_GRAPH_SCOPES`): the kernels replayed from CUDA
        graphs pay a graph node's share of the per-kernel launch cost (``cost.compute.graphed_device``).
        Priced by ``evaluate`` and ``validate``; the search does not offer it.
    dp_shard : the data-parallel ranks one copy of each ZeRO shard spans (hybrid sharded data
        parallelism, HSDP): 0 (the default) for the framework's own grouping (every data-parallel
        rank, or each scale-up domain's under ``semantics.zero3_across_domains: replicate``); else N,
        dividing ``dp``, with ``dp / N`` replicas of each shard. The sharded states (per
        ``zero_stage``) take ``1/N`` each; the stage's gathers and reduce-scatters run over the N
        innermost data-parallel ranks and the shard's gradients are all-reduced across the replicas
        once a step (``cost.terms.zero_replicas``). torchtitan's ``data_parallel_shard_degree``,
        MaxText's ``ici_fsdp``/``dcn_data``, Megatron-Core's ``--num-distributed-optimizer-instances``
        (``dp / N``). Priced by ``evaluate`` and ``validate`` with cp = ep = 1; the search does not offer
        it, ``--fix dp_shard=N`` holds it (``planner.search.space.hybrid_space``).
    head_slots : with pp > 1, the embedding and the output layer (LM head and loss) each take one
        layer's place when the layers are split over the pipeline ranks, so the first and the last
        rank hold one layer fewer (Megatron-Core's ``--account-for-embedding-in-pipeline-split
        --account-for-loss-in-pipeline-split``, DeepSpeed's ``partition_method='type:transformer|
        embedding'``, torchtitan's split since 2025-04). Off: ``ceil(L / (pp vp))`` layers per rank
        and the head on top of the last one's. The search tries both where the framework offers both
        (its own split, on under torchtitan, wins a tie); ``--fix`` holds one.
    param_gather : ``bf16`` or ``fp8`` (:data:`PARAM_GATHERS`): with ``fp8``, an FP8 or MXFP8 job's
        sharded data parallelism all-gathers the parameters already cast to the 8-bit format (ZeRO-3/FSDP
        gathers and the distributed optimizer's gather after the step), and the gathered copy it keeps is
        8-bit: Megatron-LM's ``--fp8-param-gather``, torchtitan's ``enable_fsdp_float8_all_gather`` with
        ``precompute_float8_dynamic_scale_for_fsdp`` (``cost.terms.gather_bytes``). Priced by ``evaluate``
        and ``validate``; the search does not offer it.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vp: int = 1
    micro_batch_size: int = 1
    sequence_parallel: bool = False
    recompute: str = "selective"
    zero_stage: int = 1
    order: str = DEFAULT_ORDER
    dp_overlap: bool = True
    tp_overlap: bool = False
    expert_tp: bool = True
    ep_overlap: bool = False
    recompute_layers: int = 0
    recompute_modules: tuple[str, ...] = ()
    head_slots: bool = False
    offload: str = "none"
    shard_across_domains: bool = False
    schedule: str = ""
    cp_comm: str = "p2p"
    moe_dispatcher: str = "auto"
    cuda_graph: str = "none"
    param_gather: str = "bf16"
    dp_shard: int = 0

    def __post_init__(self) -> None:
        if self.schedule and self.schedule == default_schedule(self.vp):
            object.__setattr__(self, "schedule", "")

    @property
    def pipeline_schedule(self) -> str:
        """The schedule the pipeline runs: ``schedule``, or the one ``vp`` implies."""
        return self.schedule or default_schedule(self.vp)

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    @property
    def traversal(self) -> str:
        """Torus axes, fastest first, that ranks walk on a slice ("" for device-id order)."""
        return split_order(self.order)[1]

    def stride(self, axis: str) -> int:
        """Distance in ranks between neighbours along ``axis`` under ``order``."""
        stride = 1
        for name in order_axes(self.order):
            if name == axis:
                return stride
            stride *= self.degree(name)
        raise ValueError(f"axis {axis} not in order {self.order}")

    def group(self, axis: str, base: int = 0) -> tuple[int, ...]:
        """Device ids of the ``axis`` communicator that contains device ``base`` (0 by default).

        With experts split like the dense MLP (``expert_tp``), the ``ep`` group is ``ep``
        consecutive positions of the context x data block (tp-strided; the first ``ep`` members of
        the data-parallel group when cp = 1) and ``edp`` (the ranks that hold the same experts) every
        ``ep``-th position of that block: Megatron-Core's expert rank generator (order
        ``tp-ep-dp-pp`` over the expert world, since 2024-11) and torchtitan's expert mesh (ep over
        cp and dp_shard, since 2025-07). Folded (``expert_tp``
        off): the ``ep`` group is the tensor- and context-parallel block times the first
        ``ep / (tp * cp)`` data-parallel ranks; ``edp`` takes every ``ep / (tp * cp)``-th
        data-parallel rank.
        """
        if axis in ("ep", "edp") and not self.expert_tp:
            inner = self.tp * self.cp
            step = max(1, self.ep // inner)
            dp = self.group("dp", base)
            if axis == "edp":
                return dp[::step]
            block = sorted(t + c for t in self.group("tp") for c in self.group("cp"))
            return tuple(sorted(d + b for d in dp[:step] for b in block))
        if axis in ("ep", "edp"):
            block = self._data_block_ranks()
            if axis == "edp":
                return tuple(base + block[j * self.ep] for j in range(self.cp * self.dp // self.ep))
            return tuple(sorted(base + block[k % len(block)] for k in range(self.ep)))
        s = self.stride(axis)
        return tuple(base + k * s for k in range(self.degree(axis)))

    def _data_block_ranks(self) -> list[int]:
        """Rank offset of each position of the context x data block, walked in the order's own
        sequence of ``cp`` and ``dp`` (``cp`` first under ``tp-cp-dp-pp``; each axis varies slower
        than the ones before it): the expert rank generator's ``ep`` then ``edp`` with expert tensor
        parallelism = tp. Listed at once (a search asks 56,000 positions)."""
        offsets = [0]
        for name in (a for a in order_axes(self.order) if a in ("cp", "dp")):
            stride = self.stride(name)
            offsets = [offset + k * stride for k in range(self.degree(name)) for offset in offsets]
        return offsets

    def as_dict(self) -> dict:
        """The fields as a Plan document's ``layout`` block; ``cuda_graph`` only where set (Plan
        documents written before the knob stay as they were)."""
        d = asdict(self)
        if d["cuda_graph"] == "none":
            del d["cuda_graph"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        """The layout of a Plan document's ``layout`` block (which adds ``num_microbatches``)."""
        fields = {k: v for k, v in d.items() if k != "num_microbatches"}
        if isinstance(fields.get("recompute_modules"), list):
            fields["recompute_modules"] = tuple(fields["recompute_modules"])
        return cls(**fields)

    def with_(self, **changes) -> "Layout":
        return replace(self, **changes)

    def short(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
            if self.cp_comm != "p2p":
                parts.append(f"cp_comm={self.cp_comm}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
            if not self.expert_tp:
                parts.append("etp=1")
            if self.moe_dispatcher != "auto":
                parts.append(f"moe_dispatcher={self.moe_dispatcher}")
        if self.vp > 1:
            parts.append(f"vp={self.vp}")
        parts += [f"mbs={self.micro_batch_size}", f"sp={'on' if self.sequence_parallel else 'off'}",
                  *recompute_words(self.recompute, self.recompute_layers, self.recompute_modules),
                  f"zero={self.zero_stage}"]
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        if self.shard_across_domains:
            parts.append("shard_across_domains=on")
        if self.cuda_graph != "none":
            parts.append(f"cuda_graph={self.cuda_graph}")
        if self.param_gather != "bf16":
            parts.append(f"param_gather={self.param_gather}")
        if self.dp_shard:
            parts.append(f"dp_shard={self.dp_shard}")
        if self.tp_overlap and self.tp > 1:
            parts.append("tp_overlap=on")
        if not self.dp_overlap and self.dp * self.cp > 1:
            parts.append("dp_overlap=off")
        if self.ep_overlap and self.ep > 1:
            parts.append("ep_overlap=on")
        if self.head_slots and self.pp > 1:
            parts.append("head_slots=on")
        if self.order != DEFAULT_ORDER:
            parts.append(f"order={self.order}")
        if self.schedule:
            parts.append(f"schedule={self.schedule}")
        return " ".join(parts)


def default_schedule(vp: int) -> str:
    """The schedule a layout without ``schedule`` runs: 1F1B, interleaved 1F1B with virtual stages."""
    return "1f1b" if vp == 1 else "interleaved"


@lru_cache(maxsize=64)
def _fp8_format(scaling: str, framework: str) -> str:
    """An FP8 job's GEMM format: ``fp8_current`` under current scaling (given, or the framework's
    default ``semantics.fp8_scaling``), else ``fp8``. Cached: the cost terms ask per op."""
    return FP8_CURRENT.name if (scaling or load_profile(framework).fp8_scaling) == "current" else "fp8"


class _ProfileSlot:
    """Where a :class:`Job` keeps its framework profile once asked (a slot outside the dataclass's
    fields: equality, hashing, ``asdict``, ``replace`` and pickling see the fields alone)."""

    __slots__ = ("_profile",)


@dataclass(frozen=True, slots=True)
class Job(_ProfileSlot):
    """The training job.

    Attributes
    ----------
    global_batch_size : sequences per optimizer step.
    seq_len : tokens per sequence.
    precision : bf16 | fp16 | fp8 | mxfp8 | nvfp4 (the low precisions run the linear layers' GEMMs
        in 8 or 4 bits, the rest in bf16: ``topologies.precisions``).
    tokens_to_train : total tokens, for time, cost and energy to train.
    grad_bytes : bytes per gradient element kept for the optimizer (4: fp32 main grads, the
        Megatron-LM default for 16-bit training).
    attention : flash (a fused kernel at the device's best: FlashAttention-3 / cuDNN on Hopper; the
        default), flash2 (FlashAttention-2 kernels, e.g. PyTorch SDPA's flash backend: 35% of peak
        on H100), flash1 (FlashAttention-1-era kernels, flash-attn 1.x or 2023's Triton ports: 0.55 of
        flash2's rate, ``cost.compute.FA1_OVER_FA2``) or unfused (scores written to memory, softmax and dropout as separate kernels:
        training stacks from before FlashAttention, e.g. Megatron-LM 2021;
        ``models.ops.unfused_attention_ops``).
    framework : the framework profile that runs the job (``cost.framework``: megatron, torchtitan,
        deepspeed, maxtext); the search offers only what it can run, overlap is priced by its mechanism.
    framework_date : the framework release, ``YYYY-MM`` ("" = the profile's own, newest release); a
        feature released later is not offered.
    reliability : failure rate, checkpoint storage bandwidth and restart time, for the goodput in
        time to train (``cost.goodput``; defaults from the Llama 3 run).
    compiled : the model runs under ``torch.compile`` (torchtitan's ``compile.enable``): autograd
        then keeps what the compiled graph needs rather than what each eager op saves (the profile's
        ``eager_activations`` no longer apply; ``cost.terms``). Measured by benchmarks/gpu_probe.py.
    model_code : whose modules implement the model: ``native`` (the framework's own: Megatron's fused
        layers, torchtitan's Llama) or ``huggingface`` (a Hugging Face transformers model class run by
        the framework, as DeepSpeed and FSDP users often do): its eager ops keep more for backward
        and run as separate kernels (``cost.terms.HF_MODEL_CODE``, ``models.ops.Kernels``); or
        ``fused`` (a model built from fused kernels, Transformer Engine layers, run by a framework
        whose own modules are eager: NeMo Automodel's TE models under the torchtitan profile); or
        ``llmfoundry`` (llm-foundry's MPT modules under Composer's FSDP, priced with the torchtitan
        profile: LayerNorm and GELU are one kernel each, and the loss is flash-attn's fused
        cross-entropy over the 16-bit logits, ``cost.terms.FUSED_LOSS_LOGIT_BYTES``).
    fp8_all_gather : an FP8 job's sharded data parallelism all-gathers the weights already cast to
        FP8, one byte each (torchao's ``enable_fsdp_float8_all_gather`` under FSDP2, its tensorwise
        recipe; ``cost.terms.gather_bytes``).
    weight_bytes : bytes per element of the parameters the optimizer updates (4: an fp32 master copy;
        2: MaxText's ``weight_dtype: bfloat16``, whose Adam moments take the same dtype, so the optimizer
        holds ``3 x weight_bytes`` per parameter: ``cost.terms.optimizer_state_bytes``).
    activation_func_fp8_input_store : SwiGLU keeps its gate and up inputs for backward in FP8, 1 B an
        element (Megatron-Core's ``--activation-func-fp8-input-store``, since 2024-04; DeepSeek-V3's
        MoE SwiGLU inputs, report s3.3.3): ``cost.terms.glu_input_bytes``.
    moment_bytes : bytes per element of each Adam moment where it differs from ``weight_bytes``
        (0: the same): 2 for moments kept in BF16 beside fp32 master weights (DeepSeek-V3's HAI-LLM,
        report s3.3.3; Megatron-Core's precision-aware optimizer, ``--exp-avg-dtype``/``--exp-avg-sq-dtype``
        bf16 since 2025-06, fp16 since 2024-12).
    fp8_scaling : an FP8 job's scaling, ``delayed`` (scales from earlier steps' amax history, one
        cast pass) or ``current`` (per-tensor amax of the tensor itself first); "" for the
        framework's default (``semantics.fp8_scaling``). Priced by ``gemm_format``.
    """

    global_batch_size: int
    seq_len: int
    precision: str = "bf16"
    tokens_to_train: float = 0.0
    grad_bytes: int = 4
    attention: str = "flash"
    framework: str = "megatron"
    framework_date: str = ""
    compiled: bool = False
    reliability: Reliability = field(default_factory=Reliability)
    model_code: str = "native"
    fp8_all_gather: bool = False
    fp8_scaling: str = ""
    weight_bytes: int = 4
    moment_bytes: int = 0
    activation_func_fp8_input_store: bool = False

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "seq_len"):  # the command line's bound (cli.POSITIVE_INT)
            check_number(f"job.{name}", getattr(self, name), 1, MAX_JOB_INT, whole=True)
        check_number("job.grad_bytes", self.grad_bytes, 1, 8, whole=True)
        check_number("job.weight_bytes", self.weight_bytes, 1, 8, whole=True)
        check_number("job.moment_bytes", self.moment_bytes, 0, 8, whole=True)
        if self.precision not in PRECISIONS:
            raise SpecError(f"job.precision: got {self.precision!r}; allowed: {', '.join(PRECISIONS)}")
        check_number("job.tokens_to_train", self.tokens_to_train, 0, MAX_TOKENS_TO_TRAIN)
        if not isinstance(self.reliability, Reliability):
            raise SpecError(f"job.reliability: got {shown(self.reliability)}; allowed: a cost.goodput.Reliability")
        if self.attention not in ATTENTION_KINDS:
            raise SpecError(f"job.attention: got {self.attention!r}; allowed: {', '.join(ATTENTION_KINDS)}")
        if self.framework not in FRAMEWORKS:
            raise SpecError(f"job.framework: got {self.framework!r}; allowed: {', '.join(FRAMEWORKS)}")
        if self.framework_date:
            parse_date(self.framework_date, "job.framework_date")
        if not isinstance(self.compiled, bool):
            raise SpecError(f"job.compiled: got {self.compiled!r}; allowed: true, false")
        if not isinstance(self.activation_func_fp8_input_store, bool):
            raise SpecError(f"job.activation_func_fp8_input_store: got {self.activation_func_fp8_input_store!r}; allowed: true, false")
        if not isinstance(self.fp8_all_gather, bool):
            raise SpecError(f"job.fp8_all_gather: got {self.fp8_all_gather!r}; allowed: true, false")
        if self.fp8_scaling not in ("", *FP8_SCALINGS):
            raise SpecError(f"job.fp8_scaling: got {self.fp8_scaling!r}; allowed: {', '.join(FP8_SCALINGS)}")
        if self.model_code not in MODEL_CODES:
            raise SpecError(f"job.model_code: got {self.model_code!r}; allowed: {', '.join(MODEL_CODES)}")
        rel = self.reliability
        for name, low, high in (("failure_rate_per_device_hour", 0.0, 1.0), ("checkpoint_bytes_per_s_per_device", 1e3, 1e13),
                                ("restart_s", 0.0, 1e6)):
            check_number(f"job.reliability.{name}", getattr(rel, name), low, high)

    @property
    def term_key(self) -> "Job":
        """The job without what no cached cost term reads (global batch, tokens to train,
        reliability): equal keys price every term alike (``cost.terms.Context``)."""
        return replace(self, global_batch_size=1, tokens_to_train=0.0, reliability=_DEFAULT_RELIABILITY)

    @property
    def profile(self) -> ProfileAt:
        """The framework profile at the job's release date (kept on the job: the cost terms ask it
        about 300,000 times a plan of DeepSeek-V3 on 576 GB200, 0.5 us each through the cache)."""
        try:
            return self._profile
        except AttributeError:
            prof = _profile_at(self.framework, self.framework_date or None, self.compiled)
            object.__setattr__(self, "_profile", prof)  # frozen: the fields; the slot is no field
            return prof

    @property
    def gemm_format(self) -> str:
        """The format the cost terms price the linear layers' GEMMs in: the precision, except an
        FP8 job with current scaling (its own or its framework's default), ``fp8_current``."""
        if self.precision != "fp8":
            return self.precision
        return _fp8_format(self.fp8_scaling, self.framework)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def one_microbatch(self, pp: int) -> bool:
        """Whether a step is one micro-batch per data-parallel replica: without pipeline parallelism
        under a framework release that does not accumulate gradients (``features.grad_accumulation``:
        torchtitan before 2025-06, MaxText before 2024-08). A pipeline's schedule splits the batch
        into its own micro-batches either way."""
        return pp == 1 and not self.profile.accumulates_gradients(self.precision)

    def microbatch_group(self, m: int, pp: int, vp: int) -> int | None:
        """:func:`microbatch_group_size` of ``m`` micro-batches under this job's framework."""
        return microbatch_group_size(m, pp, vp, self.profile.has("vp_groups"))


def microbatch_group_size(m: int, pp: int, vp: int, groups: bool) -> int | None:
    """Micro-batches an interleaved schedule runs through one model chunk before the next
    (Megatron-Core's ``microbatch_group_size_per_vp_stage``, default ``pp``): ``pp`` where ``pp``
    divides the ``m`` micro-batches or there is no interleaving; else, where the framework takes a
    group size (``groups``: Megatron-LM since 2024-11, ``--microbatch-group-size-per-virtual-pipeline-
    stage``), the smallest ``N`` in ``[pp, m]`` whose remainder ``m % N`` is 0 or at least ``pp``
    (``schedules.py`` refuses the others: the last group would stall the pipeline); None where no
    such ``N`` exists or the framework has no group size (interleaving refused)."""
    if vp == 1 or pp == 1 or m % pp == 0:
        return pp
    if not groups:
        return None
    return next((n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp), None)


def num_microbatches(job: Job, layout: Layout) -> int:
    """Micro-batches per pipeline per step: the global batch over dp x micro-batch size (at least one)."""
    return max(1, job.global_batch_size // (layout.dp * layout.micro_batch_size))


def interleaved_warmup(pp: int, vp: int, group: int | None = None, rank: int = 0) -> int:
    """Model chunks pipeline rank ``rank`` runs forward before its first backward in interleaved
    1F1B: ``2 (pp - rank - 1) + (vp - 1) N``, ``N`` the micro-batch ``group`` (default ``pp``;
    Megatron-Core's ``get_pp_rank_microbatches``, before the ``m vp`` cap)."""
    return 2 * (pp - rank - 1) + (vp - 1) * (group or pp)


def given_keys(text: str) -> set[str]:
    """The Layout fields a layout string sets (``"tp=8,zero=1"`` -> ``{"tp", "zero_stage"}``)."""
    aliases = {"mbs": "micro_batch_size", "sp": "sequence_parallel", "zero": "zero_stage",
               "micro_batch": "micro_batch_size", "recomp": "recompute", "etp": "expert_tp"}
    keys = {p.split("=", 1)[0].strip() for p in text.split(",") if "=" in p}
    return {aliases.get(k, k) for k in keys}


def parse_layout(text: str, num_devices: int | None = None) -> Layout:
    """Parse ``"tp=8,pp=8,dp=16,vp=2,mbs=1,recompute=selective,zero=1,sp=on"``.

    Missing degrees default to 1 except ``dp``, which (when ``num_devices`` is given) takes the
    devices left over. Raises :class:`SpecError` naming the bad key or value.
    """
    aliases = {"mbs": "micro_batch_size", "sp": "sequence_parallel", "zero": "zero_stage",
               "micro_batch": "micro_batch_size", "recomp": "recompute"}
    ints = {"tp", "pp", "dp", "cp", "ep", "vp", "micro_batch_size", "zero_stage", "etp", "recompute_layers", "dp_shard"}
    bools = {"sequence_parallel", "dp_overlap", "tp_overlap", "expert_tp", "ep_overlap", "head_slots",
             "shard_across_domains"}
    values: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise SpecError(f"layout: {item!r} is not key=value (e.g. tp=8,pp=4,dp=32)")
        key, raw = (x.strip() for x in item.split("=", 1))
        key = aliases.get(key, key)
        value = _parse_value(key, raw, ints, bools)
        if key in values:
            raise SpecError(f"layout: {key} is given twice ({knob_text(values[key])} and {knob_text(value)}); give it once")
        values[key] = value
    if "etp" in values:  # expert tensor parallelism: 1 (folded) or the dense tp
        etp = values.pop("etp")
        if etp != 1 and "tp" in values and etp != values["tp"]:
            raise SpecError(f"layout.etp: got {etp}; allowed: 1 (experts whole, ep carved from tp x cp x dp) "
                            f"or tp ({values['tp']}: experts sharded like the dense MLP)")
        values["expert_tp"] = etp != 1
    if "dp" not in values and num_devices:
        rest = 1
        for k in ("tp", "pp", "cp"):
            rest *= int(values.get(k, 1))
        values["dp"] = max(1, num_devices // rest)
    return Layout(**values)


_KINDS: dict[str, tuple[str, ...]] = {
    "recompute": RECOMPUTE_MODES, "schedule": PIPELINE_SCHEDULES, "offload": OFFLOAD_MODES, "param_gather": PARAM_GATHERS,
    "cuda_graph": CUDA_GRAPH_SCOPES, "cp_comm": CP_COMM_KINDS, "moe_dispatcher": MOE_DISPATCHERS,
}
"""The layout keys whose value is one of a set (``parse_layout``), with the values allowed."""


def _parse_value(key: str, raw: str, ints: set[str], bools: set[str]) -> object:
    if key in ints:
        zero_ok = key in ("zero_stage", "recompute_layers", "dp_shard")
        if not (raw.isascii() and raw.isdigit()) or int(raw) <= 0 and not zero_ok:
            raise SpecError(f"layout.{key}: got {raw!r}; must be a {'non-negative' if zero_ok else 'positive'} integer")
        return int(raw)
    if key in bools:
        if raw.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
            raise SpecError(f"layout.{key}: got {raw!r}; allowed: on, off")
        return raw.lower() in ("on", "true", "1", "yes")
    if key in _KINDS:  # a knob that names one of a set of values
        if raw not in _KINDS[key]:
            raise SpecError(f"layout.{key}: got {raw!r}; allowed: {', '.join(_KINDS[key])}")
        return raw
    if key == "order":
        return _parse_order(raw)
    if key == "recompute_modules":
        return parse_recompute_modules(raw.split("+"), "layout.recompute_modules")
    allowed = ("tp, pp, dp, cp, ep, etp, vp, mbs, sp, recompute, recompute_layers, recompute_modules, zero, order, "
               "dp_overlap, tp_overlap, ep_overlap, head_slots, offload, shard_across_domains, schedule, cp_comm, "
               "moe_dispatcher, cuda_graph, param_gather, dp_shard")
    raise SpecError(f"layout: unknown key {key!r}; allowed: {allowed}")


def recompute_words(recompute: str, layers: int = 0, modules=()) -> list[str]:
    """A layout's recomputation as ``key=value`` words, as ``--layout`` takes them."""
    return ([f"recompute={recompute}"] + ([f"recompute_layers={layers}"] if layers else [])
            + ([f"recompute_modules={'+'.join(modules)}"] if modules else []))


def recompute_text(layout: dict) -> str:
    """A layout document's recomputation in a table cell: the mode, with its module list or layer
    count where it has one (``selective:layernorm+moe_act``, ``full:8``)."""
    mods, k = layout.get("recompute_modules"), layout.get("recompute_layers")
    if mods:
        return f"{layout['recompute']}:{'+'.join(mods)}"
    return f"{layout['recompute']}:{k}" if k else layout["recompute"]


def parse_recompute_modules(names, where: str) -> tuple[str, ...]:
    """Megatron-Core submodule names (``RECOMPUTE_MODULES``), each once, in the order given."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise SpecError(f"{where}: got {names!r}; expected a list of: {', '.join(RECOMPUTE_MODULES)}")
    out = []
    for name in names:
        if name not in RECOMPUTE_MODULES:
            hint = " (the whole MoE layer is not priced)" if name == "moe" else ""
            raise SpecError(f"{where}: got {name!r}{hint}; allowed: {', '.join(RECOMPUTE_MODULES)} "
                            "(joined with + in a layout string, e.g. recompute_modules=layernorm+moe_act)")
        if name in out:
            raise SpecError(f"{where}: {name!r} is given twice")
        out.append(name)
    if not out:
        raise SpecError(f"{where}: empty; name at least one of {', '.join(RECOMPUTE_MODULES)}")
    return tuple(out)


def _parse_order(raw: str) -> str:
    """Check the syntax of an order; whether its traversal suits the cluster is checked against it
    (``cost.step.layout_problems``, ``planner.search.space.build_space``)."""
    axes, traversal = split_order(raw)
    if sorted(axes.split("-")) != sorted(AXES):
        raise SpecError(f"layout.order: got {raw!r}; a permutation of tp-cp-dp-pp, e.g. {DEFAULT_ORDER}, "
                        "optionally with a torus traversal such as @xzy")
    if TRAVERSAL_SEP in raw and (len(traversal) not in (2, 3) or sorted(traversal) != sorted(TORUS_AXES[: len(traversal)])):
        raise SpecError(f"layout.order: got {raw!r}; after @ come the torus axes, fastest first, each once: "
                        "a permutation of xy (2D tori) or xyz (3D), e.g. tp-cp-dp-pp@xzy")
    return raw


@lru_cache(maxsize=256)
def _profile_at(framework: str, date: str | None, compiled: bool) -> ProfileAt:
    """One :class:`ProfileAt` per (framework, release, compiled): the search reads a job's profile
    about a million times."""
    return load_profile(framework).at(date, compiled)
