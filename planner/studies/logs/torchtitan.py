"""torchtitan training logs and TOML job configs.

What torchtitan prints, from its own code (read at v0.1.0, v0.2.2 and main b5bcd76c of 2026-08-21):

- the step line of ``MetricsProcessor.log`` (torchtitan/components/metrics.py), at step 1 and
  every ``metrics.log_freq`` steps, each figure preceded by an ANSI colour unless colours are off:
  ``step: 10  loss:  7.8912  grad_norm:  1.2345  memory: 45.67GiB(57.64%)  tps: 1,234  tflops:
  456.78  mfu: 46.19%`` (``grad_norm`` since 2025-06; ``mfu: N/A`` under float8 or MX; ``wps``
  before ``tps`` in 2024). ``tps`` is tokens per second per device over the steps since the last
  line, ``ntokens_since_last_log / (time * cp * tp * pp)``, the tokens being the labels of the
  data-parallel rank's batches; ``memory`` is the peak of ``max_reserved`` since the last line;
- ``Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1,
  etp=1`` (torchtitan/distributed/parallel_dims.py, v0.2.2 on: every degree resolved), before it
  ``Building 2-D device mesh with ['dp_shard', 'tp'], [8, 8]`` (only the degrees above 1);
- ``Trainer is initialized with local batch size 2, global batch size 16, gradient accumulation
  steps 1, sequence length 8192, total steps 100 (warmup 10)`` (torchtitan/train.py), in 2024
  ``Training starts at step 1, with local batch size 8, global batch size 64, sequence length
  8192, ...``;
- ``Building llama3 8B with ...`` and ``torchtitan version: 0.2.2``.

The TOML job config (``--job.config_file``; torchtitan/config/job_config.py at v0.2.2) gives the
rest: ``[model] name, flavor, converters``; ``[training] local_batch_size`` (``batch_size`` before
2025-06), ``global_batch_size``, ``seq_len``, ``mixed_precision_param``, ``compile`` (2024);
``[parallelism]`` degrees, ``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size``;
``[activation_checkpoint] mode, selective_ac_option``; ``[compile] enable``;
``[quantize.linear.float8]`` (``[float8]`` before) ``enable_fsdp_float8_all_gather``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

from clusterplan.models.errors import SpecError
from clusterplan.models.files import read_text
from clusterplan.models.library import get_model
from clusterplan.planner.studies.logs.common import (
    NUMBER, Given, LogFile, RunFacts, Step, agree, literal, measured, median_of, median_step_time, optional, peak_gib,
    positive_int, shown_line,
)

NAME = "torchtitan"
LOOKS_LIKE = re.compile(r"\bstep:\s*\d+\s+loss:")
STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*\S+\s+(?:grad_norm:\s*\S+\s+)?memory:\s*(" + NUMBER + r")\s*GiB"
                  r"\(\s*(" + NUMBER + r")%\)\s+(?:tps|wps):\s*(" + NUMBER + r")(?:\s+tflops:\s*(" + NUMBER + "))?")
MESH = re.compile(r"Building device mesh with parallelism:\s*((?:\w+=\d+,?\s*)+)")
MESH_OLD = re.compile(r"Building \d+-D device mesh with (\[[^\]]*\]),\s*(\[[^\]]*\])")
BATCH = re.compile(r"(?:Trainer is initialized with|Training starts at step \d+, with)\s+(.*)")
BATCH_FIELDS = {"local batch size": "local", "global batch size": "global", "gradient accumulation steps": "accum",
                "sequence length": "seq_len"}
BUILDING = re.compile(r"\bBuilding (\w+) (\w[\w.]*?)\s?with\b")
VERSION = re.compile(r"torchtitan version:\s*(\S+)")

FLAVORS = {
    # (model.name, model.flavor) -> bundled model id: the flavors torchtitan ships with a bundled
    # model's shape (torchtitan/models/llama3/__init__.py, deepseek_v3/__init__.py at v0.2.2;
    # torchtitan/models/llama/__init__.py for 'llama2' in 2024; torchtitan/models/qwen3/__init__.py, 2025-26)
    ("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
    ("llama2", "7B"): "llama2-7b", ("llama2", "13B"): "llama2-13b", ("llama2", "70B"): "llama2-70b",
    ("deepseek_v3", "671B"): "deepseek-v3", ("qwen3", "8B"): "qwen3-8b", ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
}


@dataclass
class TitanLog:
    """What one pass over a torchtitan log collects."""

    steps: list[Step] = field(default_factory=list)
    tps: dict[int, list[float]] = field(default_factory=dict)
    tflops: dict[int, float] = field(default_factory=dict)
    peaks_gib: list[float] = field(default_factory=list)
    mesh: dict[str, int] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)
    model: tuple[str, str] | None = None
    version: str | None = None


def load_config(path, log: LogFile) -> dict:
    """A torchtitan TOML job config."""
    text = read_text(path, f"config of {log.path}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: invalid TOML (a torchtitan job config): {err}") from None


def read(log: LogFile, config: dict | None, given: Given) -> RunFacts:
    found = _scan(log)
    cfg = config or {}
    facts = RunFacts(framework="torchtitan", framework_version=f"torchtitan {found.version}" if found.version else None)
    facts.config_source = "; layout and batch from " + ("its TOML job config and " if config else "") + "the log"
    _layout(facts, found, cfg, log)
    facts.count = agree(log, "hardware.count (the mesh's devices)", facts.count, given.devices, "devices")
    _batch(facts, found, cfg, log)
    facts.seq_len = agree(log, "seq_len", facts.seq_len, given.seq_len, "seq_len")
    _model(facts, found, cfg)
    facts.precision, converters = _precision(cfg)
    if converters:
        facts.notes.append(f"precision {facts.precision}: model.converters {converters}")
    if _get(cfg, "quantize.linear.float8.enable_fsdp_float8_all_gather", "float8.enable_fsdp_float8_all_gather"):
        facts.extra["fp8_all_gather"] = True
    if _get(cfg, "compile.enable", "training.compile") is True:
        facts.extra["compile"] = True
    _measured(facts, found, log)
    return facts


def _scan(log: LogFile) -> TitanLog:
    found = TitanLog()
    for lineno, text in log.lines():
        if LOOKS_LIKE.search(text):
            _step(found, log, lineno, text)
        elif (m := MESH.search(text)):
            found.mesh = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
        elif (m := MESH_OLD.search(text)):
            names, dims = literal(m.group(1)), literal(m.group(2))
            if isinstance(names, list) and isinstance(dims, list) and len(names) == len(dims):
                found.mesh = {str(n): int(d) for n, d in zip(names, dims)}
                if "dp_shard_mod_ep" in found.mesh:  # v0.2.0 with ep: dp_shard = dp_shard_mod_ep x dp_shard_in_ep
                    found.mesh["dp_shard"] = found.mesh.pop("dp_shard_mod_ep") * found.mesh.pop("dp_shard_in_ep", 1)
                if "dp" in found.mesh:  # 2024, before HSDP: 'dp' was the FSDP dimension
                    found.mesh["dp_shard"] = found.mesh.pop("dp")
        elif (m := BATCH.search(text)):
            for words, key in BATCH_FIELDS.items():
                if (v := re.search(re.escape(words) + r"\s+(\d+)", m.group(1))):
                    found.batch[key] = int(v.group(1))
        elif (m := BUILDING.search(text)) and found.model is None:
            found.model = (m.group(1), m.group(2))
        elif (m := VERSION.search(text)):
            found.version = m.group(1)
    return found


def _step(found: TitanLog, log: LogFile, lineno: int, text: str) -> None:
    m = STEP.search(text)
    if not m:
        raise log.error(lineno, "a torchtitan step line ('step: N  loss: ...') without 'memory: <GiB>GiB(<%>%)  "
                        f"tps: <tokens/s>' as torchtitan's metrics print them; got {shown_line(text)}")
    step = int(m.group(1))
    found.steps.append(Step(step, lineno, 0.0))
    found.tps.setdefault(step, []).append(measured(m.group(4), log, lineno, "tps"))
    found.peaks_gib.append(optional(m.group(2)))
    if optional(m.group(5)) is not None:
        found.tflops[step] = optional(m.group(5))


def _get(cfg: dict, *paths: str):
    """The first of ``paths`` (dotted TOML keys) the config sets; none: None."""
    for path in paths:
        node = cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


MESH_KEYS = {
    # degree: (its name on the log's mesh line, its config keys: [parallelism] since 2024-09, before it
    # [training] and [experimental], as torchtitan's llama3_8b.toml of 2024-05 and 2024-08 has them)
    "tp": ("tp", ("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree")),
    "pp": ("pp", ("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree",
                  "training.pipeline_parallel_degree")),
    "cp": ("cp", ("parallelism.context_parallel_degree", "experimental.context_parallel_degree")),
    "ep": ("ep", ("parallelism.expert_parallel_degree",)),
    "dp_replicate": ("dp_replicate", ("parallelism.data_parallel_replicate_degree",
                                      "training.data_parallel_replicate_degree")),
    "dp_shard": ("dp_shard", ("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree",
                              "training.data_parallel_degree")),
}


def _layout(facts: RunFacts, found: TitanLog, cfg: dict, log: LogFile) -> None:
    """Degrees from the log's mesh line (resolved), else the config (unset: 1; dp_shard -1: the
    devices left); the device count is their product. FSDP sharding is ZeRO-3 (``never``
    resharding after forward ZeRO-2), plain replication ZeRO-0; HSDP (both) is left to the search."""
    deg = {}
    for key, (mesh_name, paths) in MESH_KEYS.items():
        # the mesh line has every device-taking degree (the old one those above 1); ep borrows devices
        value = found.mesh.get(mesh_name, 1) if found.mesh and key != "ep" else found.mesh.get("ep", _get(cfg, *paths))
        deg[key] = positive_int(value, log, paths[0]) if value != -1 else -1
        if deg[key] is None:
            deg[key] = -1 if key == "dp_shard" else 1
    if deg["dp_shard"] != -1:
        facts.count = deg["dp_replicate"] * deg["dp_shard"] * deg["cp"] * deg["tp"] * deg["pp"]
    shard, replicate = deg["dp_shard"], deg["dp_replicate"]
    reshard = _get(cfg, "parallelism.fsdp_reshard_after_forward")
    zero = 0 if shard == 1 else (None if replicate > 1 else (2 if reshard == "never" else 3))
    if _get(cfg, "training.data_parallel_type") == "ddp":  # 2024: the dp dimension replicated instead of sharding
        zero = 0
    if zero is None:
        facts.notes.append(f"zero_stage: HSDP (dp_replicate {replicate} x dp_shard {shard}) shards within a group; "
                           "left to the search")
    dp = replicate * shard if shard != -1 else None
    facts.layout = {"tp": deg["tp"], "pp": deg["pp"], "dp": dp, "cp": deg["cp"], "ep": deg["ep"],
                    "vp": _vp(cfg, deg["pp"]), "zero_stage": zero, "recompute": _recompute(facts, cfg)}
    sp = _get(cfg, "parallelism.enable_sequence_parallel")  # main since 2026-03-29; before, apply_tp always ran SP
    if deg["tp"] > 1:
        facts.layout["sequence_parallel"] = sp if isinstance(sp, bool) else True
    async_tp = _get(cfg, "parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel")
    if isinstance(async_tp, bool):
        facts.layout["tp_overlap"] = async_tp


def _vp(cfg: dict, pp: int) -> int | None:
    """1 for single-stage schedules (1F1B, GPipe); an interleaved schedule's stages per rank from
    ``module_fqns_per_model_part`` where the config gives it, else unknown."""
    if pp == 1:
        return 1
    schedule = str(_get(cfg, "parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule") or "1F1B")
    if schedule in ("1F1B", "GPipe"):
        return 1
    parts = _get(cfg, "parallelism.module_fqns_per_model_part")
    return len(parts) // pp if isinstance(parts, list) and len(parts) % pp == 0 else None


def _recompute(facts: RunFacts, cfg: dict) -> str | None:
    """``[activation_checkpoint] mode``: none, full, selective (per-op SAC, ``selective_ac_option =
    "op"``); layer SAC (an integer option k: every k-th block checkpointed whole) is full recompute
    on 1/k of the layers, left to the search here. Unset: unknown (the default moved between releases)."""
    mode = _get(cfg, "activation_checkpoint.mode")
    if mode in ("none", "full"):
        return mode
    if mode == "selective":
        option = str(_get(cfg, "activation_checkpoint.selective_ac_option") or "op")
        if option == "op":
            return "selective"
        facts.notes.append(f"recompute: layer SAC (selective_ac_option {option!r}) left to the search")
    elif mode is not None:
        facts.notes.append(f"recompute: activation_checkpoint.mode {mode!r} left to the search")
    return None


def _batch(facts: RunFacts, found: TitanLog, cfg: dict, log: LogFile) -> None:
    """Batch and sequence from the log's 'Trainer is initialized with ...' line, else the config;
    the micro-batch is the local batch (cut into ``pipeline_parallel_microbatch_size`` pieces with
    a pipeline)."""
    local = found.batch.get("local") or _get(cfg, "training.local_batch_size", "training.batch_size")
    glob = found.batch.get("global") or _get(cfg, "training.global_batch_size")
    dp = facts.layout.get("dp")
    if (glob is None or glob == -1) and local and dp:
        glob = local * dp  # global_batch_size -1: no accumulation, one local batch per replica
    facts.global_batch_size = positive_int(glob if glob != -1 else None, log, "global batch size")
    facts.seq_len = positive_int(found.batch.get("seq_len") or _get(cfg, "training.seq_len"), log, "seq_len")
    if facts.layout.get("pp", 1) > 1:
        count = _get(cfg, "experimental.pipeline_parallel_microbatches")  # 2024: a count, not a size
        size = _get(cfg, "parallelism.pipeline_parallel_microbatch_size")
        local = size or (local // count if isinstance(local, int) and isinstance(count, int) and count > 0
                         and local % count == 0 else (None if count else 1))
    facts.micro_batch_size = positive_int(local, log, "local batch size")


def _model(facts: RunFacts, found: TitanLog, cfg: dict) -> None:
    name = (_get(cfg, "model.name"), _get(cfg, "model.flavor"))
    if None in name:
        name = found.model or name
    bundled = FLAVORS.get((str(name[0]), str(name[1])))
    if bundled:
        facts.model = get_model(bundled)
        facts.model_note = f"model: torchtitan {name[0]} {name[1]} is the bundled {bundled}"
    elif None not in name:
        facts.model_note = f"torchtitan {name[0]} {name[1]}"


def _precision(cfg: dict) -> tuple[str | None, list]:
    """float8 converters (``float8``, ``quantize.linear.float8``; 2024's ``float8.enable_float8_linear``)
    are fp8, MX (``mx``, ``quantize.linear.mx``) mxfp8; else ``training.mixed_precision_param``
    (bfloat16 by default; float32 is no format the runs describe)."""
    converters = [str(c) for c in _get(cfg, "model.converters") or []]
    if any(c in ("mx", "quantize.linear.mx") for c in converters):
        return "mxfp8", converters
    if any(c in ("float8", "quantize.linear.float8") for c in converters) or _get(cfg, "float8.enable_float8_linear"):
        return "fp8", converters
    param = _get(cfg, "training.mixed_precision_param") or "bfloat16"
    return {"bfloat16": "bf16", "float16": "fp16"}.get(str(param)), converters


def _measured(facts: RunFacts, found: TitanLog, log: LogFile) -> None:
    """The step time from tokens per second per device: the global batch's tokens over ``tps``
    times the devices (each line's ``tps`` covers the steps since the previous line)."""
    if facts.global_batch_size is None or facts.seq_len is None or facts.count is None:
        raise log.error(None, "the step time needs the global batch, the sequence length and the device count "
                        "(torchtitan logs tokens per second per device, not seconds): give the TOML job config")
    tokens = facts.global_batch_size * facts.seq_len
    steps = [Step(s.step, s.lineno, tokens / (facts.count * median_of(found.tps[s.step]))) for s in found.steps]
    time_s, note, kept = median_step_time(steps, log, "torchtitan 'step: N  loss: ...  tps: ...'")
    facts.measured["step_time_s"] = round(time_s, 6)
    facts.measured["step_time_derivation"] = "global_batch_size*seq_len/(tokens_per_s_per_device*count)"
    facts.measured["tokens_per_s_per_device"] = round(median_of([v for k in kept for v in found.tps[k]]), 1)
    facts.notes.append(note)
    tflops = [found.tflops[k] for k in kept if k in found.tflops]
    if tflops:
        facts.measured["tflops_per_device"] = round(median_of(tflops), 3)
        facts.measured["tflops_definition"] = "torchtitan 'tflops': num_flops_per_token x tps (6N + attention)"
    if peak_gib(found.peaks_gib):
        facts.measured.update(peak_memory_gib=peak_gib(found.peaks_gib), peak_memory_kind="reserved")
        facts.notes.append("peak_memory_gib: the largest 'memory' of the step lines (max_memory_reserved since the "
                           "previous line)")
