"""Which layouts a job can run: ``layout_problems`` lists what is wrong with one (its degrees against
the model and the cluster, its batch, its knobs against each other and against the framework at the
job's release), each as ``(category, message)``; ``evaluate`` prices a layout without asking."""

from __future__ import annotations

import math

from clusterplan.cost.framework import framework_refusal, model_code_domains, unoffered
from clusterplan.cost.layout import (CP_COMM_KINDS, CUDA_GRAPH_SCOPES, OFFLOAD_MODES, PARAM_GATHERS, PIPELINE_SCHEDULES,
                                      RECOMPUTE_MODES, SCHEDULE_CHUNKS, Job, Layout, offloads_activations, offloads_optimizer,
                                      num_microbatches, order_axes, parse_recompute_modules)
from clusterplan.cost.step import host_offload_problem
from clusterplan.cost.terms import Context, cp_a2a_size, cp_heads_split, host_tier, layers_on_stage, stage_slots
from clusterplan.cost.terms.context import graphs_skip_moe
from clusterplan.models.errors import SpecError
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster


def layout_problems(model: ModelSpec, job: Job, cluster: Cluster, layout: Layout) -> list[tuple[str, str]]:
    """Structural reasons a layout cannot run, as ``(reason_key, message)`` pairs; empty if valid."""
    problems: list[tuple[str, str]] = []

    def bad(key: str, message: str) -> None:
        problems.append((key, message))

    n = layout.num_devices
    if n != cluster.num_devices:
        bad("device_count", f"tp*pp*dp*cp = {layout.tp}*{layout.pp}*{layout.dp}*{layout.cp} = {n}, "
            f"but the cluster has {cluster.num_devices} devices")
    g = model.num_kv_heads_resolved
    if model.num_attention_heads % layout.tp:
        bad("heads", f"num_attention_heads={model.num_attention_heads} is not divisible by tp={layout.tp}")
    elif g % layout.tp and layout.tp % g:
        bad("heads", f"num_kv_heads={g} and tp={layout.tp}: one must divide the other")
    _batch_problems(model, job, layout, bad)
    if layout.cp > 1 and job.seq_len % (2 * layout.cp):
        bad("context", f"seq_len={job.seq_len} is not divisible by 2*cp = {2 * layout.cp} (load-balanced causal chunks)")
    _moe_problems(model, job, layout, bad)
    if placement := _placement(job, layout):
        bad("placement", placement)
    if layout.recompute not in RECOMPUTE_MODES:
        bad("recompute", f"recompute={layout.recompute!r}; allowed: {', '.join(RECOMPUTE_MODES)}")
    if layout.zero_stage not in (0, 1, 2, 3):
        bad("zero", f"zero_stage={layout.zero_stage}; allowed: 0, 1, 2, 3")
    _partial_recompute_problems(model, layout, bad)
    _offload_problems(job, cluster, layout, bad)
    _cp_comm_problems(model, cluster, layout, bad)
    _cuda_graph_problems(cluster, layout, bad)
    if graph := full_graph_problem(model, job.profile.profile, layout.cuda_graph):
        bad("cuda_graph", graph)
    _param_gather_problems(job, cluster, layout, bad)
    _dp_shard_problems(job, layout, bad)
    _head_slot_problems(model, job, layout, bad)
    _schedule_problems(layout, num_microbatches(job, layout), job.profile, bad)
    _model_code_problems(job, layout, bad)
    if layout.sequence_parallel and layout.tp == 1:
        bad("sequence_parallel", "sequence_parallel needs tp > 1")
    elif layout.sequence_parallel and (job.seq_len // layout.cp) % layout.tp:
        bad("sequence_parallel", f"sequence_parallel splits each sequence over the tp ranks: seq_len/cp = "
            f"{job.seq_len}/{layout.cp} is not divisible by tp={layout.tp}")
    _framework_problems(model, job, cluster, layout, bad)
    traversal_problem = cluster.traversal_problem(layout.traversal)
    if traversal_problem:
        bad("traversal", f"order={layout.order}: {traversal_problem}")
    host = None if problems or layout.offload == "none" else host_offload_problem(Context(model, job, cluster), layout)
    if host:
        bad("offload", host)
    return problems


def _placement(job: Job, layout: Layout) -> str | None:
    return placement_problem(layout.tp, layout.pp, layout.cp, layout.ep, layout.expert_tp, layout.order,
                             job.profile.checks_dense_placement())


def _batch_problems(model: ModelSpec, job: Job, layout: Layout, bad) -> None:
    """The global batch over dp x micro-batch, gradient accumulation, layers and interleaving."""
    m = num_microbatches(job, layout)
    if job.global_batch_size % (layout.dp * layout.micro_batch_size):
        bad("batch", f"global_batch_size={job.global_batch_size} is not divisible by "
            f"dp*micro_batch_size = {layout.dp}*{layout.micro_batch_size}")
    elif job.one_microbatch(layout.pp) and job.global_batch_size != layout.dp * layout.micro_batch_size:
        release = job.profile.profile.describe(job.profile.date)
        bad("batch", f"{m} micro-batches a step: {release} does not accumulate "
            f"gradients, so without pipeline parallelism a step is one micro-batch: micro_batch_size = "
            f"global_batch_size / dp = {job.global_batch_size}/{layout.dp}")
    slots = stage_slots(model.num_layers, layout.pp, layout.head_slots)  # head_slot_problem checks the rest
    if layout.pp * layout.vp > slots:
        bad("layers", f"pp*vp = {layout.pp * layout.vp} exceeds num_layers={model.num_layers}"
            + (" + the embedding and head slots" if slots > model.num_layers else ""))
    if layout.vp > 1 and layout.pp == 1:
        bad("interleave", f"vp={layout.vp} needs pp > 1")
    if layout.vp > 1 and layout.pp > 1 and job.microbatch_group(m, layout.pp, layout.vp) is None:
        bad("interleave", f"interleaved 1F1B with {m} micro-batches and pp={layout.pp}: "
            + (f"needs at least pp micro-batches ({job.framework} groups them per model chunk)"
               if job.profile.has("vp_groups") else f"needs the micro-batch count divisible by pp ({job.framework})"))


def _schedule_problems(layout: Layout, m: int, prof, bad) -> None:
    """What a pipeline schedule given by name needs (``Layout.schedule``): a pipeline; its chunks per
    rank (1F1B and DualPipe one, the V shapes two, interleaved and looped several); DualPipe an even
    pp (its ranks pair up, rank r with pp - 1 - r) and an even micro-batch count of at least 2 pp
    (half enter at each end: deepseek-ai/DualPipe dualpipe.py ``step`` asserts both)."""
    s = layout.schedule
    if not s:
        return
    if s not in PIPELINE_SCHEDULES:
        bad("schedule", f"schedule={s!r}; allowed: {', '.join(PIPELINE_SCHEDULES)}")
        return
    if layout.pp == 1:
        bad("schedule", f"schedule={s} needs pp > 1 (a pipeline to schedule)")
        return
    chunks = SCHEDULE_CHUNKS.get(s)
    if chunks and layout.vp != chunks:
        bad("schedule", f"schedule={s} runs {chunks} chunks per rank in a V: needs vp={chunks} (got vp={layout.vp})")
    elif s in ("1f1b", "dualpipe") and layout.vp > 1:
        bad("schedule", f"schedule={s} runs one chunk per rank: needs vp=1 (got vp={layout.vp})")
    elif s in ("interleaved", "looped") and layout.vp == 1:
        bad("schedule", f"schedule={s} runs several chunks per rank: needs vp > 1")
    if s == "zb1p" and layout.vp == 1 and prof.has("schedule_zb1p") and not prof.has("schedule_zbh1"):
        bad("framework", f"schedule=zb1p with vp=1: {prof.profile.describe(prof.date)} runs zero bubble with several "
                         "stages per rank only (interleaved zero bubble): set vp >= 2, or schedule=zbv")
    if s == "dualpipe" and (layout.pp % 2 or m % 2 or m < 2 * layout.pp):
        bad("schedule", f"schedule=dualpipe pairs rank r with rank pp - 1 - r and feeds half the micro-batches from "
                        f"each end: needs an even pp and an even micro-batch count of at least 2 pp "
                        f"(got pp={layout.pp}, {m} micro-batches)")


def _model_code_problems(job: Job, layout: Layout, bad) -> None:
    held = model_code_domains(job)
    over = [f"{k}={getattr(layout, k)}" for k, allowed in held.items() if getattr(layout, k) not in allowed]
    if over:
        bad("model_code", f"model_code=huggingface: a transformers model class runs data-parallel only (DeepSpeed "
            f"ZeRO or FSDP); got {', '.join(over)}")


def _partial_recompute_problems(model: ModelSpec, layout: Layout, bad) -> None:
    k = layout.recompute_layers
    stage = layers_on_stage(model.num_layers, layout.pp, layout.vp)  # what the pricing divides by
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        bad("recompute", f"recompute_layers={k!r}; must be an integer >= 0 (0: every layer)")
    elif k and layout.recompute != "full":
        bad("recompute", f"recompute_layers={k} needs recompute=full (got recompute={layout.recompute})")
    elif k > stage:
        bad("recompute", f"recompute_layers={k} exceeds the {stage} layers of a pipeline stage")
    _recompute_module_problems(model, layout, bad)


def _offload_problems(job: Job, cluster: Cluster, layout: Layout, bad) -> None:
    """``offload`` names a mode (``OFFLOAD_MODES``), and offloading needs the device's host-memory
    tier with its bandwidth (``cost.terms.host_tier``) to price the copies, and the recompute mode and
    pipeline depth the framework's offload runs with (``semantics.offload_recompute``, ``offload_pp_max``)."""
    if layout.offload not in OFFLOAD_MODES:
        bad("offload", f"offload={layout.offload!r}; allowed: {', '.join(OFFLOAD_MODES)}")
        return
    if layout.offload != "none" and host_tier(cluster.device) is None:
        bad("offload", f"offload={layout.offload}: {cluster.device.name} has no host memory tier with a bandwidth "
            "in the device catalogue (memory_tiers: host), so the copies cannot be priced")
    if offloads_optimizer(layout.offload):
        _optimizer_offload_problems(job, cluster, layout, bad)
    prof = job.profile
    if not offloads_activations(layout.offload) or not prof.has("offload_activations"):
        return  # unoffered() names a framework without it
    sem, since = prof.profile, prof.profile.since.get("offload_activations")
    knob = f"{prof.profile.describe(prof.date)}: offload={layout.offload} (since {since})"
    if layout.recompute != sem.offload_recompute and layout.recompute in RECOMPUTE_MODES:
        bad("framework", f"{knob} runs with recompute={sem.offload_recompute} only; got recompute={layout.recompute}")
    if sem.offload_pp_max is not None and layout.pp > sem.offload_pp_max:
        bad("framework", f"{knob} runs with pp <= {sem.offload_pp_max} only; got pp={layout.pp}")


def _optimizer_offload_problems(job: Job, cluster: Cluster, layout: Layout, bad) -> None:
    """Optimizer offload steps the rank's optimizer shard on the CPU: it needs the host memory's
    bandwidth to price that step (``memory_tiers: host`` ``dram_gbyte_per_s``), a sharded optimizer
    (DeepSpeed's ``offload_optimizer`` is a ZeRO stage 1-3 option; Megatron-Core's
    ``--optimizer-cpu-offload`` asserts ``--use-precision-aware-optimizer``, which needs the distributed
    optimizer), and 16-bit parameter gathers (Megatron-Core asserts ``--fp8-recipe delayed`` with FP8
    gathers; clusterplan does not price the two together). The framework's release: ``unoffered``."""
    tier = host_tier(cluster.device)
    if tier is not None and not tier.dram_bytes_per_s:
        bad("offload", f"offload={layout.offload}: {cluster.device.name}'s host memory tier has no bandwidth of its own "
            "in the device catalogue (memory_tiers: host, dram_gbyte_per_s), so the CPU optimizer step cannot be priced")
    if layout.zero_stage == 0:
        bad("offload", f"offload={layout.offload} needs a sharded optimizer (zero_stage 1, 2 or 3: DeepSpeed's "
            "ZeRO-Offload, Megatron-Core's distributed optimizer); got zero_stage=0")
    if layout.param_gather != "bf16":
        bad("offload", f"offload={layout.offload} with param_gather={layout.param_gather} is not priced (Megatron-Core "
            "runs it with --fp8-recipe delayed only); use param_gather=bf16")


def _cp_comm_problems(model: ModelSpec, cluster: Cluster, layout: Layout, bad) -> None:
    """``cp_comm`` names a kind (``CP_COMM_KINDS``), and the all-to-all kinds split each tensor-parallel
    rank's query and key/value heads over their all-to-all group (Transformer Engine asserts "The number
    of attention heads needs to be divisible by CP size!")."""
    if layout.cp_comm not in CP_COMM_KINDS:
        bad("context", f"cp_comm={layout.cp_comm!r}; allowed: {', '.join(CP_COMM_KINDS)}")
        return
    k = cp_a2a_size(layout.cp_comm, layout.cp, layout.stride("cp"), cluster.domain_size)
    if not cp_heads_split(model, layout.tp, k):
        heads, kv = model.num_attention_heads // layout.tp, max(1, model.num_kv_heads_resolved // layout.tp)
        bad("context", f"cp_comm={layout.cp_comm}: the all-to-all over {k} context-parallel ranks splits the heads of "
            f"each tensor-parallel rank ({heads} query, {kv} key/value heads at tp={layout.tp}); both must be "
            f"divisible by {k}")


def full_graph_problem(model: ModelSpec, profile, scope: str) -> str | None:
    """Why the framework cannot replay this model's step as one CUDA graph, or None: a dropless MoE
    block's shapes change every step, so where the framework's graphs capture only the attention
    (:func:`cost.terms.context.graphs_skip_moe`) a full-iteration graph does not capture."""
    if scope != "full" or not graphs_skip_moe(model, profile):
        return None
    return (f"cuda_graph=full: {profile.name} cannot capture a dropless MoE layer in a graph (its "
            "experts' token counts change every step: Megatron-LM's MoE README, 'CUDA Graph'); use cuda_graph=layer "
            "(the attention graphed, --cuda-graph-modules attn) or a capacity factor (moe.capacity_factor)")


def _cuda_graph_problems(cluster: Cluster, layout: Layout, bad) -> None:
    """``cuda_graph`` names a scope (``CUDA_GRAPH_SCOPES``), and graphs need CUDA: the frameworks that
    capture them (Megatron-Core, torchtitan) do so on NVIDIA GPUs only (torchtitan's
    ``wrap_with_cuda_graph`` skips ROCm)."""
    if layout.cuda_graph not in CUDA_GRAPH_SCOPES:
        bad("cuda_graph", f"cuda_graph={layout.cuda_graph!r}; allowed: {', '.join(CUDA_GRAPH_SCOPES)}")
    elif layout.cuda_graph != "none" and not cluster.device.family.startswith("nvidia-"):
        bad("cuda_graph", f"cuda_graph={layout.cuda_graph}: CUDA graphs run on NVIDIA GPUs only, "
            f"not on {cluster.device.name} ({cluster.device.vendor}); use cuda_graph=none")


def _param_gather_problems(job: Job, cluster: Cluster, layout: Layout, bad) -> None:
    if layout.param_gather not in PARAM_GATHERS:
        bad("param_gather", f"param_gather={layout.param_gather!r}; allowed: {', '.join(PARAM_GATHERS)}")
    elif layout.param_gather != "bf16" and layout.zero_stage == 0:
        bad("param_gather", "param_gather=fp8 needs a sharded parameter all-gather (zero >= 1: the distributed "
            "optimizer or FSDP); zero=0 all-reduces gradients and gathers no parameters")
    elif problem := param_gather_problem(job, cluster, layout.param_gather):
        bad("framework" if problem.startswith(job.framework) else "param_gather", f"param_gather=fp8 {problem}")


def param_gather_problem(job: Job, cluster: Cluster, param_gather: str) -> str | None:
    """Why the job cannot gather its parameters in ``param_gather`` (``Layout.param_gather``), or None:
    ``fp8`` gathers them in the job's 8-bit GEMM format, so it needs an FP8 or MXFP8 job on a device
    that runs the format and the framework's gather at its release (``features.fp8_param_gather`` /
    ``mxfp8_param_gather``). The message follows ``param_gather=fp8``."""
    if param_gather == "bf16":
        return None
    fmt = job.precision if job.precision in ("fp8", "mxfp8") else None
    if fmt is None:
        return f"gathers the weights in the job's 8-bit GEMM format: needs precision fp8 or mxfp8 (got {job.precision})"
    if not cluster.device.supports(fmt):
        return f"needs a device that runs {fmt}: {cluster.device.name} does not"
    prof = job.profile
    if prof.has(f"{fmt}_param_gather"):
        return None
    since, until = prof.profile.since.get(f"{fmt}_param_gather"), prof.profile.until.get(f"{fmt}_param_gather")
    when = "never offered" if since is None else f"offered from {since}" + (f" until {until}" if until else "")
    return f"with precision={fmt}: {prof.profile.describe(prof.date)} has no {fmt} parameter all-gather ({when})"


def _dp_shard_problems(job: Job, layout: Layout, bad) -> None:
    """``dp_shard`` (hybrid sharding) divides ``dp`` into shard groups of at least 2 ranks, shards
    something (a ZeRO stage the framework's hybrid sharding runs with), and is priced with cp = ep = 1
    (the shard group as the innermost data-parallel ranks: ``cost.terms.dp_terms_of``)."""
    n = layout.dp_shard
    if not n:
        return
    if n < 2 or layout.dp % n:
        bad("dp_shard", f"dp_shard={n}: must divide dp={layout.dp} and be at least 2 (0: the framework's own grouping)")
    elif layout.cp > 1 or layout.ep > 1:
        bad("dp_shard", f"dp_shard={n}: hybrid sharding is priced with cp=1 and ep=1 only (got cp={layout.cp}, ep={layout.ep})")
    elif layout.shard_across_domains:
        bad("dp_shard", f"dp_shard={n} with shard_across_domains=on: give one (dp_shard={layout.dp} shards over every rank)")
    stages = job.profile.profile.dp_shard_stages
    if job.profile.has("dp_shard") and layout.zero_stage not in stages:
        bad("dp_shard", f"dp_shard={n} with zero={layout.zero_stage}: {job.profile.profile.describe(job.profile.date)} "
            f"shards hybrid with zero {', '.join(map(str, stages))} only")


def _head_slot_problems(model: ModelSpec, job: Job, layout: Layout, bad) -> None:
    message = head_slot_problem(model, job, layout.pp, layout.vp) if layout.head_slots else None
    if message:
        bad("layers", message)


def head_slot_problem(model: ModelSpec, job: Job, pp: int, vp: int) -> str | None:
    """Why ``head_slots`` cannot split this model over ``pp x vp`` stages, or None: it needs a
    slot per stage (the first or the last may hold the embedding or the head alone, as torchtitan's
    split allows), and under Megatron-Core an even split
    (``TransformerConfig``: ``num_layers + 2`` divisible by pp, and each rank's share by vp)."""
    L = model.num_layers
    if pp == 1:
        return None  # no pipeline: nothing to split (the knob does nothing)
    if stage_slots(L, pp, True) < pp * vp:  # a stage may hold the embedding or the head alone
        return f"head_slots=on: {L} layers + the embedding and the head fill fewer than pp*vp = {pp * vp} stages"
    prof = job.profile.profile
    if model.moe is not None and prof.head_slots_moe_from and job.profile.date < prof.head_slots_moe_from:
        return (f"head_slots=on: {prof.describe(job.profile.date)} refuses it for MoE models with a load-balancing "
                f"loss (validate_args, until {prof.head_slots_moe_from})")
    if prof.head_slots_even and ((L + 2) % pp or (L + 2) // pp % vp):
        need = (f"num_layers + 2 = {L + 2} must be divisible by pp={pp}" if (L + 2) % pp else
                f"each rank's {(L + 2) // pp} slots (num_layers + 2 over pp={pp}) must be divisible by vp={vp}")
        return f"head_slots=on under {job.framework}: {need} (Megatron-Core's --account-for-embedding/loss-in-pipeline-split)"
    return None


def _recompute_module_problems(model: ModelSpec, layout: Layout, bad) -> None:
    """``recompute_modules`` name Megatron-Core submodules of a selective recomputation, each of a
    part the model has."""
    mods = layout.recompute_modules
    if not mods:
        return
    try:
        parse_recompute_modules(mods, "recompute_modules")
    except SpecError as exc:
        bad("recompute", str(exc))
        return
    if layout.recompute != "selective":
        bad("recompute", f"recompute_modules={'+'.join(mods)} needs recompute=selective (got recompute={layout.recompute})")
    needs = {"mla_up_proj": (model.mla is not None, "multi-head latent attention"),
             "moe_act": (model.moe is not None, "MoE layers"),
             "shared_experts": (model.moe is not None and model.moe.num_shared_experts > 0, "shared experts"),
             "mlp": (model.num_dense_layers > 0, "dense MLP layers")}
    for name in mods:
        ok, what = needs.get(name, (True, ""))
        if not ok:
            bad("recompute", f"recompute_modules: {name} needs a model with {what}; {model.name} has none")


def _framework_problems(model: ModelSpec, job: Job, cluster: Cluster, layout: Layout, bad) -> None:
    """Knobs the job's framework does not offer at its date, combinations it refuses (knobs that
    are invalid anyway, e.g. zero_stage=7, are reported by their own rule only), and what its
    attention and pipeline engine refuse for this model and batch."""
    prof = job.profile
    dense = model.moe.num_dense_layers if model.moe else 0
    for message in (prof.kv_heads_problem(model, layout.tp) if layout.tp > 1 else None,
                    prof.pipeline_split_problem(model.num_layers, dense, layout.pp, layout.vp),
                    prof.pipeline_microbatch_problem(layout.pp, num_microbatches(job, layout))):
        if message:
            bad("framework", message)
    invalid = {"zero_stage": layout.zero_stage not in (0, 1, 2, 3), "recompute": layout.recompute not in RECOMPUTE_MODES,
               # vp's own schedule given against its vp, or no schedule: reported by _schedule_problems alone
               "schedule": layout.schedule in ("1f1b", "interleaved") or layout.schedule not in ("", *PIPELINE_SCHEDULES),
               "cuda_graph": layout.cuda_graph not in CUDA_GRAPH_SCOPES}
    values = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "vp": layout.vp, "ep": layout.ep,
              "sequence_parallel": layout.sequence_parallel, "recompute": layout.recompute,
              "zero_stage": layout.zero_stage, "dp_overlap": layout.dp_overlap,
              "tp_overlap": layout.tp_overlap and layout.tp > 1, "ep_overlap": layout.ep_overlap and layout.ep > 1,
              "recompute_layers": layout.recompute_layers, "recompute_modules": layout.recompute_modules,
              "head_slots": layout.head_slots, "order": layout.order, "offload": layout.offload,
              "shard_across_domains": layout.shard_across_domains, "schedule": layout.schedule,
              "cp_comm": layout.cp_comm if layout.cp > 1 else "p2p",
              "moe_dispatcher": layout.moe_dispatcher if layout.ep > 1 else "auto", "cuda_graph": layout.cuda_graph,
              "dp_shard": layout.dp_shard}
    invalid["cp_comm"] = layout.cp_comm not in CP_COMM_KINDS
    values = {k: v for k, v in values.items() if not invalid.get(k)}
    for message in unoffered(prof, cluster.device.family, values, not layout.expert_tp and layout.ep > 1):
        bad("framework", message)
    refusal = framework_refusal(prof, layout.tp, layout.pp, layout.cp, layout.ep, layout.vp, layout.zero_stage,
                                layout.recompute, layout.sequence_parallel, layout.tp_overlap,
                                layout.dp_overlap and layout.dp * layout.cp > 1, layout.ep_overlap,
                                data_parallel=layout.dp * layout.cp > 1, cuda_graph=layout.cuda_graph)
    if refusal and not any(invalid.values()):
        bad("framework", f"{prof.profile.describe(prof.date)}: {refusal}")


TORCHTITAN_MOE_QUANT_PADS_FROM = "2026-04"
"""torchtitan's float8 and MXFP8 grouped-experts converters swap the token dispatcher for one that pads
each expert's tokens, the standard or the HybridEP one, and refuse DeepEP's (6348d93d1 'quantize on
config instead of on model', #3127, 2026-04-27; components/quantization/utils.py swap_token_dispatcher
at v0.3.0)."""


def dispatcher_problem(model: ModelSpec, job: Job, dispatcher: str) -> str | None:
    """Why the job's framework cannot run its MoE layers under ``dispatcher`` (``Layout.moe_dispatcher``)
    beside the framework's own offer (``cost.framework``), or ``None``: Megatron-Core's DeepEP backend
    with a capacity factor; torchtitan's DeepEP with float8/MXFP8 grouped experts since
    :data:`TORCHTITAN_MOE_QUANT_PADS_FROM`."""
    if dispatcher != "deepep" or model.moe is None:
        return None
    if model.moe.capacity_factor and job.framework == "megatron":
        return (f"moe_dispatcher=deepep with capacity factor {model.moe.capacity_factor:g}: Megatron-Core's "
                "DeepEP backend does not pad expert inputs to a capacity (transformer_config.py); allowed: "
                "moe_dispatcher=auto, alltoall or hybridep")
    if (job.framework == "torchtitan" and job.precision in ("fp8", "mxfp8")
            and job.profile.date >= TORCHTITAN_MOE_QUANT_PADS_FROM):
        return (f"moe_dispatcher=deepep with precision={job.precision}: {job.profile.profile.describe(job.profile.date)} "
                f"converts the experts' grouped GEMMs to {job.precision} only behind a dispatcher that pads each "
                "expert's tokens (standard or HybridEP), and refuses DeepEP's; allowed: moe_dispatcher=auto, "
                "alltoall or hybridep, or precision bf16")
    return None


def dispatcher_etp_problem(job: Job, dispatcher: str, tp: int, expert_tp: bool) -> str | None:
    """torchtitan's DeepEP does not run experts split over tensor parallelism (etp = tp > 1): 0.2.2's
    deepseek_v3/infra/parallelize.py raises 'DeepEP with Expert Tensor Parallelism (ETP) is not supported
    yet' (0.3 has no ETP at all). ``None`` where the dispatcher runs the expert layout."""
    if dispatcher != "deepep" or job.framework != "torchtitan" or not expert_tp or tp == 1:
        return None
    return (f"moe_dispatcher=deepep with experts split over tp={tp} (etp={tp}): torchtitan's DeepEP does not run "
            "expert tensor parallelism (deepseek_v3/infra/parallelize.py); allowed: etp=1, tp=1, or "
            "moe_dispatcher=auto or alltoall")


def etp_dispatchers(job: Job, dispatchers: tuple[str, ...], tp: int, expert_tp: bool) -> tuple[str, ...]:
    """The ``dispatchers`` an expert group of ``tp`` / ``expert_tp`` can run (:func:`dispatcher_etp_problem`),
    all of them where none can (the layout is then refused: ``planner.search.masks``)."""
    usable = tuple(d for d in dispatchers if dispatcher_etp_problem(job, d, tp, expert_tp) is None)
    return usable or dispatchers


def _moe_problems(model: ModelSpec, job: Job, layout: Layout, bad) -> None:
    if model.moe is None and layout.ep == 1 and (layout.ep_overlap or not layout.expert_tp
                                                 or layout.moe_dispatcher != "auto"):
        knob = ("ep_overlap=on" if layout.ep_overlap else "etp=1" if not layout.expert_tp
                else f"moe_dispatcher={layout.moe_dispatcher}")
        bad("experts", f"{knob} concerns expert layers; {model.name} is dense (no experts)")
    if layout.ep == 1:
        return
    if model.moe is None:
        bad("experts", f"ep={layout.ep} needs an MoE model; {model.name} is dense")
    elif problem := (dispatcher_problem(model, job, layout.moe_dispatcher)
                     or dispatcher_etp_problem(job, layout.moe_dispatcher, layout.tp, layout.expert_tp)):
        bad("experts", problem)
    elif model.moe.num_experts % layout.ep:
        bad("experts", f"num_experts={model.moe.num_experts} is not divisible by ep={layout.ep}")
    elif layout.expert_tp and (problem := job.profile.ep_carve_problem(layout.cp, layout.dp, layout.ep)):
        bad("experts", problem)
    elif not layout.expert_tp:
        inner = layout.tp * layout.cp
        if layout.ep % inner or layout.dp % (layout.ep // inner):
            bad("experts", f"with etp=1, ep={layout.ep} must be a multiple of tp*cp={inner} and ep/(tp*cp) must "
                           f"divide dp={layout.dp} (the expert group is the tp x cp block times part of dp)")
        elif layout.tp > 1 and not layout.sequence_parallel:
            bad("experts", "etp=1 with tp > 1 needs sequence parallelism (each rank dispatches its own tokens; "
                           "Megatron-Core requires it for MoE with tensor parallelism)")


def placement_problem(tp: int, pp: int, cp: int, ep: int, expert_tp: bool, order: str,
                      dense: bool = False) -> str | None:
    """Megatron-Core's checks on the rank order (core_v0.19.0 parallel_state.py ``initialize_model_parallel``):
    a dense RankGenerator (tp, cp, dp, pp) and an expert one (etp, ep, expert dp = world / (etp x ep x pp),
    pp; cp = 1) read one order string with ep just after cp ('tp-cp-ep-dp-pp', 'tp-cp-ep-pp-dp'); it asserts
    (a) the order ends in pp, or pp = 1, or the two data-parallel sizes are equal (etp x ep = tp x cp), and
    (b) both generators' pp groups are equal: the axes inside pp span as many ranks in both. With pp = 1
    every order passes. Held for ep > 1 under every framework (the rule of expert layouts). With
    ``dense`` (a release that builds the expert generator for every model,
    ``ProfileAt.checks_dense_placement``: Megatron-Core since MoE parallel folding) it is held at ep = 1
    too, where etp = tp and cp > 1 fails both (a) and (b). ``planner.search.masks`` reads this rule."""
    axes, etp = order_axes(order), tp if expert_tp else 1
    if (ep == 1 and not dense) or pp == 1 or axes[-1] == "pp":
        return None  # (b) holds too: every axis is inside pp in both generators (world / pp ranks)
    inside = axes[:axes.index("pp")]  # dp counts 1: where (a) holds its size is the expert dp's, in both
    spans = math.prod({"tp": tp, "cp": cp}.get(a, 1) for a in inside)
    expert = math.prod({"tp": etp, "cp": ep}.get(a, 1) for a in inside)
    if etp * ep == tp * cp and spans == expert:
        return None
    why = " (it builds the expert rank generator for dense models too, etp = tp, ep = 1)" if ep == 1 else ""
    return (f"order={order} with pp={pp}, tp={tp}, cp={cp}, ep={ep}, etp={etp}: Megatron-Core lays out pp inside "
            f"another axis only where the expert groups' etp x ep ({etp * ep}) equals tp x cp ({tp * cp}) and "
            f"the axes inside pp span as many ranks for experts ({expert}) as for dense layers ({spans}){why} "
            f"(initialize_model_parallel); put pp last (order={'-'.join(a for a in axes if a != 'pp')}-pp)")
