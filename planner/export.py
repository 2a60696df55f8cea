"""Launcher configs from a Plan document: Megatron-LM arguments, a DeepSpeed config, a torchtitan
TOML fragment and MaxText overrides.

Export code formats the plan; it never recomputes a cost. Flag and key names follow each
launcher's documentation (Megatron-LM ``megatron/training/arguments.py``, DeepSpeed config JSON,
torchtitan ``job_config``, MaxText ``base.yml``); versions differ, so the output is a starting
point to check against the launcher you run. Knobs a launcher cannot express are stated in a
comment rather than dropped silently.
"""

from __future__ import annotations

import json

FORMATS = ("megatron", "deepspeed", "torchtitan", "maxtext")


def _job(doc: dict) -> dict:
    return doc["inputs"]["job"]


def megatron_args(doc: dict) -> str:
    """Megatron-LM / NeMo (Megatron-Core) command-line arguments for the plan's layout."""
    L, job = doc["layout"], _job(doc)
    model = doc["inputs"]["model"]
    args = [
        f"--tensor-model-parallel-size {L['tp']}", f"--pipeline-model-parallel-size {L['pp']}",
        f"--context-parallel-size {L['cp']}", f"--micro-batch-size {L['micro_batch_size']}",
        f"--global-batch-size {job['global_batch_size']}", f"--seq-length {job['seq_len']}",
        f"--num-layers {model['num_layers']}", f"--hidden-size {model['hidden_size']}",
    ]
    notes = []
    if L["ep"] > 1:
        args.append(f"--expert-model-parallel-size {L['ep']}")
        if not L.get("expert_tp", True):
            args.append("--expert-tensor-parallel-size 1")
    if L["vp"] > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {model['num_layers'] // (L['pp'] * L['vp'])}")
    if L["sequence_parallel"]:
        args.append("--sequence-parallel")
    if L["recompute"] == "selective":
        args.append("--recompute-granularity selective")
    elif L["recompute"] == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if L["zero_stage"] in (1, 2):
        args.append("--use-distributed-optimizer")
        if L["zero_stage"] == 2:
            notes.append("ZeRO-2: the distributed optimizer shards optimizer states and reduce-scatters gradients")
    elif L["zero_stage"] == 3:
        args.append("--use-torch-fsdp2")
        notes.append("ZeRO-3 runs as PyTorch FSDP2 in Megatron-Core")
    if L["dp_overlap"]:
        args += ["--overlap-grad-reduce"] + (["--overlap-param-gather"] if L["zero_stage"] in (1, 2) else [])
    if L["tp_overlap"]:
        args.append("--tp-comm-overlap")
    precision = job["precision"]
    args += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format hybrid"]}[precision]
    if L["order"] != "tp-cp-dp-pp":
        notes.append(f"rank order {L['order']}: Megatron-Core's default is tp-cp-ep-dp-pp; set it where your "
                     "version allows (e.g. ProcessGroupCollection / --use-tp-pp-dp-mapping)")
    header = [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
              f"predicted {doc['step_time_s']:.3f} s/step"] + [f"# note: {n}" for n in notes]
    return "\n".join(header + [" \\\n".join(args)])


def deepspeed_config(doc: dict) -> str:
    """A DeepSpeed config JSON; pipeline and tensor parallelism go to Megatron-DeepSpeed's arguments."""
    L, job = doc["layout"], _job(doc)
    gas = doc["layout"]["num_microbatches"]
    config = {
        "train_batch_size": job["global_batch_size"],
        "train_micro_batch_size_per_gpu": L["micro_batch_size"],
        "gradient_accumulation_steps": gas,
        "zero_optimization": {"stage": L["zero_stage"], "overlap_comm": bool(L["dp_overlap"]),
                              "contiguous_gradients": True},
        "bf16": {"enabled": job["precision"] in ("bf16", "fp8")},
        "fp16": {"enabled": job["precision"] == "fp16"},
        "gradient_clipping": 1.0,
        "activation_checkpointing": {"partition_activations": bool(L["sequence_parallel"]),
                                     "contiguous_memory_optimization": L["recompute"] == "full"},
    }
    # JSON has no comments: the model-parallel degrees go to Megatron-DeepSpeed's own arguments.
    head = (f"// Megatron-DeepSpeed: --tensor-model-parallel-size {L['tp']} --pipeline-model-parallel-size "
            f"{L['pp']} (context parallel {L['cp']}, expert parallel {L['ep']}, recompute {L['recompute']}); "
            "delete this line before use")
    return head + "\n" + json.dumps(config, indent=2)


def torchtitan_toml(doc: dict) -> str:
    """A torchtitan job-config fragment (TOML)."""
    L, job = doc["layout"], _job(doc)
    shard = L["dp"] if L["zero_stage"] == 3 else 1
    replicate = 1 if L["zero_stage"] == 3 else L["dp"]
    lines = [
        "[training]",
        f"local_batch_size = {L['micro_batch_size']}",
        f"global_batch_size = {job['global_batch_size']}",
        f"seq_len = {job['seq_len']}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {L['tp']}",
        f"pipeline_parallel_degree = {L['pp']}",
        f"context_parallel_degree = {L['cp']}",
        f"enable_async_tensor_parallel = {'true' if L['tp_overlap'] else 'false'}",
        "",
        "[activation_checkpoint]",
        f'mode = "{L["recompute"]}"',
    ]
    if job["precision"] == "fp8":
        lines += ["", "[model]", 'converters = ["float8"]']
    if L["zero_stage"] in (1, 2):
        lines.insert(0, f"# ZeRO-{L['zero_stage']} has no torchtitan equivalent: plain replication is written "
                        "(FSDP shards everything, ZeRO-3)")
    if L["ep"] > 1 or L["vp"] > 1:
        etp = "" if L.get("expert_tp", True) else ", expert tensor parallel 1"
        lines.insert(0, f"# set expert parallel {L['ep']}{etp} / virtual stages {L['vp']} as your torchtitan version "
                        "names them")
    return "\n".join(lines)


def maxtext_overrides(doc: dict) -> str:
    """MaxText ``key=value`` overrides: parallelism inside a slice (ici_*) and across (dcn_*)."""
    L, job = doc["layout"], _job(doc)
    fsdp = L["dp"] if L["zero_stage"] == 3 else 1
    data = 1 if L["zero_stage"] == 3 else L["dp"]
    # MaxText names what it saves: 'minimal' recomputes least (the nearest to none/selective here),
    # 'full' recomputes everything.
    remat = "full" if L["recompute"] == "full" else "minimal"
    per_device = job["global_batch_size"] / doc["num_devices"]  # MaxText: global = per_device x devices
    pairs = [
        ("ici_data_parallelism", data), ("ici_fsdp_parallelism", fsdp), ("ici_tensor_parallelism", L["tp"]),
        ("ici_context_parallelism", L["cp"]), ("ici_pipeline_parallelism", L["pp"]),
        ("ici_expert_parallelism", L["ep"]), ("per_device_batch_size", f"{per_device:g}"),
        ("max_target_length", job["seq_len"]), ("remat_policy", remat),
    ]
    note = "# everything is placed on ICI; move the outermost degrees to dcn_* when the job spans slices"
    return "\n".join([note] + [f"{k}={v}" for k, v in pairs])


def export(doc: dict, fmt: str) -> str:
    """The config for ``fmt`` (one of :data:`FORMATS`)."""
    return {"megatron": megatron_args, "deepspeed": deepspeed_config, "torchtitan": torchtitan_toml,
            "maxtext": maxtext_overrides}[fmt](doc)
