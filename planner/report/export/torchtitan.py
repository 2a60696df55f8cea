"""``--format torchtitan``: a torchtitan 0.3.0 config registry module, and what both torchtitan
formats share (the model flavors by shape, the pipeline split, the header)."""

from __future__ import annotations

from clusterplan.cost.layout import default_schedule
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import (PINNED, _job, _layout_line, cuda_arch, hsdp_degrees,
                                                    model_spec, shape_key)


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


TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb1p": "InterleavedZeroBubble",
                        "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV", "looped": "LoopedBFS"}
"""``Layout.schedule`` -> torchtitan's ``pipeline_parallel_schedule`` (torch.distributed.pipelining's
``get_schedule_class`` names; ZBVZeroBubble and DualPipeV place the stages in a V themselves)."""


def _torchtitan_pipeline(num_layers: int, pp: int, vp: int, head_slots: bool = False,
                         output: str = "output", schedule: str = "") -> tuple[str, list[list[str]]]:
    """The schedule (:data:`TORCHTITAN_SCHEDULES`; by default 1F1B for one stage per rank, else
    Interleaved1F1B), and the modules of each of
    the ``pp * vp`` stages, written out so that torchtitan runs the split the plan priced: its own
    split counts the embedding and the output as a layer each since 2025-04 (``head_slots``).
    Even: no stage holds more than ``ceil(L / (pp vp))`` layers; with ``head_slots``:
    ``L + 2`` slots, the larger parts first, the first and the last stage giving one slot each to
    ``tok_embeddings`` and to ``norm`` + ``output``."""
    name = TORCHTITAN_SCHEDULES.get(schedule or default_schedule(vp))
    if name is None or vp == 1 and name not in ("1F1B", "GPipe"):
        raise SpecError(f"--format torchtitan: schedule={schedule} with vp={vp}: torchtitan has no such schedule "
                        "(its multi-stage schedules need at least 2 stages per rank; DualPipe runs as DualPipeV, vp=2)")
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
    return name, parts


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
    if fmt == "torchtitan" and L["ep"] > 1 and L.get("moe_dispatcher") in TORCHTITAN_COMM_BACKENDS_03:
        buffer = "ElasticBuffer" if L["moe_dispatcher"] == "deepep" else "HybridEPBuffer"
        head.append(f"# moe_comm_backend {L['moe_dispatcher']}: needs DeepEP's deep_ep package (its {buffer}) on every node")
    if L["zero_stage"] == 1:  # only from a plan searched under another framework's profile
        head.append("# ZeRO-1 has no torchtitan equivalent: plain replication is written")
    if job["precision"] == "fp8" and not job.get("compiled"):
        head.append("# float8 without torch.compile runs its scaling casts unfused (torchao recommends compile): "
                    "plan with --compile to write [compile]")
    if job["precision"] == "fp16":
        head.append("# fp16: torchtitan trains in bf16 mixed precision (no fp16 loss scaling); bfloat16 is written")
    if L["vp"] > 1:
        head.append(f"# {L['vp']} virtual stages per rank: {TORCHTITAN_SCHEDULES[L.get('schedule') or 'interleaved']}")
    return head


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
    _torchtitan_03_refusals(L, job, model)
    compiled = bool(job.get("compiled"))
    mbs, gbs, dp = L["micro_batch_size"], job["global_batch_size"], L["dp"]
    body = [f'    model_spec = model_registry("{flavor}", {_torchtitan_model_args(doc, model)})',
            f"    config = {TORCHTITAN_RECIPES[(name, flavor)]}()  # torchtitan's recipe: data, optimizer, checkpointing",
            "    config.model_spec = model_spec",
            "    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(model_spec)))",
            f"    config.training.local_batch_size = {gbs // dp if L['pp'] > 1 else mbs}",
            f"    config.training.global_batch_size = {gbs}", f"    config.training.seq_len = {job['seq_len']}",
            # as the plan was priced: graphs only where it set cuda_graph=full (0.3 refuses them with pp and EP)
            f"    config.training.disable_cuda_graphs = {L.get('cuda_graph', 'none') != 'full'}",
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


TORCHTITAN_COMM_BACKENDS_03 = {"deepep": "deepep", "hybridep": "hybridep"}
"""``Layout.moe_dispatcher`` -> torchtitan 0.3.0's ``model_registry(moe_comm_backend=...)``
(models/common/config_utils.py make_token_dispatcher_config: standard, deepep, hybridep,
minimal_async_ep): the fused ones; ``alltoall`` and ``auto`` are its default, ``standard`` (PyTorch's
all-to-all). HybridEP is left blocking (no ``non_blocking_capacity_factor``): dropless, as priced."""


def _torchtitan_model_args(doc: dict, model) -> str:
    """The keyword arguments of 0.3.0's ``model_registry``: the attention backend, the MoE token
    dispatcher where the plan has a fused one over ep > 1, and the precision's converters."""
    L, job = doc["layout"], _job(doc)
    compiled = bool(job.get("compiled"))
    args = [f'attn_backend="{_torchtitan_attention(doc)}"']
    backend = TORCHTITAN_COMM_BACKENDS_03.get(L.get("moe_dispatcher", "auto")) if L["ep"] > 1 else None
    if backend:
        args.append(f'moe_comm_backend="{backend}"')
    converters = ", ".join(c.format(compiled=compiled) for c in TORCHTITAN_CONVERTERS_03.get(job["precision"], [])
                           if model.moe is not None or "GroupedExperts" not in c)
    if converters:
        args.append(f"converters=[{converters}]")
    return ", ".join(args)


def _torchtitan_attention(doc: dict) -> str:
    """0.3.0's language-model attention: FlexAttention's FLASH backend on Hopper and Blackwell (it refuses
    older GPUs), FlexAttention elsewhere (SDPA is no longer one: models/common/config_utils.py)."""
    arch = cuda_arch(doc["inputs"]["cluster"]["device"])
    return "flex_flash" if arch is not None and arch >= 9 else "flex"


def _torchtitan_03_refusals(L: dict, job: dict, model) -> None:
    if L["ep"] > 1 and L.get("moe_dispatcher", "auto") in TORCHTITAN_COMM_BACKENDS_03:
        _torchtitan_03_dispatcher_refusals(L, job, model)
    if L.get("cuda_graph", "none") == "layer":
        raise SpecError("--format torchtitan: torchtitan 0.3 has no per-layer CUDA graphs (cuda_graph=layer); its "
                        "trainer graphs each micro-batch's whole forward and backward (cuda_graph=full)")
    if L.get("recompute_layers"):
        raise SpecError(f"--format torchtitan: torchtitan 0.3 has no layer SAC (removed 2026-03, #2357) for "
                        f"recompute_layers={L['recompute_layers']}; --format torchtitan-0.2 writes 0.2.2's")
    if L["ep"] > 1 and L.get("expert_tp", True) and L["tp"] > 1:
        raise SpecError("--format torchtitan: torchtitan 0.3 has no expert tensor parallelism (removed 2026-04, #3167): "
                        "with ep > 1 experts stay whole (etp=1); plan under --framework torchtitan, whose search "
                        "keeps to it, or use --format torchtitan-0.2")
    if L.get("param_gather", "bf16") != "bf16":
        raise SpecError("--format torchtitan: torchtitan 0.3 has no float8 all-gather (removed 2026-04 with the "
                        "tensorwise recipe, #3127) for param_gather=fp8; --format torchtitan-0.2 writes 0.2.2's "
                        "enable_fsdp_float8_all_gather")


def _torchtitan_03_dispatcher_refusals(L: dict, job: dict, model) -> None:
    """What 0.3.0 refuses of a DeepEP or HybridEP dispatcher: a float8/MXFP8 converter of the grouped
    experts with DeepEP (components/quantization/utils.py swap_token_dispatcher pads the expert groups
    only through the standard or the HybridEP dispatcher), and a sequence that tensor and context
    parallelism do not split evenly (token_dispatcher.py update_ep_token_dispatcher_config sizes each
    rank's buffer from seq_len / (tp * cp))."""
    dispatcher, shards = L["moe_dispatcher"], L["tp"] * L["cp"]
    if dispatcher == "deepep" and model.moe is not None and job["precision"] in ("fp8", "mxfp8"):
        raise SpecError(f"--format torchtitan: moe_dispatcher=deepep with precision={job['precision']}: torchtitan 0.3's "
                        f"{job['precision']} grouped-experts converter needs a dispatcher that pads each expert's tokens "
                        "(standard or hybridep), and DeepEP's does not; allowed with it: moe_dispatcher=alltoall or "
                        "hybridep, or precision bf16")
    if job["seq_len"] % shards:
        raise SpecError(f"--format torchtitan: moe_dispatcher={dispatcher} with seq_len={job['seq_len']}: torchtitan 0.3 "
                        f"sizes its buffer per rank from seq_len / (tp * cp) and needs it whole; use a seq_len that "
                        f"is a multiple of {shards}, or moe_dispatcher=alltoall")


def _torchtitan_03_parallelism(L: dict, num_layers: int) -> list[tuple[str, object]]:
    """The ParallelismConfig fields of torchtitan 0.3.0 (FSDP2 shards for ZeRO 2 and 3; ZeRO-2 keeps the
    weights gathered from forward to backward)."""
    shard, replicate = hsdp_degrees(L, "torchtitan", (2, 3))
    pairs = [("data_parallel_replicate_degree", replicate),
             ("data_parallel_shard_degree", shard), ("tensor_parallel_degree", L["tp"]),
             ("pipeline_parallel_degree", L["pp"]), ("context_parallel_degree", L["cp"]),
             ("expert_parallel_degree", L["ep"]),
             ("fsdp_reshard_after_forward", "never" if L["zero_stage"] == 2 else "default")]
    if L["pp"] > 1:
        schedule, parts = _torchtitan_pipeline(num_layers, L["pp"], L["vp"], bool(L.get("head_slots")), "lm_head",
                                               L.get("schedule", ""))
        pairs += [("pipeline_parallel_schedule", schedule), ("pipeline_parallel_microbatch_size", L["micro_batch_size"]),
                  ("module_fqns_per_model_part", parts)]
    return pairs
