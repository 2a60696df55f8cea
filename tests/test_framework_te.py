"""The Transformer Engine-native profile (cost/data/frameworks/te.yaml, issue 35 item 1): TE's modules
inside a plain PyTorch loop, so the search offers data parallelism by DDP or FSDP, TP/SP and CP through
the modules' groups and no pipeline; what it refuses exits 2 naming the rule; its kernels are TE's
fused ones, not eager PyTorch's."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clusterplan.cli import main as clusterplan
from clusterplan.cost.framework import load_profile, resolve_name
from clusterplan.cost.layout import Job
from clusterplan.cost.terms import Context, layer_kernels
from clusterplan.models.library import get_model
from clusterplan.planner.search.space import build_space
from clusterplan.topologies.library import build_cluster

DENSE = ("--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16", "--framework", "te")
MOE = ("--model", "mixtral-8x7b", "--cluster", "dgx-b300-superpod", "--devices", "8", "--framework", "te",
       "--global-batch", "48", "--seq-len", "8192")


def run(*args: str):
    return CliRunner().invoke(clusterplan, list(args))


def job(framework: str = "te", date: str = "") -> Job:
    return Job(global_batch_size=64, seq_len=4096, framework=framework, framework_date=date)


def test_the_profile_loads_under_its_name_and_aliases():
    prof = load_profile("te")
    assert resolve_name("transformer-engine") == "te" and resolve_name("TE") == "te"
    now = prof.at(None)
    assert now.zero_stages() == (0, 2, 3) and not now.has("pp") and now.has("cp") and now.has("mxfp8")
    # FSDP around TE layers arrives with TE's FSDP example (v1.4, 2024-03); MXFP8 with TE 2.0 (2025-02)
    assert prof.at("2024-02").zero_stages() == (0,) and prof.at("2024-03").zero_stages() == (0, 2, 3)
    assert not prof.at("2024-12").has("mxfp8") and prof.at("2025-02").has("mxfp8")


@pytest.mark.parametrize("args", [DENSE, MOE], ids=["dense", "moe"])
def test_plan_under_te_returns_a_layout_without_a_pipeline(args):
    done = run("plan", *args, "--json", "--top", "0")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["inputs"]["job"]["framework"] == "te" and doc["layout"]["pp"] == 1
    assert doc["layout"]["zero_stage"] in (0, 2, 3) and doc["layout"]["vp"] == 1


def test_the_cli_takes_the_alias():
    done = run("evaluate", *DENSE[:-1], "transformer-engine", "--layout", "tp=2,pp=1,dp=8,sp=on", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["inputs"]["job"]["framework"] == "te"


def test_the_search_space_holds_no_pipeline_degree():
    model, cluster = get_model("llama3-8b"), build_cluster("dgx-h100-superpod", num_devices=64)
    space = build_space(model, job(), cluster)
    assert {pp for _, pp, _, _ in space.factorizations} == {1} and 1 not in space.zero_stage


@pytest.mark.parametrize("args,needle", [
    (("evaluate", *DENSE, "--layout", "tp=2,pp=2,dp=4"), "pp=2: te (Transformer Engine 2.18) does not offer it"),
    (("plan", *DENSE, "--fix", "pp=2"), "--fix pp=2: te"),
    (("evaluate", *DENSE, "--layout", "tp=2,pp=1,dp=8,zero=1"), "zero_stage=1: te"),
    (("evaluate", *DENSE, "--layout", "tp=2,pp=1,dp=8,sp=off,tp_overlap=on"), "only with sequence_parallel=True"),
    (("export", "--format", "megatron", *DENSE), "--framework te has no launcher config clusterplan writes"),
    (("export", "--format", "torchtitan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--framework",
      "nanotron"), "--framework nanotron has no launcher config clusterplan writes"),
])
def test_what_te_refuses_exits_2_naming_the_rule(args, needle):
    done = run(*args)
    assert done.exit_code == 2, done.output
    assert needle in done.output and "Traceback" not in done.output


def test_te_runs_fused_kernels_not_eager_modules():
    """LayerNormLinear / LayerNormMLP fuse the norms and SwiGLU: no eager element-wise passes, unlike a
    loop of eager PyTorch modules (nanotron's SwiGLU, torchtitan's uncompiled model)."""
    model, cluster = get_model("llama3-8b"), build_cluster("dgx-h100-superpod", num_devices=16)
    assert not layer_kernels(Context(model, job(), cluster)).eager
    assert layer_kernels(Context(model, job("nanotron"), cluster)).eager


def test_the_docs_and_help_list_every_profile():
    """docs/frameworks.md's table and README's --framework line name each profile, te among them, and
    the frameworks without an export say so."""
    from pathlib import Path

    from clusterplan.cost.framework import FRAMEWORKS
    root = Path(__file__).resolve().parent.parent
    docs, readme = (root / "docs" / "frameworks.md").read_text(), (root / "README.md").read_text()
    assert all(f"| `{fid}` |" in docs for fid in FRAMEWORKS)
    assert "--framework " + "|".join(FRAMEWORKS) in readme and "## te\n" in docs
    assert "|".join(FRAMEWORKS) in run("plan", "--help").output.replace("\n", "").replace(" ", "")


def test_a_plan_under_a_framework_without_runs_on_its_hardware_says_its_error_is_other_frameworks():
    """The validated error a plan quotes is its hardware family's; where the plan's framework has
    fewer than FRAMEWORK_MIN_RUNS runs there (te: none), the plan says so instead of passing other
    frameworks' agreement off as its own; Megatron on Hopper (dozens of runs) does not."""
    from clusterplan.planner.caveats import FRAMEWORK_MIN_RUNS, framework_runs
    assert framework_runs("nvidia-hopper", "te") == 0
    assert framework_runs("nvidia-hopper", "megatron") >= FRAMEWORK_MIN_RUNS
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16"]
    te = CliRunner().invoke(clusterplan, args + ["--framework", "te"])
    megatron = CliRunner().invoke(clusterplan, args + ["--framework", "megatron"])
    assert te.exit_code == 0 and megatron.exit_code == 0
    assert "no published runs under te on nvidia-hopper" in te.output
    assert "under megatron on nvidia-hopper" not in megatron.output
