"""Constants derived from runs are derived by code, and the cross-validated figure re-derives them
without each source (planner.studies.derived)."""

from __future__ import annotations

import pytest

from clusterplan.planner.inputs import load_cluster
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.derived import (
    DERIVED_CEILINGS, NOT_DERIVED, CeilingOverride, cross_validated, derive_ceilings, measured_hfu, stand_in,
    step_match_fraction,
)
from clusterplan.planner.studies.runs import bundled_data_path, evaluate_run, load_runs, price_run
from clusterplan.topologies.library import load_device
from clusterplan.topologies.precisions import low_precision

BUNDLED = ("runs.yaml", "family_runs.yaml")
STEP_TIME_FILES = ("runs.yaml", "family_runs.yaml", "sweeps.yaml", "memory_runs.yaml")
OPTS = SearchOptions(top_k=0)


def _on(runs: list[dict], *marks: str) -> list[dict]:
    return [r for r in runs if any(m in str((r.get("hardware") or {}).get("cluster")) for m in marks)]


@pytest.fixture(scope="module")
def tpu_runs():
    return _on([r for name in BUNDLED for r in load_runs(bundled_data_path(name))], "tpu")


@pytest.fixture(scope="module")
def trn1_pairs():
    return [price_run(run, OPTS) for run in _on(load_runs(bundled_data_path("family_runs.yaml")), "trn1")]


def test_the_catalogue_holds_what_the_code_derives_from_the_bundled_runs(tpu_runs, trn1_pairs):
    rows = [(r, p) for run in tpu_runs for r, p in [price_run(run, OPTS)] if p is not None]
    derived = derive_ceilings(rows + [(r, p) for r, p in trn1_pairs if p is not None])
    for d in DERIVED_CEILINGS:
        assert derived[d.device] is not None
        assert load_device(d.device).gemm.large == pytest.approx(derived[d.device][0], abs=5e-4), d.device
        assert "derived by code" in load_device(d.device).gemm.source or d.rule == "best_hfu", d.device


def test_the_matched_fraction_reproduces_each_run_and_is_not_the_whole_step_rate(trn1_pairs):
    """On trn1, where communication takes a share of the step, the fraction that reproduces a run's
    step lies above the whole-step hardware FLOP rate it reached: the rate understates the matmuls."""
    for r, p in trn1_pairs:
        fraction = step_match_fraction(p.run, "trainium1", OPTS)
        again = evaluate_run(p.run, OPTS, False, CeilingOverride({"trainium1": fraction}))
        assert again.error == pytest.approx(0, abs=1e-3), r.id
        assert fraction > measured_hfu(p, r.measured_step_time_s), r.id


def test_hold_out_runs_set_no_constant(trn1_pairs):
    """Runs named frozen (the hold-out files) count in the figures but are left out of the derivation."""
    runs = [p.run for _, p in trn1_pairs]
    frozen = {r.id for r, _ in trn1_pairs[::2]}
    cv = cross_validated(runs, trn1_pairs, OPTS, frozen)
    rest = derive_ceilings([(r, p) for r, p in trn1_pairs if r.id not in frozen])["trainium1"][0]
    assert cv["derived"]["trainium1"]["value"] == pytest.approx(rest, abs=1e-4)
    assert cv["derived"]["trainium1"]["value"] != pytest.approx(load_device("trainium1").gemm.large, abs=1e-3)
    assert cv["runs"] == len(trn1_pairs)


def test_a_device_with_one_source_is_cross_validated_with_its_stand_in(trn1_pairs):
    runs = [p.run for _, p in trn1_pairs]
    cv = cross_validated(runs, trn1_pairs, OPTS)
    (d,) = [d for d in DERIVED_CEILINGS if d.device == "trainium1"]
    assert cv["derived"]["trainium1"]["without"] == {trn1_pairs[0][0].source: pytest.approx(stand_in(d), abs=1e-4)}
    held = CeilingOverride({"trainium1": stand_in(d)})
    expected = sorted(abs(evaluate_run(run, OPTS, False, held).error) for run in runs)
    assert cv["median_abs_error"] == pytest.approx((expected[1] + expected[2]) / 2, abs=1e-3)


def test_every_unmeasured_device_with_bundled_runs_is_derived_or_says_why_not():
    derived = {d.device for d in DERIVED_CEILINGS}
    seen = set()
    for name in STEP_TIME_FILES:
        for run in load_runs(bundled_data_path(name)):
            hw = run.get("hardware") or {}
            if not (run.get("measured") or {}).get("step_time_s") or low_precision(str(run.get("precision") or "bf16")):
                continue
            device = load_cluster(str(hw["cluster"]), num_devices=hw.get("count"), device=hw.get("device")).device
            if not device.gemm.measured:
                seen.add(device.id)
    assert seen - derived - set(NOT_DERIVED) == set()
    assert derived <= seen and set(NOT_DERIVED) <= seen  # no stale entry
    assert not derived & set(NOT_DERIVED)


def test_each_source_is_predicted_with_the_constants_derived_without_it(tpu_runs):
    pairs = [price_run(run, OPTS) for run in tpu_runs]
    results = [r for r, _ in pairs]
    cv = cross_validated(tpu_runs, pairs, OPTS)
    for d in DERIVED_CEILINGS:
        if d.rule != "best_hfu":
            continue
        without = cv["derived"][d.device]["without"]
        assert without, d.device  # some source holds the best run: without it the constant changes
        assert all(v <= load_device(d.device).gemm.large for v in without.values())
    plain = sorted(abs(r.error) for r in results if r.error is not None)
    # a lower ceiling predicts the held-out runs slower: the cross-validated error is not the plain one
    assert cv["median_signed_error"] > sorted(r.error for r in results if r.error is not None)[len(plain) // 2]
    assert cv["runs"] == len(plain)


def test_a_plan_on_a_derived_device_quotes_the_cross_validated_error_beside_its_own():
    """The runs that set a device's matmul ceiling are predicted with it, so their error flatters the
    model: the stored figures carry the error with the ceiling re-derived without each run's source
    for exactly the families of derived devices, and the plan's line and a what-if row name it."""
    from clusterplan.planner.caveats import _family_errors, family_error
    from clusterplan.planner.studies.whatif import _validated

    families = {load_device(d.device).family for d in DERIVED_CEILINGS}
    stored = _family_errors()
    assert {f for f, e in stored.items() if "cross_validated" in e} == families
    for family in families:
        entry = family_error(family, moe=False)
        cv = stored[family]["cross_validated"]["median_abs_error"]
        assert f"median {cv:.0%}" in entry["line"] and "re-derived without each run's source" in entry["line"]
        assert f"({cv:.0%} with its derived matmul ceiling cross-validated)" in _validated(
            {"inputs": {"caveats": {"validated_error": entry}}})
    assert family_error("nvidia-a100")["cross_validated_median_abs_error"] is None
