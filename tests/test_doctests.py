"""Every module's doctests run against the installed package (issue 39): each module of
``clusterplan`` is imported by its installed name and its examples (NumPy-style ``Examples``
sections) run with :mod:`doctest`, so an example that drifts from the code fails CI. They run in a
fresh interpreter started outside the repository, where only the installed names import (pytest
puts the repository root on ``sys.path``, which would let ``from topologies.library import ...``
pass here and fail for a user). docs/api.md's examples run in tests/test_api_docs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN_DOCTESTS = r"""
import doctest, importlib, json, pkgutil, sys
import clusterplan

flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
out = {}
for info in sorted(pkgutil.walk_packages(clusterplan.__path__, "clusterplan."), key=lambda m: m.name):
    module = importlib.import_module(info.name)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, info.name) if t.examples]
    runner = doctest.DocTestRunner(optionflags=flags)
    for test in tests:
        runner.run(test, out=sys.stderr.write)
    failed, attempted = runner.summarize(verbose=False)
    out[info.name] = [failed, attempted]
print(json.dumps(out))  # the last line: summarize() prints above it
"""


def test_every_module_doctest_passes_against_the_installed_package(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", RUN_DOCTESTS], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    failed = {name: f"{f} of {n}" for name, (f, n) in results.items() if f}
    assert not failed, f"doctests failed: {failed}\n{done.stderr}{done.stdout}"
    with_examples = [name for name, (_, n) in results.items() if n]
    assert len(with_examples) >= 10 and sum(n for _, n in results.values()) >= 40, results
