"""docs/api.md's examples run as doctests: the documented Python API stays true to the code."""

from __future__ import annotations

import doctest
from pathlib import Path

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_api_doc_examples_run():
    result = doctest.testfile(str(API_DOC), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 25, f"only {result.attempted} examples found in {API_DOC}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in docs/api.md failed (output above)"


def test_import_root_is_light_and_namespaced():
    """``import clusterplan`` loads no solver, and the install puts no generic top-level module
    (cli, cli_options, cost, models, planner, topologies) on the path: checked in a fresh interpreter started
    outside the repository root."""
    import subprocess
    import sys

    code = ("import sys, importlib.util as u, clusterplan\n"
            "assert 'ortools' not in sys.modules, 'import clusterplan pulled in OR-Tools'\n"
            "clusterplan.plan\n"
            "assert 'clusterplan.planner.search' in sys.modules\n"
            "bad = [m for m in ('cli', 'cli_options', 'cost', 'models', 'planner', 'topologies') if u.find_spec(m)]\n"
            "assert not bad, f'generic top-level modules importable: {bad}'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent)
