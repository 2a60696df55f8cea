"""MaxText training logs, with their YAML config and ``key=value`` overrides.

What MaxText prints, from its own code and guide (AI-Hypercomputer/maxtext e591f30c of 2026-08-22:
docs/guides/monitoring_and_debugging/understand_logs_and_metrics.md, src/maxtext/configs/pyconfig.py,
src/maxtext/utils/maxtext_utils.py):

- one line per step: ``completed step: 9, seconds: 5.667, TFLOP/s/device: 134.924,
  Tokens/s/device: 8672.758, total_weights: 196608, loss: 10.374`` (steps numbered from 0; step 0
  includes the compilation);
- the final configuration, one ``Config param <key>: <value>`` line per key (values as Python
  prints them), after ``Updating keys from env and command line: [...]``;
- ``Num_devices: 4, shape (1, 1, 4, 1, ...)``: the device count and the mesh's shape along
  ``mesh_axes`` (``Config param mesh_axes: ['data', 'stage', 'fsdp', ...]``).

The YAML config (``base.yml`` or the run's ``config.yml``) and the ``key=value`` overrides of the
command line printed in the log fill keys the log does not print; the ``Config param`` lines, the
configuration MaxText ran, win over both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from clusterplan.models.library import get_model
from clusterplan.planner.studies.logs.common import (
    NUMBER, Given, LogFile, RunFacts, Step, agree, dims_model, literal, measured, median_of, median_step_time,
    optional, positive_int, shown_line, mapping_config,
)

NAME = "MaxText"
LOOKS_LIKE = re.compile(r"\bcompleted step:\s*\d+")
STEP = re.compile(r"\bcompleted step:\s*(\d+),\s*seconds:\s*(" + NUMBER + r")\s*,"
                  r"(?:\s*TFLOP/s/device:\s*(" + NUMBER + r")\s*,)?(?:\s*Tokens/s/device:\s*(" + NUMBER + "))?")
PARAM = re.compile(r"\bConfig param (\w+): (.*)$")
DEVICES = re.compile(r"\bNum_devices:\s*(\d+),\s*shape\s*(\([\d,\s]*\))")
COMMAND = re.compile(r"\bpython[\d.]*\s.*(?:\btrain\.py|\bMaxText[./]train|\bmaxtext\.trainers\.pre_train\.train)\b")
OVERRIDE = re.compile(r"(?:^|\s)([A-Za-z_]\w*)=(\S+)")

MODELS = {
    # MaxText model_name (src/maxtext/configs/models/<name>.yml) -> the bundled model of its shape
    "llama2-7b": "llama2-7b", "llama2-13b": "llama2-13b", "llama2-70b": "llama2-70b", "llama3-8b": "llama3-8b",
    "llama3.1-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama3.1-70b": "llama3-70b", "llama3.3-70b": "llama3-70b",
    "llama3-405b": "llama3-405b", "llama3.1-405b": "llama3-405b", "mixtral-8x7b": "mixtral-8x7b",
    "deepseek3-671b": "deepseek-v3", "gpt3-175b": "gpt3-175b", "qwen3-8b": "qwen3-8b", "qwen3-32b": "qwen3-32b",
    "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
}
AXES = {
    # mesh axis (base.yml mesh_axes, 2024 and 2026 names) -> the runs format's degree; ep is carved from dp
    "diloco": "dp", "data": "dp", "fsdp": "dp", "fsdp_transpose": "dp", "expert": "dp", "stage": "pp",
    "tensor": "tp", "tensor_transpose": "tp", "tensor_sequence": "tp", "sequence": "cp", "context": "cp",
    "context_usp_ulysses": "cp",
}
INFERENCE_AXES = ("context_autoregressive", "autoregressive")
REMAT = {"full": "full", "qkv_proj_offloaded": "full", "minimal_offloaded": "full"}
"""RUNS_FORMAT.md's MaxText remat rule: full and the offloading policies are full recompute, ``minimal``
and the ``save_*`` policies selective; ``custom`` is left to the search."""
QUANTIZATION = {"fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "nanoo_fp8": "fp8", "fp8_nanoo": "fp8",
                "fp8_gpu": "fp8", "fp8_full": "fp8", "te_fp8_delayedscaling": "fp8", "te_fp8_currentscaling": "fp8",
                "te_mxfp8": "mxfp8", "te_nvfp4": "nvfp4", "te_nvfp4_no_rht": "nvfp4"}
"""MaxText ``quantization`` (configs/types.py QuantizationType) as the format's precision; int8, int4,
intmp and fp4 are none of its formats."""


@dataclass
class MaxTextLog:
    """What one pass over a MaxText log collects."""

    steps: list[Step] = field(default_factory=list)
    tflops: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, float] = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    devices: int | None = None
    shape: tuple = ()


def load_config(path, log: LogFile) -> dict:
    return mapping_config(path, log, "a MaxText YAML config (a mapping)")


def read(log: LogFile, config: dict | None, given: Given) -> RunFacts:
    found = _scan(log)
    cfg = {**(config or {}), **found.overrides, **found.params}
    facts = RunFacts(framework="maxtext")
    sources = (["its YAML config"] if config else []) + (["the command line's overrides"] if found.overrides else [])
    facts.config_source = "; layout and batch from " + ", ".join(sources + ["the log's 'Config param' lines"])
    if not cfg:
        raise log.error(None, "no 'Config param <key>: <value>' lines in the log and no config given: the layout, "
                        "batch and model are unknown (give the YAML config as LOG::CONFIG)")
    facts.count = agree(log, "hardware.count (Num_devices)", found.devices, given.devices, "devices")
    _layout(facts, found, cfg, log)
    _batch(facts, cfg, log)
    facts.precision = _precision(facts, cfg, log)
    _model(facts, cfg, log)
    time_s, note, kept = median_step_time(found.steps, log, "MaxText 'completed step: N, seconds: X'")
    facts.measured["step_time_s"] = round(time_s, 6)
    facts.notes.append(note)
    for key, values, definition in (("tflops_per_device", found.tflops, "MaxText 'TFLOP/s/device' (model FLOPs)"),
                                    ("tokens_per_s_per_device", found.tokens, None)):
        kept_values = [values[k] for k in kept if k in values]
        if kept_values:
            facts.measured[key] = round(median_of(kept_values), 3)
            if definition:
                facts.measured["tflops_definition"] = definition
    return facts


def _scan(log: LogFile) -> MaxTextLog:
    found = MaxTextLog()
    for lineno, text in log.lines():
        if LOOKS_LIKE.search(text):
            m = STEP.search(text)
            if not m:
                raise log.error(lineno, "a MaxText step line ('completed step: N, ...') without 'seconds: <number>,' "
                                f"as MaxText's metric logger prints it; got {shown_line(text)}")
            step = int(m.group(1))
            found.steps.append(Step(step, lineno, measured(m.group(2), log, lineno, "seconds")))
            for figures, text_value in ((found.tflops, m.group(3)), (found.tokens, m.group(4))):
                if optional(text_value) is not None:
                    figures[step] = optional(text_value)
        elif (m := PARAM.search(text)):
            found.params[m.group(1)] = literal(m.group(2))
        elif (m := DEVICES.search(text)):
            found.devices, found.shape = int(m.group(1)), tuple(literal(m.group(2)))
        elif COMMAND.search(text):
            found.overrides.update({k: literal(v) for k, v in OVERRIDE.findall(text)})
    return found


def _mesh(found: MaxTextLog, cfg: dict, log: LogFile, count: int | None) -> dict[str, int]:
    """Each mesh axis's degree: the log's mesh shape along ``mesh_axes``, else ``ici_* x dcn_*``
    with a -1 filled by the devices left (``num_slices`` slices)."""
    axes = cfg.get("mesh_axes")
    if found.shape and isinstance(axes, list) and len(axes) == len(found.shape):
        return {str(a): int(d) for a, d in zip(axes, found.shape)}
    names = sorted({m.group(2) for k in cfg if (m := re.fullmatch(r"(ici|dcn)_(\w+)_parallelism", k))})
    slices = positive_int(cfg.get("num_slices") if cfg.get("num_slices") != -1 else 1, log, "num_slices") or 1
    if not names or count is None:
        raise log.error(None, "the mesh: the log gives no 'Num_devices: N, shape (...)' line with mesh_axes, or no "
                        "ici_*/dcn_* parallelism with the device count")
    degrees = {}
    for level, total in (("ici", count // slices), ("dcn", slices)):
        given = {n: cfg.get(f"{level}_{n}_parallelism", 1) for n in names}
        known = math.prod(v for v in given.values() if v != -1)
        for n, v in given.items():
            degrees[n] = degrees.get(n, 1) * (total // known if v == -1 else int(v))
    return degrees


def _layout(facts: RunFacts, found: MaxTextLog, cfg: dict, log: LogFile) -> None:
    mesh = _mesh(found, cfg, log, facts.count)
    busy = [a for a in INFERENCE_AXES if mesh.get(a, 1) > 1]
    unknown = [a for a, d in mesh.items() if d > 1 and a not in AXES and a not in INFERENCE_AXES]
    if busy or unknown:
        raise log.error(None, f"mesh axes {busy + unknown} are above 1; a training run's layout has "
                        f"only {', '.join(sorted(AXES))}")
    degree = {k: math.prod(d for a, d in mesh.items() if AXES.get(a) == k) for k in ("dp", "tp", "pp", "cp")}
    facts.count = facts.count or math.prod(mesh.values())
    fsdp = mesh.get("fsdp", 1) * mesh.get("fsdp_transpose", 1)
    remat = str(cfg.get("remat_policy", ""))
    recompute = REMAT.get(remat) or ("selective" if remat.startswith(("minimal", "save_")) else None)
    if recompute is None:
        facts.notes.append(f"recompute: remat_policy {remat!r} left to the search")
    facts.layout = {**degree, "ep": mesh.get("expert", 1), "vp": _vp(cfg, degree["pp"]),
                    "zero_stage": 3 if fsdp > 1 else 0, "recompute": recompute}


def _vp(cfg: dict, pp: int) -> int | None:
    """``num_pipeline_repeats`` stages per rank (1 without a pipeline; -1: MaxText derives it, unknown here)."""
    if pp == 1:
        return 1
    repeats = cfg.get("num_pipeline_repeats", -1)
    return int(repeats) if isinstance(repeats, int) and repeats > 0 else None


def _batch(facts: RunFacts, cfg: dict, log: LogFile) -> None:
    """The global batch (``global_batch_size_to_train_on``, else ``int(per_device_batch_size x
    devices) x gradient_accumulation_steps``) and, by RUNS_FORMAT.md's rule for MaxText, the
    micro-batch as the per-replica batch of one accumulation step."""
    per_device = cfg.get("per_device_batch_size")
    accumulation = positive_int(cfg.get("gradient_accumulation_steps", 1), log, "gradient_accumulation_steps")
    glob = cfg.get("global_batch_size_to_train_on")
    if glob is None and isinstance(per_device, (int, float)) and math.isfinite(per_device) and facts.count:
        glob = int(per_device * facts.count) * accumulation
    facts.global_batch_size = positive_int(glob, log, "global_batch_size_to_train_on")
    facts.seq_len = positive_int(cfg.get("max_target_length"), log, "max_target_length")
    dp, pp = facts.layout.get("dp"), facts.layout.get("pp", 1)
    if facts.global_batch_size and dp and facts.global_batch_size % dp == 0:
        replica = facts.global_batch_size // dp
        pieces = accumulation if pp == 1 else cfg.get("num_pipeline_microbatches", -1)
        if isinstance(pieces, int) and pieces > 0 and replica % pieces == 0:
            facts.micro_batch_size = replica // pieces


def _precision(facts: RunFacts, cfg: dict, log: LogFile) -> str:
    quant = str(cfg.get("quantization") or "")
    if quant:
        if quant not in QUANTIZATION:
            raise log.error(None, f"quantization: got {quant!r}; the runs format describes fp8, mxfp8 and nvfp4 "
                            f"runs ({', '.join(QUANTIZATION)})")
        if quant in ("te_fp8_delayedscaling", "te_fp8_currentscaling"):
            facts.extra["fp8_scaling"] = "delayed" if "delayed" in quant else "current"
        return QUANTIZATION[quant]
    dtype = str(cfg.get("dtype", "bfloat16"))  # a name, or a jnp dtype as printed
    if "bfloat16" in dtype or "float16" in dtype:
        return "bf16" if "bfloat16" in dtype else "fp16"
    raise log.error(None, f"dtype: got {dtype!r}; the runs format describes bfloat16 and float16 runs (or a quantization)")


def _model(facts: RunFacts, cfg: dict, log: LogFile) -> None:
    """The bundled model of ``model_name`` (:data:`MODELS`), else the dimensions of the config."""
    name = str(cfg.get("model_name", "default"))
    if isinstance(cfg.get("enable_dropout"), bool):
        facts.dropout = cfg["enable_dropout"]
    if name in MODELS:
        facts.model = get_model(MODELS[name])
        facts.model_note = f"model: MaxText {name} is the bundled {MODELS[name]}"
        return
    dims = _dims(cfg)
    if dims is not None:
        facts.model = dims_model(dims, f"MaxText {name}", log)
        facts.model_note = f"model dimensions from the MaxText config (model_name {name!r})"


def _dims(cfg: dict) -> dict | None:
    def pick(derived: str, base: str):
        return cfg.get(derived) if cfg.get(derived) is not None else cfg.get(base)

    scale = cfg.get("global_parameter_scale", 1)
    if scale != 1 and cfg.get("emb_dim") is None:
        return None  # the base_* dimensions are scaled; without the derived ones the shape is unknown
    fields = {"num_layers": pick("num_decoder_layers", "base_num_decoder_layers"), "hidden_size": pick("emb_dim", "base_emb_dim"),
              "num_attention_heads": pick("num_query_heads", "base_num_query_heads"),
              "num_kv_heads": pick("num_kv_heads", "base_num_kv_heads"), "ffn_hidden_size": pick("mlp_dim", "base_mlp_dim"),
              "vocab_size": cfg.get("vocab_size"), "tied_embeddings": cfg.get("logits_via_embedding")}
    if None in (fields["num_layers"], fields["hidden_size"], fields["num_attention_heads"], fields["ffn_hidden_size"]):
        return None
    activations = cfg.get("mlp_activations") or ["silu", "linear"]
    fields["ffn_activation"] = "swiglu" if len(activations) == 2 else "gelu"
    head_dim = cfg.get("head_dim")
    if isinstance(head_dim, int) and head_dim * fields["num_attention_heads"] != fields["hidden_size"]:
        fields["head_dim"] = head_dim
    experts = cfg.get("num_experts", 1)
    if isinstance(experts, int) and experts > 1:
        moe_ffn = pick("moe_mlp_dim", "base_moe_mlp_dim")
        fields["moe"] = {"num_experts": experts, "top_k": cfg.get("num_experts_per_tok", 1),
                         "expert_ffn_hidden_size": moe_ffn if isinstance(moe_ffn, int) and moe_ffn > 0 else fields["ffn_hidden_size"],
                         "num_shared_experts": cfg.get("shared_experts", 0) or 0,
                         "num_dense_layers": cfg.get("first_num_dense_layers", 0) or 0}
    return fields
