"""``--format deepspeed``: a DeepSpeed config JSON, with Megatron-DeepSpeed's arguments for tensor
and pipeline parallelism and the model shape in its ``_comment`` key."""

from __future__ import annotations

import json

from clusterplan.cost.layout import offloads_activations, offloads_optimizer
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import (PINNED, _job, _plan_device, _rope, model_spec, profile_line,
                                                      rope_theta)
from clusterplan.topologies.precisions import LOW_PRECISIONS


def deepspeed_config(doc: dict, model=None) -> str:
    """A DeepSpeed config JSON. Tensor and pipeline parallelism and the model shape are Megatron-
    DeepSpeed's arguments: they go in the ``_comment`` key, which DeepSpeed ignores."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    _deepspeed_refusals(L)
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
    if offloads_optimizer(L.get("offload", "none")):  # ZeRO-Offload: Adam's states in pinned host memory, stepped by
        # DeepSpeedCPUAdam (zero_optimization.offload_optimizer since 2021-04; pinned: the host link's full rate)
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if L["recompute"] == "full":
        # what the plan priced: each layer's input kept whole (1/tp of it with sequence parallelism), not
        # partitioned over the TP ranks by DeepSpeed; contiguous buffers need partitioned activations
        # (deepspeed.checkpointing.configure asserts it)
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
        if offloads_activations(L.get("offload", "none")):  # each checkpointed layer's input in host memory
            config["activation_checkpointing"]["cpu_checkpointing"] = True
    return json.dumps(config, indent=2)


def _deepspeed_refusals(L: dict) -> None:
    """What the pinned DeepSpeed release cannot run: ZeRO-2/3 under its PipelineEngine, and hybrid
    sharding (MiCS), removed after 0.19.5."""
    if L["pp"] > 1 and L["zero_stage"] >= 2:
        raise SpecError(f"--format deepspeed: ZeRO-{L['zero_stage']} with pipeline parallelism (pp={L['pp']}): "
                        "DeepSpeed's PipelineEngine refuses it ('ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                        "parallelism'); plan under --framework deepspeed, or fix zero=1 or pp=1")
    if L.get("dp_shard"):
        raise SpecError(f"--format deepspeed: dp_shard={L['dp_shard']}: DeepSpeed's hybrid sharding (MiCS, "
                        f"zero_optimization.mics_shard_size, 2023-04 to 0.19.5) was removed before {PINNED['deepspeed']}, "
                        "which refuses the key (DeepSpeed issue #8489); plan without dp_shard for this format")


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
    if offloads_activations(L.get("offload", "none")):  # initialize.py passes checkpoint_in_cpu to checkpointing.configure
        mds += ["--deepspeed-activation-checkpointing", "--checkpoint-in-cpu"]
    if offloads_optimizer(L.get("offload", "none")):  # DeepSpeedCPUAdam as the client optimizer: ZeRO-Offload refuses
        mds.append("--cpu-optimizer")  # another (engine.py zero_force_ds_cpu_optimizer); --cpu-optimizer since 2021-06
    if L.get("head_slots") and L["pp"] > 1:  # evaluate at a 2022 date: BigScience's fork had the flag
        raise SpecError("--format deepspeed: microsoft/Megatron-DeepSpeed splits the pipeline by transformer layers only "
                        "(GPTModelPipe's partition_method 'type:transformer'; BigScience's fork had --pp-partition-method); "
                        "evaluate the layout with head_slots=off")
    return mds
