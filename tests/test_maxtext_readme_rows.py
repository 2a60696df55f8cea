"""The MaxText v5e/v5p README rows carry what ran when their table rows were written (issue 35/36):
the synthetic model of MaxText's base.yml of 2023, each launch script's batch, mesh and remat policy
at the table's commit, and a step time derived from the README's TFLOP/s with MaxText's own FLOP
count of that date. Facts read from the AI-Hypercomputer/maxtext git history (docs/cost-model.md,
"The MaxText README rows")."""

from __future__ import annotations

import math
import re

import pytest

from clusterplan.planner.studies.runs import bundled_data_path, load_runs

# MaxText/configs/base.yml from af006780 (2023-09-07) until 3b2ac811 (2024-02-14): the synthetic
# model every README row of 2023 ran (decoder_block default, mlp_activations [relu],
# logits_via_embedding True)
BASE_2023 = {"emb": 2560, "heads": 8, "mlp": 8192, "layers": 16, "head_dim": 256, "vocab": 32768}
# global_parameter_scale -> (per_device_batch_size, ici_tensor_parallelism, remat_policy):
# MaxText/configs/v5p/<scale>b.sh at 76bd53b0 (2023-12-15, the commit of the v5p README table) and
# MaxText/configs/largest_job/<scale>b.sh at 5ebcd67f (2023-10-27, the v5e table's commits)
V5P_SCRIPTS = {32: (8, 4, "minimal"), 64: (4, 4, "minimal"), 128: (2, 8, "minimal"), 256: (2, 8, "minimal"),
               512: (2, 16, "full"), 1024: (2, 16, "full")}
V5E_SCRIPTS = {16: (6, 1, "full"), 32: (4, 1, "full"), 64: (2, 1, "full"), 128: (1, 16, "full")}
SEQ = 2048


def _dims(scale: int) -> dict:
    """pyconfig.get_individual_scales of 2023: the power of two cycles through heads and mlp, the
    embedding, the layers (rem 1: heads and mlp double; rem 2: the embedding too)."""
    base, rem = divmod(int(math.log2(scale)), 3)
    wide, emb = base + int(rem > 0), base + int(rem > 1)
    return {"num_layers": BASE_2023["layers"] << base, "hidden_size": BASE_2023["emb"] << emb,
            "num_attention_heads": BASE_2023["heads"] << wide, "ffn_hidden_size": BASE_2023["mlp"] << wide,
            "head_dim": BASE_2023["head_dim"], "vocab_size": BASE_2023["vocab"]}


def _tflop_per_chip(dims: dict, pdbs: int, v5e: bool) -> float:
    """train.py calculate_training_tflops: 6 x parameters x tokens plus attention, 12 H L d s^2 per
    sequence before 64ee4e93 (2023-11-08, the v5e rows: their flash kernel ran causal=False), half
    that after (the v5p rows). Parameters as the model tree holds them: q, k, v, out, wi, wo and one
    norm a layer, plus the v5e era's relative-position biases (32 buckets a head) or the v5p era's
    q/k/v norms, one tied embedding and the final norm."""
    L, e, H, f = dims["num_layers"], dims["hidden_size"], dims["num_attention_heads"], dims["ffn_hidden_size"]
    d, V = dims["head_dim"], dims["vocab_size"]
    per_layer = 4 * e * H * d + 2 * e * f + e + (32 * H if v5e else 3 * d)
    params = L * per_layer + V * e + e
    attention = (12 if v5e else 6) * H * L * d * SEQ ** 2 * pdbs
    return (6 * params * SEQ * pdbs + attention) / 1e12


def _readme_rows() -> list[dict]:
    return [r for name in ("runs.yaml", "family_runs.yaml") for r in load_runs(bundled_data_path(name))
            if r["hardware"]["device"] in ("tpu-v5e", "tpu-v5p") and (r.get("framework") or {}).get("name") == "maxtext"]


def test_every_readme_row_is_checked():
    ids = {r["id"] for r in _readme_rows()}
    assert len(ids) == 26 and {"maxtext-32b-v5p-128", "maxtext-128b-v5p-256"} <= ids


@pytest.mark.parametrize("run", _readme_rows(), ids=lambda r: r["id"])
def test_readme_row_carries_what_ran(run):
    v5e = run["hardware"]["device"] == "tpu-v5e"
    scale = int(re.search(r"global_parameter_scale=(\d+)", run["model"]["name"]).group(1))
    pdbs, tp, remat = (V5E_SCRIPTS if v5e else V5P_SCRIPTS)[scale]
    dims = _dims(scale)
    model = run["model"]
    assert {k: model.get(k) for k in dims} == dims
    assert model["num_kv_heads"] == dims["num_attention_heads"]
    assert (model["ffn_activation"], model["tied_embeddings"], model["norm"]) == ("gelu", True, "rmsnorm")
    assert model["position_embedding"] == ("alibi" if v5e else "rope")
    chips = run["hardware"]["count"]
    assert (run["global_batch_size"], run["micro_batch_size"]) == (pdbs * chips, pdbs * tp)
    assert (run["layout"]["tp"], run["layout"]["dp"]) == (tp, chips // tp)
    assert run["layout"]["recompute"] == ("selective" if remat == "minimal" else "full")
    assert run["framework"]["date"] == ("2023-10" if v5e else "2023-12")
    measured = run["measured"]
    expected_s = _tflop_per_chip(dims, pdbs, v5e) / measured["tflops_per_device"]
    assert measured["step_time_s"] == pytest.approx(expected_s, rel=1e-4)
