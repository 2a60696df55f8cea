"""The block-scaled precisions (MXFP8, NVFP4): formats, device math, framework recipes, pricing, labels
(INT8, MaxText's AQT: tests/test_catalogue_int8.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.compute import fp8_cast_s, op_time_s
from clusterplan.cost.layout import Layout
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.models.ops import linear_op
from clusterplan.planner.inputs import build_job
from clusterplan.planner.report.plan import caveats
from clusterplan.topologies.library import build_cluster, load_device as get_device
from clusterplan.topologies.precisions import LOW_PRECISIONS, PRECISIONS

BLACKWELL = ("b200", "gb200", "b300", "gb300")


def test_formats_count_their_block_scales():
    assert PRECISIONS == ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "int8")
    assert LOW_PRECISIONS["int8"].cast_bytes == LOW_PRECISIONS["fp8"].cast_bytes  # per-channel scales not counted
    assert LOW_PRECISIONS["fp8"].cast_bytes == 4.0  # read 2 B, write the copy and its transpose
    assert LOW_PRECISIONS["mxfp8"].element_bytes == pytest.approx(1 + 1 / 32)  # E8M0 scale per 32
    assert LOW_PRECISIONS["nvfp4"].element_bytes == pytest.approx(0.5 + 1 / 16)  # E4M3 scale per 16
    assert LOW_PRECISIONS["nvfp4"].cast_bytes < LOW_PRECISIONS["fp8"].cast_bytes < LOW_PRECISIONS["mxfp8"].cast_bytes


@pytest.mark.parametrize("device_id", BLACKWELL)
def test_blackwell_has_block_formats_with_their_own_rates(device_id):
    dev = get_device(device_id)
    assert dev.low_precisions() == ("fp8", "mxfp8", "nvfp4")
    assert dev.peak("nvfp4") >= 2 * dev.peak("fp8")  # FP4 at twice (Blackwell Ultra three times) FP8's peak
    # measured on a B300 with Transformer Engine: MXFP8 GEMMs 0.951 of per-tensor FP8, NVFP4 1.81 times
    assert dev.gemm_flops_per_s("mxfp8") < dev.gemm_flops_per_s("fp8") < dev.gemm_flops_per_s("nvfp4")
    assert dev.matmul_ceiling("nvfp4") > dev.matmul_ceiling("fp8")


def test_hopper_has_no_block_formats():
    dev = get_device("h100-sxm5-80gb")
    assert dev.low_precisions() == ("fp8",)
    # a job it cannot run falls back to the 16-bit rate, never to a made-up one
    assert dev.gemm_flops_per_s("nvfp4") == dev.gemm_flops_per_s("bf16")


def test_nvfp4_linear_is_faster_though_its_casts_cost_more():
    """Transformer Engine on a B300: NVFP4 GEMMs 1.81x per-tensor FP8's, quantization 2.34x as long."""
    dev, op = get_device("b300"), linear_op("mlp_up", 16384, 8192, 28672)
    fp8, nv = (op_time_s(op, dev, p) + op_time_s(op, dev, p, backward=True) for p in ("fp8", "nvfp4"))
    assert nv < fp8
    casts = {p: fp8_cast_s(op, dev, False, p) - dev.kernel_overhead_s for p in ("fp8", "mxfp8", "nvfp4")}
    assert casts["fp8"] < casts["mxfp8"] < casts["nvfp4"]
    assert casts["nvfp4"] / casts["fp8"] == pytest.approx(2.69 / 1.15)


def test_nvfp4_keeps_smaller_activation_copies_under_megatron():
    model, cluster = get_model("llama3-8b"), build_cluster("gb200-nvl72", 8)
    layout = Layout(tp=1, pp=1, dp=8, micro_batch_size=1, recompute="none", zero_stage=1)
    peaks = {}
    for precision in ("bf16", "fp8", "nvfp4"):
        job = build_job("llama3-8b", model, cluster, 64, 8192, precision, None)[0]
        peaks[precision] = evaluate(model, job, cluster, layout).memory.activations_bytes
    assert peaks["nvfp4"] < peaks["fp8"] < peaks["bf16"]


@pytest.mark.parametrize("precision, framework, cluster, says", [
    ("nvfp4", None, "dgx-h100-superpod", "h100-sxm5-80gb has low precisions: fp8"),
    ("mxfp8", None, "tpu-v5p-pod", "has low precisions"),
    ("nvfp4", "deepspeed", "gb200-nvl72", "in no release clusterplan knows"),
    ("nvfp4", "torchtitan", "gb200-nvl72", "from 2026-08 on"),
])
def test_refusals_name_the_field_and_what_is_allowed(precision, framework, cluster, says):
    c = build_cluster(cluster)
    date = "2026-02" if framework == "torchtitan" else None  # torchtitan 0.2.2, before its NVFP4 converter
    with pytest.raises(SpecError) as err:
        build_job("llama3-8b", get_model("llama3-8b"), c, None, None, precision, None, framework=framework,
                  framework_date=date)
    assert "--precision" in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("device_id, precision, labelled", [
    ("b300", "nvfp4", False), ("b300", "mxfp8", False), ("b200", "nvfp4", False),
    ("b200", "mxfp8", True), ("gb200", "nvfp4", True), ("gb300", "nvfp4", True), ("gb300", "fp8", False),
])
def test_borrowed_block_rates_are_labelled_unvalidated(device_id, precision, labelled):
    cluster = build_cluster({"b300": "dgx-b300-superpod", "b200": "dgx-b200-superpod",
                             "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}[device_id], 8)
    job = build_job("llama3-8b", get_model("llama3-8b"), cluster, None, None, precision, None)[0]
    lines = caveats(job, cluster)["unvalidated"]
    assert any(f"no measured {precision.upper()} GEMM rate" in line for line in lines) == labelled


def test_cli_plans_nvfp4_and_exports_megatron_flags():
    runner = CliRunner()
    args = ["--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "8", "--precision", "nvfp4"]
    planned = runner.invoke(main, ["plan", *args, "--json"])
    assert planned.exit_code == 0, planned.output
    doc = json.loads(planned.output)
    assert doc["inputs"]["job"]["precision"] == "nvfp4"
    exported = runner.invoke(main, ["export", *args, "--format", "megatron"])
    assert exported.exit_code == 0 and "--fp4-format e2m1" in exported.output and "--fp4-recipe nvfp4" in exported.output
    refused = runner.invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--precision",
                                   "mxfp8"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output and "--precision" in refused.output


def test_sequence_parallel_gathers_move_the_quantized_copy_under_transformer_engine():
    """Transformer Engine all-gathers the FP8/MXFP8/NVFP4 copy and reduce-scatters in bf16: the TP
    traffic of a low-precision Megatron job shrinks; DeepSpeed's profile keeps bf16 gathers."""
    from clusterplan.cost.terms import Context, tp_comm_terms

    model, cluster = get_model("llama3-70b"), build_cluster("gb200-nvl72", 64)
    times = {}
    for precision, framework in (("bf16", None), ("fp8", None), ("nvfp4", None), ("fp8", "deepspeed")):
        job = build_job("llama3-70b", model, cluster, 64, 8192, precision, None, framework=framework)[0]
        ctx = Context(model, job, cluster)
        times[precision, framework] = tp_comm_terms(ctx, 4, 1, 1, True, "none", 1, False)
    assert times["nvfp4", None] < times["fp8", None] < times["bf16", None]
    assert times["fp8", "deepspeed"] == pytest.approx(times["bf16", None])


def test_fp8_current_scaling_pays_its_amax_pass():
    """Current (per-tensor) scaling reduces each tensor to its amax before casting: Transformer
    Engine's B300 profile times its quantization at 2.03x delayed scaling's. Megatron defaults to
    delayed, torchao's float8 (torchtitan) to current; a run may say which."""
    from clusterplan.cost.layout import Job

    dev, op = get_device("h100-sxm5-80gb"), linear_op("mlp_up", 8192, 4096, 14336)
    delayed, current = (fp8_cast_s(op, dev, True, p) - dev.kernel_overhead_s for p in ("fp8", "fp8_current"))
    assert current / delayed == pytest.approx(2.335 / 1.15)
    assert Job(64, 8192, "fp8").gemm_format == "fp8"
    assert Job(64, 8192, "fp8", framework="torchtitan").gemm_format == "fp8_current"
    assert Job(64, 8192, "fp8", fp8_scaling="current").gemm_format == "fp8_current"
    assert Job(64, 8192, "fp8", framework="torchtitan", fp8_scaling="delayed").gemm_format == "fp8"
    assert Job(64, 8192, "bf16", fp8_scaling="current").gemm_format == "bf16"
    assert dev.supports("fp8_current") and dev.gemm_flops_per_s("fp8_current") == dev.gemm_flops_per_s("fp8")
    with pytest.raises(SpecError, match="job.fp8_scaling"):
        Job(64, 8192, "fp8", fp8_scaling="tensorwise")


def test_cli_fp8_scaling_prices_and_exports_the_recipe():
    runner = CliRunner()
    base = ["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "8", "--precision", "fp8",
            "--global-batch", "64", "--fix", "tp=1,pp=1,dp=8,mbs=1,recompute=full,zero=1"]
    steps = {}
    for scaling in ("delayed", "current"):
        out = runner.invoke(main, ["plan", *base, "--fp8-scaling", scaling, "--json"])
        assert out.exit_code == 0, out.output
        steps[scaling] = json.loads(out.output)["step_time_s"]
    assert steps["current"] > steps["delayed"]
    exported = runner.invoke(main, ["export", *base, "--fp8-scaling", "current", "--format", "megatron"]).output
    assert "--fp8-recipe tensorwise" in exported
    refused = runner.invoke(main, ["plan", *base[:6], "--precision", "bf16", "--fp8-scaling", "current"])
    assert refused.exit_code == 2 and "--fp8-scaling" in refused.output


def test_validate_refuses_a_run_whose_device_or_release_lacks_its_precision():
    """A run in MXFP8 on an H100 (no MX math), or in NVFP4 under a 2024 Megatron, is reported with
    its reason, never priced in bf16 behind the user's back."""
    import copy
    from pathlib import Path

    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies.validate import evaluate_run, load_runs

    runs = {r["id"]: r for r in load_runs(Path(__file__).resolve().parent.parent / "planner/data/runs.yaml")}
    h100 = copy.deepcopy(runs["mbridge2511-llama3_8b-8h100"])
    h100["precision"] = "mxfp8"
    res = evaluate_run(h100, SearchOptions(), best=False)
    assert res.error is None and "needs a device with MXFP8 math" in res.reason
    old = copy.deepcopy(runs["nemo2407-llama3-8b-8h100-fp8"])
    old["precision"] = "nvfp4"
    res = evaluate_run(old, SearchOptions(), best=False)
    assert res.error is None and "from 2025-09 on" in res.reason
