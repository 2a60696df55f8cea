"""Cost terms, each a pure function of the few knobs it depends on.

The step time and memory are assembled from these in ``cost.step``; the search tabulates each term
over its own small domain (``planner.search.space``). Keeping a term's inputs explicit is what lets the
CP-SAT model stay small: compute depends on tp, cp, micro-batch and recompute; a collective on its
axis degree and placement; the bubble on pp, vp and the micro-batch count.

All results are seconds or bytes for one device.

The package is cut by concern, each module importing only the ones before it:
``context``: The fixed inputs of one planning problem, and what every term asks of them: tokens per rank, the model's layer kinds.
``activations``: What a layer keeps for its backward: activation bytes per layer and per token (Korthikanti et al. 2022, generalised).
``compute``: Compute of the layers for one micro-batch: time per layer kind on the device's roofline, and the activations it leaves.
``comm``: Communication of the layers: tensor-, context- and expert-parallel collectives, and what overlapping them costs.
``pipeline``: The pipeline: the split of the layers over the ranks, the head, the stage sends, the period and the slowest stage.
``memory``: Memory outside the activations: parameters per rank, weights, gradients and optimizer states by ZeRO stage, the runtime.
``dp``: Data parallelism: gradient reductions, ZeRO gathers, their host work, and the optimizer step.
``layer``: The layer terms of one micro-batch assembled from compute and communication (``LayerTerms``).
"""

from clusterplan.cost.terms.context import (  # noqa: F401
    HF_MODEL_CODE,
    FUSED_MODEL_CODE,
    LLMFOUNDRY_MODEL_CODE,
    Context,
    _placed_context,
    _tokens,
    _kind_total,
    _layer_kinds,
    mixed_kinds,
    _COMPUTE_CONTEXTS,
    _compute_context,
    _local_experts,
    _comm_multiplier,
)
from clusterplan.cost.terms.activations import (  # noqa: F401
    FUSED_LOSS_LOGIT_BYTES,
    HF_LOGIT_BYTES,
    MODEL_CODE_LOGIT_BYTES,
    op_sac_recomputed_share,
    op_sac_activation_bytes,
    dots_activation_bytes,
    dots_recomputed_share,
    _score_elements,
    fp8_saved_inputs,
    activation_bytes,
    _attention_kept_bytes,
    score_bytes,
    mlp_kept_tensors,
    mlp_width_bytes,
    ROUTER_BYTES_PER_SCORE,
    ROUTER_BYTES_PER_CHOICE,
    linear_input_bytes,
    moe_mlp_activation_bytes,
)
from clusterplan.cost.terms.compute import (  # noqa: F401
    recompute_module_terms,
    _recompute_module_parts,
    _mla_up_ops,
    ComputeTerms,
    compute_terms,
    _compute_terms,
    activation_terms,
    _op_sac_saved,
    _dots_saved,
    _activation_terms,
    layer_kernels,
    _kind_times,
)
from clusterplan.cost.terms.comm import (  # noqa: F401
    NCCL_RING_SHARE,
    UNMEASURED_OVERLAP_SHARE,
    ep_overlap_steady_share,
    ep_ranks,
    tp_comm_terms,
    tp_comm_over,
    _tp_comm_total_s,
    overlap_share,
    overlap_charge,
    comm_kernel_slowdown,
    overlapped_exposed_s,
    cp_comm_terms,
    cp_a2a_size,
    cp_comm_choice,
    dispatcher_choice,
    cp_heads_split,
    ep_comm_terms,
    _ep_open_s,
    ep_comm_parts,
    ep_overlap_window_s,
    _tp_comm_s,
    tp_gather_bytes,
    _cp_comm_s,
    _ep_comm_s,
    remote_nodes_per_token,
)
from clusterplan.cost.terms.pipeline import (  # noqa: F401
    HeadTerms,
    bubble_s,
    head_terms,
    p2p_s,
    layers_on_stage,
    StageSplit,
    chunks_fit,
    stage_slots,
    stage_split,
    head_layer_ratio,
    period_layers,
    stage_kind_shares,
    kind_windows,
    kind_windows_over,
    head_in_period,
)
from clusterplan.cost.terms.memory import (  # noqa: F401
    OPTIMIZER_STATE_BYTES,
    optimizer_state_bytes,
    host_tier,
    offload_exposed_s,
    WEIGHT_BYTES,
    RUNTIME_RESERVE_BYTES,
    CUDA_CONTEXT_EAGER_BYTES,
    CUDA_CONTEXT_LAZY_BYTES,
    LAZY_LOADING_SINCE,
    NCCL_COMMUNICATOR_BYTES,
    NCCL_PAIR_COMMUNICATOR_BYTES,
    NCCL_LAZY_CONNECT_SINCE,
    allocator_fraction,
    nccl_communicator_sizes,
    runtime_bytes,
    ParamCounts,
    param_counts,
    _rank_params,
    _stage_params,
    _layer_params,
    partitioned_modules,
    StaticMemory,
    owned_params,
    zero_replicas,
    shard_copies,
    effective_zero_stage,
    static_memory,
    static_memories,
    _lp_grads_kept,
    grads_freed_bytes,
    FP32_BYTES,
    step_gradients,
    kept_param_bytes,
)
from clusterplan.cost.terms.dp import (  # noqa: F401
    NUM_GRAD_BUCKETS,
    optimizer_s,
    GRAD_ACCUMULATION_BYTES,
    grad_accumulation_adds,
    grad_accumulation_kind,
    grad_accumulation_parts,
    grad_accumulation_s,
    host_optimizer_bytes,
    host_optimizer_terms,
    DataParallelTerms,
    dp_terms,
    dp_terms_of,
    regather_share,
    zero3_collectives,
    PYTHON_COPY_S,
    PYTHON_VIEW_S,
    zero3_host_s,
    zero3_released_modules,
    zero3_regather_s,
    gather_bytes,
    fp8_gathers_no_slower,
    dp_traffic,
    dp_profiles,
    _dp_cp_group,
)
from clusterplan.cost.terms.layer import (  # noqa: F401
    LayerTerms,
    layer_terms,
    _module_recompute_terms,
    _partial_recompute_terms,
)


def clear_caches() -> None:
    """Forget every term cached in the package (each cache keys on its problem's context, which holds
    the cluster graph): what a study that walks many clusters calls between them."""
    import sys

    for name in ("context", "activations", "compute", "comm", "pipeline", "memory", "dp", "layer"):
        module = sys.modules[f"{__name__}.{name}"]
        for value in list(vars(module).values()):
            if hasattr(value, "cache_clear") and getattr(value, "__module__", "") == module.__name__:
                value.cache_clear()
    _COMPUTE_CONTEXTS.clear()
