"""The reports (issue 39): the Plan document holds results computed before it is built
(planner/results.py), and the text report is one renderer of that document alone, for ``plan`` and
``render`` alike (planner/report/text.py), checked against golden files."""

from __future__ import annotations

import json

import pytest

import clusterplan.planner.explain as explain_module
import clusterplan.planner.results as results_module
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
