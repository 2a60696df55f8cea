"""The bundled model library and loading of user model files.

A model argument is either a bundled id (or alias, or display name; case-insensitive) or a path to
a file: a YAML/JSON file with the keys of :class:`~models.spec.ModelSpec`, or a Hugging Face
``config.json``. Every user mistake becomes a :class:`~models.errors.SpecError` whose message names
the field, the value given, what is allowed and a fix; none escapes as a traceback.

Examples
--------
>>> get_model("GPT").name
'GPT-3 175B'
>>> round(get_model("llama2-7b").num_params / 1e9, 2)
6.74
>>> job_defaults("gpt")["global_batch_size"]
1536
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any


from clusterplan.models.files import bundled_yaml, parse_json, parse_yaml, read_text
from clusterplan.models.errors import SpecError
from clusterplan.models import hf
from clusterplan.models.spec import ModelSpec, model_from_mapping

LIBRARY_RESOURCE = ("data", "models.yaml")
"""Location of the bundled library inside the ``models`` package."""

ENTRY_ONLY_KEYS = frozenset(
    {"aliases", "published_params", "published_params_source", "published_active_params",
     "job_defaults", "job_defaults_source"}
)
"""Library entry keys that describe the entry, not the architecture (not ModelSpec fields)."""

MODEL_FILE_SUFFIXES = (".yaml", ".yml", ".json")
_LIST_HINT = "run `clusterplan models` to list the bundled models"


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One row of :func:`list_models`."""

    id: str
    """Library id, e.g. ``gpt3-175b``."""
    aliases: tuple[str, ...]
    """Other names that resolve to this entry."""
    name: str
    """Display name (``ModelSpec.name``)."""
    num_params: int
    """Total parameters computed from the spec."""
    num_active_params: int
    """Parameters one token uses (differs from ``num_params`` for MoE models)."""
    published_params: float
    """The published total the spec is checked against."""
    source: str
    """Where the architecture was published."""


# ---- the bundled library ----------------------------------------------------------------------
def _library() -> dict[str, dict]:
    """The bundled YAML (parsed once: ``models.files.bundled_yaml``)."""
    entries = bundled_yaml("clusterplan.models", *LIBRARY_RESOURCE)["models"]
    assert isinstance(entries, dict) and entries, "models.yaml must map model ids to entries"
    return entries


@lru_cache(maxsize=1)
def _name_index() -> dict[str, str]:
    """Lower-cased id, alias and display name -> library id."""
    index: dict[str, str] = {}
    for model_id, entry in _library().items():
        for key in (model_id, entry["name"], *entry.get("aliases", [])):
            previous = index.setdefault(key.lower(), model_id)
            assert previous == model_id, f"name {key!r} names both {previous} and {model_id}"
    return index


def load_model_library() -> dict[str, dict]:
    """Return the bundled library as ``{model_id: entry}`` (a deep copy; mutate freely).

    Returns
    -------
    dict[str, dict]
        Each entry holds the ModelSpec fields plus ``aliases``, ``published_params``,
        ``published_params_source``, ``job_defaults`` and ``job_defaults_source``.
    """
    return copy.deepcopy(_library())


def resolve_model_id(name: str) -> str:
    """Map an id, alias or display name (any case) to its library id.

    Raises
    ------
    SpecError
        If no bundled model has that name; the message suggests close names.
    """
    model_id = _name_index().get(str(name).strip().lower())
    if model_id is None:
        raise SpecError(_unknown_model_message(str(name)))
    return model_id


def _aliases() -> set[str]:
    return {a.lower() for entry in _library().values() for a in entry.get("aliases", [])}


def _unknown_model_message(name: str) -> str:
    index = _name_index()
    close = difflib.get_close_matches(name.lower(), list(index), n=5, cutoff=0.6)
    # one suggestion per model, named by the key that matched best (an alias such as "gpt" reads
    # better than the id it stands for)
    best: dict[str, str] = {}
    for c in close:
        best.setdefault(index[c], c if c in _aliases() else index[c])
    suggestions = list(best.values())[:3]
    hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    return (
        f"model: unknown model {name!r}; {hint}{_LIST_HINT}, or pass the path of a YAML/JSON "
        "model file or of a Hugging Face config.json"
    )


@lru_cache(maxsize=None)
def _bundled_spec(model_id: str) -> ModelSpec:
    entry = _library()[model_id]
    fields = {k: v for k, v in entry.items() if k not in ENTRY_ONLY_KEYS}
    return model_from_mapping(fields, where=f"models.yaml: {model_id}")


def get_model(name: str) -> ModelSpec:
    """Return the bundled model named ``name`` (id, alias or display name, case-insensitive).

    Raises
    ------
    SpecError
        If the name is unknown.

    Examples
    --------
    >>> get_model("Mixtral").moe.top_k
    2
    """
    return _bundled_spec(resolve_model_id(name))


def job_defaults(name: str) -> dict[str, Any]:
    """Return the published training setup of a bundled model.

    Returns
    -------
    dict
        ``global_batch_size`` (sequences), ``seq_len`` (tokens), ``precision`` (one of ``cost.layout.PRECISIONS``) and
        ``tokens_to_train``. A value the source does not publish is ``None``: the caller applies
        its own default.
    """
    defaults = dict(_library()[resolve_model_id(name)]["job_defaults"])
    if defaults.get("tokens_to_train") is not None:  # written as 300.0e+9 in YAML: a count
        defaults["tokens_to_train"] = int(defaults["tokens_to_train"])
    return defaults


def list_models() -> list[ModelEntry]:
    """Return one row per bundled model, in library order."""
    rows = []
    for model_id, entry in _library().items():
        spec = _bundled_spec(model_id)
        rows.append(ModelEntry(
            id=model_id, aliases=tuple(entry.get("aliases", ())), name=spec.name,
            num_params=spec.num_params, num_active_params=spec.num_active_params,
            published_params=float(entry["published_params"]), source=spec.source,
        ))
    return rows


# ---- user input -------------------------------------------------------------------------------
def load_model(name_or_path: str | Path) -> ModelSpec:
    """Resolve a model argument: a file path if it looks like one, else a bundled name.

    A path is anything that exists, ends in .yaml/.yml/.json, or contains a path separator.

    Raises
    ------
    SpecError
        For an unknown name, a missing or malformed file, or an invalid spec.
    """
    text = str(name_or_path)
    if not text.strip():
        raise SpecError("model: the name is empty; give a bundled model id (clusterplan models) or a file path")
    if _looks_like_path(text):
        return load_model_file(text)
    return get_model(text)


def _looks_like_path(text: str) -> bool:
    path = Path(text)
    return path.exists() or path.suffix.lower() in MODEL_FILE_SUFFIXES or "/" in text or "\\" in text


def load_model_file(path: str | Path) -> ModelSpec:
    """Load a ModelSpec YAML/JSON file or a Hugging Face ``config.json``.

    A ModelSpec file holds the ModelSpec keys at top level, or under a single ``model:`` key.
    A file with ``model_type`` or ``architectures`` is read as a Hugging Face config.

    Raises
    ------
    SpecError
        If the file is missing, unreadable, malformed or not a valid spec.
    """
    path = Path(path)
    data = _read_mapping(path)
    if hf.is_hf_config(data):
        return hf.from_hf_config(data, name=_hf_model_name(path, data))
    if set(data) == {"model"} and isinstance(data["model"], Mapping):
        data = data["model"]
    return model_from_mapping(data, name=path.stem, where=str(path))


def _hf_model_name(path: Path, cfg: Mapping) -> str:
    """``_name_or_path`` when the config carries it, else the folder (HF snapshot) or file stem."""
    given = cfg.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        return given.strip()
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def _read_mapping(path: Path) -> dict:
    if not path.exists():
        hint = ("; Hugging Face hub ids are not downloaded: fetch the repository's config.json and "
                "pass its path") if path.suffix == "" and "/" in str(path) else ""
        raise SpecError(f"model: file {str(path)!r} does not exist{hint}; {_LIST_HINT}")
    text = read_text(path, "model")
    data = _parse_json(text, path) if path.suffix.lower() == ".json" else _parse_yaml(text, path)
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of model fields at top level, got {type(data).__name__}"
        )
    return data


def _parse_json(text: str, path: Path) -> Any:
    return parse_json(text, str(path))


def _parse_yaml(text: str, path: Path) -> Any:
    return parse_yaml(text, str(path))
