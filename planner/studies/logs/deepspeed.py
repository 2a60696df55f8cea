"""DeepSpeed training logs and JSON configs.

What DeepSpeed prints, from its own code (deepspeedai/DeepSpeed edaa7221 of 2026-08-22):

- ``ThroughputTimer.stop`` (deepspeed/utils/timer.py), every ``steps_per_print`` optimizer steps
  once the first two are past: ``epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=...,
  CurrSamplesPerSec=12.3, MemAllocated=20.1GB, MaxMemAllocated=35.7GB``; ``CurrSamplesPerSec`` is
  ``train_batch_size`` over that step's time (forward to optimizer step, summed over its
  micro-batches), the memory ``torch.cuda.max_memory_allocated`` in GiB;
- the pipeline engine's ``steps: 10 loss: 2.3456 iter time (s): 1.234 samples/sec: 51.9``
  (deepspeed/runtime/pipe/engine.py), and per stage ``RANK=0 STAGE=0 LAYERS=... STAGE_PARAMS=...``;
- ``DeepSpeedEngine configuration:`` then ``  name ........ value`` per config attribute
  (``DeepSpeedConfig.print``: ``world_size`` is the data-parallel size) and ``  json = {...}``,
  the user's config as indented JSON;
- ``DeepSpeed info: version=0.14.4, git-hash=..., git-branch=...``.

The JSON config (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``zero_optimization.stage``, ``bf16``/``fp16``,
``tensor_parallel.autotp_size``, ``sequence_parallel_size``) comes from the file given or the
log's ``json = {...}``. DeepSpeed does not know the model or the sequence length: the model comes
from a Hugging Face ``Model config <Class> {...}`` block in the log (transformers prints it) or from
``model=``, the sequence length from ``seq_len=``. (The flops profiler's ``iter latency`` times one
micro-batch, not a step: it is not read.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterplan.models import hf
from clusterplan.models.errors import SpecError
from clusterplan.models.files import parse_json
from clusterplan.planner.studies.logs.common import (
    NUMBER, Given, LogFile, RunFacts, Step, literal, measured, median_step_time, optional, peak_gib, positive_int,
    shown_line, mapping_config,
)

NAME = "DeepSpeed"
LOOKS_LIKE = re.compile(r"CurrSamplesPerSec=|\bsteps:\s*\d+\s+loss:")
TIMER = re.compile(r"\bglobal_step=(\d+),\s*RunningAvgSamplesPerSec=\S+,\s*CurrSamplesPerSec=(" + NUMBER + r")"
                   r"(?:,\s*MemAllocated=" + NUMBER + r"GB,\s*MaxMemAllocated=(" + NUMBER + ")GB)?")
PIPE = re.compile(r"\bsteps:\s*(\d+)\s+loss:\s*\S+\s+.*?iter time \(s\):\s*(" + NUMBER + r")\s+samples/sec:\s*" + NUMBER)
STAGE = re.compile(r"\bRANK=\d+ STAGE=(\d+) LAYERS=")
DUMP_START = "DeepSpeedEngine configuration:"
DUMP = re.compile(r"\s([a-z_]\w*) \.{2,} (.*)$")
JSON_START = re.compile(r"\bjson = (\{.*)$")
HF_START = re.compile(r"\bModel config (\w+) (\{.*)$")
VERSION = re.compile(r"DeepSpeed info: version=([^,\s]+)")


@dataclass
class DeepSpeedLog:
    """What one pass over a DeepSpeed log collects."""

    timer: list[tuple[Step, float]] = field(default_factory=list)  # (step, samples per second)
    pipe: list[Step] = field(default_factory=list)
    peaks_gib: list[float] = field(default_factory=list)
    stages: set[int] = field(default_factory=set)
    dump: dict = field(default_factory=dict)
    json: dict | None = None
    hf: dict | None = None
    hf_class: str = ""
    hf_line: int = 0
    version: str | None = None
    block: list[str] = field(default_factory=list)  # the lines of a JSON block being read
    block_kind: str = ""
    block_line: int = 0
    in_dump: bool = False


def load_config(path, log: LogFile) -> dict:
    return mapping_config(path, log, "a DeepSpeed JSON config (a mapping)")


def read(log: LogFile, config: dict | None, given: Given) -> RunFacts:
    found = _scan(log)
    cfg = {**(found.json or {}), **(config or {})} if config else (found.json or {})
    facts = RunFacts(framework="deepspeed", framework_version=f"DeepSpeed {found.version}" if found.version else None)
    facts.config_source = "; batch and ZeRO stage from " + ("the JSON config" if config else "the log's DeepSpeed config")
    _batch_and_layout(facts, found, cfg, log)
    facts.precision = _precision(cfg, found.dump, log)
    if found.hf is not None:
        try:
            facts.model = hf.from_hf_config(found.hf, name=str(found.hf.get("_name_or_path") or found.hf_class))
        except SpecError as err:
            raise log.error(found.hf_line, f"the Hugging Face 'Model config {found.hf_class}' block: {err}") from None
        facts.model_note = f"model from the log's Hugging Face 'Model config {found.hf_class}' block"
        facts.extra["model_code"] = "huggingface"
        facts.notes.append("model_code huggingface: the log prints a transformers model config (a transformers "
                           "model class trained under DeepSpeed)")
    _measured(facts, found, log)
    return facts


def _scan(log: LogFile) -> DeepSpeedLog:
    found = DeepSpeedLog()
    for lineno, text in log.lines():
        if found.block_kind:
            _block_line(found, log, text)
        elif LOOKS_LIKE.search(text):
            _step(found, log, lineno, text)
        elif DUMP_START in text:
            found.in_dump = True
        elif (m := JSON_START.search(text)) and found.in_dump:
            found.in_dump = False
            _block_start(found, log, lineno, "json", m.group(1))
        elif (m := HF_START.search(text)) and found.hf is None:
            found.hf_class, found.hf_line = m.group(1), lineno
            _block_start(found, log, lineno, "hf", m.group(2))
        elif found.in_dump and (m := DUMP.search(text)):
            found.dump[m.group(1)] = literal(m.group(2))
        elif (m := STAGE.search(text)):
            found.stages.add(int(m.group(1)))
        elif (m := VERSION.search(text)):
            found.version = m.group(1)
    if found.block_kind:
        raise log.error(found.block_line, f"the {_BLOCKS[found.block_kind]} that starts here does not end")
    return found


_BLOCKS = {"json": "DeepSpeed config 'json = {...}'", "hf": "Hugging Face 'Model config {...}'"}


def _block_start(found: DeepSpeedLog, log: LogFile, lineno: int, kind: str, text: str) -> None:
    found.block, found.block_kind, found.block_line = [], kind, lineno
    _block_line(found, log, text)


def _block_line(found: DeepSpeedLog, log: LogFile, text: str) -> None:
    """One line of a JSON block; at its closing brace the block is parsed."""
    found.block.append(text)
    body = "\n".join(found.block)
    if body.count("{") > body.count("}"):
        return
    kind, found.block_kind = found.block_kind, ""
    try:
        doc = parse_json(body, f"{log.path}:{found.block_line}: the {_BLOCKS[kind]}")
    except SpecError as err:
        raise log.error(found.block_line, f"the {_BLOCKS[kind]} is not valid JSON ({err})") from None
    if kind == "json":
        found.json = doc
    else:
        found.hf = doc


def _step(found: DeepSpeedLog, log: LogFile, lineno: int, text: str) -> None:
    if (m := TIMER.search(text)):
        found.timer.append((Step(int(m.group(1)), lineno, 0.0), measured(m.group(2), log, lineno, "CurrSamplesPerSec")))
        found.peaks_gib.append(optional(m.group(3)))
    elif (m := PIPE.search(text)):
        found.pipe.append(Step(int(m.group(1)), lineno, measured(m.group(2), log, lineno, "iter time (s)")))
    else:
        raise log.error(lineno, "a DeepSpeed step line without 'global_step=N, RunningAvgSamplesPerSec=..., "
                        "CurrSamplesPerSec=<number>' (ThroughputTimer) or 'steps: N loss: ... iter time (s): <number> "
                        f"samples/sec: <number>' (pipeline engine); got {shown_line(text)}")


def _value(cfg: dict, dump: dict, key: str, log: LogFile):
    """A config value: the engine's dump (resolved, e.g. after the HF Trainer's "auto") over the JSON."""
    value = dump.get(key, cfg.get(key))
    return None if value == "auto" else positive_int(value, log, key)


def _batch_and_layout(facts: RunFacts, found: DeepSpeedLog, cfg: dict, log: LogFile) -> None:
    dump = found.dump
    glob, micro = _value(cfg, dump, "train_batch_size", log), _value(cfg, dump, "train_micro_batch_size_per_gpu", log)
    accumulation = _value(cfg, dump, "gradient_accumulation_steps", log) or 1
    dp = positive_int(dump.get("world_size"), log, "world_size")
    if dp is None and glob and micro and glob % (micro * accumulation) == 0:
        dp = glob // (micro * accumulation)
    glob = glob or (micro * accumulation * dp if micro and dp else None)
    facts.global_batch_size, facts.micro_batch_size = glob, micro
    tp = positive_int((cfg.get("tensor_parallel") or {}).get("autotp_size"), log, "tensor_parallel.autotp_size") or 1
    pp = 1 + max(found.stages) if found.stages else (None if found.pipe else 1)
    sp = positive_int(cfg.get("sequence_parallel_size"), log, "sequence_parallel_size") or 1
    if sp > 1:
        facts.notes.append(f"cp: DeepSpeed-Ulysses sequence parallelism of {sp} (all-to-all of heads) is not the "
                           "format's context parallelism; left to the search")
    zero = (cfg.get("zero_optimization") or {}).get("stage", dump.get("zero_optimization_stage", 0))
    facts.layout = {"tp": tp, "pp": pp, "dp": dp, "cp": None if sp > 1 else 1,  # ep: the model's layers set it
                    "vp": 1 if pp == 1 else None, "zero_stage": zero if zero in (0, 1, 2, 3) else None}
    if dp and pp:
        facts.count = dp * tp * pp * sp


def _precision(cfg: dict, dump: dict, log: LogFile) -> str:
    """``bf16`` (or the older ``bfloat16``) or ``fp16`` enabled in the config, else the engine dump's
    ``bfloat16_enabled`` / ``fp16_enabled``; neither is an fp32 run, which the format does not describe."""
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        if (cfg.get(key) or {}).get("enabled") is True:
            return name
    for key, name in (("bfloat16_enabled", "bf16"), ("fp16_enabled", "fp16")):
        if dump.get(key) is True:
            return name
    raise log.error(None, "precision: the DeepSpeed config enables neither bf16 nor fp16 (an fp32 run, or the config "
                    "is missing); the runs format describes bf16, fp16 and fp8 runs: give the JSON config")


def _measured(facts: RunFacts, found: DeepSpeedLog, log: LogFile) -> None:
    if found.timer:
        if not facts.global_batch_size:
            raise log.error(None, "train_batch_size: the ThroughputTimer's samples per second need it; give the JSON config")
        steps = [Step(s.step, s.lineno, facts.global_batch_size / rate) for s, rate in found.timer]
        what = "DeepSpeed ThroughputTimer 'CurrSamplesPerSec'"
        facts.measured["step_time_derivation"] = "train_batch_size/CurrSamplesPerSec"
    else:
        steps, what = found.pipe, "DeepSpeed pipeline engine 'iter time (s)'"
    time_s, note, _ = median_step_time(steps, log, what)
    facts.measured["step_time_s"] = round(time_s, 6)
    facts.notes.append(note)
    if peak_gib(found.peaks_gib):
        facts.measured.update(peak_memory_gib=peak_gib(found.peaks_gib), peak_memory_kind="allocated")
        facts.notes.append("peak_memory_gib: the largest 'MaxMemAllocated' of the ThroughputTimer lines "
                           "(torch.cuda.max_memory_allocated of rank 0)")
