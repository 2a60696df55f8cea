"""clusterplan's memory for MaxText's 32B v5p-128 recipe against XLA's own answer (issue 36: a layout
that ran must be predicted to fit, and one that did not run must not be made to): the configuration
the README measured (``readme-2023``, what the bundled row ``maxtext-32b-v5p-128`` carries since
2026-11-29), the transcription it carried before (``record``: base.yml of 2024-02-14 at the script's
batch of 2024-02-01) and that model at the batch the script moved to, each compiled by XLA for a
v5p-128 slice (``benchmarks/xla_v5p_probe.py``, results in ``benchmarks/results/``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from clusterplan.cost.step import evaluate
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.runs import load_runs, price_run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "xla_v5p_probe_2026-11-29.json"
RUNS = ROOT / "planner" / "data" / "runs.yaml"


def _row_as(case: dict) -> dict:
    """The bundled row with one probe case's model and batch (one pass of ``pdbs`` sequences a chip)."""
    run = copy.deepcopy(next(r for r in load_runs(RUNS) if r["id"] == "maxtext-32b-v5p-128"))
    run["model"].update(hidden_size=case["h"], num_attention_heads=case["heads"], num_kv_heads=case["heads"],
                        head_dim=case["hd"], ffn_hidden_size=case["f"], vocab_size=case["vocab"],
                        ffn_activation="swiglu" if case["mlp"] == "swiglu" else "gelu",  # gelu: one up projection, as relu
                        tied_embeddings=False)  # the probe compiles a separate output matrix in every case
    run["global_batch_size"] = case["pdbs"] * case["chips"]
    run["micro_batch_size"] = case["pdbs"] * case["tp"]
    return run


def _cases() -> dict[str, dict]:
    return {case["case"]: case for case in json.loads(RESULTS.read_text())["cases"]}


def test_the_probe_covers_the_row_as_written():
    """The row carries the README's configuration of 2023-12, which XLA compiled; the transcription it
    carried before (the 2024-02 model at 7 sequences a chip) is the case XLA refused for lack of HBM."""
    cases = _cases()
    row = next(r for r in load_runs(RUNS) if r["id"] == "maxtext-32b-v5p-128")
    m = row["model"]
    readme = cases["readme-2023"]
    assert (readme["h"], readme["heads"], readme["hd"], readme["f"], readme["vocab"], readme["layers"]) == (
        m["hidden_size"], m["num_attention_heads"], m["head_dim"], m["ffn_hidden_size"], m["vocab_size"], m["num_layers"])
    assert (readme["pdbs"] * readme["chips"], readme["mlp"], m["ffn_activation"]) == (row["global_batch_size"], "relu", "gelu")
    assert "error" not in readme
    assert "Ran out of memory on HBM" in cases["record"]["error"]
    assert cases["record"]["h"] != m["hidden_size"]


@pytest.mark.parametrize("name", ["record", "record-pdbs6", "readme-2023"])
def test_fit_verdict_and_peak_agree_with_xla(name):
    """Fits where XLA compiled the step, not where XLA ran out of HBM; where it compiled, the peak is
    within 5% of XLA's (clusterplan counts a 1 GiB runtime reserve XLA's peak does not)."""
    case = _cases()[name]
    priced = price_run(_row_as(case), SearchOptions())[1]
    ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
    assert ev.fits == ("error" not in case)
    if "error" not in case:
        assert ev.memory.fit_bytes == pytest.approx(case["peak_memory_in_bytes"], rel=0.05)


def test_maxtext_default_headroom_covers_the_memory_model_s_shortfall_against_xla():
    """plan's default headroom under MaxText (semantics.plan_headroom: XLA has no allocator reserve)
    is what clusterplan's peak falls short of XLA's compiled one, at most, over the compiled cases."""
    from clusterplan.cost.framework import load_profile
    shortfall = 0.0
    for case in _cases().values():
        if "error" in case:
            continue
        priced = price_run(_row_as(case), SearchOptions())[1]
        ev = evaluate(priced.model, priced.job, priced.cluster, priced.layout)
        shortfall = max(shortfall, case["peak_memory_in_bytes"] / ev.memory.fit_bytes - 1)
    headroom = load_profile("maxtext").plan_headroom
    assert shortfall <= headroom < shortfall + 0.01, (shortfall, headroom)
