"""A framework profile as data: the refusal rules, the :class:`Profile` of one framework release
(features by month, semantics, overlap figures) and :class:`ProfileAt`, the profile at the job's
release date: what the search and the cost terms ask of it. :mod:`cost.profile_file` reads the
profile files into these; :mod:`cost.framework` holds the questions asked across profiles."""

from __future__ import annotations

from dataclasses import dataclass, field


FLASH_LIBRARY_KERNELS = ("flash1", "flash2")  # FlashAttention's own kernels (the flash-attn package)
FLASH_LIBRARY_PLATFORMS = ("nvidia", "amd")  # flash-attn ships CUDA kernels and a ROCm port only
# What a framework's selective recomputation saves (semantics.selective_recompute): Megatron's
# checkpointed core attention, torchtitan's per-op SAC, MaxText's remat_policy minimal (the outputs
# of the matmuls without batch dimensions; cost.terms.dots_activation_bytes)
SELECTIVE_RECOMPUTE_KINDS = ("attention_core", "op_sac", "dots")
# Device families by architecture, for profiles that name an architecture (tp_overlap_families)
ARCHITECTURE_OF_FAMILY = {"nvidia-b200": "nvidia-blackwell", "nvidia-gb200": "nvidia-blackwell",
                          "nvidia-b300": "nvidia-blackwell", "nvidia-gb300": "nvidia-blackwell"}


@dataclass(frozen=True)
class Rule:
    """A combination the framework refuses: every condition in ``when`` holds, in releases before
    ``until`` (YYYY-MM; None: every release)."""

    id: str
    message: str
    source: str
    when: tuple[tuple[str, object], ...]
    until: str | None = None
    # a condition on the ZeRO stage holds without data-parallel ranks too: the framework checks the
    # configured stage, not whether it shards anything (DeepSpeed's PipelineEngine asserts stage < 2)
    without_data_parallel: bool = False

    def refuses(self, tp: int, pp: int, cp: int, ep: int, vp: int, zero_stage: int, recompute: str,
                sequence_parallel: bool, tp_overlap: bool = False, dp_overlap: bool = False,
                ep_overlap: bool = False, data_parallel: bool = True, cuda_graph: str = "none") -> bool:
        """``data_parallel``: the layout has data-parallel ranks (dp x cp > 1); without them there
        is nothing to shard or replicate, so a condition on the ZeRO stage never holds.
        ``cuda_graph``: the layout's CUDA graph scope (``Layout.cuda_graph``)."""
        values = {"pp_min": pp, "tp_min": tp, "cp_min": cp, "ep_min": ep, "vp_min": vp}
        if not data_parallel and not self.without_data_parallel and any(key == "zero_stage_in" for key, _ in self.when):
            return False
        for key, want in self.when:
            if key in values and values[key] < want:
                return False
            if key == "vp_max" and vp > want:
                return False
            if key == "zero_stage_in" and zero_stage not in want:
                return False
            if key == "recompute_in" and recompute not in want:
                return False
            if key == "sequence_parallel" and sequence_parallel != want:
                return False
            if key == "tp_overlap" and tp_overlap != want:
                return False
            if key == "dp_overlap" and dp_overlap != want:
                return False
            if key == "ep_overlap" and ep_overlap != want:
                return False
            if key == "cuda_graph_in" and cuda_graph not in want:
                return False
        return True


@dataclass(frozen=True)
class Profile:
    """One framework profile, as of ``date`` (a job may ask for an earlier release)."""

    id: str
    name: str
    version: str
    date: str
    aliases: tuple[str, ...]
    platforms: tuple[str, ...]
    since: dict = field(hash=False)  # feature -> "YYYY-MM" or None
    feature_sources: dict = field(hash=False)
    until: dict = field(default_factory=dict, hash=False)  # feature -> "YYYY-MM": the first month it no longer exists
    rules: tuple[Rule, ...] = ()
    sequence_parallel_with_tp: bool = False
    tp_overlap_families: tuple[str, ...] = ()
    tp_overlap_needs_compile: bool = False  # TP overlap runs only under torch.compile (torchtitan's async TP)
    head_slots_even: bool = False  # head_slots needs num_layers + 2 divisible over the stages (Megatron-Core)
    head_slots_moe_from: str | None = None  # before this month head_slots is refused for MoE (Megatron's aux loss check)
    head_slots_default: bool = False  # the framework's own pipeline split counts the embedding and head (torchtitan)
    # The pipeline's own rules (requires.pipeline_*): the pipelined layers split evenly over pp x vp stages,
    # the micro-batches a multiple of pp, and leading dense layers of an MoE model kept out of the
    # pipeline (MaxText's deepseek decoder), which clusterplan does not price: refused with pp > 1
    pipeline_even_split: bool = False
    pipeline_microbatches_multiple: bool = False
    pipeline_dense_layers_outside: bool = False
    # requires.pipeline_microbatches_fill_warmup: the 1F1B engine needs at least pp - 1 micro-batches
    # to fill its warm-up (nanotron's OneForwardOneBackwardPipelineEngine asserts it)
    pipeline_microbatches_fill_warmup: bool = False
    # requires.kv_heads_divisible_by_tp: tp must divide the key/value heads (no K/V replication over
    # TP ranks, nanotron's CausalSelfAttention asserts it); else tp may also be a multiple of them
    kv_heads_divisible_by_tp: bool = False
    precisions: tuple[str, ...] = ()  # requires.precisions: the training precisions it runs (empty: any)
    no_accumulation_precisions: tuple[str, ...] = ()  # requires.no_accumulation_precisions: no grad accumulation with these
    # The model kinds (MODEL_KINDS) run with FlexAttention, by release (semantics.flex_attention_history),
    # and the month context parallelism first ran with it (requires.cp_with_flex_attention_from; None: never)
    flex_attention_history: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cp_with_flex_attention_from: str | None = None
    ep_expert_tp_until: str | None = None  # requires.ep_expert_tp_until: experts split over TP with ep > 1 until this month
    # requires.ep_spans_cp_from: from this month an expert group with experts split over TP may take
    # its ranks from context x data parallelism (ep divides cp x dp), before from dp alone (None: never);
    # requires.ep_whole_cp_until: until this month such a group must hold whole cp groups (cp divides ep)
    ep_spans_cp_from: str | None = None
    ep_whole_cp_until: str | None = None
    # requires.dense_placement_from: from this month the framework builds its expert rank generator for
    # dense models too (etp = tp, ep = 1), so its rank-order checks refuse cp > 1 with pp not last
    dense_placement_from: str | None = None
    grad_bytes: int = 4
    # semantics.grad_bytes_fp16: the gradient bytes under fp16 where they differ (Megatron keeps fp16
    # main grads unless --accumulate-allreduce-grads-in-fp32; it forces fp32 only for bf16)
    grad_bytes_fp16: int | None = None
    zero2_param_gather: str | None = "per_step"
    # ZeRO-1's gradient reduction (semantics.zero1_grad_reduce): "reduce_scatter" of the full buffer to
    # the shards' owners, or "all_reduce" of it (nanotron, which then updates only its shard)
    zero1_grad_reduce: str = "reduce_scatter"
    dropout: float = 0.0
    attention: str = "flash"
    logit_bytes: float = 6.0  # bytes per logit held by the loss at its peak (semantics.logit_bytes)
    compiled_logit_bytes: float | None = None  # the same when the loss itself runs compiled
    # The same on one platform where it was measured apart (semantics.logit_bytes_by_platform: MaxText on TPU)
    logit_bytes_by_platform: dict = field(default_factory=dict, hash=False)
    # Where XLA plans the step's buffers (semantics.logits_freed_before_layers): the logits and their
    # gradient die in the head's backward, before any layer is recomputed, so the peak holds the larger
    # of the two, not both
    logits_freed_before_layers: bool = False
    compiled_loss_history: tuple[tuple[str, bool], ...] = ()  # (since YYYY-MM, loss compiled under compile)
    fsdp_with_pp: str = "sharded"  # "unsharded": FSDP keeps params and grads gathered with pp > 1 (torchtitan)
    selective_recompute: str = "attention_core"  # or "op_sac" (torchtitan's per-op SAC), "dots" (MaxText's minimal)
    recompute_none: bool = True  # a layer can keep every activation (MaxText cannot: semantics.recompute_none)
    attention_history: tuple[tuple[str, str], ...] = ()  # (since YYYY-MM, kernel): the kernel by release
    # The kernel on platforms without FlashAttention's CUDA/ROCm kernels, where the profile's kernel is
    # one of those (semantics.attention_by_platform); a platform not named runs its own fused kernel
    attention_by_platform: dict = field(default_factory=dict, hash=False)
    # The shapes the unfused attention's fused softmax takes, by release (semantics.softmax_fusion_history:
    # (since YYYY-MM, (dimension its rows per block come from, longest key length)); models.ops.softmax_fused)
    softmax_fusion_history: tuple[tuple[str, tuple[str, int]], ...] = ()
    # Pipeline sends: each TP rank sends 1/tp of the activation and the next stage all-gathers it
    # (Megatron's scatter-gather, per release in p2p_scatter_gather_history), else the whole tensor
    # unless sequence parallelism already shards it; blocking sends and receives run one after the
    # other (4 transfers per micro-batch slot, not 2 paired ones).
    p2p_scatter_gather: bool = True
    p2p_scatter_gather_history: tuple[tuple[str, bool], ...] = ()
    p2p_blocking: bool = False
    p2p_gathers_per_slot: int = 2  # TP all-gathers of scattered sends per slot (receiver fwd and bwd; DeepSpeed 3)
    # ZeRO-3 parameter fetch by release (semantics.zero3_fetch_history): "bucketed" (prefetched,
    # overlapped, one collective per layer or bucket) or "per_module_blocking" (one collective per
    # partitioned module, each waiting for the device to go idle: DeepSpeed before v0.6.0)
    zero3_fetch_history: tuple[tuple[str, str], ...] = ()
    # Host work per rank of the group around each ZeRO-3 module gather and gradient reduce-scatter,
    # by release (semantics.zero3_host_copies_history): (since YYYY-MM, (gather Python-loop copies,
    # gather list copies, reduce-scatter Python views, reduce-scatter list copies))
    zero3_host_copies_history: tuple[tuple[str, tuple[int, int, int, int]], ...] = ()
    zero3_persistence_threshold: int = 0  # parameters with fewer elements are kept whole on every rank
    # ZeRO-3 releases a module after its recomputed forward unless it is reused within this many
    # elements of other gathers (DeepSpeed's stage3_max_reuse_distance); 0: it keeps what the
    # recompute gathered for the backward (FSDP2)
    zero3_reuse_distance_numel: int = 0
    # ZeRO-3's live set of gathered weights and unreduced gradients, by release
    # (semantics.zero3_live_history): "layers" (the layer in use and the one prefetched, no full-size
    # gradient) or "module_prefetch" (module by module: the next module is prefetched only while fewer
    # than zero3_max_live_numel gathered elements are live, and a gradient larger than
    # zero3_reduce_bucket_numel is reduced whole, held until the next one arrives: DeepSpeed before v0.6.0)
    zero3_live_history: tuple[tuple[str, str], ...] = ()
    zero3_max_live_numel: int = 0
    zero3_reduce_bucket_numel: int = 0
    # Rank orders the framework lays out, by release (semantics.order_history): (since YYYY-MM,
    # orders); none: every order (the user builds the mesh)
    order_history: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # ZeRO-3 across scale-up domains: "shard" over every data-parallel rank, or "replicate" (shard
    # inside a domain, plain data parallelism between domains: MaxText's ICI fsdp / DCN data)
    zero3_across_domains: str = "shard"
    # ZeRO stages hybrid sharding (features.dp_shard, Layout.dp_shard) runs with (semantics.dp_shard_stages)
    dp_shard_stages: tuple[int, ...] = ()
    # whether plan's search offers hybrid sharding by itself where the framework has it (semantics.
    # dp_shard_searched; false: evaluate prices it and --fix holds it, as for DeepSpeed's MiCS, which
    # the pinned release no longer runs)
    dp_shard_searched: bool = True
    # Per-op SAC leaves the SDPA output unsaved from this CUDA compute capability on, by release
    # (semantics.op_sac_unsaved_attention_history: (since YYYY-MM, capability or None for none))
    op_sac_unsaved_attention_history: tuple[tuple[str, float | None], ...] = ()
    eager_activations: bool = False  # eager PyTorch modules: autograd keeps more than fused kernels (terms.activation_bytes)
    fused_rotary: bool = False  # eager modules whose rotary embedding is one fused kernel (nanotron: flash-attn's)
    # The RMSNorm kernel eager modules run, by release (semantics.eager_norm_history): (since YYYY-MM,
    # "fused" or "composite"); before the first entry, fused (models.ops.Kernels)
    eager_norm_history: tuple[tuple[str, str], ...] = ()
    # The AdamW implementation by release (semantics.optimizer_history): (since YYYY-MM, "fused" or
    # "foreach"); before the first entry, fused (cost.terms.optimizer_s)
    optimizer_history: tuple[tuple[str, str], ...] = ()
    # How each micro-batch's weight gradients join the step's accumulated gradient, by release
    # (semantics.grad_accumulation_history): (since YYYY-MM, kind of cost.terms.GRAD_ACCUMULATION_BYTES);
    # before the first entry, autograd's in-place add into .grad (cost.terms.grad_accumulation_s)
    grad_accumulation_history: tuple[tuple[str, str], ...] = ()
    kv_repeat_until: str | None = None  # GQA's K/V repeated per query head before attention until this month
    allocator_reserved_fraction: float = 0.0  # caching allocator's reserved-but-unallocated share of the peak
    # The same share where the job runs through the framework's pipeline engine (pp > 1), where that
    # engine was measured apart (semantics.allocator_reserved_fraction_pipeline: DeepSpeed's
    # PipelineEngine); None: the one share for every layout
    allocator_reserved_fraction_pipeline: float | None = None
    sharded_weight_copy: bool = True  # ZeRO-3 keeps a 16-bit copy of its weight shard (DeepSpeed; not FSDP2)
    fsdp_copies: bool = False  # FSDP2 copies around each gather and reduce-scatter on the compute stream (terms.fsdp_copy_s)
    # semantics.cuda_graph_dropless_moe: whether its CUDA graphs capture the MoE layers of a dropless
    # model (Megatron: attention only, the experts' shapes change every step: per-layer graphs are priced
    # with the MoE blocks eager, terms.context.graphs_skip_moe; a full-iteration graph is refused)
    cuda_graph_dropless_moe: bool = True
    grads_freed_between_steps: bool = False  # sharded gradients are freed after each step (zero_grad(set_to_none))
    # Activation offload (features.offload_activations, layout offload=activations): the recompute mode it
    # runs with (MaxText and DeepSpeed offload what full recomputation keeps; Megatron's --cpu-offloading
    # refuses recomputation), the largest pp it runs with (None: any), whether the host copies run
    # beside the compute (cost.terms.offload_exposed_s), and the layers it keeps on the device
    offload_recompute: str = "full"
    offload_pp_max: int | None = None
    offload_copies_overlap: bool = True
    offload_layers_kept: int = 0  # layers whose activations stay on the device (Megatron: the last)
    # the device families (prefixes) where plan's search offers the offload by itself: where published
    # runs measure it (MaxText's TPU recipes); elsewhere evaluate prices it, --fix holds it and fit
    # counts it (Bounds.offer_offload)
    offload_searched: tuple[str, ...] = ()
    # Optimizer offload (features.offload_optimizer, layout offload=optimizer): the ZeRO stages at which
    # the framework accumulates gradients in host memory, each micro-batch after the first bringing the
    # accumulated gradient back to the device and sending the sum out again (DeepSpeed ZeRO-1/2:
    # cost.terms.dp.host_optimizer_terms); elsewhere one copy per step
    optimizer_offload_host_accumulation: tuple[int, ...] = ()
    lp_grads_beside_fp32: bool = False  # 16-bit .grad tensors stay beside an fp32 accumulation buffer (DeepSpeed bf16)
    # ZeRO stages whose optimizer step copies the rank's 16-bit gradient partition into a new flat 16-bit
    # tensor and casts that to a new fp32 one while the partition is still held, by release
    # (semantics.step_grad_copies_history: (since YYYY-MM, stages); cost.terms.step_gradients_bytes)
    step_grad_copies_history: tuple[tuple[str, tuple[int, ...]], ...] = ()
    fp8_saved_inputs: bool = False  # FP8 linears keep their FP8 input copy for the weight gradient (1 B; terms.activation_bytes)
    tp_gather_quantized: bool = False  # sequence-parallel all-gathers move the low-precision copy (terms._tp_comm_s)
    lp_param_both_layouts: bool = False  # low-precision params keep a row- and a column-wise copy (terms.param_gather_bytes)
    fp8_scaling: str = "delayed"  # an FP8 job's default scaling, delayed or current (Job.gemm_format)
    nccl_runtime: bool = False  # PyTorch on CUDA/ROCm with NCCL: the CUDA context and NCCL buffers (terms.runtime_bytes)
    plan_headroom: float = 0.0  # share of device memory a plan keeps free by default (semantics.plan_headroom)
    tp_comm_sms: int | None = None
    dp_comm_sms: int | None = None
    ep_comm_sms: int | None = None
    tp_comm_share: float | None = None  # measured cost of an overlapped TP collective per second of it
    tp_comm_sm_margin: bool = False  # the overlapped TP GEMMs are launched on the SMs the comm kernels leave
    sources: dict = field(default_factory=dict, hash=False)
    notes: tuple[str, ...] = ()

    def has(self, feature: str, date: str | None = None) -> bool:
        """Whether ``feature`` exists at ``date`` (default: the profile's own release)."""
        since, until, date = self.since.get(feature), self.until.get(feature), date or self.date
        return since is not None and since <= date and (until is None or date < until)

    def at(self, date: str | None, compiled: bool = False) -> "ProfileAt":
        return ProfileAt(self, date or self.date, compiled)

    def grad_bytes_for(self, precision: str) -> int:
        """Bytes per gradient element kept for the optimizer under ``precision``: ``grad_bytes``, or
        ``grad_bytes_fp16`` for fp16 where the framework keeps them in the parameters' dtype there."""
        return self.grad_bytes_fp16 if precision == "fp16" and self.grad_bytes_fp16 else self.grad_bytes

    def describe(self, date: str | None = None) -> str:
        when = f" as of {date}" if date and date != self.date else ""
        return f"{self.id} ({self.version}{when})"


@dataclass(frozen=True)
class ProfileAt:
    """A profile at one release date: what the search and the cost terms ask."""

    profile: Profile
    date: str
    compiled: bool = False  # the job runs under torch.compile (Job.compiled)

    def has(self, feature: str) -> bool:
        return self.profile.has(feature, self.date)

    def at_compiled(self) -> "ProfileAt":
        """The same release for a job run under torch.compile."""
        return ProfileAt(self.profile, self.date, True)

    def zero_stages(self) -> tuple[int, ...]:
        return tuple(z for z in (0, 1, 2, 3) if self.has(f"zero{z}"))

    def own_split_has_head_slots(self) -> bool:
        """The framework's own pipeline split, at this release, counts the embedding and the output
        layer as a layer each (``Layout.head_slots``: torchtitan from 2025-04)."""
        return self.profile.head_slots_default and self.has("head_slots")

    def recompute_modes(self) -> tuple[str, ...]:
        return tuple(r for r in ("none", "selective", "full")
                     if self.has(f"recompute_{r}") or r == "none" and self.profile.recompute_none)

    def tp_overlap_on(self, family: str) -> bool:
        """TP overlap exists here, works on this device family, and the job runs the way it needs
        (compiled, where the profile's ``requires.tp_overlap_needs_compile`` says so)."""
        fams = self.profile.tp_overlap_families
        arch = ARCHITECTURE_OF_FAMILY.get(family, family)
        return (self.has("tp_overlap") and (not fams or family in fams or arch in fams)
                and (self.compiled or not self.profile.tp_overlap_needs_compile))

    def op_sac_saves_attention(self, compute_capability: float | None) -> bool:
        """Per-op selective checkpointing keeps the attention output on a device of this CUDA compute
        capability at this release. torchtitan ran cuDNN's SDPA first from capability 10.0 on while
        its save list named only the flash and memory-efficient SDPA ops: on Blackwell the attention
        output went unsaved and attention ran again in backward
        (``semantics.op_sac_unsaved_attention_history``)."""
        floor = self._as_of(self.profile.op_sac_unsaved_attention_history, None)
        return floor is None or compute_capability is None or compute_capability < floor

    @property
    def eager_norm_composite(self) -> bool:
        """Eager modules at this release run RMSNorm as PyTorch ops rather than a fused kernel
        (``semantics.eager_norm_history``)."""
        return self._as_of(self.profile.eager_norm_history, "fused") == "composite"

    @property
    def optimizer_kernel(self) -> str:
        """The AdamW implementation at this release: ``fused`` (one kernel per step) or ``foreach``
        (PyTorch's multi-tensor ops, one pass each; ``semantics.optimizer_history``)."""
        return self._as_of(self.profile.optimizer_history, "fused")

    @property
    def grad_accumulation(self) -> str:
        """How a micro-batch's weight gradients are added into the step's gradient at this release
        (``semantics.grad_accumulation_history``; ``cost.terms.grad_accumulation_s``)."""
        return self._as_of(self.profile.grad_accumulation_history, "autograd")

    @property
    def softmax_rule(self) -> tuple[str, int]:
        """The shapes the unfused attention's fused softmax kernel takes at this release
        (``semantics.softmax_fusion_history``, ``models.ops.Kernels.softmax_rule``); ``("", 0)``: all."""
        return self._as_of(self.profile.softmax_fusion_history, ("", 0))

    @property
    def kv_repeated(self) -> bool:
        """K and V are materialised per query head before attention (``repeat_kv``) at this release."""
        until = self.profile.kv_repeat_until
        return until is not None and self.date < until

    def logit_bytes(self, compiled: bool | None = None, platform: str | None = None) -> float:
        """Bytes per logit the loss holds at its peak: ``semantics.compiled_logit_bytes`` where the job
        runs compiled (``compiled``, by default this job's) and this release compiles the loss with the
        model (the latest ``semantics.compiled_loss_history`` entry not after the date), else the
        figure measured on ``platform`` (``semantics.logit_bytes_by_platform``), else
        ``semantics.logit_bytes``."""
        prof = self.profile
        if compiled is None:
            compiled = self.compiled
        if compiled and self._as_of(prof.compiled_loss_history, False) and prof.compiled_logit_bytes is not None:
            return prof.compiled_logit_bytes
        return prof.logit_bytes_by_platform.get(platform, prof.logit_bytes)

    @property
    def p2p_scatter_gather(self) -> bool:
        """Each TP rank sends only its 1/tp of a pipeline activation at this release
        (``semantics.p2p_scatter_gather_history``, else ``semantics.p2p_scatter_gather``)."""
        return self._as_of(self.profile.p2p_scatter_gather_history, self.profile.p2p_scatter_gather)

    @property
    def zero3_fetch(self) -> str:
        """How ZeRO-3 fetches parameters at this release (``semantics.zero3_fetch_history``)."""
        return self._as_of(self.profile.zero3_fetch_history, "bucketed")

    @property
    def zero3_live(self) -> str:
        """How ZeRO-3 holds gathered weights and unreduced gradients at this release
        (``semantics.zero3_live_history``; ``cost.terms.zero3_live_bytes``)."""
        return self._as_of(self.profile.zero3_live_history, "layers")

    @property
    def zero3_host_copies(self) -> tuple[int, int, int, int]:
        """Per rank of the group, the host work around a ZeRO-3 module gather and gradient
        reduce-scatter at this release: (gather Python-loop copies, gather list copies, reduce-scatter
        Python views, reduce-scatter list copies) (``semantics.zero3_host_copies_history``); zeros
        where the collectives use one flat buffer."""
        return self._as_of(self.profile.zero3_host_copies_history, (0, 0, 0, 0))

    @property
    def attention(self) -> str:
        """The attention kernel at this release: unfused before the framework had a fused one, then
        the kernel of the latest ``semantics.attention_history`` entry not after the date (else
        ``semantics.attention``)."""
        if not self.has("flash_attention"):
            return "unfused"
        return self._as_of(self.profile.attention_history, self.profile.attention)

    def attention_on(self, platform: str) -> str:
        """The attention kernel this release runs on ``platform`` (:func:`device_platform`): its
        :attr:`attention`, except that FlashAttention's own kernels (flash1, flash2) exist for CUDA and
        ROCm only; elsewhere the framework's port runs the device's fused attention
        (``semantics.attention_by_platform``, else ``flash``: the device catalogue's best fused kernel)."""
        kernel = self.attention
        if kernel in FLASH_LIBRARY_KERNELS and platform not in FLASH_LIBRARY_PLATFORMS:
            return self.profile.attention_by_platform.get(platform, "flash")
        return kernel

    def pipeline_split_problem(self, num_layers: int, num_dense_layers: int, pp: int, vp: int) -> str | None:
        """Why this framework's pipeline cannot split ``num_layers`` (``num_dense_layers`` of them the
        leading dense layers of an MoE model) over ``pp`` ranks of ``vp`` stages each, or None."""
        prof, name = self.profile, self.profile.describe(self.date)
        if pp == 1:
            return None
        if prof.pipeline_dense_layers_outside and num_dense_layers:
            return (f"pp={pp}: {name} pipelines the MoE layers only and runs the {num_dense_layers} leading dense "
                    "layers outside the pipeline, which clusterplan does not price; use pp=1")
        if prof.pipeline_even_split and num_layers % (pp * vp):
            fit = [d for d in range(2, num_layers + 1) if num_layers % (d * vp) == 0][:6]
            return (f"pp={pp}, vp={vp}: {name} needs the {num_layers} layers to divide evenly over pp x vp = "
                    f"{pp * vp} stages (pp x num_pipeline_repeats x num_layers_per_pipeline_stage = layers); "
                    f"pp dividing them at vp={vp}: {', '.join(map(str, fit)) or 'none'}")
        return None

    def flex_attention(self, model) -> bool:
        """This release runs ``model``'s attention with FlexAttention (``semantics.flex_attention_history``)."""
        return bool(set(self._as_of(self.profile.flex_attention_history, ())) & model_kinds(model))

    def cp_problem(self, model) -> str | None:
        """Why this release cannot run ``model`` with context parallelism, or None: it runs the model's
        attention with FlexAttention, and CP with it came later (or never)."""
        since = self.profile.cp_with_flex_attention_from
        if not self.flex_attention(model) or (since is not None and self.date >= since):
            return None
        later = f"from {since}" if since else "in no release"
        return (f"cp > 1: {self.profile.describe(self.date)} runs {model.name}'s attention with FlexAttention and "
                f"refuses context parallelism with it ('Context Parallel only supports SDPA attention'; {later})")

    def ep_splits_experts_over_tp(self) -> bool:
        """With ep > 1 this release can still split each expert over the TP ranks (expert tensor
        parallelism = tp); after ``requires.ep_expert_tp_until`` only whole experts (etp = 1)."""
        until = self.profile.ep_expert_tp_until
        return until is None or self.date < until

    def checks_dense_placement(self) -> bool:
        """This release holds dense layouts to the expert rank generator's order checks
        (``requires.dense_placement_from``; ``cost.checks.placement_problem``)."""
        since = self.profile.dense_placement_from
        return since is not None and self.date >= since

    def ep_carve_problem(self, cp: int, dp: int, ep: int) -> str | None:
        """Why this release cannot carve an expert group of ``ep`` ranks, experts split over TP like
        the dense MLP, from ``cp x dp``, or None: from ``requires.ep_spans_cp_from`` on ``ep`` divides
        ``cp x dp`` (and until ``requires.ep_whole_cp_until`` is a multiple of ``cp``), before ``dp``."""
        since, until = self.profile.ep_spans_cp_from, self.profile.ep_whole_cp_until
        if since is None or self.date < since:
            return None if dp % ep == 0 else (f"ep={ep} must divide dp={dp} (expert parallelism is carved from data "
                                              "parallelism; etp=1 carves it from tp x cp x dp)")
        if (cp * dp) % ep:
            return (f"ep={ep} must divide cp x dp = {cp}x{dp} = {cp * dp} ({self.profile.describe(self.date)} "
                    "carves expert parallelism from context and data parallelism)")
        if until is not None and self.date < until and ep % cp:
            return (f"ep={ep} must be a multiple of cp={cp} ({self.profile.describe(self.date)}: the expert "
                    f"group takes whole context-parallel groups until {until})")
        return None

    def accumulates_gradients(self, precision: str) -> bool:
        """This release accumulates gradients over micro-batches (``features.grad_accumulation``) for a
        job of ``precision`` (``requires.no_accumulation_precisions``: MaxText refuses FP8 with it)."""
        return self.has("grad_accumulation") and precision not in self.profile.no_accumulation_precisions

    def pipeline_microbatch_problem(self, pp: int, num_microbatches: int) -> str | None:
        """Why this framework's pipeline cannot run ``num_microbatches`` over ``pp`` stages, or None."""
        if pp > 1 and self.profile.pipeline_microbatches_multiple and num_microbatches % pp:
            return (f"{self.profile.describe(self.date)} needs the pipeline micro-batches to be a multiple of the "
                    f"stages: {num_microbatches} micro-batches over pp={pp}")
        if pp > 1 and self.profile.pipeline_microbatches_fill_warmup and num_microbatches < pp - 1:
            return (f"{self.profile.describe(self.date)}'s 1F1B engine needs at least pp - 1 = {pp - 1} micro-batches "
                    f"('Number of microbatches ... must be at least PP_SIZE-1'): {num_microbatches} over pp={pp}")
        return None

    def kv_heads_problem(self, model, tp: int) -> str | None:
        """Why this framework cannot split ``model``'s key/value heads over ``tp`` ranks, or None:
        frameworks that replicate a K/V head over the ranks that share it (Megatron-Core) take a tp
        that is a multiple of the heads; ``requires.kv_heads_divisible_by_tp`` does not."""
        g = model.num_kv_heads_resolved
        if not self.profile.kv_heads_divisible_by_tp or g % tp == 0:
            return None
        return (f"tp={tp}: {self.profile.describe(self.date)} needs tp to divide the {g} key/value heads of "
                f"{model.name} (it does not replicate K/V heads over TP ranks)")

    def orders(self) -> tuple[str, ...] | None:
        """The rank orders (parallel axes, innermost first) this release lays out; None: any."""
        return self._as_of(self.profile.order_history, None)

    def step_grad_copies(self, zero_stage: int) -> bool:
        """At this release the optimizer step of ``zero_stage`` copies the gradient partition twice, a
        flat 16-bit copy and its fp32 cast (``semantics.step_grad_copies_history``)."""
        return zero_stage in self._as_of(self.profile.step_grad_copies_history, ())

    def _as_of(self, history: tuple[tuple[str, object], ...], default):
        """The value of the latest ``(since YYYY-MM, value)`` entry not after this release, else ``default``."""
        values = [value for since, value in history if since <= self.date]
        return values[-1] if values else default


MODEL_KINDS = ("mla",)
"""Model families a profile names (``semantics.flex_attention_history``): ``mla``, multi-latent attention
(DeepSeek-V2/V3)."""


def model_kinds(model) -> set[str]:
    return {"mla"} if getattr(model, "mla", None) is not None else set()
