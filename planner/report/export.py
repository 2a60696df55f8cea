"""Launcher configs from a Plan document: Megatron-LM arguments, a DeepSpeed config, a torchtitan
TOML job config, MaxText overrides and a Slurm batch script that starts Megatron-LM with torchrun.

Each format is written for one pinned launcher release (:data:`PINNED`) and is checked against that
release's own parser and validator by ``tests/test_launchers.py`` (``tests/launchers/``): Megatron's
``parse_args`` + ``validate_args``, DeepSpeed's ``DeepSpeedConfig``, torchtitan's ``ConfigManager``
and ``ParallelDims``, MaxText's ``pyconfig.initialize`` with its packaged ``base.yml``, and torchrun's
own argument parser for the Slurm script. Every format carries the model shape (layers, width,
heads, query groups, FFN, vocabulary, experts, latent attention), so the launcher builds the model
the plan was costed for.

Export code formats the plan; it never recomputes a cost. Knobs a launcher cannot express are
stated in a comment (or a ``_comment`` key in JSON) rather than dropped silently; a plan that the
pinned launcher would refuse is refused here with :class:`SpecError` and a hint.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from fractions import Fraction
from types import SimpleNamespace

from clusterplan.cost.framework import check_platform, load_profile
from clusterplan.cost.layout import microbatch_group_size, order_axes, recompute_words, split_order
from clusterplan.models.errors import SpecError
from clusterplan.topologies.precisions import LOW_PRECISIONS

FORMATS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2", "maxtext", "slurm")
PINNED = {
    "megatron": "Megatron-Core 0.19.2 (PyPI megatron-core==0.19.2, megatron/training/arguments.py)",
    "deepspeed": "DeepSpeed 0.19.8 (PyPI deepspeed==0.19.8)",
    "torchtitan": "torchtitan 0.3.0 (PyPI torchtitan==0.3.0, a config_registry module for --module/--config)",
    "torchtitan-0.2": "torchtitan 0.2.2 (PyPI torchtitan==0.2.2, TOML job config via --job.config_file)",
    "maxtext": "MaxText 0.2.5 (PyPI maxtext==0.2.5, src/maxtext/configs/base.yml)",
    "slurm": "Megatron-Core 0.19.2 pretrain_gpt.py under torchrun (PyTorch 2.13)",
}
"""The launcher release each format is written for and tested against (tests/launchers/README.md)."""
TORCHTITAN_CONVERTERS = {
    "fp8": ['converters = ["quantize.linear.float8"]'],
    "mxfp8": ['converters = ["quantize.linear.mx"]'],  # [quantize.linear.mx] recipe_name defaults to mxfp8_cublas
}
"""torchtitan's model converters per job precision (job_config.py Float8Linear, MXLinear; 0.2.2)."""
MEGATRON_PRECISION_ARGS = {
    "bf16": ["--bf16"], "fp16": ["--fp16"],
    "fp8": ["--bf16", "--fp8-format hybrid"],  # --fp8-recipe defaults to delayed (per-tensor scales)
    "mxfp8": ["--bf16", "--fp8-format e4m3", "--fp8-recipe mxfp8"],  # Megatron-Bridge bf16_with_mxfp8_mixed
    "nvfp4": ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"],  # Megatron-Bridge bf16_with_nvfp4_mixed
}
"""Megatron-LM precision flags per job precision (TransformerConfig fp8, fp8_recipe, fp4, fp4_recipe)."""
TORCHRUN_FAMILIES = ("nvswitch", "nvlink-domain", "xgmi", "gaudi")
"""Cluster families whose devices PyTorch drives, one process per device: torchrun can start them.
TPU slices run under XLA/JAX launchers, Cerebras and Groq under their own compilers and runtimes."""
GPU_FAMILIES = ("nvswitch", "nvlink-domain", "xgmi")
RDZV_PORT = 29500  # torchrun's default master port


def _job(doc: dict) -> dict:
    return doc["inputs"]["job"]


# ---- the model shape ------------------------------------------------------------------------------
def model_spec(doc: dict, model=None):
    """The :class:`models.spec.ModelSpec` the plan was made for.

    The Plan document records the model's name and size only; the shape comes from ``model`` when
    the caller has it (``export(doc, fmt, model=result.model)``), else from the bundled catalogue,
    matched on name, layers, width and parameter count.

    Raises
    ------
    SpecError
        A model that is not bundled, when no ``model`` is given.
    """
    from clusterplan.models.library import get_model, list_models
    from clusterplan.models.spec import ModelSpec

    info = doc["inputs"]["model"]
    if model is not None:
        return model
    if isinstance(info.get("spec"), dict):
        return ModelSpec(**info["spec"])
    for entry in list_models():
        if entry.name == info["name"]:
            spec = get_model(entry.id)
            if (spec.num_layers, spec.hidden_size, spec.num_params) == (
                    info["num_layers"], info["hidden_size"], info["num_params"]):
                return spec
    raise SpecError(f"export: the plan is for {info['name']!r}, which is not a bundled model, and the plan "
                    "document does not carry its shape (heads, FFN, vocabulary); export it from the process "
                    "that planned it: planner.report.export.export(doc, fmt, model=result.model)")


def _rope(model) -> bool:
    """SwiGLU models in the catalogue (Llama, Mixtral, DeepSeek, PaLM) use rotary positions and
    RMSNorm without biases; GELU models (GPT-3, Megatron/MT-NLG) learned positions and LayerNorm.
    The model spec records the MLP only, so the other two follow from it (stated in the header)."""
    return model.ffn_activation == "swiglu"


ROPE_THETA_DEFAULT = 10000  # RoPE's original base (Su et al. 2021): a model spec without rope_theta


def rope_theta(model) -> int:
    """The model's RoPE base as the integer launchers take (Megatron's --rotary-base and Megatron-DeepSpeed's
    --rotary-position-embeddings-theta are ``type=int``)."""
    theta = model.rope_theta or ROPE_THETA_DEFAULT
    if theta != int(theta):
        raise SpecError(f"export: rope_theta {theta} is not a whole number; the launchers take an integer base")
    return int(theta)


def _moe_layer_pattern(model) -> str:
    dense, moe = model.moe.num_dense_layers, model.num_layers - model.moe.num_dense_layers
    return f"([0]*{dense}+[1]*{moe})" if dense else "1"


# ---- Megatron-Core ---------------------------------------------------------------------------------
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


def cuda_arch(device: str) -> int | None:
    """The CUDA compute-capability major of a device id (8 Ampere, 9 Hopper, 10 Blackwell); None for
    a device CUDA does not drive."""
    d = device.lower()
    if re.match(r"g?b[0-9]{3}", d):
        return 10
    if re.match(r"g?h[0-9]{3}", d):
        return 9
    if re.match(r"a[0-9]{2,3}\b|a[0-9]{3}-", d):
        return 8
    return None


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


def _megatron_model_args(model, seq_len: int) -> tuple[list[str], list[str]]:
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
                 "--moe-token-dispatcher-type alltoall"]
        if moe.num_shared_experts:
            args.append(f"--moe-shared-expert-intermediate-size {moe.num_shared_experts * moe.expert_ffn_hidden_size}")
        if moe.num_dense_layers:
            args.append(f"--moe-layer-freq '{_moe_layer_pattern(model)}'")
        if moe.max_nodes_per_token:
            notes.append(f"node-limited routing ({moe.max_nodes_per_token} nodes per token): set "
                         "--moe-router-num-groups / --moe-router-group-topk to your expert placement")
    return args, notes


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
    model_args, notes = _megatron_model_args(model, job["seq_len"])
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
    args += _megatron_pipeline_args(model.num_layers, L, notes)
    args += _megatron_group_args(L, notes)
    if L["sequence_parallel"]:
        args.append("--sequence-parallel")
    args += _megatron_recompute_args(L)
    args += _megatron_sharding_args(L["zero_stage"], model.tied_embeddings, L["ep"], notes)
    if L["dp_overlap"]:
        args += ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if L["zero_stage"] in (1, 2) else [])
    if L["tp_overlap"]:
        args.append("--tp-comm-overlap")
    if L.get("ep_overlap") and L["ep"] > 1:
        args.append("--overlap-moe-expert-parallel-comm")
        notes.append("EP overlap (combined 1F1B) needs PyTorch >= 2.6 and CUDA_DEVICE_MAX_CONNECTIONS > 1 "
                     "(left unset, as Megatron-Bridge does); Megatron's MoE README pairs it with "
                     "--delay-wgrad-compute, which the plan does not price")
    precision = job["precision"]
    args += MEGATRON_PRECISION_ARGS[precision]
    if job.get("gemm_format") == "fp8_current":
        args.append("--fp8-recipe tensorwise")  # per-tensor current scaling
    order = split_order(L["order"])[0]
    if order == "tp-cp-pp-dp":
        args.append("--use-tp-pp-dp-mapping")  # RankGenerator order tp-cp-ep-pp-dp (Megatron-LM 2024-04)
    elif order != "tp-cp-dp-pp":
        notes.append(f"rank order {L['order']}: Megatron's command line lays out tp-cp-ep-dp-pp or, with "
                     "--use-tp-pp-dp-mapping, tp-cp-ep-pp-dp; this order needs your own process groups")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if _needs_single_connection(doc) else {}
    return args, notes, env


# ---- DeepSpeed -------------------------------------------------------------------------------------
def deepspeed_config(doc: dict, model=None) -> str:
    """A DeepSpeed config JSON. Tensor and pipeline parallelism and the model shape are Megatron-
    DeepSpeed's arguments: they go in the ``_comment`` key, which DeepSpeed ignores."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    if L["pp"] > 1 and L["zero_stage"] >= 2:
        raise SpecError(f"--format deepspeed: ZeRO-{L['zero_stage']} with pipeline parallelism (pp={L['pp']}): "
                        "DeepSpeed's PipelineEngine refuses it ('ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                        "parallelism'); plan under --framework deepspeed, or fix zero=1 or pp=1")
    comment = [f"for {PINNED['deepspeed']}; {doc['inputs']['model']['name']} on {doc['num_devices']} x "
               f"{doc['inputs']['cluster']['device']}, predicted {doc['step_time_s']:.3f} s/step", profile_line(doc)]
    if job.get("model_code", "native") == "huggingface":
        comment.append("a Hugging Face transformers model class: pass this file as the DeepSpeed config of the "
                       "transformers Trainer or Accelerate (deepspeed=ds_config.json), with gradient checkpointing "
                       "on where the plan recomputes (model.gradient_checkpointing_enable())")
    else:
        comment.append("Megatron-DeepSpeed arguments: " + " ".join(_megatron_deepspeed_args(L, job, model))
                       + " --deepspeed --deepspeed_config ds_config.json")
    if L["cp"] > 1:
        comment.append(f"context parallel {L['cp']}: DeepSpeed has no ring context parallelism (Ulysses is "
                       "--ds-sequence-parallel-size, a different scheme)")
    if job["precision"] in LOW_PRECISIONS:
        comment.append(f"{job['precision']}: DeepSpeed's config has no {job['precision']} training switch; bf16 is "
                       "written (low-precision GEMMs come from Transformer Engine layers in the model code)")
    if model.mla is not None:
        comment.append("multi-latent attention: Megatron-DeepSpeed has no MLA; the shape above is the MHA "
                       "approximation")
    if _plan_device(doc).family.startswith("intel-gaudi"):
        comment.append("Intel Gaudi: run Intel's Megatron-DeepSpeed fork for HPUs (HabanaAI/Megatron-DeepSpeed); its "
                       "--use-fused-sdpa is the fused attention the plan prices")
    config = {
        "_comment": comment,
        "train_batch_size": job["global_batch_size"],
        "train_micro_batch_size_per_gpu": L["micro_batch_size"],
        "gradient_accumulation_steps": L["num_microbatches"],
        "zero_optimization": {"stage": L["zero_stage"], "overlap_comm": bool(L["dp_overlap"]),
                              "contiguous_gradients": True},
        "bf16": {"enabled": job["precision"] == "bf16" or job["precision"] in LOW_PRECISIONS},
        "fp16": {"enabled": job["precision"] == "fp16"},
        "gradient_clipping": 1.0,
    }
    if L["recompute"] == "full":
        # what the plan priced: each layer's input kept whole (1/tp of it with sequence parallelism), not
        # partitioned over the TP ranks by DeepSpeed; contiguous buffers need partitioned activations
        # (deepspeed.checkpointing.configure asserts it)
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    return json.dumps(config, indent=2)


MDS_ATTENTION_ARGS = {"flash2": ["--use-flash-attn-v2"], "flash1": ["--use-flash-attn-v1"]}
"""Megatron-DeepSpeed's FlashAttention switches (megatron/arguments.py); without one it runs its unfused
attention. ``flash`` on Gaudi is Intel's fork's fused SDPA (a note in the config says so)."""


def _megatron_deepspeed_args(L: dict, job: dict, model) -> list[str]:
    """Megatron-DeepSpeed's arguments for the layout and the model's shape."""
    mds = [f"--tensor-model-parallel-size {L['tp']}", f"--pipeline-model-parallel-size {L['pp']}",
           f"--num-layers {model.num_layers}", f"--hidden-size {model.hidden_size}",
           f"--num-attention-heads {model.num_attention_heads}", f"--ffn-hidden-size {model.ffn_hidden_size}",
           f"--seq-length {job['seq_len']}", f"--max-position-embeddings {max(job['seq_len'], model.seq_len)}",
           f"--micro-batch-size {L['micro_batch_size']}", f"--global-batch-size {job['global_batch_size']}",
           f"--zero-stage {L['zero_stage']}"]
    if model.num_kv_heads_resolved != model.num_attention_heads:
        mds.append(f"--num-key-value-heads {model.num_kv_heads_resolved}")
    if _rope(model):
        mds += ["--swiglu", "--normalization rmsnorm", "--use-rotary-position-embeddings", "--disable-bias-linear",
                f"--rotary-position-embeddings-theta {rope_theta(model)}"]
    if not model.tied_embeddings:
        mds.append("--untie-embeddings-and-output-weights")
    if model.moe is not None:
        mds += [f"--num-experts {model.moe.num_experts}", f"--topk {model.moe.top_k}",
                f"--moe-expert-parallel-size {L['ep']}"]
    if L["sequence_parallel"]:
        mds.append("--sequence-parallel")
    mds += MDS_ATTENTION_ARGS.get(job.get("attention", ""), [])
    if L["recompute"] != "none":
        mds.append(f"--recompute-granularity {L['recompute']}")
    if L.get("recompute_layers"):
        mds += ["--recompute-method block", f"--recompute-num-layers {L['recompute_layers']}"]
    if L.get("head_slots") and L["pp"] > 1:  # evaluate at a 2022 date: BigScience's fork had the flag
        raise SpecError("--format deepspeed: microsoft/Megatron-DeepSpeed splits the pipeline by transformer layers only "
                        "(GPTModelPipe's partition_method 'type:transformer'; BigScience's fork had --pp-partition-method); "
                        "evaluate the layout with head_slots=off")
    return mds


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


# ---- torchtitan ------------------------------------------------------------------------------------
def shape_key(model) -> tuple[int, ...]:
    """(layers, hidden, heads, kv heads, FFN, routed experts, vocabulary): what tells bundled
    models apart (Llama 2 7B and Llama 3 8B share a trunk)."""
    return (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads_resolved,
            model.ffn_hidden_size, model.moe.num_experts if model.moe else 0, model.vocab_size)


TORCHTITAN_FLAVORS = {
    # (name, flavor): shape_key -- torchtitan 0.2.2 and 0.3.0 torchtitan/models/*/__init__.py (vocabulary from
    # the tokenizer the flavor is trained with; MLA models count kv heads as query heads)
    ("llama3", "8B"): (32, 4096, 32, 8, 14336, 0, 128256),
    ("llama3", "70B"): (80, 8192, 64, 8, 28672, 0, 128256),
    ("llama3", "405B"): (126, 16384, 128, 8, 53248, 0, 128256),
    ("deepseek_v3", "16B"): (27, 2048, 16, 16, 10944, 64, 102400),
    ("deepseek_v3", "236B"): (60, 5120, 128, 128, 12288, 160, 102400),
    ("deepseek_v3", "671B"): (61, 7168, 128, 128, 18432, 256, 129280),
}
"""Model definitions torchtitan 0.2.2 and 0.3.0 ship, by shape."""
TORCHTITAN_RECIPES = {("llama3", "8B"): "llama3_8b", ("llama3", "70B"): "llama3_70b", ("llama3", "405B"): "llama3_70b",
                      ("deepseek_v3", "16B"): "deepseek_v3_16b", ("deepseek_v3", "236B"): "deepseek_v3_671b",
                      ("deepseek_v3", "671B"): "deepseek_v3_671b"}
"""The torchtitan 0.3.0 config_registry function each flavor's config starts from (data, optimizer,
checkpointing: the recipe's): 236B has none of its own and takes 671B's; 405B's (llama3_405b) builds
float8 converters and async TP whatever the plan says, which refuse GPUs without FP8, so 70B's is taken."""
TORCHTITAN_FORMAT_DATES = {"torchtitan-0.2": "2026-02"}
"""The framework date a format's plan is searched at: 0.2.2's TOML (2026-02); the others the profile's own."""


def torchtitan_flavor(model) -> tuple[str, str]:
    """torchtitan's (model.name, model.flavor) with the plan's shape; :class:`SpecError` when
    torchtitan 0.2.2 defines no such model."""
    key = shape_key(model)
    for flavor, shape in TORCHTITAN_FLAVORS.items():
        if shape == key:
            return flavor
    known = ", ".join(f"{n} {f}" for n, f in TORCHTITAN_FLAVORS)
    raise SpecError(f"--format torchtitan: torchtitan 0.2.2 and 0.3.0 have no model definition of {model.name}'s shape "
                    f"({model.num_layers} layers x {model.hidden_size}); it defines {known} (plus qwen3, llama4, "
                    "gpt_oss). Register a TrainSpec for it (experimental.custom_import) or use --format megatron")


def _torchtitan_pipeline(num_layers: int, pp: int, vp: int, head_slots: bool = False,
                         output: str = "output") -> tuple[str, list[list[str]]]:
    """The schedule (1F1B for one stage per rank, else Interleaved1F1B), and the modules of each of
    the ``pp * vp`` stages, written out so that torchtitan runs the split the plan priced: its own
    split counts the embedding and the output as a layer each since 2025-04 (``head_slots``).
    Even: no stage holds more than ``ceil(L / (pp vp))`` layers; with ``head_slots``:
    ``L + 2`` slots, the larger parts first, the first and the last stage giving one slot each to
    ``tok_embeddings`` and to ``norm`` + ``output``."""
    stages = pp * vp
    if head_slots:
        q, r = divmod(num_layers + 2, stages)
        counts = [q + 1] * r + [q] * (stages - r)
        counts[0] -= 1
        counts[-1] -= 1
    else:
        q, r = divmod(num_layers, stages)
        counts = [q] + [q + 1] * r + [q] * (stages - 1 - r)
    if min(counts[1:-1] or [1]) < 1 or min(counts) < 0:  # the first or last may hold the embedding or head alone
        raise SpecError(f"--format torchtitan: {num_layers} layers cannot fill {stages} pipeline stages")
    parts, first = [], 0
    for count in counts:
        parts.append([f"layers.{i}" for i in range(first, first + count)])
        first += count
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", output]  # the output layer: 'output' in 0.2.2, 'lm_head' in 0.3.0
    return ("1F1B" if vp == 1 else "Interleaved1F1B"), parts


def torchtitan_toml(doc: dict, model=None) -> str:
    """A torchtitan 0.2.2 job config (TOML, for ``--job.config_file``), for a plan searched under the
    torchtitan profile as of 0.2.2's month (``export --format torchtitan-0.2`` plans so)."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    _check_plan_date(doc, "torchtitan-0.2", TORCHTITAN_FORMAT_DATES["torchtitan-0.2"])
    problem = load_profile("torchtitan").at(TORCHTITAN_FORMAT_DATES["torchtitan-0.2"]).cp_problem(model)
    if L["cp"] > 1 and problem:
        raise SpecError(f"--format torchtitan-0.2: {problem}; --format torchtitan writes 0.3's config, which runs it")
    name, flavor = torchtitan_flavor(model)
    mbs, gbs, dp = L["micro_batch_size"], job["global_batch_size"], L["dp"]
    # torchtitan: gradient accumulation = global / (local x dp); with a pipeline the local batch is
    # cut into local / pipeline_parallel_microbatch_size micro-batches instead.
    local = gbs // dp if L["pp"] > 1 else mbs
    lines = _torchtitan_header(doc, L, job, "torchtitan-0.2") + [
        "[job]",
        f'description = "clusterplan: {doc["inputs"]["model"]["name"]}, {_layout_line(L)}"',
        "",
        "[model]",
        f'name = "{name}"',
        f'flavor = "{flavor}"',
    ]
    lines += TORCHTITAN_CONVERTERS.get(job["precision"], [])
    lines += [
        "",
        "[training]",
        f"local_batch_size = {local}",
        f"global_batch_size = {gbs}",
        f"seq_len = {job['seq_len']}",
        'mixed_precision_param = "bfloat16"',
        "",
    ] + _torchtitan_parallelism(L, model.num_layers)
    lines += ["", "[activation_checkpoint]"] + _torchtitan_ac(L, model.num_layers)
    if job.get("compiled"):  # the plan was priced compiled (--compile); async TP is offered only then
        lines += ["", "[compile]", "enable = true", 'components = ["model", "loss"]']
    return "\n".join(lines)


def _torchtitan_ac(L: dict, num_layers: int) -> list[str]:
    """``[activation_checkpoint]``: the recompute mode, or for ``recompute_layers`` of a stage its
    layer SAC, which checkpoints every k-th block whole (``selective_ac_option = "k"``)."""
    k = L.get("recompute_layers", 0)
    if not k:
        return [f'mode = "{L["recompute"]}"']
    stage = num_layers // L["pp"]
    if num_layers % L["pp"] or stage % k:
        raise SpecError(f"recompute_layers={k}: torchtitan checkpoints every k-th block of a stage, and {k} is not "
                        f"{stage} layers divided by a whole k; use a divisor of {stage}")
    return ['mode = "selective"', f'selective_ac_option = "{stage // k}"  # every {stage // k}th block, {k} of {stage}']


def _torchtitan_header(doc: dict, L: dict, job: dict, fmt: str) -> list[str]:
    """The comment lines of a torchtitan config: the prediction, the command, what differs."""
    head = [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
            f"predicted {doc['step_time_s']:.3f} s/step"]
    if fmt == "torchtitan-0.2":
        head += [f"# for {PINNED[fmt]}: torchrun ... -m torchtitan.train --job.config_file this.toml",
                 "# (torchtitan 0.3 configures jobs in Python config registries instead: --format torchtitan)"]
    else:
        head += [f"# for {PINNED[fmt]}: save as clusterplan_torchtitan.py on PYTHONPATH, then",
                 "#   torchrun ... -m torchtitan.train --module clusterplan_torchtitan --config clusterplan",
                 "# (torchtitan 0.2.2's TOML job config: --format torchtitan-0.2)",
                 "# unvalidated: attention runs FlexAttention (its FLASH backend on Hopper/Blackwell) and, where 0.3 allows, "
                 "CUDA graphs; the plan priced fused attention and eager host time"]
    if L["zero_stage"] == 1:  # only from a plan searched under another framework's profile
        head.append("# ZeRO-1 has no torchtitan equivalent: plain replication is written")
    if job["precision"] == "fp8" and not job.get("compiled"):
        head.append("# float8 without torch.compile runs its scaling casts unfused (torchao recommends compile): "
                    "plan with --compile to write [compile]")
    if job["precision"] == "fp16":
        head.append("# fp16: torchtitan trains in bf16 mixed precision (no fp16 loss scaling); bfloat16 is written")
    if L["vp"] > 1:
        head.append(f"# {L['vp']} virtual stages per rank: Interleaved1F1B")
    return head


def _torchtitan_parallelism(L: dict, num_layers: int) -> list[str]:
    """The [parallelism] table. FSDP2 shards for ZeRO 2 and 3 (ZeRO-2 is reshard_after_forward
    off: weights stay gathered from forward to backward); ZeRO-0 is plain replication; torchtitan
    has no ZeRO-1 (its profile)."""
    sharded = L["zero_stage"] in (2, 3)
    shard, replicate = (L["dp"], 1) if sharded else (1, L["dp"])
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {L['tp']}",
        f"pipeline_parallel_degree = {L['pp']}",
        f"context_parallel_degree = {L['cp']}",
        f"expert_parallel_degree = {L['ep']}",
        f"expert_tensor_parallel_degree = {L['tp'] if L.get('expert_tp', True) else 1}",
        f"enable_async_tensor_parallel = {'true' if L['tp_overlap'] else 'false'}",
        f'fsdp_reshard_after_forward = "{"never" if L["zero_stage"] == 2 else "default"}"',
    ]
    if L["pp"] > 1:
        schedule, parts = _torchtitan_pipeline(num_layers, L["pp"], L["vp"], bool(L.get("head_slots")))
        lines += [f'pipeline_parallel_schedule = "{schedule}"', f"pipeline_parallel_microbatch_size = {L['micro_batch_size']}",
                  f"module_fqns_per_model_part = {json.dumps(parts)}"]
    return lines


def _check_plan_date(doc: dict, fmt: str, latest: str) -> None:
    """A plan searched as of a later release may use what ``fmt``'s release lacks: refused."""
    date = (doc["inputs"].get("framework") or {}).get("date")
    if date and date > latest:
        raise SpecError(f"--format {fmt}: this plan was searched under torchtitan as of {date}; the {PINNED[fmt]} form "
                        f"needs a plan as of {latest} or earlier (export --format {fmt} searches so)")


TORCHTITAN_CONVERTERS_03 = {
    "fp8": ["Float8LinearConverter.Config(filter_fqns=['lm_head', 'router.gate'], model_compile_enabled={compiled})",
            "Float8GroupedExpertsConverter.Config(model_compile_enabled={compiled})"],
    "mxfp8": ["MXFP8LinearConverter.Config(model_compile_enabled={compiled})",
              "MXFP8GroupedExpertsConverter.Config(model_compile_enabled={compiled})"],
    "nvfp4": ["NVFP4LinearConverter.Config(fqns=['layers'], model_compile_enabled={compiled})"],
}
"""torchtitan 0.3.0's model converters per job precision (components/quantization: float8.py, mx.py, nvfp4.py:
NVFP4 on every decoder block, as priced, not the first 85% its Llama 3 recipe converts): the
linear layers, and an MoE model's grouped experts too; the lm_head and the router stay bf16, as the
llama3_405b and deepseek_v3_671b_float8 recipes leave them."""


def torchtitan_registry(doc: dict, model=None) -> str:
    """A torchtitan 0.3.0 config registry: a Python module whose function ``clusterplan`` returns the
    ``Trainer.Config`` of the plan (0.3 has no TOML: ``--module`` names a config_registry module,
    ``--config`` its function). It starts from torchtitan's own recipe for the model (data,
    optimizer, checkpointing) and sets the model, the batch, the parallelism, recomputation and compile."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    name, flavor = torchtitan_flavor(model)
    _torchtitan_03_refusals(L)
    compiled = bool(job.get("compiled"))
    converters = ", ".join(c.format(compiled=compiled) for c in TORCHTITAN_CONVERTERS_03.get(job["precision"], [])
                           if model.moe is not None or "GroupedExperts" not in c)
    mbs, gbs, dp = L["micro_batch_size"], job["global_batch_size"], L["dp"]
    body = [f'    model_spec = model_registry("{flavor}", attn_backend="{_torchtitan_attention(doc)}"'
            + (f", converters=[{converters}])" if converters else ")"),
            f"    config = {TORCHTITAN_RECIPES[(name, flavor)]}()  # torchtitan's recipe: data, optimizer, checkpointing",
            "    config.model_spec = model_spec",
            "    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(model_spec)))",
            f"    config.training.local_batch_size = {gbs // dp if L['pp'] > 1 else mbs}",
            f"    config.training.global_batch_size = {gbs}", f"    config.training.seq_len = {job['seq_len']}",
            f"    config.training.disable_cuda_graphs = {L['pp'] > 1 or L['ep'] > 1}  # 0.3 refuses them with pp (and EP's default dispatcher)",
            *(f"    config.parallelism.{k} = {v!r}" for k, v in _torchtitan_03_parallelism(L, model.num_layers)),
            f"    config.activation_checkpoint = {TORCHTITAN_AC_03[L['recompute']]}",
            f"    config.compile = CompileConfig(enable={compiled}, components=['model', 'loss'], "
            f"enable_async_tensor_parallel={bool(L['tp_overlap'])})",
            "    return config"]
    head = ['"""' + f"clusterplan: {doc['inputs']['model']['name']}, {_layout_line(L)}" + '"""',
            *_torchtitan_header(doc, L, job, "torchtitan")]
    imports = ["from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
               "from torchtitan.components.quantization import (Float8GroupedExpertsConverter, Float8LinearConverter,",
               "                                                MXFP8GroupedExpertsConverter, MXFP8LinearConverter,",
               "                                                NVFP4LinearConverter)",
               "from torchtitan.config import CompileConfig",
               "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
               "from torchtitan.models.common.config_utils import decoder_vocab_size",
               f"from torchtitan.models.{name} import model_registry",
               f"from torchtitan.models.{name}.config_registry import {TORCHTITAN_RECIPES[(name, flavor)]}"]
    return "\n".join(head + imports + ["", "", "def clusterplan():", '    """The plan\'s Trainer.Config."""', *body]) + "\n"


TORCHTITAN_AC_03 = {"none": "None", "selective": "SelectiveAC.Config()  # per-op SAC", "full": "FullAC.Config()"}
"""torchtitan 0.3.0's activation checkpointing per recompute mode (distributed/activation_checkpoint.py)."""


def _torchtitan_attention(doc: dict) -> str:
    """0.3.0's language-model attention: FlexAttention's FLASH backend on Hopper and Blackwell (it refuses
    older GPUs), FlexAttention elsewhere (SDPA is no longer one: models/common/config_utils.py)."""
    arch = cuda_arch(doc["inputs"]["cluster"]["device"])
    return "flex_flash" if arch is not None and arch >= 9 else "flex"


def _torchtitan_03_refusals(L: dict) -> None:
    if L.get("recompute_layers"):
        raise SpecError(f"--format torchtitan: torchtitan 0.3 has no layer SAC (removed 2026-03, #2357) for "
                        f"recompute_layers={L['recompute_layers']}; --format torchtitan-0.2 writes 0.2.2's")
    if L["ep"] > 1 and L.get("expert_tp", True) and L["tp"] > 1:
        raise SpecError("--format torchtitan: torchtitan 0.3 has no expert tensor parallelism (removed 2026-04, #3167): "
                        "with ep > 1 experts stay whole (etp=1); plan under --framework torchtitan, whose search "
                        "keeps to it, or use --format torchtitan-0.2")


def _torchtitan_03_parallelism(L: dict, num_layers: int) -> list[tuple[str, object]]:
    """The ParallelismConfig fields of torchtitan 0.3.0 (FSDP2 shards for ZeRO 2 and 3; ZeRO-2 keeps the
    weights gathered from forward to backward)."""
    sharded = L["zero_stage"] in (2, 3)
    pairs = [("data_parallel_replicate_degree", 1 if sharded else L["dp"]),
             ("data_parallel_shard_degree", L["dp"] if sharded else 1), ("tensor_parallel_degree", L["tp"]),
             ("pipeline_parallel_degree", L["pp"]), ("context_parallel_degree", L["cp"]),
             ("expert_parallel_degree", L["ep"]),
             ("fsdp_reshard_after_forward", "never" if L["zero_stage"] == 2 else "default")]
    if L["pp"] > 1:
        schedule, parts = _torchtitan_pipeline(num_layers, L["pp"], L["vp"], bool(L.get("head_slots")), "lm_head")
        pairs += [("pipeline_parallel_schedule", schedule), ("pipeline_parallel_microbatch_size", L["micro_batch_size"]),
                  ("module_fqns_per_model_part", parts)]
    return pairs


# ---- MaxText ---------------------------------------------------------------------------------------
MAXTEXT_MODELS = {
    # shape_key: MaxText 0.2.5 configs/models/<name>.yml
    (32, 4096, 32, 8, 14336, 0, 128256): "llama3-8b",
    (80, 8192, 64, 8, 28672, 0, 128256): "llama3-70b",
    (126, 16384, 128, 8, 53248, 0, 128256): "llama3.1-405b",
    (32, 4096, 32, 32, 11008, 0, 32000): "llama2-7b",
    (40, 5120, 40, 40, 13824, 0, 32000): "llama2-13b",
    (80, 8192, 64, 8, 28672, 0, 32000): "llama2-70b",
    (32, 4096, 32, 8, 14336, 8, 32000): "mixtral-8x7b",
    (61, 7168, 128, 128, 18432, 256, 129280): "deepseek3-671b",
    (96, 12288, 96, 96, 49152, 0, 50257): "gpt3-175b",
}


def maxtext_model(model) -> list[tuple[str, object]]:
    """``model_name`` when MaxText ships the model, else the explicit shape (dense SwiGLU only)."""
    name = MAXTEXT_MODELS.get(shape_key(model))
    if name:
        return [("model_name", name)]
    if model.moe is not None or model.mla is not None or not _rope(model):
        raise SpecError(f"--format maxtext: MaxText 0.2.5 ships no config of {model.name}'s shape and clusterplan "
                        "writes explicit shapes for dense SwiGLU models only; add a configs/models/<name>.yml and "
                        "pass model_name=<name>")
    return [("decoder_block", "llama2"), ("base_emb_dim", model.hidden_size),
            ("base_num_query_heads", model.num_attention_heads), ("base_num_kv_heads", model.num_kv_heads_resolved),
            ("base_mlp_dim", model.ffn_hidden_size), ("base_num_decoder_layers", model.num_layers),
            ("head_dim", model.head_dim_resolved), ("vocab_size", model.vocab_size),
            ("mlp_activations", '["silu","linear"]'), ("enable_dropout", str(model.dropout).lower()),
            ("rope_max_timescale", rope_theta(model)),
            ("logits_via_embedding", str(model.tied_embeddings).lower())]


MAXTEXT_AXES = ("data", "fsdp", "tensor", "context", "pipeline", "expert")
MAXTEXT_MESH_ORDER = ("data", "pipeline", "fsdp", "context", "tensor", "expert")
"""The axes in MaxText's ``mesh_axes`` order (base.yml, 0.2.5: data, stage, fsdp, ..., context, ...,
tensor, ..., expert), least network-intensive first: the order jax places them on the torus in reverse."""


def torus_axes_fit(sizes: list[int], physical: tuple[int, ...]) -> bool:
    """Whether each logical mesh axis (``sizes``, least network-intensive first) gets whole physical
    torus axes, as ``jax.experimental.mesh_utils.create_device_mesh`` assigns them without
    ``allow_split_physical_axes``: from the last logical axis back, the first subset of the free
    physical axes (most axes first, in combination order) whose lengths multiply to the size."""
    free = list(physical)
    for size in reversed(sizes):
        if size == 1:
            continue
        found = next((combo for k in range(len(free), 0, -1) for combo in itertools.combinations(range(len(free)), k)
                      if math.prod(free[i] for i in combo) == size), None)
        if found is None:
            return False
        for i in found:
            free[i] = 0  # assigned: a zero length matches no size
    return True


def maxtext_mesh(doc: dict) -> tuple[dict[str, int], dict[str, int], int]:
    """(ici degrees, dcn degrees, devices per slice). A slice is a TPU pod slice (the whole job) or,
    on GPUs, a node: ICI takes the innermost axes of the plan's rank order up to the slice size,
    DCN the rest."""
    L, cluster = doc["layout"], doc["inputs"]["cluster"]
    if L["ep"] > 1 and not L.get("expert_tp", True):
        raise SpecError("--format maxtext: MaxText has no expert-tensor-parallel folding (etp=1); plan under "
                        "--framework maxtext")
    zero3 = L["zero_stage"] == 3
    dp_rest = L["dp"] // L["ep"]
    degrees = {"tensor": L["tp"], "context": L["cp"], "pipeline": L["pp"], "expert": L["ep"],
               "data": 1 if zero3 else dp_rest, "fsdp": dp_rest if zero3 else 1}
    if cluster["family"] in GPU_FAMILIES:
        per_slice = cluster["devices_per_node"]
    else:  # a TPU pod slice: the cluster's scale-up domain (the whole job on one slice)
        per_slice = min(cluster.get("domain_size") or doc["num_devices"], doc["num_devices"])
    if doc["num_devices"] % per_slice:
        raise SpecError(f"--format maxtext: {doc['num_devices']} devices are not whole {per_slice}-device slices")
    by_axis = {"tp": ["tensor"], "cp": ["context"], "dp": ["expert", "data", "fsdp"], "pp": ["pipeline"]}
    order = [a for k in order_axes(L["order"]) for a in by_axis[k]]
    ici, dcn, room = {}, {}, per_slice
    for axis in order:
        g = math.gcd(degrees[axis], room)
        ici[axis], dcn[axis] = g, degrees[axis] // g
        room //= g
    if room != 1:
        raise SpecError(f"--format maxtext: the layout's degrees do not fill a {per_slice}-device slice with whole "
                        "axes (ici product must equal the devices per slice)")
    if (doc.get("zero_shard_copies") or 1) > 1:
        # what the plan priced (maxtext semantics.zero3_across_domains: replicate, cost.terms.zero_replicas):
        # fsdp inside a slice, plain data parallelism across slices, as base.yml's -1 defaults do
        dcn["data"], dcn["fsdp"] = dcn["fsdp"], 1
    return ici, dcn, per_slice


def maxtext_batch(gbs: int, devices: int, accumulation: int) -> str:
    """``per_device_batch_size`` such that MaxText's ``int(devices * per_device) * accumulation`` is
    ``gbs`` exactly: the exact decimal where there is one, else the nearest float above the
    fraction (e.g. 2048 over 6144 devices: 1/3 is written 0.3333333333333333, whose product with
    6144 is 2048.0, where 0.333333 gives 2047)."""
    if gbs % accumulation:
        raise SpecError(f"--format maxtext: global batch {gbs} is not {accumulation} accumulation steps")
    target = gbs // accumulation
    exact = Fraction(target, devices)
    candidate = float(exact)
    for _ in range(4):
        if int(devices * candidate) == target and abs(Fraction(candidate) - exact) < Fraction(1, 10 ** 12):
            return repr(candidate) if exact.denominator != 1 else str(exact.numerator)
        candidate = math.nextafter(candidate, math.inf)
    raise SpecError(f"--format maxtext: per_device_batch_size {exact} cannot be written so that MaxText trains "
                    f"{gbs} sequences; choose a global batch that is a multiple of {exact.denominator}")


def _maxtext_refusals(doc: dict, model, family: str) -> None:
    """What MaxText cannot run, by its profile's rules (the search keeps to them): another platform,
    a pipeline split or micro-batch count its config validation asserts against, partial remat."""
    L = doc["layout"]
    if family not in GPU_FAMILIES and family != "tpu-torus":
        raise SpecError(f"--format maxtext: MaxText runs on TPUs and GPUs, not {family}")
    prof = load_profile("maxtext").at(None)
    dense = model.moe.num_dense_layers if model.moe else 0
    for problem in (prof.pipeline_split_problem(model.num_layers, dense, L["pp"], L["vp"]),
                    prof.pipeline_microbatch_problem(L["pp"], L["num_microbatches"])):
        if problem:
            raise SpecError(f"--format maxtext: {problem} (plan under --framework maxtext, whose search keeps to it)")
    if L.get("recompute_layers"):
        raise SpecError("--format maxtext: MaxText's remat_policy applies to every layer alike; it has no "
                        f"recompute_layers={L['recompute_layers']} (evaluate the layout without it)")


def maxtext_overrides(doc: dict, model=None) -> str:
    """MaxText 0.2.5 ``key=value`` overrides for ``train.py base.yml ...``: the model, the mesh
    (ici_* inside a slice, dcn_* across slices, every axis written so no -1 default fills in), the
    batch and the pipeline."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    family = doc["inputs"]["cluster"]["family"]
    _maxtext_refusals(doc, model, family)
    ici, dcn, per_slice = maxtext_mesh(doc)
    stages = L["pp"] * L["vp"]
    accumulation = L["num_microbatches"] if L["pp"] == 1 else 1
    # MaxText names what it saves: 'minimal' recomputes least (the nearest to none/selective here),
    # 'full' recomputes everything.
    remat = "full" if L["recompute"] == "full" else "minimal"
    pairs: list[tuple[str, object]] = [*maxtext_model(model),
                                       ("hardware", "tpu" if family == "tpu-torus" else "gpu")]
    names = {"pipeline": "pipeline"}
    for axis in MAXTEXT_AXES:
        pairs.append((f"ici_{names.get(axis, axis)}_parallelism", ici[axis]))
    for axis in MAXTEXT_AXES:
        pairs.append((f"dcn_{names.get(axis, axis)}_parallelism", dcn[axis]))
    pairs += [("per_device_batch_size", maxtext_batch(job["global_batch_size"], doc["num_devices"], accumulation)),
              ("gradient_accumulation_steps", accumulation), ("max_target_length", job["seq_len"]),
              ("remat_policy", remat)]
    if L["pp"] > 1:
        pairs += [("num_layers_per_pipeline_stage", model.num_layers // stages),
                  ("num_pipeline_repeats", L["vp"]), ("num_pipeline_microbatches", L["num_microbatches"])]
    if job["precision"] == "fp8":
        pairs.append(("quantization", "fp8"))
    torus = doc["inputs"]["cluster"].get("torus_shape")
    split = bool(torus) and not torus_axes_fit([ici[a] for a in MAXTEXT_MESH_ORDER], tuple(torus))
    if split:  # else create_device_mesh raises 'Failed to find assignment for logical_axis_index ...'
        pairs.append(("allow_split_physical_axes", "true"))
    slices = doc["num_devices"] // per_slice
    head = [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
            f"predicted {doc['step_time_s']:.3f} s/step",
            f"# for {PINNED['maxtext']}: python -m maxtext.trainers.pre_train.train <base.yml> run_name=... <these>",
            f"# {slices} slice(s) of {per_slice} devices: ici_* inside a slice, dcn_* across"]
    if split:
        head.append(f"# the ici degrees do not each take whole axes of the {'x'.join(map(str, torus))} torus: "
                    "allow_split_physical_axes lets jax split a physical axis between two mesh axes")
    return "\n".join(head + [f"{k}={v}" for k, v in pairs])


# ---- Slurm -----------------------------------------------------------------------------------------
FAMILY_NOTES = {
    "nvlink-domain": "an NVLink domain spans several nodes: allocate each domain's nodes together (on Slurm with "
                     "the topology/block plugin, --segment)",
    "xgmi": "AMD GPUs: run a ROCm build of Megatron-LM (e.g. AMD's rocm/megatron-lm image) and check its launch "
            "notes for the environment it expects",
    "gaudi": "Intel Gaudi: run Intel's Megatron-LM fork for HPUs (HabanaAI/Megatron-LM, based on Megatron-Core "
             "core_r0.9.0: flags newer than that release may be missing) and request the accelerators as your Slurm "
             "site names them (the gres may not be gpu); CUDA_DEVICE_MAX_CONNECTIONS does not apply",
}


def _segment_line(cluster: dict, num_devices: int) -> list[str]:
    """On NVLink Switch domains spanning several nodes, the nodes of each domain the plan assumes,
    kept together by Slurm's topology/block plugin (``--segment``: Megatron-Bridge's GB200 executor
    sets it the same way)."""
    if cluster["family"] != "nvlink-domain" or not cluster.get("domain_size"):
        return []
    nodes = min(cluster["domain_size"], num_devices) // cluster["devices_per_node"]
    return [f"#SBATCH --segment={nodes}"]


def slurm_script(doc: dict, model=None) -> str:
    """An sbatch script: one torchrun per node (``srun``), which starts one Megatron-LM process per device.

    Raises
    ------
    SpecError
        A cluster torchrun does not drive (TPU, Cerebras, Groq), or one that is not whole nodes.
    """
    cluster = doc["inputs"]["cluster"]
    per_node, num_devices = cluster["devices_per_node"], doc["num_devices"]
    _check_torchrun(cluster, num_devices)
    args, notes, env = _megatron_args_and_notes(doc, model_spec(doc, model))
    notes = [*notes, *([FAMILY_NOTES[cluster["family"]]] if cluster["family"] in FAMILY_NOTES else [])]
    header = ["#!/bin/bash", *_megatron_header(doc, notes),
              f"# layout: {_layout_line(doc['layout'])}",
              f"#SBATCH --job-name={_job_name(doc['inputs']['model']['name'])}",
              f"#SBATCH --nodes={num_devices // per_node}",
              "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the per-device ranks
              f"#SBATCH --gpus-per-node={per_node}",
              "#SBATCH --exclusive",
              *_segment_line(cluster, num_devices),
              ""]
    body = ["set -euo pipefail"]
    for key, value in env.items():
        body += [f"# {ENV_REASONS[key]}", f"export {key}={value}"]
    body += ["# the first host of the allocation hosts the rendezvous (no pipe: a long host list must not",
             "# end the script through SIGPIPE under pipefail)",
             'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
             'if [ "${#hosts[@]}" -eq 0 ]; then echo "error: no hosts in SLURM_JOB_NODELIST" >&2; exit 1; fi',
             'MASTER_ADDR="${hosts[0]}"',
             "export MASTER_ADDR",
             ""]
    launch = ["srun torchrun", '--nnodes "$SLURM_NNODES"', f"--nproc-per-node {per_node}",
              '--rdzv-id "$SLURM_JOB_ID"', "--rdzv-backend c10d", f'--rdzv-endpoint "$MASTER_ADDR:{RDZV_PORT}"',
              "pretrain_gpt.py", *args]
    return "\n".join(header + body + [" \\\n  ".join(launch)])


def _check_torchrun(cluster: dict, num_devices: int) -> None:
    if cluster["family"] not in TORCHRUN_FAMILIES:
        raise SpecError(f"--format slurm: {cluster['id']} is a {cluster['family']} cluster ({cluster['device']}), "
                        f"which torchrun does not launch; the slurm format is for {', '.join(TORCHRUN_FAMILIES)} "
                        "clusters (for a TPU slice use --format maxtext)")
    if num_devices % cluster["devices_per_node"]:
        raise SpecError(f"--format slurm: {num_devices} devices are not whole {cluster['devices_per_node']}-device "
                        "nodes; use a multiple of the node size")


def _layout_line(layout: dict) -> str:
    """The layout in the words of ``plan``'s report: ``tp=8 pp=4 dp=32 mbs=1 recompute=none zero=1``."""
    always = ("tp", "pp", "dp")
    degrees = [f"{k}={layout[k]}" for k in (*always, "cp", "ep", "vp") if k in always or layout[k] > 1]
    sp = "on" if layout["sequence_parallel"] else "off"
    recompute = recompute_words(layout["recompute"], layout.get("recompute_layers", 0), layout.get("recompute_modules") or ())
    return " ".join(degrees + [f"mbs={layout['micro_batch_size']}", f"sp={sp}", *recompute,
                               f"zero={layout['zero_stage']}"])


def _job_name(model_name: str) -> str:
    """A Slurm-safe job name: ``Llama 3 70B`` -> ``llama-3-70b``."""
    return re.sub(r"[^a-z0-9._-]+", "-", model_name.lower()).strip("-") or "clusterplan"


FRAMEWORK_OF_FORMAT = {"megatron": "megatron", "slurm": "megatron", "deepspeed": "deepspeed",
                       "torchtitan": "torchtitan", "torchtitan-0.2": "torchtitan", "maxtext": "maxtext"}
"""The framework profile a format's plan must be searched under (the slurm script runs Megatron)."""


def export_framework(fmt: str, given: str | None) -> str:
    """The framework to search under for ``fmt``; :class:`SpecError` when ``--framework`` names another
    (a plan searched for one framework may use knobs the other lacks: search again under it)."""
    want = FRAMEWORK_OF_FORMAT[fmt]
    if given and given != want:
        raise SpecError(f"export --format {fmt}: the config is for {want}, but --framework {given} was given; "
                        f"drop --framework (the plan is then searched under {want}) or use --framework {want}")
    return want


def export(doc: dict, fmt: str, model=None) -> str:
    """The config for ``fmt`` (one of :data:`FORMATS`); the plan must have been searched under the
    format's framework (:func:`export_framework`). ``model`` is the plan's
    :class:`models.spec.ModelSpec` (needed for a model that is not bundled: :func:`model_spec`)."""
    fw = (doc["inputs"].get("framework") or {}).get("id")
    if doc["inputs"]["job"].get("model_code", "native") == "huggingface" and fmt != "deepspeed":
        raise SpecError(f"export --format {fmt}: the plan trains a Hugging Face transformers model class, which "
                        f"{fmt} does not run; --format deepspeed writes its ZeRO config (plan with --framework deepspeed)")
    if fw and fw != FRAMEWORK_OF_FORMAT[fmt]:
        raise SpecError(f"export --format {fmt}: this plan was searched under {fw}; a {fmt} config needs a plan "
                        f"searched under {FRAMEWORK_OF_FORMAT[fmt]}")
    check_platform(FRAMEWORK_OF_FORMAT[fmt], _plan_device(doc), f"export --format {fmt}", export=True)
    text = {"megatron": megatron_args, "deepspeed": deepspeed_config, "torchtitan": torchtitan_registry,
            "torchtitan-0.2": torchtitan_toml, "maxtext": maxtext_overrides, "slurm": slurm_script}[fmt](doc, model)
    if fmt == "deepspeed" or not text.startswith(("#", '"""')):  # JSON carries it in its comment; a shebang stays first
        return text
    first, _, rest = text.partition("\n")
    return f"{first}\n# {profile_line(doc)}\n{rest}"


def _plan_device(doc: dict) -> SimpleNamespace:
    """The plan's device as an id and a family: the Plan document's ``device_family``, else (a document
    written before it carried one) the bundled device's."""
    cluster = doc["inputs"]["cluster"]
    family = cluster.get("device_family")
    if family is None:
        from clusterplan.topologies.library import load_device
        family = load_device(cluster["device"]).family
    return SimpleNamespace(id=cluster["device"], family=family)


def profile_line(doc: dict) -> str:
    """What the plan was searched under, beside the launcher release the config is written for: the
    profile describes a framework release's features (possibly as of an earlier date), the pinned
    launcher is the package the flags are checked against (tests/launchers)."""
    fw = doc["inputs"].get("framework") or {}
    when = f", features as of {fw['date']}" if fw.get("as_of") else ""
    return (f"planned with the {fw.get('id', '?')} profile ({fw.get('version', '?')}{when}); written for the "
            "launcher release this header names")
