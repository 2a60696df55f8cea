"""What every training-log reader shares: reading a log line by line (colours stripped), the
step-time rule (warm-up dropped, the median of the rest), the model and the run's framework date,
and the assembly of a ``clusterplan-runs/1`` run from what a reader found.

A reader fills a :class:`RunFacts`; :func:`assemble` turns it into the run mapping the validation
loader reads (``planner/data/RUNS_FORMAT.md``), leaving out every field the log did not give.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from clusterplan.cost.framework import load_profile
from clusterplan.models.errors import SpecError
from clusterplan.models.library import load_model
from clusterplan.models.spec import ModelSpec, model_from_mapping

MAX_LOG_BYTES = 4 * 2**30
"""A log is read line by line (twice: to detect its format, then to read it), so its size costs time,
not memory; 4 GiB is about 40 million lines, beyond any log of the steps a calibration needs."""

WARMUP_STEPS = 3
"""Logged steps numbered below the log's first logged step + 3 are warm-up (compilation, the
allocator's first growth, NCCL's first connections) and are dropped before the median: Megatron's
first line is iteration 1 alone, torchtitan logs step 1 alone, MaxText's step 0 includes the XLA
compile (its guide's example: 44.9 s against 5.7 s) and its step 1 can end before the device does
(0.3 s)."""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TIMESTAMP = re.compile(r"\b(20\d\d)-(0[1-9]|1[0-2])-([0-3]\d)[ T_]\d\d:\d\d")
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
"""A logged number: digits with optional thousands commas (torchtitan's ``tps: 1,234``; a comma
not followed by three digits separates fields, as in MaxText's ``seconds: 5.6, ...``), a fraction
and an exponent."""

GIB = 2**30


def measured(text: str, log: "LogFile", lineno: int, what: str) -> float:
    """A figure a step line must give (a time, a rate): a finite number > 0, else :class:`SpecError`
    naming the line."""
    value = float(text.replace(",", ""))
    if not math.isfinite(value) or value <= 0:
        raise log.error(lineno, f"{what}: got {text}; expected a finite number > 0")
    return value


def optional(text: str | None) -> float | None:
    """A figure a line may give (TFLOP/s, a memory peak): None where absent, not finite or not > 0."""
    if text is None:
        return None
    value = float(text.replace(",", ""))
    return value if math.isfinite(value) and value > 0 else None


def literal(text: str):
    """A value as Python printed it (``True``, ``None``, ``[0, 1]``, ``'full'``), else the text."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text


class LogFile:
    """One training log: its lines with ANSI colours and carriage returns stripped, and errors
    that name the file and the line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            exists, regular = self.path.exists(), self.path.is_file()
        except OSError as err:
            raise SpecError(f"log {str(self.path)!r}: cannot open it: {err.strerror or err}") from None
        if not exists:
            raise SpecError(f"log {str(self.path)!r}: file does not exist")
        if not regular:
            raise SpecError(f"log {str(self.path)!r}: not a regular file (a directory, FIFO or device); give a log file")
        size = self.path.stat().st_size
        if size > MAX_LOG_BYTES:
            raise SpecError(f"log {str(self.path)!r}: {size:,} bytes; allowed: logs up to {MAX_LOG_BYTES:,} bytes "
                            "(cut it to the steps to read)")

    def lines(self) -> Iterator[tuple[int, str]]:
        """``(line number from 1, text)``; undecodable bytes read as U+FFFD."""
        try:
            with self.path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    text = ANSI.sub("", raw.rstrip("\r\n"))
                    yield lineno, text.rsplit("\r", 1)[-1]  # a progress bar's last redraw
        except OSError as err:
            raise SpecError(f"log {str(self.path)!r}: cannot read it: {err.strerror or err}") from None

    def error(self, lineno: int | None, message: str) -> SpecError:
        where = f"{self.path}:{lineno}" if lineno else str(self.path)
        return SpecError(f"{where}: {message}")


def shown_line(text: str, limit: int = 160) -> str:
    """A log line as quoted in an error, cut to ``limit`` characters."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class Step:
    """One logged training step: its number, the line it came from, and its time in seconds."""

    step: int
    lineno: int
    time_s: float


def median_of(values: list[float]) -> float:
    return statistics.median(values)


def median_step_time(steps: list[Step], log: LogFile, what: str) -> tuple[float, str, list[int]]:
    """The step time of a log, the note that says how it was taken, and the step numbers kept: the
    median over logged steps after dropping the warm-up (:data:`WARMUP_STEPS`). A step logged more
    than once (one line per rank) counts once, at the median of its lines."""
    if not steps:
        raise log.error(None, f"no {what} lines with a step time")
    by_step: dict[int, list[float]] = {}
    for s in steps:
        by_step.setdefault(s.step, []).append(s.time_s)
    numbers = sorted(by_step)
    first = numbers[0]
    warm = [n for n in numbers if n < first + WARMUP_STEPS]
    kept = [n for n in numbers if n >= first + WARMUP_STEPS]
    if not kept:
        raise log.error(None, f"all {len(numbers)} logged steps ({steps_text(numbers)}) are warm-up (steps below "
                        f"{first + WARMUP_STEPS}: the log's first step {first} and the {WARMUP_STEPS - 1} after it); "
                        "a step time needs a logged step after them: log more steps")
    value = statistics.median(statistics.median(by_step[n]) for n in kept)
    note = (f"step_time_s: the median of {len(kept)} logged steps ({steps_text(kept)}) of {what} lines; "
            f"warm-up dropped: {len(warm)} logged step(s) ({steps_text(warm) or 'none'}), those below step "
            f"{first + WARMUP_STEPS} (the first logged step, {first}, and the {WARMUP_STEPS - 1} after it)")
    return value, note, kept


def steps_text(numbers: list[int]) -> str:
    """``4-20``, ``10, 20, ..., 200`` or ``1, 5, 9``: a list of step numbers in few characters.

    Examples
    --------
    >>> steps_text([4, 5, 6, 7]), steps_text([10, 20, 30, 40]), steps_text([1, 5, 9])
    ('4-7', '10, 20, ..., 40', '1, 5, 9')
    """
    if len(numbers) <= 3:
        return ", ".join(map(str, numbers))
    gaps = {b - a for a, b in zip(numbers, numbers[1:])}
    if gaps == {1}:
        return f"{numbers[0]}-{numbers[-1]}"
    if len(gaps) == 1:
        return f"{numbers[0]}, {numbers[1]}, ..., {numbers[-1]}"
    return ", ".join(map(str, numbers[:3])) + f", ... ({len(numbers)} steps), {numbers[-1]}"


@dataclass(frozen=True, kw_only=True)
class Given:
    """What the caller tells a reader that the log cannot know."""

    cluster: str
    """A cluster preset id or the path of a cluster file (``hardware.cluster``)."""
    device: str | None = None
    """A device id (``hardware.device``); None: the preset's own."""
    model: str | None = None
    """A bundled model id or a model file, for logs that do not give the model's dimensions."""
    framework_version: str | None = None
    """The release that ran (``framework.version``); a NeMo container tag in it (``NeMo 24.07``) dates the run."""
    devices: int | None = None
    """The device count, for logs that print no world size (Megatron-Bridge); must agree with the log's."""
    seq_len: int | None = None
    """The sequence length, for logs and configs that give none (DeepSpeed under the HF Trainer)."""


@dataclass
class RunFacts:
    """What a reader found in a log and its config; None: not given."""

    framework: str
    framework_version: str | None = None
    first_timestamp: str | None = None  # YYYY-MM of the first timestamp in the log
    model: ModelSpec | None = None
    model_note: str = ""
    dropout: bool | None = None
    seq_len: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    precision: str | None = None
    count: int | None = None
    layout: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # top-level optional fields (compile, fp8_scaling, model_code, ...)
    notes: list[str] = field(default_factory=list)
    config_source: str = ""  # what the layout was read from, for the run's source


def first_timestamp(log: LogFile, max_lines: int = 10_000) -> str | None:
    """``YYYY-MM`` of the first ``YYYY-MM-DD HH:MM`` timestamp among the log's first lines."""
    for lineno, text in log.lines():
        found = TIMESTAMP.search(text)
        if found:
            return f"{found.group(1)}-{found.group(2)}"
        if lineno >= max_lines:
            break
    return None


NEMO_TAG = re.compile(r"\b(\d{2})\.(0[1-9]|1[0-2])(?:\.\d{2})?\b")


def framework_date(facts: RunFacts) -> tuple[str | None, str]:
    """The run's ``framework.date`` and where it came from: the NeMo / Megatron-Bridge container tag
    (YY.MM) named in the framework version, else the month of the log's first timestamp (the code
    can be no newer than the run), each capped at the profile's release; else none (the loader's
    rule gives the profile's release)."""
    latest = load_profile(facts.framework).date
    version = facts.framework_version or ""
    tag = NEMO_TAG.search(version) if re.search(r"nemo|bridge", version, re.I) else None
    if tag:
        return min(f"20{tag.group(1)}-{tag.group(2)}", latest), f"the container tag in {version!r}"
    if facts.first_timestamp:
        return min(facts.first_timestamp, latest), "the month of the log's first timestamp (the code is no newer)"
    return None, ""


def model_entry(spec: ModelSpec, dropout: bool | None) -> dict:
    """A run's ``model`` block: the model's fields that differ from ModelSpec's defaults, without
    its default sequence length or source; ``dropout`` only where the log says."""
    entry = spec.model_dump(exclude_defaults=True, exclude={"seq_len", "seq_len_note", "source", "dropout"})
    entry.setdefault("moe", None)
    if dropout is not None:
        entry["dropout"] = dropout
    return entry


def resolve_model(facts: RunFacts, given: Given, log: LogFile) -> ModelSpec:
    """The run's model: ``model=`` where given (its shape checked against the log's), else the
    model the log names or describes; neither: :class:`SpecError`."""
    if given.model:
        spec = load_model(given.model)
        found = facts.model
        if found is not None and _shape(found) != _shape(spec):
            raise log.error(None, f"model={given.model!r} has {_shape_text(spec)}; the log's model "
                            f"({facts.model_note}) has {_shape_text(found)}: give the model that ran, or none")
        facts.model_note = f"model from model={given.model!r}"
        return spec
    if facts.model is None:
        why = f" ({facts.model_note})" if facts.model_note else ""
        raise log.error(None, f"model: the log and its config name no bundled model and give no whole model{why}; "
                        "pass model= (a bundled model id, a model file or a Hugging Face config.json)")
    return facts.model


def _shape(spec: ModelSpec) -> tuple[int, int, int]:
    return spec.num_layers, spec.hidden_size, spec.num_attention_heads


def _shape_text(spec: ModelSpec) -> str:
    return f"{spec.num_layers} layers x {spec.hidden_size} wide, {spec.num_attention_heads} heads"


def dims_model(fields: dict, name: str, log: LogFile) -> ModelSpec:
    """A ModelSpec from dimensions read in a log, errors naming the log."""
    return model_from_mapping({k: v for k, v in fields.items() if v is not None}, name=name,
                              where=f"{log.path}: the model the log describes")


def agree(log: LogFile, what: str, found: int | None, given: int | None, option: str) -> int | None:
    """``found`` (from the log) or ``given`` (a keyword), refusing the two where they differ."""
    if found is not None and given is not None and int(found) != int(given):
        raise log.error(None, f"{what}: the log gives {found}, {option}={given}; they must agree (leave {option} out)")
    return found if found is not None else given


def positive_int(value, log: LogFile, what: str) -> int | None:
    """A count read from a log or config (None stays None); anything but an integer > 0 is refused."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value < 1):
        raise log.error(None, f"{what}: got {value!r}; expected an integer >= 1")
    return int(value)


def assemble(facts: RunFacts, given: Given, log: LogFile, fmt: str) -> dict:
    """The ``clusterplan-runs/1`` run of a log (RUNS_FORMAT.md); keys the log did not give are left out."""
    spec = resolve_model(facts, given, log)
    seq_len = agree(log, "seq_len", facts.seq_len, given.seq_len, "seq_len")
    count = agree(log, "hardware.count (devices)", facts.count, given.devices, "devices")
    for value, what, fix in ((seq_len, "seq_len", "pass seq_len="), (count, "hardware.count", "pass devices="),
                             (facts.global_batch_size, "global_batch_size", "give the config"),
                             (facts.precision, "precision", "give the config")):
        if value is None:
            raise log.error(None, f"{what}: neither the log nor its config gives it ({fix})")
    layout = complete_dp(facts.layout, int(count), log)
    date, date_origin = framework_date(facts)
    framework = {"name": facts.framework, "version": facts.framework_version, "date": date}
    notes = [facts.model_note] if facts.model_note else []
    notes += ([f"framework.date {date}: {date_origin}"] if date else []) + facts.notes
    hardware = {"cluster": given.cluster, "device": given.device, "count": count}
    notes.insert(0, f"read from a {fmt} training log by clusterplan (docs/logs.md)")
    # the source names the log alone: a framework's name in it would file the run under that
    # framework's publications (planner.studies.uncertainty.source_key)
    run = {"id": run_id(log.path), "source": f"training log {log.path}" + facts.config_source,
           "framework": {k: v for k, v in framework.items() if v is not None},
           "model": model_entry(spec, facts.dropout), "seq_len": int(seq_len),
           "global_batch_size": facts.global_batch_size, "micro_batch_size": facts.micro_batch_size,
           "precision": facts.precision, **facts.extra,
           "hardware": {k: v for k, v in hardware.items() if v is not None},
           "layout": {k: v for k, v in layout.items() if v is not None},
           "measured": {k: v for k, v in sorted(facts.measured.items(), key=lambda kv: kv[0] != "step_time_s")
                        if v is not None}, "notes": notes}
    return {k: v for k, v in run.items() if v is not None}


def complete_dp(layout: dict, count: int, log: LogFile) -> dict:
    """The layout with ``dp`` from the device count where the log gave the other degrees only, and
    the degrees checked against the count (``tp x pp x cp x dp``; ``ep`` is carved from ``dp``)."""
    layout = dict(layout)
    tp, pp, cp, dp = (layout.get(k) for k in ("tp", "pp", "cp", "dp"))
    if dp is None and None not in (tp, pp, cp) and count % (tp * pp * cp) == 0:
        layout["dp"] = dp = count // (tp * pp * cp)
    if None not in (tp, pp, cp, dp) and tp * pp * cp * dp != count:
        raise log.error(None, f"layout: tp {tp} x pp {pp} x cp {cp} x dp {dp} = {tp * pp * cp * dp} devices, but the "
                        f"run has {count}")
    return layout


def run_id(path: Path) -> str:
    """A run's id: the log's folder and name without a log suffix, so that logs of one name in
    several folders stay apart.

    Examples
    --------
    >>> run_id(Path("/scratch/run7/train.log")), run_id(Path("stdout.txt"))
    ('run7/train', 'stdout')
    """
    stem = path.with_suffix("").name if path.suffix in (".log", ".txt", ".out", ".err") else path.name
    parent = path.parent.name
    return f"{parent}/{stem}" if parent else stem


def peak_gib(values_gib: list[float | None]) -> float | None:
    """The largest of the peaks a log reports (ranks and intervals), rounded to MiB; none: None."""
    values = [v for v in values_gib if v is not None]
    return round(max(values), 3) if values else None


def mapping_config(path, log: "LogFile", what: str) -> dict:
    """A config file that must hold a mapping (YAML or JSON by suffix), read through the file limits;
    SpecError naming ``what`` was expected otherwise."""
    from clusterplan.models.files import load_file

    doc = load_file(path, f"config of {log.path}")
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected {what}, got {type(doc).__name__}")
    return doc
