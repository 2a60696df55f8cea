"""Constants derived from runs are derived by code, and the cross-validated figure re-derives them
without each source (planner.studies.derived)."""

from __future__ import annotations

import pytest

from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.derived import DERIVED_CEILINGS, cross_validated, derive_ceilings
from clusterplan.planner.studies.runs import bundled_data_path, load_runs, price_run
from clusterplan.topologies.library import load_device

BUNDLED = ("runs.yaml", "family_runs.yaml")


@pytest.fixture(scope="module")
def tpu_runs():
    return [r for name in BUNDLED for r in load_runs(bundled_data_path(name))
            if "tpu" in str((r.get("hardware") or {}).get("cluster"))]


def test_the_catalogue_holds_what_the_code_derives_from_the_bundled_runs(tpu_runs):
    rows = [(r, p) for run in tpu_runs for r, p in [price_run(run, SearchOptions(top_k=0))] if p is not None]
    derived = derive_ceilings(rows)
    for d in DERIVED_CEILINGS:
        assert derived[d.device] is not None
        assert load_device(d.device).gemm.large == pytest.approx(derived[d.device][0], abs=5e-4), d.device


def test_each_source_is_predicted_with_the_constants_derived_without_it(tpu_runs):
    opts = SearchOptions(top_k=0)
    pairs = [price_run(run, opts) for run in tpu_runs]
    results = [r for r, _ in pairs]
    cv = cross_validated(tpu_runs, pairs, opts)
    for d in DERIVED_CEILINGS:
        without = cv["derived"][d.device]["without"]
        assert without, d.device  # some source holds the best run: without it the constant changes
        assert all(v <= load_device(d.device).gemm.large for v in without.values())
    plain = sorted(abs(r.error) for r in results if r.error is not None)
    # a lower ceiling predicts the held-out runs slower: the cross-validated error is not the plain one
    assert cv["median_signed_error"] > sorted(r.error for r in results if r.error is not None)[len(plain) // 2]
    assert cv["runs"] == len(plain)
