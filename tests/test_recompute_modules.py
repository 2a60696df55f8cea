"""Megatron-Core's selective recomputation of named submodules (``Layout.recompute_modules``,
``--recompute-modules``): priced by evaluate and validate, refused where the framework or the model
has no such module, exported to Megatron-LM."""

import pytest

from clusterplan import export
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.report.plan import evaluation_document
from clusterplan.topologies.library import build_cluster

DSV3 = get_model("deepseek-v3")
CLUSTER = build_cluster("dgx-b200-superpod", num_devices=256)
JOB = Job(global_batch_size=2048, seq_len=4096)
BASE = Layout(pp=8, dp=32, ep=32, recompute="selective", zero_stage=1)


def _eval(recompute: str = "selective", modules: tuple[str, ...] = ()):
    return evaluate(DSV3, JOB, CLUSTER, BASE.with_(recompute=recompute, recompute_modules=modules))


def test_parse_and_print():
    layout = parse_layout("pp=8,dp=32,recompute=selective,recompute_modules=mla_up_proj+moe_act")
    assert layout.recompute_modules == ("mla_up_proj", "moe_act")
    assert "recompute_modules=mla_up_proj+moe_act" in layout.short()
    for bad, needle in (("recompute_modules=moe", "whole MoE layer is not priced"),
                        ("recompute_modules=attn", "allowed: core_attn"),
                        ("recompute_modules=mlp+mlp", "given twice")):
        with pytest.raises(SpecError, match=needle):
            parse_layout(bad)


def test_each_module_trades_kept_activations_for_recompute_time():
    none = _eval("none")
    for modules in (("mla_up_proj",), ("layernorm",), ("moe_act",), ("mlp",), ("shared_experts",)):
        ev = _eval(modules=modules)
        if modules == ("mlp",):  # dense MLPs: DeepSeek-V3's three dense layers sit on rank 0, and the
            # peak is an all-MoE rank's (cost.stages), so it does not move; on one rank it does
            assert ev.memory.activations_bytes <= none.memory.activations_bytes
            flat = dict(pp=1, dp=256, ep=32)
            one_rank = evaluate(DSV3, JOB, CLUSTER, BASE.with_(recompute_modules=modules, **flat))
            assert one_rank.memory.activations_bytes < evaluate(
                DSV3, JOB, CLUSTER, BASE.with_(recompute="none", **flat)).memory.activations_bytes
            assert 0.0 < one_rank.time.recompute_s  # the slowest stage of the pipeline holds no dense layer
            continue
        assert ev.memory.activations_bytes < none.memory.activations_bytes, modules
        assert 0.0 < ev.time.recompute_s, modules
    one, two = _eval(modules=("mla_up_proj",)), _eval(modules=("mla_up_proj", "moe_act"))
    assert two.memory.activations_bytes < one.memory.activations_bytes
    assert two.time.recompute_s > one.time.recompute_s


def test_core_attn_alone_is_megatrons_default_selective():
    default, named = _eval(), _eval(modules=("core_attn",))
    assert named.memory.activations_bytes == pytest.approx(default.memory.activations_bytes, rel=1e-9)
    assert named.time.recompute_s == pytest.approx(default.time.recompute_s, rel=1e-9)


@pytest.mark.parametrize("model, layout, job, needle", [
    ("llama3-8b", "dp=16,recompute=selective,recompute_modules=mla_up_proj", JOB, "needs a model with multi-head latent"),
    ("llama3-8b", "dp=16,recompute=selective,recompute_modules=moe_act", JOB, "needs a model with MoE layers"),
    ("deepseek-v3", "pp=8,dp=32,ep=32,recompute=full,recompute_modules=mla_up_proj", JOB, "needs recompute=selective"),
    ("llama3-8b", "dp=16,zero=3,recompute=selective,recompute_modules=layernorm",
     Job(global_batch_size=2048, seq_len=4096, framework="torchtitan"), "recompute_modules=layernorm"),
])
def test_refusals_name_the_field(model, layout, job, needle):
    problems = layout_problems(get_model(model), job, CLUSTER, parse_layout(layout))
    assert any(needle in msg for _, msg in problems), problems


def test_megatron_export_names_the_modules():
    ev = _eval(modules=("mla_up_proj", "moe_act"))
    args = export(evaluation_document(DSV3, JOB, CLUSTER, ev), "megatron", model=DSV3)
    assert "--recompute-granularity selective" in args and "--recompute-modules mla_up_proj moe_act" in args
