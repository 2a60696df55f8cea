"""Launcher configs from a Plan document: Megatron-LM arguments, a DeepSpeed config, a torchtitan
TOML fragment, MaxText overrides and a Slurm batch script that starts Megatron-LM with torchrun.

Export code formats the plan; it never recomputes a cost. Flag and key names follow each
launcher's documentation (Megatron-LM ``megatron/training/arguments.py``, DeepSpeed config JSON,
torchtitan ``job_config``, MaxText ``base.yml``); versions differ, so the output is a starting
point to check against the launcher you run. Knobs a launcher cannot express are stated in a
comment rather than dropped silently.
"""

from __future__ import annotations

import json
import re

from models.errors import SpecError

FORMATS = ("megatron", "deepspeed", "torchtitan", "maxtext", "slurm")
TORCHRUN_FAMILIES = ("nvswitch", "nvlink-domain", "xgmi", "gaudi")
"""Cluster families whose devices PyTorch drives, one process per device: torchrun can start them.
TPU slices run under XLA/JAX launchers, Cerebras and Groq under their own compilers and runtimes."""
RDZV_PORT = 29500  # torchrun's default master port


def _job(doc: dict) -> dict:
    return doc["inputs"]["job"]


def megatron_args(doc: dict) -> str:
    """Megatron-LM / NeMo (Megatron-Core) command-line arguments for the plan's layout."""
    args, notes = _megatron_args_and_notes(doc)
    return "\n".join(_megatron_header(doc, notes) + [" \\\n".join(args)])


def _megatron_header(doc: dict, notes: list[str]) -> list[str]:
    return [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
            f"predicted {doc['step_time_s']:.3f} s/step"] + [f"# note: {n}" for n in notes]


def _megatron_args_and_notes(doc: dict) -> tuple[list[str], list[str]]:
    """The arguments (one ``--flag value`` per item) and the notes on what they cannot say."""
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
    return args, notes


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
    # FSDP2 shards (zero 2 and 3; zero 2 is reshard_after_forward off: weights stay gathered from
    # forward to backward); zero 0 is plain replication. torchtitan has no ZeRO-1 (its profile).
    shard = L["dp"] if L["zero_stage"] in (2, 3) else 1
    replicate = 1 if L["zero_stage"] in (2, 3) else L["dp"]
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
        f'fsdp_reshard_after_forward = "{"never" if L["zero_stage"] == 2 else "default"}"',
        "",
        "[activation_checkpoint]",
        f'mode = "{L["recompute"]}"',
    ]
    if job["precision"] == "fp8":
        lines += ["", "[model]", 'converters = ["float8"]']
    if L["zero_stage"] == 1:  # only from a plan searched under another framework's profile
        lines.insert(0, "# ZeRO-1 has no torchtitan equivalent: plain replication is written")
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


FAMILY_NOTES = {
    "nvlink-domain": "an NVLink domain spans several nodes: allocate each domain's nodes together (on Slurm with "
                     "the topology/block plugin, --segment)",
    "xgmi": "AMD GPUs: run a ROCm build of Megatron-LM (e.g. AMD's rocm/megatron-lm image) and check its launch "
            "notes for the environment it expects",
    "gaudi": "Intel Gaudi: run Intel's Megatron-DeepSpeed fork for HPUs and request the accelerators as your Slurm "
             "site names them (the gres may not be gpu); CUDA_DEVICE_MAX_CONNECTIONS does not apply",
}


def slurm_script(doc: dict) -> str:
    """An sbatch script: one torchrun per node (``srun``), which starts one Megatron-LM process per device.

    Raises
    ------
    SpecError
        A cluster torchrun does not drive (TPU, Cerebras, Groq), or one that is not whole nodes.
    """
    cluster = doc["inputs"]["cluster"]
    per_node, num_devices = cluster["devices_per_node"], doc["num_devices"]
    _check_torchrun(cluster, num_devices)
    args, notes = _megatron_args_and_notes(doc)
    notes = [*notes, *([FAMILY_NOTES[cluster["family"]]] if cluster["family"] in FAMILY_NOTES else [])]
    header = ["#!/bin/bash", *_megatron_header(doc, notes),
              f"# layout: {_layout_line(doc['layout'])}",
              "# A starting point: add your data, tokenizer, model-shape, optimizer and checkpoint arguments.",
              f"#SBATCH --job-name={_job_name(doc['inputs']['model']['name'])}",
              f"#SBATCH --nodes={num_devices // per_node}",
              "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the per-device ranks
              f"#SBATCH --gpus-per-node={per_node}",
              "#SBATCH --exclusive",
              ""]
    body = ["set -euo pipefail",
            "# Megatron-LM: one hardware queue keeps the TP/SP collectives in the order they were issued",
            "export CUDA_DEVICE_MAX_CONNECTIONS=1",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
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
    return " ".join(degrees + [f"mbs={layout['micro_batch_size']}", f"sp={sp}", f"recompute={layout['recompute']}",
                               f"zero={layout['zero_stage']}"])


def _job_name(model_name: str) -> str:
    """A Slurm-safe job name: ``Llama 3 70B`` -> ``llama-3-70b``."""
    return re.sub(r"[^a-z0-9._-]+", "-", model_name.lower()).strip("-") or "clusterplan"


FRAMEWORK_OF_FORMAT = {"megatron": "megatron", "slurm": "megatron", "deepspeed": "deepspeed",
                       "torchtitan": "torchtitan", "maxtext": "maxtext"}
"""The framework profile a format's plan must be searched under (the slurm script runs Megatron)."""


def export_framework(fmt: str, given: str | None) -> str:
    """The framework to search under for ``fmt``; :class:`SpecError` when ``--framework`` names another
    (a plan searched for one framework may use knobs the other lacks: search again under it)."""
    want = FRAMEWORK_OF_FORMAT[fmt]
    if given and given != want:
        raise SpecError(f"export --format {fmt}: the config is for {want}, but --framework {given} was given; "
                        f"drop --framework (the plan is then searched under {want}) or use --framework {want}")
    return want


def export(doc: dict, fmt: str) -> str:
    """The config for ``fmt`` (one of :data:`FORMATS`); the plan must have been searched under the
    format's framework (:func:`export_framework`)."""
    fw = (doc["inputs"].get("framework") or {}).get("id")
    if fw and fw != FRAMEWORK_OF_FORMAT[fmt]:
        raise SpecError(f"export --format {fmt}: this plan was searched under {fw}; a {fmt} config needs a plan "
                        f"searched under {FRAMEWORK_OF_FORMAT[fmt]}")
    return {"megatron": megatron_args, "deepspeed": deepspeed_config, "torchtitan": torchtitan_toml,
            "maxtext": maxtext_overrides, "slurm": slurm_script}[fmt](doc)
