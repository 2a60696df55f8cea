"""The house rules of issue 12, checked on the source: the command line holds no input policy,
no function runs past about 50 lines, and the model readers do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cli.py", "cost", "models", "planner", "topologies")
MAX_FUNCTION_LINES = 50

# What decides the inputs of a problem (planner.inputs, planner.requests): the CLI only parses
# options into a Request and prints what comes back.
INPUT_POLICY = {"build_job", "load_cluster", "build_cluster", "load_cluster_file", "load_model", "get_model",
                "evaluate", "plan", "fewest_devices", "smallest_device", "with_what_if", "default_framework"}


def _sources() -> list[Path]:
    files = []
    for name in PACKAGES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def _imported_names(path: Path) -> dict[str, str]:
    names = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.name] = node.module
    return names


def test_no_function_runs_past_fifty_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def test_cli_imports_no_input_policy():
    policy = {name: module for name, module in _imported_names(ROOT / "cli.py").items() if name in INPUT_POLICY}
    assert not policy, f"cli.py imports input policy: {policy}; call planner.requests with a Request instead"


def test_model_readers_do_not_import_each_other():
    assert not any(m.endswith("models.library") for m in _imported_names(ROOT / "models" / "hf.py").values())
    assert not any(m.endswith("models.hf") for m in _imported_names(ROOT / "models" / "spec.py").values())
