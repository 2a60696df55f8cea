"""Full recomputation of only some layers of each stage (``Layout.recompute_layers``): Megatron's
``--recompute-method block --recompute-num-layers`` and torchtitan's layer SAC, priced by evaluate
and validate, exported to the launchers that have it."""

import pytest

from clusterplan import export
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.report.plan import evaluation_document
from clusterplan.topologies.library import build_cluster

MODEL = get_model("llama3-8b")
CLUSTER = build_cluster("dgx-h100-superpod", num_devices=16)


def _eval(recompute: str, k: int = 0, framework: str = "torchtitan"):
    layout = Layout(dp=16, zero_stage=3, recompute=recompute, recompute_layers=k)
    return evaluate(MODEL, Job(global_batch_size=16, seq_len=4096, framework=framework), CLUSTER, layout)


def test_parse_and_print():
    layout = parse_layout("dp=16,recompute=full,recompute_layers=16")
    assert layout.recompute_layers == 16 and "recompute_layers=16" in layout.short()
    with pytest.raises(SpecError, match="recompute_layers: got 'x'; must be a non-negative integer"):
        parse_layout("recompute_layers=x")


def test_half_the_layers_cost_half_the_recompute_and_keep_the_mean_activations():
    full, none, half = _eval("full"), _eval("none"), _eval("full", 16)
    assert half.time.recompute_s == pytest.approx(full.time.recompute_s / 2)
    mean = (full.memory.activations_bytes + none.memory.activations_bytes) / 2
    assert half.memory.activations_bytes == pytest.approx(mean)
    assert half.memory.working_bytes == pytest.approx(full.memory.working_bytes)
    assert _eval("full", 32).step_time_s == pytest.approx(full.step_time_s)


@pytest.mark.parametrize("text, needle", [
    ("dp=16,recompute=selective,recompute_layers=4", "needs recompute=full"),
    ("dp=16,recompute=full,recompute_layers=33", "exceeds the 32 layers"),
    ("tp=1,pp=2,dp=8,recompute=full,recompute_layers=17", "exceeds the 16 layers"),
])
def test_bad_values_are_named(text, needle):
    job = Job(global_batch_size=16, seq_len=4096)
    problems = layout_problems(MODEL, job, CLUSTER, parse_layout(text))
    assert any(needle in msg for _, msg in problems), problems


def test_maxtext_has_no_per_layer_count():
    tpu = build_cluster("v5p-pod", num_devices=16)
    job = Job(global_batch_size=16, seq_len=4096, framework="maxtext")
    problems = layout_problems(MODEL, job, tpu, parse_layout("dp=16,zero=3,recompute=full,recompute_layers=4"))
    assert any(key == "framework" and "recompute_layers" in msg for key, msg in problems), problems


def test_exports():
    # torchtitan's layer SAC is 0.2.2's (0.3 dropped it, 2026-03): the 0.2 TOML of a job as of 2026-02
    job = Job(global_batch_size=16, seq_len=4096, framework="torchtitan", framework_date="2026-02")
    ev = evaluate(MODEL, job, CLUSTER, Layout(dp=16, zero_stage=3, recompute="full", recompute_layers=8))
    toml = export(evaluation_document(MODEL, job, CLUSTER, ev), "torchtitan-0.2", model=MODEL)
    assert 'mode = "selective"' in toml and 'selective_ac_option = "4"' in toml
    with pytest.raises(SpecError, match="no layer SAC"):
        export(evaluation_document(MODEL, job, CLUSTER, ev), "torchtitan", model=MODEL)
    job = Job(global_batch_size=64, seq_len=4096)
    interleaved = Layout(tp=2, pp=2, dp=4, vp=2, recompute="full", recompute_layers=6)
    doc = evaluation_document(MODEL, job, CLUSTER, evaluate(MODEL, job, CLUSTER, interleaved))
    args = export(doc, "megatron", model=MODEL)
    assert "--recompute-method block" in args and "--recompute-num-layers 3" in args
    odd = interleaved.with_(recompute_layers=5)
    with pytest.raises(SpecError, match="per model chunk"):
        export(evaluation_document(MODEL, job, CLUSTER, evaluate(MODEL, job, CLUSTER, odd)), "megatron", model=MODEL)
