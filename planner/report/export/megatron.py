"""``--format megatron``: Megatron-LM / NeMo (Megatron-Core) arguments as a bash file to source, for
the release :data:`~planner.report.export.common.PINNED` names (the Slurm script reuses them)."""

from __future__ import annotations

import math

from clusterplan.cost.layout import microbatch_group_size, offloads_activations, offloads_optimizer, split_order
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import (PINNED, _job, _rope, cuda_arch, hsdp_degrees, model_spec,
                                                    rope_theta)


MEGATRON_PRECISION_ARGS = {
    "bf16": ["--bf16"], "fp16": ["--fp16"],
    "fp8": ["--bf16", "--fp8-format hybrid"],  # --fp8-recipe defaults to delayed (per-tensor scales)
    "mxfp8": ["--bf16", "--fp8-format e4m3", "--fp8-recipe mxfp8"],  # Megatron-Bridge bf16_with_mxfp8_mixed
    "nvfp4": ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"],  # Megatron-Bridge bf16_with_nvfp4_mixed
}
"""Megatron-LM precision flags per job precision (TransformerConfig fp8, fp8_recipe, fp4, fp4_recipe)."""


def _moe_layer_pattern(model) -> str:
    dense, moe = model.moe.num_dense_layers, model.num_layers - model.moe.num_dense_layers
    return f"([0]*{dense}+[1]*{moe})" if dense else "1"


def megatron_args(doc: dict, model=None) -> str:
    """Megatron-LM / NeMo (Megatron-Core) arguments for the plan's layout and model, as a bash file to
    source: the environment the launch needs as ``export`` lines, the arguments as the array
    ``MEGATRON_ARGS`` (the form of Megatron-LM's own example scripts, e.g. ``GPT_MODEL_ARGS=(...)``)."""
    args, notes, env = _megatron_args_and_notes(doc, model_spec(doc, model))
    family = doc["inputs"]["cluster"]["family"]
    notes = [*notes, *([FAMILY_NOTES[family]] if family in FAMILY_NOTES else [])]
    lines = _megatron_header(doc, notes) + [
        '# source this file, then: torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data, optimizer, checkpoint args>']
    for key, value in env.items():
        lines += [f"# {ENV_REASONS[key]}", f"export {key}={value}"]
    return "\n".join(lines + ["MEGATRON_ARGS=(", *(f"  {a}" for a in args), ")"])


ENV_REASONS = {"CUDA_DEVICE_MAX_CONNECTIONS": "Megatron-Core with tensor/context parallelism before Blackwell: one hardware "
                                              "queue keeps the collectives in the order they were issued (validate_args "
                                              "checks it)"}
"""Why each environment variable of a Megatron launch is set (written beside its ``export`` line)."""


def _megatron_header(doc: dict, notes: list[str]) -> list[str]:
    lines = [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
             f"predicted {doc['step_time_s']:.3f} s/step",
             f"# for {PINNED['megatron']}; add your data (--data-path or --mock-data), optimizer and "
             "checkpoint arguments"]
    return lines + [f"# note: {n}" for n in notes]


def _needs_single_connection(doc: dict) -> bool:
    """Megatron-Core (validate_args) requires CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context
    parallelism before Blackwell, except under FSDP (which refuses it) and with EP overlap, which
    needs more than one connection (Megatron-Core's MoE README; Megatron-Bridge leaves it unset then,
    comm_overlap.py ``_set_num_cuda_device_max_connections``)."""
    L, cluster = doc["layout"], doc["inputs"]["cluster"]
    if L.get("ep_overlap") and L["ep"] > 1:
        return False
    arch = cuda_arch(cluster["device"])
    if arch is None and cluster["family"] == "xgmi":
        arch = 9  # ROCm reports MI300-class GPUs (gfx94x) as major 9: Megatron applies the same rule
    return (L["tp"] > 1 or L["cp"] > 1) and L["zero_stage"] != 3 and arch is not None and arch < 10


def pipeline_layout(num_layers: int, pp: int, vp: int) -> str | None:
    """Megatron's ``--pipeline-model-parallel-layout`` for ``num_layers`` over ``pp * vp`` stages when
    they do not divide evenly: no stage holds more than ``ceil(L / (pp vp))`` layers (what the cost
    model charges), the embedding (E) opens the first stage and the loss (L) closes the last. None
    when the split is even (plain flags say it)."""
    stages = pp * vp
    if num_layers % stages == 0:
        return None
    q, r = divmod(num_layers, stages)
    if q == 0:
        raise SpecError(f"export: {num_layers} layers cannot fill {stages} pipeline stages")
    counts = [q] + [q + 1] * r + [q] * (stages - 1 - r)
    parts = [f"t*{c}" if c > 1 else "t" for c in counts]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def _megatron_pipeline_args(num_layers: int, L: dict, notes: list[str]) -> list[str]:
    """How the layers split over the pipeline stages: the embedding and the loss each as a layer
    (``head_slots``; an even split of ``num_layers + 2``, checked by the plan), a layout string where
    ``num_layers`` does not split evenly, else the plain per-chunk count."""
    if L["pp"] == 1:
        return []
    if L.get("head_slots"):
        args = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        # uneven splits take the chunk count, not a per-chunk layer count (!1961)
        return args + ([f"--num-virtual-stages-per-pipeline-rank {L['vp']}"] if L["vp"] > 1 else [])
    layout = pipeline_layout(num_layers, L["pp"], L["vp"])
    if layout is not None:
        notes.append(f"{num_layers} layers do not split evenly over {L['pp'] * L['vp']} pipeline stages: "
                     f"the layout string gives each stage at most {math.ceil(num_layers / (L['pp'] * L['vp']))} layers")
        return [f"--pipeline-model-parallel-layout '{layout}'"]
    return [f"--num-layers-per-virtual-pipeline-stage {num_layers // (L['pp'] * L['vp'])}"] if L["vp"] > 1 else []


def _megatron_model_args(model, seq_len: int, dispatcher: str = "auto") -> tuple[list[str], list[str]]:
    """Model-shape arguments (what validate_args and the GPT model builder need) and their notes."""
    args = [f"--num-layers {model.num_layers}", f"--hidden-size {model.hidden_size}",
            f"--num-attention-heads {model.num_attention_heads}",
            f"--ffn-hidden-size {model.ffn_hidden_size}",
            f"--max-position-embeddings {max(seq_len, model.seq_len)}",
            "--tokenizer-type NullTokenizer", f"--vocab-size {model.vocab_size}"]
    notes = ["NullTokenizer keeps the model's vocabulary size; for real data use your tokenizer "
             "(e.g. --tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH)"]
    kv = model.num_kv_heads_resolved
    if kv != model.num_attention_heads and model.mla is None:
        args += ["--group-query-attention", f"--num-query-groups {kv}"]
    if model.head_dim is not None and model.mla is None and \
            model.head_dim * model.num_attention_heads != model.hidden_size:
        args.append(f"--kv-channels {model.head_dim}")
    if _rope(model):
        args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear",
                 f"--rotary-base {rope_theta(model)}"]
        notes.append("SwiGLU model: RMSNorm, rotary positions and no linear biases (Llama-style) are assumed")
    else:
        args.append("--position-embedding-type learned_absolute")
        notes.append("GELU model: LayerNorm and learned absolute positions (GPT-style) are assumed")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.dropout:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if model.mla is not None:
        m = model.mla
        args += ["--multi-latent-attention", f"--kv-lora-rank {m.kv_lora_rank}",
                 f"--qk-head-dim {m.qk_nope_head_dim}", f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}",
                 f"--v-head-dim {m.v_head_dim}"]
        if m.q_lora_rank:
            args.append(f"--q-lora-rank {m.q_lora_rank}")
    if model.moe is not None:
        moe = model.moe
        args += [f"--num-experts {moe.num_experts}", f"--moe-router-topk {moe.top_k}",
                 f"--moe-ffn-hidden-size {moe.expert_ffn_hidden_size}", "--moe-grouped-gemm",
                 *_megatron_dispatcher_args(dispatcher)]
        if moe.num_shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {moe.num_shared_experts * moe.expert_ffn_hidden_size}")
        if moe.num_dense_layers:
            args.append(f"--moe-layer-freq '{_moe_layer_pattern(model)}'")
        if moe.max_nodes_per_token:
            notes.append(f"node-limited routing ({moe.max_nodes_per_token} nodes per token): set "
                         "--moe-router-num-groups / --moe-router-group-topk to your expert placement")
    return args, notes


def _megatron_dispatcher_args(dispatcher: str) -> list[str]:
    """Megatron-Core's token dispatcher for ``Layout.moe_dispatcher``: the alltoall dispatcher (NCCL
    all-to-all; what ``auto`` writes too), or the flex dispatcher with its DeepEP or Hybrid-EP backend
    (``--moe-flex-dispatcher-backend``, Megatron-LM 3df200905e, 2025-11), whose kernels take float32
    router probabilities (token_dispatcher.py casts and warns without ``--moe-router-dtype fp32``)."""
    if dispatcher in ("deepep", "hybridep"):
        return ["--moe-token-dispatcher-type flex", f"--moe-flex-dispatcher-backend {dispatcher}",
                "--moe-router-dtype fp32"]
    return ["--moe-token-dispatcher-type alltoall"]


def _megatron_capacity_args(doc: dict, dispatcher: str) -> list[str]:
    """The capacity factor the plan priced (``--moe-capacity-factor``: each expert's input padded to it,
    tokens beyond it dropped): Megatron-Core's ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``. Its DeepEP backend refuses the padding
    (transformer_config.py): refused here too."""
    factor = (doc["inputs"]["model"].get("moe_routing") or {}).get("capacity_factor")
    if not factor:
        return []
    if dispatcher == "deepep":
        raise SpecError("--format megatron: Megatron-Core's DeepEP backend does not pad expert inputs to a "
                        f"capacity (capacity factor {factor:g}); use moe_dispatcher=alltoall or hybridep, or plan dropless")
    return [f"--moe-expert-capacity-factor {factor:g}", "--moe-pad-expert-input-to-capacity"]


def _megatron_sharding_args(zero_stage: int, tied_embeddings: bool, ep: int, notes: list[str]) -> list[str]:
    """The arguments of a ZeRO stage in Megatron-Core (a note on each mapping appended to ``notes``).
    ZeRO-3 is PyTorch FSDP2 where Megatron-Core allows it, else Megatron-FSDP: its arguments.py
    refuses --use-torch-fsdp2 with tied embeddings and with expert parallelism."""
    if zero_stage in (1, 2):
        if zero_stage == 2:
            notes.append("ZeRO-2: the distributed optimizer shards optimizer states and reduce-scatters gradients")
        return ["--use-distributed-optimizer"]
    if zero_stage != 3:
        return []
    if tied_embeddings or ep > 1:
        why = "untied embeddings" if tied_embeddings else "expert parallelism 1"
        notes.append(f"ZeRO-3 runs as Megatron-FSDP (optim_grads_params); Megatron's FSDP2 path needs {why}")
        return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                "--ckpt-format fsdp_dtensor"]
    notes.append("ZeRO-3 runs as PyTorch FSDP2 in Megatron-Core (CUDA_DEVICE_MAX_CONNECTIONS must stay unset)")
    return ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format torch_dist"]


def _megatron_group_args(L: dict, notes: list[str]) -> list[str]:
    """The interleaved schedule's micro-batch group where ``pp`` does not divide the micro-batches
    (Megatron-Core's default group is ``pp``: :func:`cost.layout.microbatch_group_size`)."""
    if L["vp"] == 1 or L["pp"] == 1:
        return []
    m = L["num_microbatches"]
    n = microbatch_group_size(m, L["pp"], L["vp"], groups=True)
    if n is None or n == L["pp"]:
        return []
    notes.append(f"{m} micro-batches do not divide into groups of pp={L['pp']}: the interleaved schedule runs "
                 f"{n} micro-batches through each model chunk before the next (more activations in flight "
                 "on the first stage, priced)")
    return [f"--microbatch-group-size-per-virtual-pipeline-stage {n}"]


def _megatron_args_and_notes(doc: dict, model) -> tuple[list[str], list[str], dict[str, str]]:
    """The arguments (one ``--flag value`` per item), the notes on what they cannot say, and the
    environment the launch needs."""
    L, job = doc["layout"], _job(doc)
    dispatcher = L.get("moe_dispatcher", "auto") if L["ep"] > 1 else "auto"
    model_args, notes = _megatron_model_args(model, job["seq_len"], dispatcher)
    args = [
        f"--tensor-model-parallel-size {L['tp']}", f"--pipeline-model-parallel-size {L['pp']}",
        f"--context-parallel-size {L['cp']}", f"--micro-batch-size {L['micro_batch_size']}",
        f"--global-batch-size {job['global_batch_size']}", f"--seq-length {job['seq_len']}",
        *model_args,
    ]
    if L["ep"] > 1:
        args.append(f"--expert-model-parallel-size {L['ep']}")
        if not L.get("expert_tp", True):
            args.append("--expert-tensor-parallel-size 1")
    args += _megatron_capacity_args(doc, dispatcher)
    args += _megatron_pipeline_args(model.num_layers, L, notes)
    args += _megatron_group_args(L, notes)
    if L["sequence_parallel"]:
        args.append("--sequence-parallel")
    args += _megatron_cp_comm_args(L, doc.get("cp_hierarchy"))
    args += _megatron_recompute_args(L)
    args += _megatron_state_args(L, model, notes)
    if L["dp_overlap"]:
        args += ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if L["zero_stage"] in (1, 2) else [])
    if L["tp_overlap"]:
        args.append("--tp-comm-overlap")
    if L.get("ep_overlap") and L["ep"] > 1:
        args.append("--overlap-moe-expert-parallel-comm")
        notes.append("EP overlap (combined 1F1B) needs PyTorch >= 2.6 and CUDA_DEVICE_MAX_CONNECTIONS > 1 "
                     "(left unset, as Megatron-Bridge does); Megatron's MoE README pairs it with "
                     "--delay-wgrad-compute, which the plan does not price")
    args += _megatron_cuda_graph_args(L, model)
    precision = job["precision"]
    args += MEGATRON_PRECISION_ARGS[precision]
    if job.get("gemm_format") == "fp8_current":
        args.append("--fp8-recipe tensorwise")  # per-tensor current scaling
    if L.get("param_gather", "bf16") != "bf16":  # FP8/MXFP8 params, gathered in 8 bits (needs the distributed optimizer)
        args.append("--fp8-param-gather")
    order = split_order(L["order"])[0]
    if order == "tp-cp-pp-dp":
        args.append("--use-tp-pp-dp-mapping")  # RankGenerator order tp-cp-ep-pp-dp (Megatron-LM 2024-04)
    elif order != "tp-cp-dp-pp":
        notes.append(f"rank order {L['order']}: Megatron's command line lays out tp-cp-ep-dp-pp or, with "
                     "--use-tp-pp-dp-mapping, tp-cp-ep-pp-dp; this order needs your own process groups")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if _needs_single_connection(doc) else {}
    return args, notes, env


def _megatron_state_args(L: dict, model, notes: list[str]) -> list[str]:
    """Where the training state lives: activations offloaded to the host, the ZeRO stage's sharding,
    and hybrid sharding's distributed-optimizer instances."""
    args = []
    if offloads_activations(L.get("offload", "none")):  # every layer's activations but the last's: TransformerConfig's limit
        args.append(f"--cpu-offloading-num-layers {model.num_layers - 1}")
    if offloads_optimizer(L.get("offload", "none")):  # every optimizer state on the host (Megatron-Core 2025-02,
        # core_v0.12.0); validate_args asserts the precision-aware optimizer with it, which runs on the
        # distributed optimizer the ZeRO stage (>= 1, checks refuse 0) writes below
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0", "--use-precision-aware-optimizer"]
    args += _megatron_sharding_args(L["zero_stage"], model.tied_embeddings, L["ep"], notes)
    if L.get("dp_shard"):  # hybrid sharding: the partial distributed optimizer (Megatron-Core 2024-11), ZeRO-1
        args.append(f"--num-distributed-optimizer-instances {hsdp_degrees(L, 'megatron', (1,))[1]}")
    return args


def _megatron_cp_comm_args(L: dict, hierarchy: list[int] | None) -> list[str]:
    """Megatron-Core's context-parallel communication type (``--cp-comm-type``, core_r0.10.0; default
    p2p, Transformer Engine's name ``all_gather`` for the all-gather kind) and, for the hierarchical
    kind, the all-to-all and ring group sizes as priced (the plan's ``cp_hierarchy``)."""
    kind = L.get("cp_comm", "p2p")
    if L["cp"] == 1 or kind == "p2p":
        return []
    args = [f"--cp-comm-type {'all_gather' if kind == 'allgather' else kind}"]
    if kind == "a2a+p2p":
        if not hierarchy:
            raise SpecError("export --format megatron: cp_comm=a2a+p2p needs the plan's cp_hierarchy (the all-to-all "
                            "and ring sizes, --hierarchical-context-parallel-sizes); plan again with this release")
        args.append(f"--hierarchical-context-parallel-sizes {hierarchy[0]} {hierarchy[1]}")
    return args


MEGATRON_CUDA_GRAPH_IMPL = {"layer": "transformer_engine", "full": "full_iteration"}
"""Megatron-Core 0.19's ``--cuda-graph-impl`` for a plan's ``cuda_graph`` scope (TransformerConfig
``cuda_graph_impl``: transformer_engine captures each layer with TE's make_graphed_callables,
full_iteration the iteration's forward and backward; none is the default and is not written).
full_iteration needs ``--no-check-for-nan-in-loss-and-grad`` (validate_args asserts it: the NaN check
reads the loss on the host inside the captured iteration)."""


def _megatron_cuda_graph_args(L: dict, model) -> list[str]:
    """The graph scope's arguments; a dropless MoE model's per-layer graphs capture the attention alone
    (``--cuda-graph-modules attn``: its MoE blocks cannot be captured, Megatron-LM's MoE README, "CUDA
    Graph"; a dense layer's ``mlp`` is refused beside EP overlap), as ``models.ops.MLP_BLOCK_OPS`` prices them."""
    scope = L.get("cuda_graph", "none")
    if scope == "none":
        return []
    args = [f"--cuda-graph-impl {MEGATRON_CUDA_GRAPH_IMPL[scope]}"] + (
        ["--no-check-for-nan-in-loss-and-grad"] if scope == "full" else [])
    if scope == "layer" and model.moe is not None and model.moe.capacity_factor is None:
        args.append("--cuda-graph-modules attn")
    return args


def _megatron_recompute_args(L: dict) -> list[str]:
    """Selective recomputation (of the named ``recompute_modules``, else Megatron's core attention);
    full recomputation of every layer (uniform, one layer a unit), or of ``recompute_layers`` of
    each stage: ``--recompute-method block`` counts per model chunk, so an interleaved stage's count
    must split evenly over its ``vp`` chunks."""
    if L["recompute"] == "selective":
        modules = L.get("recompute_modules")
        return ["--recompute-granularity selective"] + (["--recompute-modules " + " ".join(modules)] if modules else [])
    if L["recompute"] != "full":
        return []
    k = L.get("recompute_layers", 0)
    if not k:
        return ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if k % L["vp"]:
        raise SpecError(f"recompute_layers={k}: Megatron's --recompute-num-layers counts per model chunk, and "
                        f"{k} layers do not split over vp={L['vp']} chunks; use a multiple of {L['vp']}")
    return ["--recompute-granularity full", "--recompute-method block", f"--recompute-num-layers {k // L['vp']}"]


FAMILY_NOTES = {
    "nvlink-domain": "an NVLink domain spans several nodes: allocate each domain's nodes together (on Slurm with "
                     "the topology/block plugin, --segment)",
    "xgmi": "AMD GPUs: run a ROCm build of Megatron-LM (e.g. AMD's rocm/megatron-lm image) and check its launch "
            "notes for the environment it expects",
    "gaudi": "Intel Gaudi: run Intel's Megatron-LM fork for HPUs (HabanaAI/Megatron-LM, based on Megatron-Core "
             "core_r0.9.0: flags newer than that release may be missing) and request the accelerators as your Slurm "
             "site names them (the gres may not be gpu); CUDA_DEVICE_MAX_CONNECTIONS does not apply",
}
