"""Framework profiles: what a training framework can run, and how it runs it.

A profile (``cost/data/frameworks/<id>.yaml``, format ``clusterplan-framework/1``) says which knobs
and combinations a framework offers and since which release (``features``, ``rules``), which
communication it overlaps and with how many SMs (``overlap``), and its defaults and memory semantics
(``semantics``). The search offers only what the profile can run at the job's framework date; the
cost terms read the overlap and semantics figures; the report and exports name the profile.

A feature is available at a date when its ``since`` month is not after that date and its ``until``
month (where the framework dropped it) is after it; ``since: null`` means the framework never offered it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from functools import lru_cache

from clusterplan.cost.orders import ORDERS, split_order
from clusterplan.models.errors import SpecError
from clusterplan.models.files import bundled_yaml
from clusterplan.topologies.precisions import FP8_SCALINGS

FORMAT = "clusterplan-framework/1"
FRAMEWORKS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "maxtext")
FEATURES: tuple[str, ...] = (
    "tp", "pp", "vp", "vp_groups", "grad_accumulation", "cp", "ep", "etp1", "sequence_parallel",
    "recompute_selective", "recompute_full", "recompute_layers", "recompute_modules", "head_slots",
    "zero0", "zero1", "zero2", "zero3", "dp_overlap", "tp_overlap", "ep_overlap", "flash_attention", "compile",
    "mxfp8", "nvfp4",
)
RULE_KEYS = ("pp_min", "tp_min", "cp_min", "ep_min", "vp_min", "vp_max", "zero_stage_in", "recompute_in",
             "sequence_parallel", "tp_overlap", "dp_overlap", "ep_overlap")
ZERO3_FETCH = ("bucketed", "per_module_blocking")
_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
PLATFORM_FAMILIES: dict[str, str] = {
    "nvidia": "nvidia-", "amd": "amd-", "gaudi": "intel-gaudi", "tpu": "google-tpu", "trainium": "aws-trainium",
    "cerebras": "cerebras-", "groq": "groq-", "graphcore": "graphcore-", "tenstorrent": "tenstorrent-",
    "dojo": "tesla-dojo", "sambanova": "sambanova-",
}
"""The software platforms frameworks run on (a profile's ``platforms``), each the device families
(``topologies/data/devices.yaml``) whose names start with its prefix: CUDA on NVIDIA GPUs, ROCm on
AMD Instinct, Intel Gaudi's SynapseAI, XLA on TPUs, AWS Neuron on Trainium, and the vendors' own stacks."""
PLATFORM_NAMES = {"nvidia": "NVIDIA GPUs (CUDA)", "amd": "AMD Instinct GPUs (ROCm)", "gaudi": "Intel Gaudi (HPU)",
                  "tpu": "Google TPUs", "trainium": "AWS Trainium (Neuron)", "cerebras": "Cerebras CS systems",
                  "groq": "Groq LPUs", "graphcore": "Graphcore IPUs", "tenstorrent": "Tenstorrent (TT-Metalium)",
                  "dojo": "Tesla Dojo", "sambanova": "SambaNova RDUs"}
FLASH_LIBRARY_KERNELS = ("flash1", "flash2")  # FlashAttention's own kernels (the flash-attn package)
FLASH_LIBRARY_PLATFORMS = ("nvidia", "amd")  # flash-attn ships CUDA kernels and a ROCm port only
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

    def refuses(self, tp: int, pp: int, cp: int, ep: int, vp: int, zero_stage: int, recompute: str,
                sequence_parallel: bool, tp_overlap: bool = False, dp_overlap: bool = False,
                ep_overlap: bool = False, data_parallel: bool = True) -> bool:
        """``data_parallel``: the layout has data-parallel ranks (dp x cp > 1); without them there
        is nothing to shard or replicate, so a condition on the ZeRO stage never holds."""
        values = {"pp_min": pp, "tp_min": tp, "cp_min": cp, "ep_min": ep, "vp_min": vp}
        if not data_parallel and any(key == "zero_stage_in" for key, _ in self.when):
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
    no_accumulation_precisions: tuple[str, ...] = ()  # requires.no_accumulation_precisions: no grad accumulation with these
    # The model kinds (MODEL_KINDS) run with FlexAttention, by release (semantics.flex_attention_history),
    # and the month context parallelism first ran with it (requires.cp_with_flex_attention_from; None: never)
    flex_attention_history: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cp_with_flex_attention_from: str | None = None
    ep_expert_tp_until: str | None = None  # requires.ep_expert_tp_until: experts split over TP with ep > 1 until this month
    grad_bytes: int = 4
    zero2_param_gather: str | None = "per_step"
    dropout: float = 0.0
    attention: str = "flash"
    logit_bytes: float = 6.0  # bytes per logit held by the loss at its peak (semantics.logit_bytes)
    compiled_logit_bytes: float | None = None  # the same when the loss itself runs compiled
    compiled_loss_history: tuple[tuple[str, bool], ...] = ()  # (since YYYY-MM, loss compiled under compile)
    fsdp_with_pp: str = "sharded"  # "unsharded": FSDP keeps params and grads gathered with pp > 1 (torchtitan)
    selective_recompute: str = "attention_core"  # or "op_sac": torchtitan's per-op selective checkpointing
    attention_history: tuple[tuple[str, str], ...] = ()  # (since YYYY-MM, kernel): the kernel by release
    # The kernel on platforms without FlashAttention's CUDA/ROCm kernels, where the profile's kernel is
    # one of those (semantics.attention_by_platform); a platform not named runs its own fused kernel
    attention_by_platform: dict = field(default_factory=dict, hash=False)
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
    # Rank orders the framework lays out, by release (semantics.order_history): (since YYYY-MM,
    # orders); none: every order (the user builds the mesh)
    order_history: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # ZeRO-3 across scale-up domains: "shard" over every data-parallel rank, or "replicate" (shard
    # inside a domain, plain data parallelism between domains: MaxText's ICI fsdp / DCN data)
    zero3_across_domains: str = "shard"
    # Per-op SAC leaves the SDPA output unsaved from this CUDA compute capability on, by release
    # (semantics.op_sac_unsaved_attention_history: (since YYYY-MM, capability or None for none))
    op_sac_unsaved_attention_history: tuple[tuple[str, float | None], ...] = ()
    eager_activations: bool = False  # eager PyTorch modules: autograd keeps more than fused kernels (terms.activation_bytes)
    # The RMSNorm kernel eager modules run, by release (semantics.eager_norm_history): (since YYYY-MM,
    # "fused" or "composite"); before the first entry, fused (models.ops.Kernels)
    eager_norm_history: tuple[tuple[str, str], ...] = ()
    # The AdamW implementation by release (semantics.optimizer_history): (since YYYY-MM, "fused" or
    # "foreach"); before the first entry, fused (cost.terms.optimizer_s)
    optimizer_history: tuple[tuple[str, str], ...] = ()
    kv_repeat_until: str | None = None  # GQA's K/V repeated per query head before attention until this month
    allocator_reserved_fraction: float = 0.0  # caching allocator's reserved-but-unallocated share of the peak
    sharded_weight_copy: bool = True  # ZeRO-3 keeps a 16-bit copy of its weight shard (DeepSpeed; not FSDP2)
    grads_freed_between_steps: bool = False  # sharded gradients are freed after each step (zero_grad(set_to_none))
    lp_grads_beside_fp32: bool = False  # 16-bit .grad tensors stay beside an fp32 accumulation buffer (DeepSpeed bf16)
    fp8_saved_inputs: bool = False  # FP8 linears keep their FP8 input copy for the weight gradient (1 B; terms.activation_bytes)
    tp_gather_quantized: bool = False  # sequence-parallel all-gathers move the low-precision copy (terms._tp_comm_s)
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
        return tuple(r for r in ("none", "selective", "full") if r == "none" or self.has(f"recompute_{r}"))

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
    def kv_repeated(self) -> bool:
        """K and V are materialised per query head before attention (``repeat_kv``) at this release."""
        until = self.profile.kv_repeat_until
        return until is not None and self.date < until

    def logit_bytes(self, compiled: bool | None = None) -> float:
        """Bytes per logit the loss holds at its peak: ``semantics.compiled_logit_bytes`` where the job
        runs compiled (``compiled``, by default this job's) and this release compiles the loss with the
        model (the latest ``semantics.compiled_loss_history`` entry not after the date), else
        ``semantics.logit_bytes``."""
        prof = self.profile
        if compiled is None:
            compiled = self.compiled
        if compiled and self._as_of(prof.compiled_loss_history, False) and prof.compiled_logit_bytes is not None:
            return prof.compiled_logit_bytes
        return prof.logit_bytes

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

    def accumulates_gradients(self, precision: str) -> bool:
        """This release accumulates gradients over micro-batches (``features.grad_accumulation``) for a
        job of ``precision`` (``requires.no_accumulation_precisions``: MaxText refuses FP8 with it)."""
        return self.has("grad_accumulation") and precision not in self.profile.no_accumulation_precisions

    def pipeline_microbatch_problem(self, pp: int, num_microbatches: int) -> str | None:
        """Why this framework's pipeline cannot run ``num_microbatches`` over ``pp`` stages, or None."""
        if pp > 1 and self.profile.pipeline_microbatches_multiple and num_microbatches % pp:
            return (f"{self.profile.describe(self.date)} needs the pipeline micro-batches to be a multiple of the "
                    f"stages: {num_microbatches} micro-batches over pp={pp}")
        return None

    def orders(self) -> tuple[str, ...] | None:
        """The rank orders (parallel axes, innermost first) this release lays out; None: any."""
        return self._as_of(self.profile.order_history, None)

    def _as_of(self, history: tuple[tuple[str, object], ...], default):
        """The value of the latest ``(since YYYY-MM, value)`` entry not after this release, else ``default``."""
        values = [value for since, value in history if since <= self.date]
        return values[-1] if values else default


def framework_domains(prof: ProfileAt, family: str) -> dict[str, tuple]:
    """The values of each knob the framework profile (at its date) does not offer in full: a knob
    missing here is unrestricted. A degree the framework lacks is held at 1."""
    out: dict[str, tuple] = {}
    for knob in ("tp", "pp", "cp", "vp", "ep"):
        if not prof.has(knob):
            out[knob] = (1,)
    if not prof.has("sequence_parallel"):
        out["sequence_parallel"] = (False,)
    out["recompute"] = prof.recompute_modes()
    if not prof.has("recompute_layers"):
        out["recompute_layers"] = (0,)
    if not prof.has("recompute_modules"):
        out["recompute_modules"] = ((),)
    if not prof.has("head_slots"):
        out["head_slots"] = (False,)
    out["zero_stage"] = prof.zero_stages()
    if not prof.has("dp_overlap"):
        out["dp_overlap"] = (False,)
    if not prof.tp_overlap_on(family):
        out["tp_overlap"] = (False,)
    if not prof.has("ep_overlap"):
        out["ep_overlap"] = (False,)
    if prof.orders() is not None:
        out["order"] = prof.orders()
    return out


def model_code_domains(job) -> dict[str, tuple]:
    """The knobs a job's model code holds: a Hugging Face transformers model class (``Job.model_code``
    huggingface) has no tensor, pipeline, context or expert parallel modules, so DeepSpeed ZeRO and
    FSDP run it data-parallel only."""
    if job.model_code != "huggingface":
        return {}
    return {"tp": (1,), "pp": (1,), "cp": (1,), "ep": (1,), "vp": (1,), "sequence_parallel": (False,)}


def unoffered(prof: ProfileAt, family: str, values: dict, folded_experts: bool = False) -> list[str]:
    """One message per knob value (``values``: knob -> value, Layout field names) the framework does not
    offer at its date, and for folded experts (etp=1) where it has no folding."""
    name = prof.profile.describe(prof.date)
    offered = framework_domains(prof, family)
    values = {k: split_order(v)[0] if k == "order" else v for k, v in values.items()}
    out = [_unoffered_message(prof, family, name, knob, value, offered[knob])
           for knob, value in values.items() if knob in offered and value not in offered[knob]]
    if folded_experts and not prof.has("etp1"):
        out.append(f"etp=1: {name} has no expert tensor parallelism 1 (MoE parallel folding)")
    return out


def _unoffered_message(prof: ProfileAt, family: str, name: str, knob: str, value, allowed: tuple) -> str:
    if knob == "tp_overlap" and not prof.compiled and prof.at_compiled().tp_overlap_on(family):
        return (f"tp_overlap=on: {name} overlaps TP (async TP) only under torch.compile; "
                "plan with --compile (the exported config then enables it)")
    return (f"{knob}={knob_text(value)}: {name} does not offer it "
            f"(allowed: {', '.join(knob_text(v) for v in allowed)})")


def knob_text(value) -> str:
    """A knob value as the CLI takes it: switches as on/off, module lists joined with + (none: the
    framework's default)."""
    if isinstance(value, tuple):
        return "+".join(value) or "default"
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def framework_refusal(prof: ProfileAt, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int, recompute: str,
                      sp: bool, tp_overlap: bool = False, dp_overlap: bool = False,
                      ep_overlap: bool = False, data_parallel: bool = True) -> str | None:
    """The message of the first profile rule that refuses this combination at the profile's
    release, or None. Frameworks whose TP always shards the sequence (torchtitan) refuse tp > 1
    without sequence parallelism. ``dp_overlap`` and ``ep_overlap`` are the knobs as they act:
    pass False where there is no data or expert parallelism. ``data_parallel``: False where the
    layout has no data-parallel ranks (dp x cp = 1): its ZeRO stage means nothing, so no rule on the
    stage applies (torchtitan's plain-DDP rules do not refuse pp = 4 on 4 devices)."""
    if prof.profile.sequence_parallel_with_tp and tp > 1 and not sp:
        return f"{prof.profile.id} shards the sequence whenever tp > 1 (sequence parallelism is always on)"
    for rule in prof.profile.rules:
        if rule.until is not None and prof.date >= rule.until:
            continue
        if rule.refuses(tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap and tp > 1, dp_overlap, ep_overlap and ep > 1,
                        data_parallel):
            return rule.message
    return None


def refuses_overlap(prof: ProfileAt, overlap: str, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int,
                    recompute: str, sp: bool, tp_overlap: bool = False) -> bool:
    """A profile rule refuses ``overlap`` (``dp_overlap`` or ``ep_overlap``) for these knobs, and
    nothing refuses them without it (DeepSpeed's ZeRO-3 before v0.6.0 on DP overlap; Megatron's EP
    overlap with full recomputation)."""
    def refusal(on: bool) -> str | None:
        return framework_refusal(prof, tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap, **{overlap: on})
    return refusal(True) is not None and refusal(False) is None


def refuses_dp_overlap(prof: ProfileAt, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int, recompute: str,
                       sp: bool, tp_overlap: bool) -> bool:
    """:func:`refuses_overlap` on DP overlap."""
    return refuses_overlap(prof, "dp_overlap", tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap)


def framework_defaults(layout, given: set[str], prof: ProfileAt, family: str):
    """``layout`` with the knobs the user did not give (``given``: Layout field names) moved to a
    value the framework offers: ZeRO to its lowest sharding stage from 1 up (MaxText: its fsdp axis),
    recomputation to the first mode it has among selective, full, none, overlap off where it has none
    or where it cannot overlap this layout's data-parallel traffic (a rule on ``dp_overlap``)."""
    offered = framework_domains(prof, family)
    changes = {}
    if "zero_stage" not in given and layout.zero_stage not in offered["zero_stage"]:
        stages = offered["zero_stage"]
        changes["zero_stage"] = next((z for z in stages if z >= 1), stages[0])
    if "recompute" not in given and layout.recompute not in offered["recompute"]:
        changes["recompute"] = next(r for r in ("selective", "full", "none") if r in offered["recompute"])
    if "dp_overlap" not in given and "dp_overlap" in offered:
        changes["dp_overlap"] = False
    elif "dp_overlap" not in given and layout.dp_overlap and layout.dp * layout.cp > 1 and refuses_dp_overlap(
            prof, layout.tp, layout.pp, layout.cp, layout.ep, layout.vp, changes.get("zero_stage", layout.zero_stage),
            changes.get("recompute", layout.recompute), layout.sequence_parallel, layout.tp_overlap):
        changes["dp_overlap"] = False  # the framework cannot overlap this layout's DP traffic
    if "sequence_parallel" not in given and prof.profile.sequence_parallel_with_tp and layout.tp > 1:
        changes["sequence_parallel"] = True
    return layout.with_(**changes) if changes else layout


def resolve_name(name: str) -> str:
    """The profile id for a name or alias (``nemo`` -> ``megatron``); :class:`SpecError` if unknown."""
    key = str(name).strip().lower()
    for fid in FRAMEWORKS:
        if key == fid or key in load_profile(fid).aliases:
            return fid
    allowed = ", ".join(FRAMEWORKS)
    raise SpecError(f"framework: got {name!r}; allowed: {allowed} (NeMo and Megatron-Bridge are megatron)")


def _zero3(sem: dict, where: str) -> dict:
    """The ZeRO-3 semantics: fetch and host work by release, sharding across domains, the
    persistence threshold and the reuse distance under which a module stays gathered."""
    return dict(
        zero3_fetch_history=_zero3_fetch(sem, where),
        zero3_host_copies_history=_zero3_copies(sem, where),
        zero3_across_domains=_choice(sem.get("zero3_across_domains", "shard"), ("shard", "replicate"),
                                     f"{where}: semantics.zero3_across_domains"),
        zero3_persistence_threshold=int(sem.get("zero3_persistence_threshold", 0)),
        zero3_reuse_distance_numel=int(sem.get("zero3_reuse_distance_numel", 0)),
    )


@lru_cache(maxsize=None)
def load_profile(framework_id: str) -> Profile:
    """Read and check one profile file."""
    if framework_id not in FRAMEWORKS:
        raise SpecError(f"framework: got {framework_id!r}; allowed: {', '.join(FRAMEWORKS)}")
    doc = copy.deepcopy(bundled_yaml("clusterplan.cost", "data", "frameworks", f"{framework_id}.yaml"))
    where = f"framework profile {framework_id}"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SpecError(f"{where}: format must be {FORMAT!r}")
    sources = doc.get("sources") or {}
    since, feature_sources, until = _features(doc.get("features") or {}, where)
    rules = _rules(doc.get("rules") or [], where)
    req = doc.get("requires") or {}
    sem = doc.get("semantics") or {}
    ov = doc.get("overlap") or {}
    date = str(doc.get("date"))
    if not _DATE.match(date):
        raise SpecError(f"{where}: date: got {date!r}; expected YYYY-MM")
    return Profile(
        id=framework_id, name=str(doc.get("name")), version=str(doc.get("version")), date=date,
        aliases=tuple(str(a).lower() for a in doc.get("aliases") or ()),
        platforms=_platforms(doc, where), since=since, until=until, feature_sources=feature_sources,
        rules=tuple(rules), **_requires(req), head_slots_default=bool(sem.get("head_slots_default", False)),
        grad_bytes=int(sem.get("grad_bytes", 4)), zero2_param_gather=sem.get("zero2_param_gather"),
        dropout=float(sem.get("dropout") or 0.0), **_attention(sem, where),
        logit_bytes=float(sem.get("logit_bytes", 6.0)), flex_attention_history=_flex_history(sem, where),
        compiled_logit_bytes=None if sem.get("compiled_logit_bytes") is None else float(sem["compiled_logit_bytes"]),
        compiled_loss_history=_history(sem, "compiled_loss_history", "compiled", bool),
        fsdp_with_pp=str(sem.get("fsdp_with_pp", "sharded")),
        eager_norm_history=_choice_history(sem, where, "eager_norm_history", "kernel", EAGER_NORMS),
        optimizer_history=_choice_history(sem, where, "optimizer_history", "kernel", OPTIMIZER_KERNELS),
        **_activations(sem, where),
        **_p2p(sem),
        **_zero3(sem, where),
        order_history=_order_history(sem, where),
        allocator_reserved_fraction=_fraction(sem.get("allocator_reserved_fraction", 0.0),
                                              f"{where}: semantics.allocator_reserved_fraction"),
        plan_headroom=_fraction(sem.get("plan_headroom", 0.0), f"{where}: semantics.plan_headroom"),
        sharded_weight_copy=bool(sem.get("sharded_weight_copy", True)),
        grads_freed_between_steps=bool(sem.get("grads_freed_between_steps", False)),
        lp_grads_beside_fp32=bool(sem.get("lp_grads_beside_fp32", False)),
        nccl_runtime=bool(sem.get("nccl_runtime", False)),
        fp8_saved_inputs=bool(sem.get("fp8_saved_inputs", False)),
        tp_gather_quantized=bool(sem.get("tp_gather_quantized", False)),
        fp8_scaling=_choice(sem.get("fp8_scaling", "delayed"), FP8_SCALINGS, f"{where}: semantics.fp8_scaling"),
        tp_comm_sms=ov.get("tp_comm_sms"), dp_comm_sms=ov.get("dp_comm_sms"), ep_comm_sms=ov.get("ep_comm_sms"),
        tp_comm_share=None if ov.get("tp_comm_share") is None else _fraction(ov["tp_comm_share"], f"{where}: overlap.tp_comm_share"),
        tp_comm_sm_margin=bool(ov.get("tp_comm_sm_margin", False)),
        sources=sources, notes=tuple(doc.get("notes") or ()),
    )


def _requires(req: dict) -> dict:
    """The profile's ``requires`` section: what a knob needs beside it."""
    return {"sequence_parallel_with_tp": bool(req.get("sequence_parallel_with_tp", False)),
            "tp_overlap_families": tuple(req.get("tp_overlap_families") or ()),
            "tp_overlap_needs_compile": bool(req.get("tp_overlap_needs_compile", False)),
            "head_slots_even": bool(req.get("head_slots_even", False)),
            **{k: bool(req.get(k, False)) for k in ("pipeline_even_split", "pipeline_microbatches_multiple",
                                                    "pipeline_dense_layers_outside")},
            "no_accumulation_precisions": tuple(req.get("no_accumulation_precisions") or ()),
            "cp_with_flex_attention_from": parse_date(req.get("cp_with_flex_attention_from"),
                                                      "requires.cp_with_flex_attention_from"),
            "ep_expert_tp_until": parse_date(req.get("ep_expert_tp_until"), "requires.ep_expert_tp_until"),
            "head_slots_moe_from": parse_date(req.get("head_slots_moe_from"), "requires.head_slots_moe_from")}


def _history(sem: dict, key: str, field: str, cast) -> tuple[tuple[str, object], ...]:
    """A ``semantics`` list of ``{since: YYYY-MM, field: value}`` entries as ``(since, value)`` pairs."""
    return tuple((str(e["since"]), cast(e[field])) for e in sem.get(key) or ())


EAGER_NORMS = ("fused", "composite")
OPTIMIZER_KERNELS = ("fused", "foreach")


def _choice_history(sem: dict, where: str, key: str, field: str, allowed: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """A ``semantics`` history whose values are names from ``allowed``, each entry checked."""
    history = _history(sem, key, field, str)
    for since, value in history:
        if value not in allowed:
            raise SpecError(f"{where}: semantics.{key}: got {value!r}; allowed: {', '.join(allowed)}")
        parse_date(since, f"{where}: semantics.{key}.since")
    return history


def _zero3_fetch(sem: dict, where: str) -> tuple[tuple[str, str], ...]:
    return _choice_history(sem, where, "zero3_fetch_history", "fetch", ZERO3_FETCH)


ZERO3_COPY_FIELDS = ("gather_python", "gather_list", "scatter_python", "scatter_list")


def _zero3_copies(sem: dict, where: str) -> tuple[tuple[str, tuple[int, int, int, int]], ...]:
    """``semantics.zero3_host_copies_history``: ``{since, gather_python, gather_list,
    scatter_python, scatter_list}`` entries, non-negative integers (the gather fields required, the
    scatter fields default to 0)."""
    out = []
    for entry in sem.get("zero3_host_copies_history") or ():
        key = f"{where}: semantics.zero3_host_copies_history"
        since = str(entry.get("since"))
        parse_date(since, f"{key}.since")
        counts = []
        for name in ZERO3_COPY_FIELDS:
            value = entry.get(name, 0 if name.startswith("scatter") else None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{key}.{name}: got {value!r}; allowed: a non-negative integer")
            counts.append(value)
        out.append((since, tuple(counts)))
    return tuple(out)


def _activations(sem: dict, where: str) -> dict:
    """What the framework's modules keep for backward (``Profile.selective_recompute`` and the rest)."""
    return dict(selective_recompute=str(sem.get("selective_recompute", "attention_core")),
                eager_activations=bool(sem.get("eager_activations", False)),
                kv_repeat_until=parse_date(sem.get("kv_repeat_until"), f"{where}: semantics.kv_repeat_until"),
                op_sac_unsaved_attention_history=_history(sem, "op_sac_unsaved_attention_history",
                                                          "min_compute_capability",
                                                          lambda v: None if v is None else float(v)))


def _p2p(sem: dict) -> dict:
    """The pipeline-send semantics of a profile (``Profile.p2p_*``)."""
    return dict(p2p_scatter_gather=bool(sem.get("p2p_scatter_gather", True)),
                p2p_scatter_gather_history=_history(sem, "p2p_scatter_gather_history", "enabled", bool),
                p2p_blocking=bool(sem.get("p2p_blocking", False)),
                p2p_gathers_per_slot=int(sem.get("p2p_gathers_per_slot", 2)))


def _order_history(sem: dict, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    history = _history(sem, "order_history", "orders", tuple)
    for since, orders in history:
        parse_date(since, f"{where}: semantics.order_history.since")
        bad = [o for o in orders if o not in ORDERS]
        if bad or not orders:
            raise SpecError(f"{where}: semantics.order_history: got {list(orders)!r}; allowed: {', '.join(ORDERS)}")
    return history


def _features(features: dict, where: str) -> tuple[dict[str, str | None], dict[str, str | None], dict[str, str]]:
    """The month each feature arrived (None: never), its source, and the month it went (``until``,
    where the framework dropped it)."""
    since, feature_sources, until = {}, {}, {}
    for name in FEATURES:
        entry = features.get(name)
        if not isinstance(entry, dict) or "since" not in entry:
            raise SpecError(f"{where}: features.{name} needs a 'since' (YYYY-MM or null)")
        value = entry["since"]
        if value is not None and not _DATE.match(str(value)):
            raise SpecError(f"{where}: features.{name}.since: got {value!r}; expected YYYY-MM or null")
        since[name] = None if value is None else str(value)
        feature_sources[name] = entry.get("source")
        if entry.get("until") is not None:
            until[name] = parse_date(entry["until"], f"{where}: features.{name}.until")
    return since, feature_sources, until


def _rules(raw_rules: list, where: str) -> list[Rule]:
    """The knob combinations the framework refuses, each with its conditions and source."""
    rules = []
    for raw in raw_rules:
        when = raw.get("when") or {}
        unknown = set(when) - set(RULE_KEYS)
        if unknown:
            raise SpecError(f"{where}: rule {raw.get('id')}: unknown condition(s) {sorted(unknown)}; allowed: {RULE_KEYS}")
        frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in when.items())
        until = parse_date(raw.get("until"), f"{where}: rule {raw.get('id')}: until")
        rules.append(Rule(str(raw.get("id")), str(raw.get("message", "")), str(raw.get("source", "")), frozen, until))
    return rules


def _choice(value, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise SpecError(f"{where}: got {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _fraction(value, where: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: got {value!r}; expected a number from 0 to 1") from None
    if not 0.0 <= x < 1.0:
        raise SpecError(f"{where}: got {value!r}; allowed: 0 <= value < 1")
    return x


MODEL_KINDS = ("mla",)
"""Model families a profile names (``semantics.flex_attention_history``): ``mla``, multi-latent attention
(DeepSeek-V2/V3)."""


def model_kinds(model) -> set[str]:
    return {"mla"} if getattr(model, "mla", None) is not None else set()


def model_domains(prof: ProfileAt, model) -> dict[str, tuple]:
    """Knob values the framework lacks for this model at its release (cp held at 1: :meth:`ProfileAt.cp_problem`)."""
    return {"cp": (1,)} if prof.cp_problem(model) else {}


def _flex_history(sem: dict, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    history = _history(sem, "flex_attention_history", "models", tuple)
    for since, kinds in history:
        parse_date(since, f"{where}: semantics.flex_attention_history.since")
        for kind in kinds:
            _choice(kind, MODEL_KINDS, f"{where}: semantics.flex_attention_history.models")
    return history


def _attention(sem: dict, where: str) -> dict:
    """The attention kernel (``semantics.attention``), by release (``attention_history``) and on platforms
    without FlashAttention's kernels (``attention_by_platform``: platform -> kernel, both checked)."""
    from clusterplan.models.ops import ATTENTION_KINDS

    table = sem.get("attention_by_platform") or {}
    for platform, kernel in table.items():
        _choice(platform, tuple(PLATFORM_FAMILIES), f"{where}: semantics.attention_by_platform")
        _choice(kernel, ATTENTION_KINDS, f"{where}: semantics.attention_by_platform.{platform}")
    return dict(attention=str(sem.get("attention", "flash")),
                attention_history=_history(sem, "attention_history", "kernel", str), attention_by_platform=dict(table))


def _platforms(doc: dict, where: str) -> tuple[str, ...]:
    """The profile's ``platforms``: names from :data:`PLATFORM_FAMILIES`, at least one."""
    platforms = tuple(doc.get("platforms") or ())
    if not platforms:
        raise SpecError(f"{where}: platforms: name at least one of {', '.join(PLATFORM_FAMILIES)}")
    for name in platforms:
        _choice(name, tuple(PLATFORM_FAMILIES), f"{where}: platforms")
    return platforms


def device_platform(device) -> str:
    """The platform (:data:`PLATFORM_FAMILIES`) of a device (anything with a ``family``: a
    :class:`topologies.devices.DeviceSpec`); a family no platform names is its own (a user's device
    file may name any family)."""
    for name, prefix in PLATFORM_FAMILIES.items():
        if device.family.startswith(prefix):
            return name
    return device.family


def platform_name(platform: str) -> str:
    return PLATFORM_NAMES.get(platform, platform)


def frameworks_on(platform: str) -> tuple[str, ...]:
    """The framework profiles that run on ``platform``."""
    return tuple(f for f in FRAMEWORKS if platform in load_profile(f).platforms)


def check_platform(framework: str, device, name: str = "--framework", export: bool = False) -> None:
    """:class:`SpecError` when ``framework`` does not run on ``device`` (anything with an ``id`` and a
    ``family``) by its profile's ``platforms``, naming the framework, the device and the frameworks
    that do run there. ``name``: how the caller spells the field (``--framework``, ``export --format
    F``); ``export``: the fix an export needs (another format) rather than a plan's."""
    platform = device_platform(device)
    prof = load_profile(framework)
    if platform in prof.platforms:
        return
    others = frameworks_on(platform)
    if export:
        fix = (f"use --format {' or '.join(others)}" if others else
               "no framework clusterplan exports for runs there: use the vendor's own launcher")
    else:
        fix = (f"use --framework {' or '.join(others)}" if others else
               "no framework profile runs there: plan without --framework (megatron's profile then stands in, "
               "unvalidated) and use the vendor's own launcher")
    raise SpecError(f"{name}: {framework} does not run on {device.id} ({platform_name(platform)}); {framework} runs on "
                    f"{', '.join(platform_name(p) for p in prof.platforms)}; {fix}")


def default_framework(platform: str) -> str:
    """``maxtext`` on TPU, ``megatron`` elsewhere (DESIGN.md)."""
    return "maxtext" if platform == "tpu" else "megatron"


def parse_date(value: str | None, where: str = "framework date") -> str | None:
    """``"2021-04"`` or ``"2021-04-12"`` -> ``"2021-04"``; None stays None."""
    if value is None:
        return None
    text = str(value).strip()[:7]
    if not _DATE.match(text):
        raise SpecError(f"{where}: got {value!r}; expected YYYY-MM (the month of the framework release)")
    return text
