"""The nanotron profile (cost/data/frameworks/nanotron.yaml, issue 35 item 1): the search offers only
the knobs nanotron has, the combinations its code refuses exit 2 naming the rule, and the mechanisms
its code runs (ZeRO-1's all-reduce, eager SwiGLU beside fused rotary, fp32 gradient buffers beside
bf16 ones) are what the cost terms price."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clusterplan.cli import main as clusterplan
from clusterplan.cost import collectives as coll
from clusterplan.cost.framework import framework_refusal, load_profile, resolve_name
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import Context, dp_traffic, layer_kernels, param_counts
from clusterplan.models.library import get_model
from clusterplan.models.ops import Kernels
from clusterplan.planner.search.space import build_space
from clusterplan.planner.studies.runs import run_framework
from clusterplan.topologies.library import build_cluster

LLAMA = get_model("llama3-8b")
CLUSTER = build_cluster("dgx-h100-superpod", num_devices=64)
COMMON = ("--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--framework", "nanotron")


def run(*args: str):
    return CliRunner().invoke(clusterplan, list(args))


def job(date: str | None = None, framework: str = "nanotron") -> Job:
    return Job(global_batch_size=512, seq_len=4096, framework=framework, framework_date=date or "")


def test_nanotron_plans_on_a_superpod_with_only_its_knobs():
    """No interleaving, no ZeRO-2/3 (nor ZeRO-1 since 2025-06), no TP or EP overlap, full recomputation
    but no selective one, TP innermost: the space holds nothing else, and the plan picks from it."""
    space = build_space(LLAMA, job(), CLUSTER)
    assert space.vp == (1,) and space.zero_stage == (0,) and space.tp_overlap == (False,)
    assert set(space.recompute) == {"none", "full"} and space.order == ("tp-cp-dp-pp",)
    assert all(LLAMA.num_kv_heads_resolved % tp == 0 for tp, _, _, _ in space.factorizations)
    done = run("plan", *COMMON, "--json", "--top", "0")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    layout = doc["layout"]
    assert doc["inputs"]["job"]["framework"] == "nanotron" and doc["inputs"]["job"]["attention"] == "flash2"
    assert layout["vp"] == 1 and layout["zero_stage"] == 0 and not layout["tp_overlap"]
    assert layout["recompute"] in ("none", "full")


def test_the_playbooks_release_still_had_zero1():
    """The Ultra-Scale Playbook ran main of 2025-02, whose ZeRO-1 ran; #376 (2025-06) broke it."""
    assert load_profile("nanotron").at("2025-02").zero_stages() == (0, 1)
    assert load_profile("nanotron").at("2025-06").zero_stages() == (0,)
    assert load_profile("nanotron").at("2024-01").recompute_modes() == ("none", "selective")


@pytest.mark.parametrize("args,needle", [
    (("evaluate", *COMMON, "--layout", "tp=2,pp=2,dp=16,zero=3"), "zero_stage=3: nanotron"),
    (("evaluate", *COMMON, "--layout", "tp=2,pp=4,dp=8,vp=2"), "vp=2: nanotron"),
    (("evaluate", *COMMON, "--layout", "tp=2,pp=4,dp=8,mbs=1", "--global-batch", "16"),
     "must be at least PP_SIZE-1"),
    (("evaluate", *COMMON, "--layout", "tp=2,pp=1,dp=32,tp_overlap=on,sp=on"), "tp_overlap=on: nanotron"),
    (("plan", "--model", "palm-540b", "--cluster", "dgx-h100-superpod", "--devices", "1024", "--framework",
      "nanotron", "--fix", "tp=8"), "needs tp to divide the 1 key/value heads"),
    (("plan", *COMMON, "--precision", "fp8"), "trains in bf16, fp16 only"),
    (("plan", *COMMON, "--fix", "zero=1"), "zero_stage=1: nanotron"),
])
def test_what_nanotron_refuses_exits_2_naming_the_rule(args, needle):
    done = run(*args)
    assert done.exit_code == 2, done.output
    assert needle in done.output and "Traceback" not in done.output


def test_megatron_takes_the_tp_nanotron_refuses():
    """Megatron-Core replicates K/V heads over the TP ranks that share them: PaLM's one K/V head takes
    tp = 8 there; nanotron asserts num_key_value_heads % tp == 0."""
    palm, cluster = get_model("palm-540b"), build_cluster("dgx-h100-superpod", num_devices=1024)
    layout = Layout(tp=8, pp=8, dp=16, sequence_parallel=True)
    megatron = [key for key, _ in layout_problems(palm, job(framework="megatron"), cluster, layout)]
    nanotron = [msg for key, msg in layout_problems(palm, job(), cluster, layout) if key == "framework"]
    assert "heads" not in megatron and any("key/value heads" in m for m in nanotron)


def test_zero1_of_2025_02_all_reduces_after_the_backward():
    """Without DDP (fp32 accumulation with ZeRO) the gradients are all-reduced after the backward
    (rule zero1_no_dp_overlap), the whole fp32 buffer, then the bf16 weights are gathered."""
    prof = load_profile("nanotron").at("2025-02")
    assert "not overlapped" in framework_refusal(prof, 1, 1, 1, 1, 1, 1, "none", False, dp_overlap=True)
    assert framework_refusal(prof, 1, 1, 1, 1, 1, 1, "none", False, dp_overlap=False) is None
    pc = param_counts(LLAMA, 1, 1, 1, 1)
    group = CLUSTER.strided_profile(64, 1)
    nanotron = dp_traffic(4, pc, group, group, 1, zero1_all_reduce=True).per_step_s
    megatron = dp_traffic(4, pc, group, group, 1).per_step_s
    count = pc.dense + pc.expert
    extra = coll.all_reduce_s(4 * count, group) - coll.reduce_scatter_s(4 * count, group)
    assert nanotron - megatron == pytest.approx(extra)
    layout = Layout(tp=1, pp=1, dp=64, zero_stage=1, dp_overlap=False)
    late = evaluate(LLAMA, job("2025-02"), CLUSTER, layout).time
    meg = evaluate(LLAMA, job("2025-02", "megatron"), CLUSTER, layout).time
    assert late.dp_comm_s > meg.dp_comm_s


def test_eager_swiglu_beside_fused_rotary_and_norms():
    """GLUActivation is split, silu, multiply (eager); the rotary embedding and the RMSNorm are
    flash-attn's Triton kernels."""
    kernels = layer_kernels(Context(LLAMA, job(), CLUSTER))
    assert kernels == Kernels(eager=True, composite_norm=False, kv_repeat=False, fused_rotary=True)
    titan = layer_kernels(Context(LLAMA, job(framework="torchtitan"), CLUSTER))
    assert titan.eager and not titan.fused_rotary


def test_bf16_gradients_live_beside_the_fp32_buffers():
    """FP32GradientAccumulator's fp32 buffers (4 B) and the bf16 gradients beside them (2 B): 1.5 x
    Megatron's fp32 main grads for the same layout."""
    layout = Layout(tp=2, pp=1, dp=32, sequence_parallel=True, zero_stage=0)
    ours = evaluate(LLAMA, job(), CLUSTER, layout).memory.gradients_bytes
    theirs = evaluate(LLAMA, job(framework="megatron"), CLUSTER, layout).memory.gradients_bytes
    assert ours == pytest.approx(1.5 * theirs)


def test_a_run_that_names_nanotron_gets_its_profile():
    run_ = {"id": "smollm3-nanotron-384gpu", "source": "nanotron", "hardware": {"cluster": "dgx-h100-superpod"}}
    assert run_framework(run_, "nvidia")[0] == "nanotron"
    assert resolve_name("NanoTron") == "nanotron" and resolve_name("hf-nanotron") == "nanotron"
