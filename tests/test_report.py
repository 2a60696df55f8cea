"""The reports (issue 39): the Plan document holds results computed before it is built
(planner/results.py), and the text report is one renderer of that document alone, for ``plan`` and
``render`` alike (planner/report/text.py), checked against golden files."""

from __future__ import annotations

import difflib
import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

import clusterplan.planner.explain as explain_module
import clusterplan.planner.results as results_module
from clusterplan.cli import main
from clusterplan.planner.inputs import Request
from clusterplan.planner.report.plan import plan_document, results_document
from clusterplan.planner.requests import plan_request
from clusterplan.planner.results import plan_results
from clusterplan.planner.search import SearchOptions

# every function planner.results computes with: none may run once the results exist
COMPUTING = [(results_module, name) for name in ("step_energy_j", "step_cost_usd", "goodput", "overlap_charge",
                                                  "shard_copies", "gemm_precision", "host_power_w", "has_idle_power",
                                                  "caveats", "explain", "placement")] + [(explain_module, "evaluate")]


@pytest.fixture(scope="module")
def searched():
    """An MoE plan with runners-up and time to train: every kind of figure the document carries."""
    request = Request(model="mixtral", cluster="dgx-h100-superpod", num_devices=64, tokens=10**12)
    return plan_request(request, SearchOptions(top_k=2)).result


def test_the_plan_document_is_written_from_results_without_computing(searched, monkeypatch):
    results = plan_results(searched)
    expected = json.dumps(plan_document(searched))

    def computes(*args, **kwargs):
        raise AssertionError("building the Plan document computed a figure")

    for module, name in COMPUTING:
        monkeypatch.setattr(module, name, computes)
    doc = results_document(results)
    assert json.dumps(doc) == expected
    with pytest.raises(AssertionError, match="computed a figure"):
        plan_results(searched)  # the patches hold: computing the results again would fail
    assert doc["runners_up"] and doc["explanation"]["sensitivity"] and doc["goodput"]["goodput"] > 0
    assert doc["overlap_charges"] and doc["energy_per_step_j"] > 0


GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = {line.split(maxsplit=1)[0]: shlex.split(line.split(maxsplit=1)[1])
         for line in (GOLDEN / "cases.txt").read_text().splitlines() if line.strip() and not line.startswith("#")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_text_report_matches_its_golden_file_and_render_prints_the_same(name, tmp_path):
    """A dense GPU plan, an MoE plan on NVL72 racks and a TPU plan, byte for byte; ``render`` of the
    same plan's saved --json prints the same bytes (one renderer, the document alone). After an
    intended change to a report: python benchmarks/update_golden.py, and review the diff."""
    args = CASES[name]
    golden = (GOLDEN / f"{name}.txt").read_text()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.stderr
    diff = "".join(difflib.unified_diff(golden.splitlines(True), result.stdout.splitlines(True),
                                        f"tests/golden/{name}.txt", "now"))
    assert result.stdout == golden, f"the report changed (python benchmarks/update_golden.py if intended):\n{diff}"
    saved = tmp_path / "plan.json"
    saved.write_text(CliRunner().invoke(main, [*args, "--json"]).stdout)
    rendered = CliRunner().invoke(main, ["render", str(saved)])
    assert rendered.exit_code == 0 and rendered.stdout == golden, rendered.stderr


def test_the_readme_example_is_the_golden_dense_plan():
    """README's example is the dense GPU plan's golden report, trimmed (its first lines, then the
    rejection table): python benchmarks/update_golden.py rewrites both."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "update_golden.py"
    spec = importlib.util.spec_from_file_location("update_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = module.README.read_text()
    assert module.readme_example((GOLDEN / "plan_dense_gpu.txt").read_text(), readme) == readme, \
        "README's example differs from tests/golden/plan_dense_gpu.txt: python benchmarks/update_golden.py"
