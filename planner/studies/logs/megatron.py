"""Megatron-LM, Megatron-DeepSpeed and Megatron-Bridge (NeMo) training logs.

What they print, from their own code (read at Megatron-LM d98e8a64 of 2026-08-22 and
Megatron-Bridge 067f987d of 2026-08-22):

- the step line of ``training_log`` (megatron/training/training.py; Megatron-Bridge
  src/megatron/bridge/training/utils/train_utils.py), every ``log_interval`` iterations, averaged
  over them: `` [time] iteration       10/    1000 | consumed samples: ... | elapsed time per
  iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 | ...``; Megatron-DeepSpeed
  (microsoft/Megatron-DeepSpeed, bigscience-workshop/Megatron-DeepSpeed ``training_log``) prints
  ``elapsed time per iteration (s): 12.34 |``;
- the argument dump of ``_print_args`` (megatron/training/arguments.py): a line
  ``------------------------ arguments ------------------------``, then one line
  ``  name ........ value`` per argument (dots to column 48, values as Python prints them), then
  ``-------------------- end of arguments ---------------------``;
- Megatron-Bridge's ``log_non_default_values`` (src/megatron/bridge/training/config.py) instead: a
  block ``Configuration Summary (Non-Default Values vs Megatron Core)`` with sections ``[model]``,
  ``[ddp]`` (``  field: value  (Mcore default: x)``, only fields that differ from Megatron Core's
  dataclass defaults) and ``[train]``, ``[dataset]`` (``  field: value``);
- ``report_memory``: ``[Rank r] (after 10 iterations) memory (MB) | allocated: ... | max allocated:
  X | reserved: ... | max reserved: ...`` (MiB); Megatron-Bridge ``memory (GB) | ... |
  mem-max-allocated-gigabytes: X | ...`` (10^9 bytes);
- `` > padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)`` (megatron/training/
  vocab_utils.py), the embedding's rows; ``using world size: N, data-parallel size: ...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterplan.models.errors import SpecError
from clusterplan.models.files import load_file
from clusterplan.planner.studies.logs.common import (
    GIB, NUMBER, Given, LogFile, RunFacts, Step, agree, dims_model, literal, measured, median_of, median_step_time,
    optional, peak_gib, positive_int, shown_line,
)

NAME = "Megatron-LM / NeMo / Megatron-Bridge"
LOOKS_LIKE = re.compile(r"\biteration\s+\d+\s*/\s*\d+\s*\|\s*consumed samples:")
STEP = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|.*?\belapsed time per iteration \((ms|s)\):\s*(" + NUMBER + r")\s*\|")
TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*(" + NUMBER + ")")
ARGS_START = re.compile(r"-{8,} arguments -{8,}")
ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
ARG = re.compile(r"([A-Za-z_]\w*) \.+ (.*)$")
BRIDGE_START = "Configuration Summary (Non-Default Values vs Megatron Core)"
BRIDGE_SECTION = re.compile(r"^\[(\w+)\](?: Non-default values.*|:)\s*$")
BRIDGE_FIELD = re.compile(r"^\s{2}(\w+): (.*?)(?:\s{2}\(Mcore default: .*\))?$")
MEMORY_MB = re.compile(r"memory \(MB\).*?\|\s*max allocated:\s*(" + NUMBER + ")")
MEMORY_GB = re.compile(r"memory \(GB\).*?\bmem-max-allocated-gigabytes:\s*(" + NUMBER + ")")
PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
WORLD = re.compile(r"using world size:\s*(\d+)")
SRUN_LABEL = re.compile(r"^\s*\d+:\s")

BRIDGE_DEFAULTS = {
    # Megatron Core's dataclass defaults for the fields read here: the summary leaves a field out when
    # it has them (megatron/core/model_parallel_config.py, transformer/transformer_config.py,
    # distributed/distributed_data_parallel_config.py at d98e8a64)
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1, "expert_model_parallel_size": 1, "sequence_parallel": False, "bf16": False,
    "fp16": False, "fp8": None, "tp_comm_overlap": False, "hidden_dropout": 0.1, "attention_dropout": 0.1,
    "gated_linear_unit": False, "num_moe_experts": None, "normalization": "LayerNorm",
    "multi_latent_attention": False, "recompute_granularity": None, "moe_layer_freq": 1, "moe_router_topk": 2,
    "num_query_groups": None, "use_distributed_optimizer": False, "overlap_grad_reduce": False,
}
BRIDGE_NAMES = {"num_moe_experts": "num_experts", "gated_linear_unit": "swiglu", "sequence_length": "seq_length"}
"""Megatron Core / Megatron-Bridge field names that differ from Megatron-LM's argument names."""


@dataclass
class MegatronLog:
    """What one pass over a Megatron log collects."""

    args: dict = field(default_factory=dict)
    bridge: dict = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    tflops: dict[int, float] = field(default_factory=dict)
    peaks_gib: list[float] = field(default_factory=list)
    vocab: int | None = None
    world: int | None = None
    state: str = ""  # "args" inside the argument dump, "bridge" inside the configuration summary
    section: str = ""


def read(log: LogFile, config: dict | None, given: Given) -> RunFacts:
    """The facts of a Megatron log; ``config`` (a Megatron-Bridge config YAML or a mapping of
    Megatron argument names) fills what the log does not print."""
    found = _scan(log)
    args = {**_flatten(config or {}, defaults=False), **_flatten(found.bridge, defaults=True), **found.args}
    if not args:
        raise log.error(None, "no Megatron argument dump ('---- arguments ----' then '  name .... value' lines) "
                        "and no Megatron-Bridge 'Configuration Summary' in the log, and no config given: the layout, "
                        "batch and model are unknown (give the config as LOG::CONFIG)")
    facts = RunFacts(framework="deepspeed" if args.get("deepspeed") is True else "megatron")
    facts.config_source = _config_source(found, config)
    time_s, note, kept_steps = median_step_time(found.steps, log,
                                                "Megatron 'iteration N/M | ... elapsed time per iteration (ms)'")
    facts.notes.append(note)
    kept = [found.tflops[k] for k in kept_steps if k in found.tflops]
    facts.measured = {"step_time_s": round(time_s, 6)}
    if found.peaks_gib:
        facts.measured.update(peak_memory_gib=peak_gib(found.peaks_gib), peak_memory_kind="allocated")
        facts.notes.append("peak_memory_gib: the largest 'max allocated' of the log's memory reports "
                           "(torch.cuda.max_memory_allocated, every rank that printed one)")
    if kept:
        facts.measured["tflops_per_device"] = round(median_of(kept), 3)
        facts.measured["tflops_definition"] = "Megatron 'throughput per GPU (TFLOP/s/GPU)' (num_floating_point_operations)"
    _fill(facts, args, found, log, given)
    return facts


def _config_source(found: MegatronLog, config: dict | None) -> str:
    parts = (["its argument dump"] if found.args else []) + (["its Configuration Summary"] if found.bridge else [])
    parts += ["the config file"] if config else []
    return "; layout, batch and model from " + " and ".join(parts)


def _scan(log: LogFile) -> MegatronLog:
    found = MegatronLog()
    for lineno, text in log.lines():
        if LOOKS_LIKE.search(text):  # also ends a block whose closing line the log lost
            found.state = ""
            _step(found, log, lineno, text)
        elif found.state:
            _in_block(found, SRUN_LABEL.sub("", text, count=1))
        elif ARGS_START.search(text):
            found.state = "args"
        elif BRIDGE_START in text:
            found.state, found.section = "bridge", ""
        else:
            _other(found, text)
    return found


def _in_block(found: MegatronLog, text: str) -> None:
    """A line inside the argument dump or the Megatron-Bridge summary."""
    if found.state == "args":
        if ARGS_END.search(text):
            found.state = ""
        elif (m := ARG.search(text)):
            found.args[m.group(1)] = literal(m.group(2))
        return
    stripped = text.strip()
    if stripped.startswith("=" * 20) and found.section:
        found.state = ""
    elif (m := BRIDGE_SECTION.match(stripped)):
        found.section = m.group(1)
        found.bridge.setdefault(found.section, {})
    elif found.section and (m := BRIDGE_FIELD.match(text)):
        found.bridge[found.section][m.group(1)] = literal(m.group(2))


def _step(found: MegatronLog, log: LogFile, lineno: int, text: str) -> None:
    m = STEP.search(text)
    if not m:
        raise log.error(lineno, "a Megatron step line ('iteration N/M | consumed samples: ...') without "
                        f"'elapsed time per iteration (ms): <number> |'; got {shown_line(text)}")
    step, unit_s = int(m.group(1)), 1e-3 if m.group(2) == "ms" else 1.0
    found.steps.append(Step(step, lineno, measured(m.group(3), log, lineno, "elapsed time per iteration") * unit_s))
    tflops = TFLOPS.search(text)
    if tflops and optional(tflops.group(1)) is not None:
        found.tflops[step] = optional(tflops.group(1))


def _other(found: MegatronLog, text: str) -> None:
    if (m := MEMORY_MB.search(text)) and optional(m.group(1)):
        found.peaks_gib.append(optional(m.group(1)) * 2**20 / GIB)
    elif (m := MEMORY_GB.search(text)) and optional(m.group(1)):
        found.peaks_gib.append(optional(m.group(1)) * 1e9 / GIB)
    elif (m := PADDED_VOCAB.search(text)):
        found.vocab = int(m.group(1))
    elif (m := WORLD.search(text)):
        found.world = int(m.group(1))


def _flatten(sections: dict, defaults: bool) -> dict:
    """Megatron argument names from a Megatron-Bridge summary or config (sections ``model``,
    ``mixed_precision``, ``ddp``, ``dataset``, ``train``; with ``defaults``, the summary's, the fields
    it leaves out at Megatron Core's defaults), or a flat mapping of argument names as it is."""
    if not any(isinstance(sections.get(k), dict) for k in ("model", "train", "ddp", "dataset")):
        return dict(sections)
    flat = dict(BRIDGE_DEFAULTS) if defaults else {}
    for section in ("model", "mixed_precision", "ddp", "dataset", "train"):
        for key, value in (sections.get(section) or {}).items():
            flat[BRIDGE_NAMES.get(key, key)] = value
    return flat


def load_config(path, log: LogFile) -> dict:
    """A Megatron config file: a Megatron-Bridge ConfigContainer YAML (``cfg.to_yaml``: sections
    ``model``, ``train``, ``ddp``, ``dataset``) or a mapping of Megatron argument names."""
    doc = load_file(path, f"config of {log.path}")
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping (a Megatron-Bridge config or Megatron argument names), "
                        f"got {type(doc).__name__}")
    return doc


def _fill(facts: RunFacts, a: dict, found: MegatronLog, log: LogFile, given: Given) -> None:
    """Batch, sequence, precision, device count, layout and model from Megatron's argument names."""
    facts.global_batch_size = positive_int(a.get("global_batch_size"), log, "global_batch_size")
    facts.micro_batch_size = positive_int(a.get("micro_batch_size"), log, "micro_batch_size")
    facts.seq_len = positive_int(a.get("seq_length"), log, "seq_length")
    facts.precision = _precision(a, facts, log)
    facts.count = agree(log, "world size", positive_int(a.get("world_size") or found.world, log, "world_size"),
                        given.devices, "devices")
    facts.layout = _layout(a, facts, log)
    facts.model, facts.dropout, facts.model_note = _model(a, found.vocab, log)


def _precision(a: dict, facts: RunFacts, log: LogFile) -> str:
    """``--fp4`` (nvfp4), ``--fp8-format`` with ``--fp8-recipe`` (mxfp8, else fp8: tensorwise is
    current scaling, delayed delayed), else ``--bf16`` / ``--fp16`` (RUNS_FORMAT.md, precision rule)."""
    if a.get("fp4"):
        return "nvfp4"
    if a.get("fp8") not in (None, False, "None"):
        recipe = a.get("fp8_recipe")
        if recipe in ("tensorwise", "delayed"):
            facts.extra["fp8_scaling"] = "current" if recipe == "tensorwise" else "delayed"
        return "mxfp8" if recipe == "mxfp8" else "fp8"
    if a.get("bf16") is True:
        return "bf16"
    if a.get("fp16") is True:
        return "fp16"
    raise log.error(None, "precision: the arguments set none of bf16, fp16, fp8, fp4 (an fp32 run); the runs format "
                    "describes bf16, fp16, fp8, mxfp8 and nvfp4 runs")


def _degree(a: dict, key: str, log: LogFile) -> int:
    """A parallel degree; absent (a release before the feature) or None: 1."""
    return positive_int(a.get(key), log, key) or 1


def _layout(a: dict, facts: RunFacts, log: LogFile) -> dict:
    tp, pp, cp = (_degree(a, k, log) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                 "context_parallel_size"))
    dp = positive_int(a.get("data_parallel_size"), log, "data_parallel_size")  # None: from the count (assemble)
    layout = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": _degree(a, "expert_model_parallel_size", log),
              "vp": _degree(a, "virtual_pipeline_model_parallel_size", log),
              "sequence_parallel": bool(a.get("sequence_parallel")), "zero_stage": _zero_stage(a, facts)}
    for key, arg in (("tp_overlap", "tp_comm_overlap"), ("dp_overlap", "overlap_grad_reduce")):
        if isinstance(a.get(arg), bool):
            layout[key] = a[arg]
    _recompute(a, layout, facts)
    return layout


FSDP_STAGES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron FSDP's ``--data-parallel-sharding-strategy`` as a ZeRO stage (arguments.py choices)."""


def _zero_stage(a: dict, facts: RunFacts) -> int | None:
    """Megatron-DeepSpeed's ``--zero-stage``; Torch FSDP2 3; Megatron FSDP by its sharding strategy;
    else the distributed optimizer (ZeRO-1) or plain DDP (0)."""
    if facts.framework == "deepspeed":
        return a.get("zero_stage") if isinstance(a.get("zero_stage"), int) else None
    if a.get("use_torch_fsdp2") is True:
        return 3
    if a.get("use_megatron_fsdp") is True or a.get("use_custom_fsdp") is True:
        return FSDP_STAGES.get(str(a.get("data_parallel_sharding_strategy")))
    return 1 if a.get("use_distributed_optimizer") is True else 0


def _recompute(a: dict, layout: dict, facts: RunFacts) -> None:
    """``--recompute-granularity`` (none, selective with ``--recompute-modules``, full); full with
    ``--recompute-method block`` recomputes ``--recompute-num-layers`` layers of each stage
    (``recompute_layers``)."""
    granularity = a.get("recompute_granularity")
    if granularity in (None, "None"):
        layout["recompute"] = "none"
    elif granularity == "selective":
        layout["recompute"] = "selective"
        if isinstance(a.get("recompute_modules"), list):
            layout["recompute_modules"] = [str(m) for m in a["recompute_modules"]]
    elif granularity == "full":
        layout["recompute"] = "full"
        k = a.get("recompute_num_layers")
        if a.get("recompute_method") == "block" and isinstance(k, int) and k > 0:
            if layout["vp"] > 1:  # block counts layers of each virtual stage: not the format's per-stage count
                layout["recompute"] = None
                facts.notes.append(f"recompute: full on {k} layers of each virtual stage; left to the search")
            else:
                layout["recompute_layers"] = k
    else:
        facts.notes.append(f"recompute_granularity {granularity!r} not read; left to the search")


def _model(a: dict, vocab: int | None, log: LogFile):
    """The model's dimensions from Megatron's arguments, its dropout (hidden or attention > 0), and
    where it came from (or why there is none)."""
    needed = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")
    if any(a.get(k) is None for k in needed):
        return None, None, f"the arguments lack {', '.join(k for k in needed if a.get(k) is None)}"
    heads = a["num_attention_heads"]
    kv = a.get("num_query_groups") if a.get("group_query_attention") is not False else None
    fields = {"num_layers": a["num_layers"], "hidden_size": a["hidden_size"], "num_attention_heads": heads,
              "num_kv_heads": kv or heads, "ffn_hidden_size": a.get("ffn_hidden_size"),
              "vocab_size": vocab or a.get("padded_vocab_size") or a.get("vocab_size"),
              "ffn_activation": "swiglu" if a.get("swiglu") is True else "gelu",
              "norm": {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}.get(str(a.get("normalization"))),
              "position_embedding": {"rope": "rope", "learned_absolute": "learned"}.get(str(a.get("position_embedding_type"))),
              "rope_theta": a.get("rotary_base") if a.get("position_embedding_type") == "rope" else None,
              "moe": _moe(a, log), "mla": _mla(a)}
    if isinstance(a.get("kv_channels"), int) and a["kv_channels"] * heads != a["hidden_size"]:
        fields["head_dim"] = a["kv_channels"]
    if "untie_embeddings_and_output_weights" in a:
        fields["tied_embeddings"] = a["untie_embeddings_and_output_weights"] is not True
    elif isinstance(a.get("share_embeddings_and_output_weights"), bool):  # Megatron-Bridge's model provider
        fields["tied_embeddings"] = a["share_embeddings_and_output_weights"]
    drops = [a.get(k) for k in ("hidden_dropout", "attention_dropout") if isinstance(a.get(k), (int, float))]
    dropout = any(d > 0 for d in drops) if drops else None
    if fields["vocab_size"] is None:  # Megatron-Bridge prints none: model= names the model
        return None, dropout, "the log gives no vocabulary size (no ' > padded vocab' line, no vocab_size argument)"
    origin = f" (vocab_size {vocab}: the padded vocabulary the log prints)" if vocab else ""
    return dims_model(fields, "model of the log's arguments", log), dropout, f"model dimensions from the log's arguments{origin}"


def _moe(a: dict, log: LogFile) -> dict | None:
    experts = a.get("num_experts")
    if not experts:
        return None
    freq = a.get("moe_layer_freq", 1)
    if isinstance(freq, list) and all(f in (0, 1) for f in freq):
        dense = next((i for i, f in enumerate(freq) if f), len(freq))
        if any(not f for f in freq[dense:]):
            raise log.error(None, f"moe_layer_freq: got {freq}; the runs format has MoE layers after leading dense ones only")
    elif freq == 1:
        dense = 0
    else:
        raise log.error(None, f"moe_layer_freq: got {freq!r}; the runs format has MoE layers after leading dense ones only")
    expert_ffn = a.get("moe_ffn_hidden_size") or a.get("ffn_hidden_size")
    shared = a.get("moe_shared_expert_intermediate_size") or 0
    return {"num_experts": experts, "top_k": a.get("moe_router_topk", 2), "expert_ffn_hidden_size": expert_ffn,
            "num_shared_experts": shared // expert_ffn if shared and shared % expert_ffn == 0 else (1 if shared else 0),
            "num_dense_layers": dense}


def _mla(a: dict) -> dict | None:
    if a.get("multi_latent_attention") is not True:
        return None
    return {"q_lora_rank": a.get("q_lora_rank") or 0, "kv_lora_rank": a.get("kv_lora_rank"),
            "qk_nope_head_dim": a.get("qk_head_dim"), "qk_rope_head_dim": a.get("qk_pos_emb_head_dim"),
            "v_head_dim": a.get("v_head_dim")}
