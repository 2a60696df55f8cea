"""Training logs as measured runs: a Megatron-LM / NeMo / Megatron-Bridge, torchtitan, MaxText or
DeepSpeed log (with its config) becomes a ``clusterplan-runs/1`` run that ``validate`` and
``calibrate`` score like a published one (docs/logs.md).

A log's format is told from its step lines (:data:`FORMATS`); each reader takes what its framework
prints (its module docstring quotes the framework's own code), and :mod:`.common` turns it into a
run: the step time is the median of the logged steps after the warm-up, and every field the log
and its config do not give is left out, for the loader and the search to fill.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from clusterplan.models.errors import SpecError
from clusterplan.planner.studies.logs import deepspeed, maxtext, megatron, torchtitan
from clusterplan.planner.studies.logs.common import (
    WARMUP_STEPS, Given, LogFile, assemble, first_timestamp, positive_int,
)
from clusterplan.planner.studies.runs import load_runs

__all__ = ["FORMATS", "WARMUP_STEPS", "detect_format", "load_inputs", "runs_from_log"]

FORMATS = {
    # id: (reader module, the config file suffixes looked for beside the log); the order is the
    # precedence when a log has step lines of two formats (Megatron-DeepSpeed prints Megatron's
    # iteration lines and DeepSpeed's timer lines: its arguments say which framework ran)
    "megatron": (megatron, (".yaml", ".yml")),
    "torchtitan": (torchtitan, (".toml",)),
    "maxtext": (maxtext, (".yml", ".yaml")),
    "deepspeed": (deepspeed, (".json",)),
}
RUN_FILE_SUFFIXES = (".yaml", ".yml", ".json")
CONFIG_SEPARATOR = "::"


def detect_format(log: LogFile) -> str:
    """The format whose step lines the log holds (:data:`FORMATS` order where several match)."""
    seen: set[str] = set()
    for _, text in log.lines():
        for fmt, (reader, _) in FORMATS.items():
            if fmt not in seen and reader.LOOKS_LIKE.search(text):
                seen.add(fmt)
        if "megatron" in seen:
            break
    for fmt in FORMATS:
        if fmt in seen:
            return fmt
    expected = "; ".join(f"{reader.NAME}: {reader.LOOKS_LIKE.pattern!r}" for reader, _ in FORMATS.values())
    raise log.error(None, f"no training step lines of a known format; expected lines matching one of: {expected} "
                    "(docs/logs.md)")


def config_beside(log_path: Path, fmt: str) -> Path | None:
    """The config found beside a log: the file of the log's name with the format's config suffix
    (``train.log`` -> ``train.toml`` for torchtitan, ``train.yaml``/``.yml`` for MaxText and
    Megatron-Bridge, ``train.json`` for DeepSpeed)."""
    for suffix in FORMATS[fmt][1]:
        candidate = log_path.with_suffix(suffix)
        if candidate != log_path and candidate.is_file():
            return candidate
    return None


def runs_from_log(log_path: str | Path, config_path: str | Path | None = None, *, cluster: str,
                  device: str | None = None, model: str | None = None, framework_version: str | None = None,
                  devices: int | None = None, seq_len: int | None = None) -> list[dict]:
    """The run of one training log, in the ``clusterplan-runs/1`` shape (RUNS_FORMAT.md).

    Parameters
    ----------
    log_path
        The log (stdout of the training job), in one of :data:`FORMATS`, told apart by its step lines.
    config_path
        The job's config (torchtitan TOML, MaxText YAML, DeepSpeed JSON, Megatron-Bridge YAML); None:
        the file beside the log of the log's name with the format's suffix (:func:`config_beside`),
        if there is one. What the log itself prints wins over the config.
    cluster, device
        ``hardware.cluster`` (a preset id or a cluster file) and ``hardware.device``: the log cannot know them.
    model
        A bundled model id or a model file, for logs that give no model (it must match the log's shape).
    framework_version
        ``framework.version``; a NeMo container tag in it (``NeMo 24.07``) sets ``framework.date``.
    devices, seq_len
        The device count and the sequence length, for logs that give none (Megatron-Bridge prints
        no world size; DeepSpeed knows no sequence length); where the log gives them they must agree.

    Returns
    -------
    list of dict
        One run: its step time the median of the logged steps from the first logged step +
        :data:`WARMUP_STEPS` on (its notes say which); fields neither log nor config gives left out.

    Raises
    ------
    SpecError
        No known format; a step line that does not parse (naming the file and line); a value the
        run needs that neither the log nor the config gives.
    """
    log = LogFile(log_path)
    fmt = detect_format(log)
    reader = FORMATS[fmt][0]
    if not cluster or not str(cluster).strip():
        raise log.error(None, "cluster: a log does not say which cluster it ran on; give a preset id or a cluster file")
    given = Given(cluster=cluster, device=device, model=model, framework_version=framework_version,
                  devices=positive_int(devices, log, "devices="), seq_len=positive_int(seq_len, log, "seq_len="))
    config_file = Path(config_path) if config_path is not None else config_beside(log.path, fmt)
    config = reader.load_config(config_file, log) if config_file is not None else None
    facts = reader.read(log, config, given)
    facts.framework_version = framework_version or facts.framework_version
    facts.first_timestamp = first_timestamp(log)
    if config_file is not None:
        facts.config_source += f" ({config_file}{'' if config_path is not None else ', found beside the log'})"
    return [assemble(facts, given, log, reader.NAME)]


def load_inputs(paths: Iterable[str | Path], **given) -> list[dict]:
    """The runs of several inputs: a ``.yaml``/``.yml``/``.json`` file is a ``clusterplan-runs/1``
    file (read by the validation loader as it is; ``given`` does not apply to it); anything else is
    a training log, ``LOG::CONFIG`` naming its config (else the config beside it:
    :func:`config_beside`), read by :func:`runs_from_log` with ``given``. Run ids must be unique
    across the inputs."""
    runs: list[dict] = []
    origin: dict[str, str] = {}
    for raw in paths:
        text = str(raw)
        if CONFIG_SEPARATOR in text:
            log_part, config_part = text.split(CONFIG_SEPARATOR, 1)
            found = runs_from_log(log_part, config_part, **given)
        elif Path(text).suffix.lower() in RUN_FILE_SUFFIXES:
            found = _run_file(text)
        else:
            found = runs_from_log(text, **given)
        for run in found:
            if run["id"] in origin:
                raise SpecError(f"{text}: run id {run['id']!r} is also a run of {origin[run['id']]}; ids must be unique "
                                "across the inputs (a log's id is its folder and name: rename one)")
            origin[run["id"]] = text
        runs += found
    return runs


def _run_file(path: str) -> list[dict]:
    try:
        return load_runs(path, "INPUT")
    except SpecError as err:
        raise SpecError(f"{err} (a .yaml/.yml/.json input is a clusterplan-runs/1 file; a log's config goes after "
                        f"its log: LOG{CONFIG_SEPARATOR}CONFIG)") from None
