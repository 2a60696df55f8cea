"""Run one launcher's own parser/validator on a clusterplan export. Runs INSIDE the launcher
virtual environment (tests/launchers/requirements.txt), never in clusterplan's own.

    python check.py FORMAT EXPORT_FILE META_JSON

FORMAT: megatron | slurm | deepspeed | torchtitan | torchtitan-0.2 | maxtext. META_JSON describes the plan the
export came from (world size, layout, model shape, CUDA arch): what the launcher's view of the
config is compared against once the launcher has accepted it. Prints one JSON line
{"ok": true, ...facts the launcher derived...}; an exception (the launcher's refusal) exits non-zero
with its message on stderr.

Everything that needs a GPU or a cluster is supplied the way the launcher itself allows on CPU:
Megatron reads WORLD_SIZE/RANK from the environment and asks the GPU's arch (patched to the
plan's device); DeepSpeed gets a real one-process gloo group and a Megatron-style mpu that reports
the plan's data-parallel size (Megatron-DeepSpeed passes its mpu the same way); MaxText targets the
plan's topology through its AOT options (compile_topology / compile_topology_num_slices, or
internal_compile_num_devices); the Slurm script runs under bash with stub scontrol/srun on PATH and
the recorded torchrun command line goes through torchrun's own parser.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def _fail(message: str) -> None:
    raise SystemExit(f"check failed: {message}")


def _expect(label: str, got, want) -> None:
    if got != want:
        _fail(f"{label}: launcher has {got!r}, plan has {want!r}")


# ---- Megatron-Core ---------------------------------------------------------------------------------
def megatron_argv(text: str) -> tuple[list[str], dict[str, str]]:
    """The ``MEGATRON_ARGS`` array and the variables a megatron export exports, as bash itself reads
    them when the file is sourced (what a user's launch script does)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "megatron_args.sh"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        clean = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
        show = 'source "$1" >/dev/null; printf "%s\\0" "${MEGATRON_ARGS[@]}"; printf "\\0"; env -0'
        out = subprocess.run(["bash", "-c", show, "bash", str(path)], env=clean, capture_output=True, check=True).stdout
    argv_part, _, env_part = out.decode().partition("\0\0")
    before = set(subprocess.run(["bash", "-c", "env -0"], env=clean, capture_output=True).stdout.decode().split("\0"))
    env = dict(e.split("=", 1) for e in env_part.split("\0") if e and e not in before and "=" in e)
    env = {k: v for k, v in env.items() if k not in ("SHLVL", "_", "PWD", "OLDPWD")}
    return [a for a in argv_part.split("\0") if a], env


def check_megatron_argv(argv: list[str], env: dict[str, str], meta: dict) -> dict:
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update({"WORLD_SIZE": str(meta["world_size"]), "RANK": "0", "LOCAL_RANK": "0", **env})
    import torch

    arch = meta.get("cuda_arch") or 9
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)  # the plan's GPU, on a CPU machine
    import megatron.training.arguments as arguments
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    arguments.get_device_arch_version = lambda: arch
    if "--fp4-format" in argv:  # NVFP4 needs Transformer Engine >= 2.7 on the plan's GPU; none is installed here
        arguments.is_te_min_version = lambda version, check_equality=True: True
    sys.argv = ["pretrain_gpt.py", *argv]
    args = arguments.parse_args()
    arguments.validate_args(args)
    # the model's TransformerConfig, as pretrain_gpt.py builds it: its __post_init__ asserts what
    # validate_args leaves to it (MoE with CUDA graph modules, recomputation with graphs, ...)
    import megatron.core.transformer.transformer_config as transformer_config  # no Transformer Engine here:
    transformer_config.is_te_min_version = lambda version, check_equality=True: True  # its version checks pass
    import megatron.core.models.common.embeddings.rope_utils as rope_utils  # and TE's fused RoPE is there
    rope_utils.fused_apply_rotary_pos_emb = rope_utils.fused_apply_rotary_pos_emb or (lambda *a, **k: None)
    arguments.core_transformer_config_from_args(args)
    calc = ConstantNumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size,
                                             args.data_parallel_size, False, 0)
    layout = args.pipeline_model_parallel_layout
    if layout is not None:
        if isinstance(layout, str):
            layout = PipelineParallelLayerLayout(layout, args.pipeline_model_parallel_size)
        layout.validate_layer_layout(args.num_layers, args.mtp_num_layers)
        most = max(len([x for x in stage if x.name == "decoder"]) for rank in layout.layout for stage in rank)
        _expect("layers on the fullest stage", most, meta["layers_per_stage_max"])
    m, L = meta["model"], meta["layout"]
    _expect("num_layers", args.num_layers, m["num_layers"])
    _expect("hidden_size", args.hidden_size, m["hidden_size"])
    _expect("num_attention_heads", args.num_attention_heads, m["num_attention_heads"])
    _expect("ffn_hidden_size", args.ffn_hidden_size, m["ffn_hidden_size"])
    _expect("padded-free vocab_size", args.vocab_size, m["vocab_size"])
    _expect("num_experts", args.num_experts, m["num_experts"])
    if not m["mla"]:
        groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
        _expect("query groups", groups, m["num_kv_heads"])
    _expect("data_parallel_size", args.data_parallel_size, L["dp"])
    _check_experts(args, L)
    _expect("micro-batches", calc.get(), L["num_microbatches"])
    _expect("virtual pipeline", args.virtual_pipeline_model_parallel_size or 1, L["vp"])
    _expect("recompute granularity", args.recompute_granularity, None if L["recompute"] == "none" else L["recompute"])
    host_optimizer = "optimizer" in L.get("offload", "none")  # offload=optimizer: every optimizer state on the host
    _expect("optimizer cpu offload", (args.optimizer_cpu_offload, args.optimizer_offload_fraction if host_optimizer else None,
                                      args.use_distributed_optimizer if host_optimizer else None),
            (host_optimizer, 1.0 if host_optimizer else None, True if host_optimizer else None))
    if L.get("recompute_layers"):
        _expect("recompute method", args.recompute_method, "block")
        _expect("recomputed layers per stage", args.recompute_num_layers * (args.virtual_pipeline_model_parallel_size or 1),
                L["recompute_layers"])
    if meta.get("interleave"):
        _check_interleave(args, calc.get(), meta["interleave"])
    return {"dp": args.data_parallel_size, "microbatches": calc.get(),
            "vp": args.virtual_pipeline_model_parallel_size, "layout": str(args.pipeline_model_parallel_layout)}


def _check_experts(args, L: dict) -> None:
    """The expert-parallel degree and the token dispatcher the plan priced (``Layout.moe_dispatcher``:
    deepep and hybridep are the flex dispatcher's backends; alltoall and auto the alltoall dispatcher)."""
    _expect("expert_model_parallel_size", args.expert_model_parallel_size, L["ep"])
    if args.num_experts:
        flex = L.get("moe_dispatcher", "auto") in ("deepep", "hybridep") and L["ep"] > 1
        _expect("moe_token_dispatcher_type", args.moe_token_dispatcher_type, "flex" if flex else "alltoall")
        if flex:
            _expect("moe_flex_dispatcher_backend", args.moe_flex_dispatcher_backend, L["moe_dispatcher"])


def _check_interleave(args, m: int, want: dict) -> None:
    """The interleaved schedule Megatron-Core builds from the arguments: its micro-batch group (the
    two conditions forward_backward_pipelining_with_interleaving raises on, restated: it needs a
    model to run), the schedule table of schedules.py, and the first pipeline rank's warm-up from
    get_pp_rank_microbatches against what the cost model holds in flight."""
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel import schedules

    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    group = args.microbatch_group_size_per_vp_stage or pp
    _expect("micro-batch group per virtual stage", group, want["group"])
    if not pp <= group <= m or 0 < m % group < pp:
        _fail(f"schedules.py refuses a micro-batch group of {group} with {m} micro-batches and pp={pp}")
    table = schedules.get_schedule_table(m, vp, group)
    _expect("schedule table entries", sorted(table), sorted((i, c) for c in range(vp) for i in range(m)))
    rank0 = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: 0),
                            virtual_pipeline_model_parallel_size=vp)
    _, _, warmup, _ = schedules.get_pp_rank_microbatches(m, vp, group, p2p_communicator=rank0)
    _expect("first rank's warm-up micro-batch chunks", warmup, want["first_rank_warmup"])


def check_megatron(text: str, meta: dict) -> dict:
    argv, env = megatron_argv(text)
    return check_megatron_argv(argv, env, meta)


def check_slurm(text: str, meta: dict) -> dict:
    """bash -n, then the script itself under stub scontrol/srun with a host list far past 4 KiB;
    the torchrun line srun receives goes through torchrun's parser, its script arguments through
    Megatron's."""
    nodes = meta["world_size"] // meta["devices_per_node"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        script = tmp / "job.sbatch"
        script.write_text(text)
        subprocess.run(["bash", "-n", str(script)], check=True)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        hosts = max(nodes, 600)  # 600 x 24-char names: ~15 KiB, well past a pipe buffer's first write
        (bin_dir / "scontrol").write_text(
            "#!/bin/bash\n[ \"$1 $2\" = 'show hostnames' ] || exit 2\n"
            f"for i in $(seq 1 {hosts}); do printf 'gpu-node-rack%04d-a%05d\\n' $((i/32)) $i; done\n")
        (bin_dir / "srun").write_text(
            "#!/bin/bash\npython3 -c 'import json,os,sys; json.dump({\"argv\": sys.argv[1:], "
            "\"env\": {k: os.environ.get(k) for k in (\"CUDA_DEVICE_MAX_CONNECTIONS\", \"MASTER_ADDR\")}}, "
            f"open(\"{tmp}/srun.json\", \"w\"))' \"$@\"\n")
        for stub in ("scontrol", "srun"):
            (bin_dir / stub).chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-node[1-9999]",
               "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "4242"}
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            _fail(f"the script exited {done.returncode}: {done.stderr.strip()}")
        record = json.loads((tmp / "srun.json").read_text())
    argv = record["argv"]
    if not argv or argv[0] != "torchrun":
        _fail(f"srun did not start torchrun: {argv[:3]}")
    from torch.distributed.run import get_args_parser

    targs = get_args_parser().parse_args(argv[1:])
    _expect("torchrun --nnodes", targs.nnodes, str(nodes))
    _expect("torchrun --nproc-per-node", str(targs.nproc_per_node), str(meta["devices_per_node"]))
    _expect("MASTER_ADDR", record["env"]["MASTER_ADDR"], "gpu-node-rack0000-a00001")
    _expect("rdzv endpoint", targs.rdzv_endpoint, "gpu-node-rack0000-a00001:29500")
    _expect("training script", targs.training_script, "pretrain_gpt.py")
    env = {k: v for k, v in record["env"].items() if k == "CUDA_DEVICE_MAX_CONNECTIONS" and v is not None}
    facts = check_megatron_argv(targs.training_script_args, env, meta)
    return {**facts, "CUDA_DEVICE_MAX_CONNECTIONS": env.get("CUDA_DEVICE_MAX_CONNECTIONS")}


# ---- DeepSpeed -------------------------------------------------------------------------------------
def check_deepspeed(text: str, meta: dict) -> dict:
    config = json.loads(text)  # strict JSON: no comment lines
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"})
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    deepspeed.init_distributed(dist_backend="gloo")  # a real one-process group
    L = meta["layout"]

    class MPU:  # what Megatron-DeepSpeed hands deepspeed.initialize: the plan's model-parallel groups
        def get_data_parallel_world_size(self):
            return L["dp"]

        def get_model_parallel_world_size(self):
            return L["tp"]

        def get_pipeline_model_parallel_world_size(self):
            return L["pp"]

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    cfg = DeepSpeedConfig(f.name, mpu=MPU())
    _expect("train_batch_size", cfg.train_batch_size, meta["global_batch_size"])
    _expect("micro batch", cfg.train_micro_batch_size_per_gpu, L["micro_batch_size"])
    _expect("gradient accumulation", cfg.gradient_accumulation_steps, L["num_microbatches"])
    _expect("zero stage", int(cfg.zero_optimization_stage), L["zero_stage"])
    if L["pp"] > 1 and cfg.zero_optimization_stage >= 2:  # PipelineEngine's own assertion
        _fail("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    if cfg.activation_checkpointing_config.contiguous_memory_optimization and \
            not cfg.activation_checkpointing_config.partition_activations:  # deepspeed.checkpointing.configure asserts it
        _fail("Contiguous Checkpointing is only available with partitioned activations")
    offload = cfg.zero_config.offload_optimizer  # offload=optimizer: ZeRO-Offload to host memory
    _expect("offload_optimizer device", None if offload is None else str(getattr(offload.device, "value", offload.device)),
            "cpu" if "optimizer" in L.get("offload", "none") else None)
    facts = {"world_size": cfg.world_size, "zero": int(cfg.zero_optimization_stage)}
    prefix = "Megatron-DeepSpeed arguments: "
    line = next((c for c in config["_comment"] if c.startswith(prefix)), None)
    return {**facts, **(_check_megatron_deepspeed_args(line[len(prefix):], meta) if line else {})}


def _check_megatron_deepspeed_args(text: str, meta: dict) -> dict:
    """The Megatron-DeepSpeed arguments the config names, parsed by an argparse built from
    megatron_deepspeed_args.json (every option microsoft/Megatron-DeepSpeed's parser defines, with its
    action, type, nargs and choices) plus DeepSpeed's own add_config_arguments: an unknown flag, a
    value of the wrong type or outside the choices fails, and the parsed values must be the plan's."""
    import argparse

    import deepspeed

    facts = json.loads((Path(__file__).with_name("megatron_deepspeed_args.json")).read_text())["flags"]
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    types = {"int": int, "float": float, "str": str}
    for flag, spec in facts.items():
        kwargs = {k: spec[k] for k in ("nargs", "choices") if k in spec}
        if spec.get("action"):
            kwargs["action"] = spec["action"]
        elif spec.get("type") in types:
            kwargs["type"] = types[spec["type"]]
        parser.add_argument(flag, **kwargs)
    deepspeed.add_config_arguments(parser)
    args, unknown = parser.parse_known_args(shlex.split(text))
    if unknown:
        _fail(f"Megatron-DeepSpeed has no argument {unknown[0]!r}")
    m, L = meta["model"], meta["layout"]
    for name, want in (("tensor_model_parallel_size", L["tp"]), ("pipeline_model_parallel_size", L["pp"]),
                       ("micro_batch_size", L["micro_batch_size"]), ("global_batch_size", meta["global_batch_size"]),
                       ("num_layers", m["num_layers"]), ("hidden_size", m["hidden_size"]),
                       ("num_attention_heads", m["num_attention_heads"]), ("zero_stage", L["zero_stage"])):
        _expect(f"Megatron-DeepSpeed --{name.replace('_', '-')}", getattr(args, name), want)
    # ZeRO-Offload refuses a client optimizer other than DeepSpeedCPUAdam (zero_force_ds_cpu_optimizer)
    _expect("Megatron-DeepSpeed --cpu-optimizer", bool(getattr(args, "cpu_optimizer", False)),
            "optimizer" in L.get("offload", "none"))
    return {"mds_args": len(shlex.split(text))}


# ---- torchtitan ------------------------------------------------------------------------------------
def _side(pin: str) -> None:
    """Put a side-installed launcher release (launcher_venv.side_dir) first on sys.path."""
    sys.path.insert(0, str(Path(sys.prefix) / "side" / pin))


def check_torchtitan_02(text: str, meta: dict) -> dict:
    """torchtitan 0.2.2's TOML through its ConfigManager, ParallelDims, the model args'
    update_from_config (what the trainer calls before building the model), its pipeline split and the
    trainer's batch arithmetic."""
    _side("torchtitan-0.2.2")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.protocols.train_spec import get_train_spec

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    cfg = ConfigManager().parse_args(["--job.config_file", f.name])
    p = cfg.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=meta["world_size"])
    deepep = meta["layout"]["ep"] > 1 and meta["layout"].get("moe_dispatcher") == "deepep"
    _expect("expert_parallel_comm_backend", p.expert_parallel_comm_backend, "deepep" if deepep else "standard")
    args = get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
    args.update_from_config(cfg)  # the trainer's call: refuses e.g. CP with FlexAttention
    _expect_torchtitan_model(args.n_layers, args.dim, args.n_heads, getattr(args, "n_kv_heads", None), args, meta)
    facts = _torchtitan_batches(cfg.training, p, dims.dp_replicate * dims.dp_shard, dims.pp, meta,
                                lambda stages, layers: generate_llm_fqn_per_model_part(stages, layers, 1, 1))
    _expect_torchtitan_ac(cfg.activation_checkpoint.mode, getattr(cfg.activation_checkpoint, "selective_ac_option", ""),
                          meta)
    return {"model": f"{cfg.model.name} {cfg.model.flavor}", **facts, "fsdp": dims.fsdp_enabled, "ep": dims.ep}


def check_torchtitan(text: str, meta: dict) -> dict:
    """torchtitan 0.3.0's config registry module: ConfigManager with --module/--config (Trainer.Config's
    own validation), ParallelDims, the model config's update_from_config, the model built on the meta
    device and checked by the SPMD backend's validate_config (CP and the attention backend), the trainer's
    batch arithmetic and sequence divisibility, and the pipeline split."""
    import torchtitan.tools.utils as tt_utils

    arch = meta.get("cuda_arch")  # the plan's GPU, on a CPU machine: converters and flex_flash ask for it
    tt_utils.has_cuda_capability = lambda major, minor: arch is not None and (arch, 0) >= (major, minor)
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.full_dtensor import validate_config
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    _deep_ep_stand_in()
    tmp = tempfile.mkdtemp()
    (Path(tmp) / "clusterplan_torchtitan.py").write_text(text)
    sys.path.insert(0, tmp)
    cfg = ConfigManager().parse_args(["--module", "clusterplan_torchtitan", "--config", "clusterplan"])
    p, t = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(p, meta["world_size"])
    model_config = cfg.model_spec.model
    model_config.update_from_config(config=cfg)
    with torch.device("meta"):
        model = model_config.build()
    if p.spmd_backend in ("full_dtensor", "spmd_types"):
        validate_config(dims, model)
    if dims.ep > 1 and (dims.dp_shard * dims.cp * dims.tp) % dims.ep:  # ParallelismConfig: dp_shard*cp*tp == efsdp*ep
        _fail(f"expert_parallel_degree {dims.ep} does not divide dp_shard*cp*tp = {dims.dp_shard * dims.cp * dims.tp}")
    divisor = (dims.tp if p.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)  # trainer.py
    if t.seq_len % divisor:
        _fail(f"seq_len {t.seq_len} is not divisible by {divisor} (sequence/context parallelism)")
    layer = model_config.layers[0].attention
    _expect_torchtitan_model(len(model_config.layers), model_config.dim, layer.n_heads,
                             getattr(layer, "n_kv_heads", None), model_config, meta)
    facts = _torchtitan_batches(t, p, dims.dp_replicate * dims.dp_shard, dims.pp, meta,
                                lambda stages, layers: _generate_llm_fqn_per_model_part(stages, layers, 1, 1))
    _expect_torchtitan_dispatcher(model_config, meta)
    ac = cfg.activation_checkpoint
    _expect_torchtitan_ac("none" if ac is None else "full" if type(ac).__qualname__.startswith("FullAC") else "selective",
                          "op", meta)
    return {"model": f"{cfg.model_spec.name} {cfg.model_spec.flavor}", **facts, "ep": dims.ep,
            "attention": type(layer.inner_attention).__qualname__}


def _deep_ep_stand_in() -> None:
    """DeepEP's ``deep_ep`` is a CUDA extension (no CPU build): torchtitan 0.3's DeepEP dispatcher imports its
    ``ElasticBuffer`` when the model is built (distributed/deepep/deepep.py) and uses it only once a GPU
    buffer is made; a stand-in module answers that import (HybridEP's imports wait for the GPU). HybridEP's
    module imports ``torch._library.opaque_object.CustomClassBase``, the name the PyTorch nightly torchtitan
    0.3.0 pins gives ``OpaqueBase`` (torchtitan 0e719d6c5, 2026-07-07: 'CustomClassBase is the drop-in
    replacement'); torch 2.13.0 (requirements.txt) still calls it OpaqueBase: the old name answers for it."""
    import torch._library.opaque_object as opaque

    if not hasattr(opaque, "CustomClassBase"):
        opaque.CustomClassBase = opaque.OpaqueBase
    try:
        import deep_ep  # noqa: F401
    except ImportError:
        import types
        sys.modules["deep_ep"] = types.SimpleNamespace(ElasticBuffer=type("ElasticBuffer", (), {}))


def _expect_torchtitan_dispatcher(model_config, meta: dict) -> None:
    """The routed experts' token dispatcher torchtitan built, against the plan's (fused ones with ep > 1)."""
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    L = meta["layout"]
    dispatcher = L.get("moe_dispatcher", "auto") if L["ep"] > 1 else "auto"
    want = {"deepep": "DeepEPTokenDispatcher", "hybridep": "HybridEPTokenDispatcher"}.get(dispatcher)
    built = {type(c).__qualname__.split(".")[0] for _, c, _, _ in model_config.traverse(LocalTokenDispatcher.Config)}
    if want is not None:
        _expect("token dispatchers", built, {want})
    elif built & {"DeepEPTokenDispatcher", "HybridEPTokenDispatcher"}:
        _fail(f"the plan has moe_dispatcher={dispatcher}; torchtitan built {sorted(built)}")


def _expect_torchtitan_model(layers: int, dim: int, heads: int, kv_heads, args, meta: dict) -> None:
    m = meta["model"]
    _expect("n_layers", layers, m["num_layers"])
    _expect("dim", dim, m["hidden_size"])
    _expect("n_heads", heads, m["num_attention_heads"])
    _expect("n_kv_heads", kv_heads or m["num_kv_heads"], m["num_kv_heads"])
    _expect("vocab_size", getattr(args, "vocab_size", m["vocab_size"]) if m["mla"] else m["vocab_size"], m["vocab_size"])


def _torchtitan_batches(t, p, dp_degree: int, pp: int, meta: dict, own_split) -> dict:
    """The trainer's batch arithmetic (trainer.py) and the pipeline's stages against the plan."""
    m, L = meta["model"], meta["layout"]
    _expect("global batch", t.global_batch_size, meta["global_batch_size"])
    if t.global_batch_size % (t.local_batch_size * dp_degree):
        _fail("global_batch_size is not a multiple of local_batch_size x dp degree")
    accumulation = t.global_batch_size // (t.local_batch_size * dp_degree)
    micro = accumulation
    if pp > 1:
        if t.local_batch_size % p.pipeline_parallel_microbatch_size:
            _fail("local_batch_size is not a multiple of pipeline_parallel_microbatch_size")
        micro = t.local_batch_size // p.pipeline_parallel_microbatch_size * accumulation
        parts = p.module_fqns_per_model_part or own_split(pp * (1 if p.pipeline_parallel_schedule in ("1F1B", "GPipe")
                                                                 else 2), m["num_layers"])
        layers = [x for part in parts for x in part if x.startswith("layers.")]
        _expect("layers in the stages", layers, [f"layers.{i}" for i in range(m["num_layers"])])
        _expect("layers on the fullest stage", max(sum(x.startswith("layers.") for x in part) for part in parts),
                meta["layers_per_stage_max"])
        if meta.get("head_slots"):  # the plan priced torchtitan's own split: the parts must be it
            _expect("the stages' modules (torchtitan's own split)", [list(x) for x in parts],
                    [list(x) for x in own_split(len(parts), m["num_layers"])])
        _expect("pipeline stages", len(parts), L["pp"] * L["vp"])
    _expect("micro-batches", micro, L["num_microbatches"])
    return {"accumulation": accumulation}


def _expect_torchtitan_ac(mode: str, option: str, meta: dict) -> None:
    L = meta["layout"]
    if L.get("recompute_layers"):  # layer SAC: every k-th block of a stage checkpointed whole
        stage = meta["model"]["num_layers"] // L["pp"]
        _expect("activation checkpoint", (mode, option), ("selective", str(stage // L["recompute_layers"])))
    else:
        _expect("activation checkpoint mode", mode, L["recompute"])


# ---- MaxText ---------------------------------------------------------------------------------------
def check_maxtext(text: str, meta: dict) -> dict:
    from maxtext.configs import pyconfig
    from maxtext.utils import max_utils

    base = Path(pyconfig.__file__).with_name("base.yml")  # the base.yml packaged with the release
    overrides = [line for line in text.splitlines() if line and not line.startswith("#")]
    per_slice, slices = meta["maxtext_devices_per_slice"], meta["world_size"] // meta["maxtext_devices_per_slice"]
    target = meta.get("maxtext_compile_topology")
    aot = ([f"compile_topology={target}", f"compile_topology_num_slices={slices}"] if target else
           ["internal_compile=true", f"internal_compile_num_devices={meta['world_size']}", f"num_slices={slices}"])
    cfg = pyconfig.initialize(["train.py", str(base), "run_name=clusterplan-check", "skip_jax_distributed_system=true",
                               *overrides, *aot])
    devices = cfg.num_target_devices
    _expect("devices", devices, meta["world_size"])
    ici = max_utils.fill_unspecified_mesh_axes(list(cfg.ici_parallelism), devices // cfg.num_slices, "ICI")
    dcn = max_utils.fill_unspecified_mesh_axes(list(cfg.dcn_parallelism), cfg.num_slices, "DCN")
    _expect("global batch", cfg.global_batch_size_to_train_on, meta["global_batch_size"])
    m = meta["model"]
    _expect("decoder layers", cfg.base_num_decoder_layers, m["num_layers"])
    _expect("emb dim", cfg.base_emb_dim, m["hidden_size"])
    _expect("query heads", cfg.base_num_query_heads, m["num_attention_heads"])
    _expect("experts", cfg.num_experts if m["num_experts"] else 0, m["num_experts"] or 0)
    _expect("kv heads", cfg.base_num_kv_heads, m["num_kv_heads"])
    _expect("mlp dim", cfg.base_mlp_dim, m["ffn_hidden_size"])
    if m["vocab_size"] != 50257:  # GPT-3's 50257 is padded to 50304 in MaxText's gpt3 configs
        _expect("vocabulary", cfg.vocab_size, m["vocab_size"])
    if meta["layout"].get("offload", "none") != "none":  # offload=activations: the custom policy offloads the input
        _expect("remat policy", (cfg.remat_policy, "decoder_layer_input" in cfg.tensors_to_offload), ("custom", True))
    mesh = _maxtext_mesh_on_torus(cfg, meta) if meta.get("torus_shape") else None
    return {"ici": dict(zip(cfg.mesh_axes, ici)), "dcn": dict(zip(cfg.mesh_axes, dcn)), "slices": cfg.num_slices,
            "per_device_batch_size": cfg.per_device_batch_size, "mesh": mesh}


TPU_KINDS = {"tpu-v4": "TPU v4", "tpu-v5p": "TPU v5p", "tpu-v5e": "TPU v5 lite", "tpu-v6e": "TPU v6 lite"}
"""jax's device_kind of each clusterplan TPU (jax/_src/mesh_utils.py names them so)."""


def _maxtext_mesh_on_torus(cfg, meta: dict) -> list[int]:
    """MaxText's own create_device_mesh (maxtext_utils) on devices laid out as the plan's torus: one
    stand-in device per chip with the coords, slice index and device kind a TPU reports, so jax's
    mesh_utils assigns the ICI axes to physical torus axes exactly as on the slice (it raises where
    a logical axis would need part of a physical axis and allow_split_physical_axes is off)."""
    from types import SimpleNamespace

    from maxtext.utils import maxtext_utils

    shape = list(meta["torus_shape"]) + [1] * (3 - len(meta["torus_shape"]))
    kind = TPU_KINDS[meta["device"]]
    devices = []
    for s in range(cfg.num_slices):
        for z in range(shape[2]):
            for y in range(shape[1]):
                for x in range(shape[0]):
                    devices.append(SimpleNamespace(id=len(devices), coords=(x, y, z), core_on_chip=0, platform="tpu",
                                                   device_kind=kind, slice_index=s, process_index=len(devices) // 4))
    mesh = maxtext_utils.create_device_mesh(cfg, devices)
    _expect("devices in the mesh", mesh.size, meta["world_size"])
    return list(mesh.shape)


CHECKS = {"megatron": check_megatron, "slurm": check_slurm, "deepspeed": check_deepspeed,
          "torchtitan": check_torchtitan, "torchtitan-0.2": check_torchtitan_02, "maxtext": check_maxtext}


def main() -> None:
    fmt, export_file, meta_file = sys.argv[1:4]
    facts = CHECKS[fmt](Path(export_file).read_text(), json.loads(Path(meta_file).read_text()))
    print(json.dumps({"ok": True, **facts}, default=str))


if __name__ == "__main__":
    main()
