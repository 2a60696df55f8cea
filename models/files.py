"""Reading files: the catalogue bundled with clusterplan (:func:`bundled_yaml`: models, devices,
clusters, framework profiles, validated errors) and user files. Every YAML or JSON input of a user
(models, clusters, run files, Plan documents) goes through here, so a hostile or broken file gets a clear SpecError (exit 2) within a second and
a few hundred MB rather than a hang, a memory blow-up or a traceback.

Limits (each names the file and the limit in its message):

- the path must be a regular file (not a directory, FIFO or device such as ``/dev/zero``);
- at most ``MAX_FILE_BYTES`` bytes (the largest bundled data file is about 2 MB);
- nesting at most ``MAX_DEPTH`` levels (deeper input would exhaust Python's recursion);
- YAML aliases may not expand the document beyond ``MAX_NODES`` nodes (a 1.3 KB "billion laughs"
  file expands to 10^9), and a recursive alias is refused;
- a YAML file holds at most ``MAX_YAML_CHARS`` characters and ``MAX_YAML_NODES`` nodes as written:
  PyYAML's pure-Python composer takes about 20 us and 1 KB per node, so a 31 MB list of small
  items ran for minutes into gigabytes where the same content as JSON (a C parser) took seconds.
  The nodes are counted by libyaml's event parser first where PyYAML has it (about 1 us per
  node, so such a file is refused in well under a second), and again as the document is composed;
- a key given twice in one mapping (JSON or YAML) is refused, naming the key: both parsers
  otherwise keep the last value without a word.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clusterplan.models.errors import SpecError

MAX_FILE_BYTES = 32 * 2**20
MAX_DEPTH = 64
MAX_NODES = 2_000_000
MAX_YAML_CHARS = 8 * 2**20  # ten times the largest bundled YAML file (0.7 MB), at ~1 s/MB in pure Python
MAX_YAML_NODES = 200_000  # ten times the nodes of the largest bundled YAML file (21,000); ~4 s to compose
_MERGE_TAG = "tag:yaml.org,2002:merge"


def read_text(path: str | Path, where: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` bytes (default ``MAX_FILE_BYTES``)."""
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    p = Path(path)
    try:
        exists, regular = p.exists(), p.is_file()
    except OSError as err:  # e.g. a name too long
        raise SpecError(f"{where}: cannot open {str(p)!r}: {err.strerror or err}") from None
    if not exists:
        raise SpecError(f"{where}: file {str(p)!r} does not exist")
    if not regular:
        raise SpecError(f"{where}: {str(p)!r} is not a regular file (a directory, FIFO or device); give a file")
    try:
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise SpecError(f"{where}: cannot read {str(p)!r}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise SpecError(f"{where}: {str(p)!r} is larger than {max_bytes:,} bytes; allowed: files up to that size")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{where}: {str(p)!r} is not UTF-8 text (byte {err.start}); give a YAML or JSON file") from None


def parse_json(text: str, where: str) -> Any:
    """JSON with its nesting bounded (Python's decoder recurses per level)."""
    _check_brackets(text, where)
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _unique_pairs(pairs, where))
    except json.JSONDecodeError as err:
        raise SpecError(f"{where}: line {err.lineno} column {err.colno}: invalid JSON: {err.msg}") from None
    except RecursionError:
        raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH}") from None
    except ValueError as err:  # not SpecError: a number too long to read
        if isinstance(err, SpecError):
            raise
        raise SpecError(_unreadable_value(err, where)) from None


def parse_yaml(text: str, where: str) -> Any:
    """Safe YAML with nesting and alias expansion bounded (see the module docstring)."""
    if len(text) > MAX_YAML_CHARS:
        raise SpecError(f"{where}: {len(text):,} characters of YAML; allowed: up to {MAX_YAML_CHARS:,} (YAML is "
                        f"parsed in pure Python; JSON, parsed in C, may have up to {MAX_FILE_BYTES:,} bytes)")
    _check_brackets(text, where)
    _count_nodes_fast(text, where)
    loader = None
    try:
        loader = _BoundedLoader(text, where)  # its reader refuses control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" line {mark.line + 1} column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"{where}:{at} invalid YAML: {str(problem)[:300]}") from None
    except RecursionError:
        raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH}") from None
    except ValueError as err:  # a value PyYAML's constructors cannot build (a 5,000-digit integer, 2021-13-45)
        if isinstance(err, SpecError):
            raise
        raise SpecError(_unreadable_value(err, where)) from None
    finally:
        if loader is not None:
            loader.dispose()


def _unreadable_value(err: ValueError, where: str) -> str:
    """A value the parser cannot build: an integer of more digits than Python converts (4,300 by
    default; no model or cluster figure has more than about 20), or a malformed date."""
    if "digits" in str(err):
        return (f"{where}: a number of more than {sys.get_int_max_str_digits():,} digits; allowed: numbers a "
                "model or cluster has (at most a few dozen digits)")
    return f"{where}: invalid value: {str(err)[:200]}"


def _unique_pairs(pairs: list[tuple[str, Any]], where: str) -> dict:
    """A JSON object as a dict, refusing a key given twice (``json`` would keep the last value)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise SpecError(f"{where}: key {_shown(key)} is given twice in one object; give each key once")
        out[key] = value
    return out


def _shown(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:80] + "..."


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting the nodes it composes and their depth: a file over
    ``MAX_YAML_NODES`` nodes or ``MAX_DEPTH`` levels stops as soon as it passes the bound, not after
    minutes of composing (nor in Python's recursion limit)."""

    def __init__(self, text: str, where: str):
        super().__init__(text)
        self.where, self.num_nodes, self.depth = where, 0, 0

    def compose_node(self, parent, index):
        self.num_nodes += 1
        if self.num_nodes > MAX_YAML_NODES:
            raise SpecError(_too_many_nodes(self.where))
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise SpecError(f"{self.where}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _too_many_nodes(where: str) -> str:
    return (f"{where}: more than {MAX_YAML_NODES:,} YAML nodes (values, lists and mappings); allowed: "
            f"{MAX_YAML_NODES:,} (a model, cluster or runs file has a few thousand)")


_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)


def _count_nodes_fast(text: str, where: str) -> None:
    """Refuse a YAML text of more than ``MAX_YAML_NODES`` nodes from libyaml's event stream (C, about
    1 us a node) before the pure-Python composer sees it. Without libyaml, or where libyaml finds
    the text malformed, the composer's own count and error apply."""
    parser_class = getattr(yaml, "CBaseLoader", None)  # libyaml's parser, where PyYAML was built with it
    if parser_class is None:
        return
    parser, count = parser_class(text), 0
    try:
        while parser.check_event():
            if isinstance(parser.get_event(), _NODE_EVENTS):
                count += 1
                if count > MAX_YAML_NODES:
                    raise SpecError(_too_many_nodes(where))
    except yaml.YAMLError:
        return
    finally:
        parser.dispose()


def load_file(path: str | Path, where: str, max_bytes: int | None = None) -> Any:
    """A YAML or JSON file (by suffix: ``.json`` is JSON, anything else YAML) through the limits."""
    text = read_text(path, where, max_bytes)
    return parse_json(text, where) if str(path).lower().endswith(".json") else parse_yaml(text, where)


def _check_brackets(text: str, where: str) -> None:
    """Refuse flow nesting deeper than MAX_DEPTH before a recursive parser sees it (a cheap scan:
    brackets inside strings count too, which only makes the bound stricter for odd files)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # cannot nest deeper: skip the per-character scan
        return
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH}")
        elif ch in "]}" and depth:
            depth -= 1


def _check_node(root: yaml.Node, where: str) -> None:
    """Count the nodes the document expands to (aliases counted at every use) and its depth,
    without expanding it: each distinct node is weighed once (memoised), so the check is linear in
    the file. A node that contains itself (a recursive alias) is refused."""
    weight: dict[int, int] = {}
    active: set[int] = set()

    def visit(node: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise SpecError(f"{where}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH}")
        key = id(node)
        if key in weight:
            return weight[key]
        if key in active:
            raise SpecError(f"{where}: a YAML alias refers to a node that contains it (recursive); not allowed")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(visit(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            _check_unique_keys(node, where)
            total += sum(visit(k, depth + 1) + visit(v, depth + 1) for k, v in node.value)
        active.discard(key)
        if total > MAX_NODES:
            raise SpecError(f"{where}: YAML aliases expand the document to more than {MAX_NODES:,} nodes; "
                            f"allowed: {MAX_NODES:,}")
        weight[key] = total
        return total

    visit(root, 0)


def _check_unique_keys(node: yaml.MappingNode, where: str) -> None:
    """Refuse a scalar key written twice in one mapping (PyYAML keeps the last value). Checked on the
    composed nodes, before merge keys (``<<: *base``, whose keys an explicit key may override) are
    flattened; keys compare by their resolved tag and text."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
            continue
        if (key.tag, key.value) in seen:
            raise SpecError(f"{where}: line {key.start_mark.line + 1}: key {_shown(key.value)} is given twice in one "
                            "mapping; give each key once")
        seen.add((key.tag, key.value))


def bundled_yaml(package: str, *parts: str) -> Any:
    """A YAML data file bundled with clusterplan (``bundled_yaml("clusterplan.models", "data",
    "models.yaml")``), parsed once per process. Read through importlib.resources, so an installed
    wheel works as a checkout does. The result is shared: copy it before changing it."""
    return _bundled(package, parts)


# libyaml's parser where PyYAML has it: the same safe constructor and resolver over a C scanner, so the
# same objects (tests/test_search_speed.py compares every bundled file) ten times faster; the catalogue a
# plan reads (devices, clusters, models, its framework) took 0.16 s of a 4.2 s plan in pure Python
_BUNDLED_LOADER = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


@lru_cache(maxsize=None)
def _bundled(package: str, parts: tuple[str, ...]) -> Any:
    return yaml.load(resources.files(package).joinpath(*parts).read_text(encoding="utf-8"), Loader=_BUNDLED_LOADER)
