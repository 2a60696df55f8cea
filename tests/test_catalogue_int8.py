"""Issue 36 item 4: INT8 training on TPUs, as MaxText runs it (AQT, ``quantization=int8``).

TPU v5e, v5p and v6e carry their published INT8 peaks; ``--precision int8`` plans under MaxText on
them and is refused (exit 2, naming what is allowed) on a device without INT8 math or under a
framework without the recipe; the linear layers' GEMMs run at the INT8 peak, labelled where their
rate is borrowed; no INT8 weight copy is kept; the MaxText export writes the flag.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.compute import op_time_s
from clusterplan.cost.layout import Layout
from clusterplan.cost.step import evaluate
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.models.ops import linear_op
from clusterplan.planner.caveats import caveats
from clusterplan.planner.inputs import build_job
from clusterplan.topologies.library import build_cluster, load_device

TPU_INT8_TOPS = {"tpu-v5e": 393, "tpu-v5p": 918, "tpu-v6e": 1836}  # Google Cloud TPU docs, scaling book


@pytest.mark.parametrize("device_id", sorted(TPU_INT8_TOPS))
def test_tpus_carry_their_int8_peak(device_id):
    d = load_device(device_id)
    assert d.peak("int8") == TPU_INT8_TOPS[device_id] * 1e12
    assert d.peak("int8") == pytest.approx(2 * d.peak("bf16"), rel=0.01)
    assert "int8" in d.low_precisions()
    assert d.gemm_flops_per_s("int8") > d.gemm_flops_per_s("bf16")


@pytest.mark.parametrize("device_id", ["h100-sxm5-80gb", "tpu-v4", "tpu7x", "mi355x"])
def test_no_int8_training_math_elsewhere(device_id):
    d = load_device(device_id)
    assert "int8" not in d.low_precisions()
    assert d.gemm_flops_per_s("int8") == d.gemm_flops_per_s("bf16")  # never a made-up rate


def _plan(*args: str):
    return CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--precision", "int8", *args])


@pytest.mark.parametrize("cluster", ["tpu-v5p-pod", "tpu-v6e-pod"])
def test_int8_plans_under_maxtext(cluster):
    result = _plan("--cluster", cluster, "--devices", "64", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"]["job"]["precision"] == "int8" and doc["inputs"]["job"]["framework"] == "maxtext"
    assert doc["gemm_precision"] == "int8" and 0 < doc["mfu_precision_peak"] < doc["mfu"]


@pytest.mark.parametrize("args, says", [
    (["--cluster", "dgx-h100-superpod", "--devices", "64"], "h100-sxm5-80gb has low precisions: fp8"),
    (["--cluster", "dgx-h100-superpod", "--devices", "64", "--framework", "maxtext"], "needs a device with INT8 math"),
    (["--cluster", "tpu-v5p-pod", "--devices", "64", "--framework", "megatron"], "--framework maxtext"),
    (["--cluster", "tpu-v4-pod", "--devices", "64"], "tpu-v4 has low precisions: none"),
])
def test_int8_refused_where_it_does_not_run(args, says):
    result = _plan(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "--precision: int8" in result.stderr and says in result.stderr


def test_int8_refused_before_maxtext_had_it():
    """quantization=int8 with all three GEMMs in 8 bits since MaxText's 'Local AQT' (2024-02)."""
    cluster = build_cluster("tpu-v5p-pod", 64)
    with pytest.raises(SpecError, match="from 2024-02 on"):
        build_job("llama3-8b", get_model("llama3-8b"), cluster, None, None, "int8", None, framework="maxtext",
                  framework_date="2023-12")


def test_int8_linear_gemms_run_at_the_int8_peak():
    """A linear layer's GEMMs at the INT8 rate plus AQT's quantization casts; the LM head stays 16-bit."""
    dev, op = load_device("tpu-v5p"), linear_op("mlp_up", 16384, 4096, 14336)
    int8, bf16 = (op_time_s(op, dev, p) + op_time_s(op, dev, p, backward=True) for p in ("int8", "bf16"))
    assert int8 < bf16
    gemm_s = 3 * op.flops / dev.gemm_flops_per_s("int8")  # forward + two backward GEMMs
    assert gemm_s < int8 < gemm_s * 1.5  # the casts add to the GEMMs, never replace them
    assert dev.gemm_flops_per_s("int8") == pytest.approx(918e12 * dev.gemm.large_int8)


def test_int8_step_is_faster_and_keeps_no_weight_copy():
    """The same layout under MaxText: a faster step; AQT quantizes the fp32 weights at each use
    (its TRAIN mode stores no quantized copy), so memory is that of the bf16 job."""
    model, cluster = get_model("llama3-8b"), build_cluster("tpu-v5p-pod", 64)
    layout = Layout(tp=1, pp=1, dp=64, micro_batch_size=1, recompute="full", zero_stage=3)
    ev = {p: evaluate(model, build_job("llama3-8b", model, cluster, 256, 8192, p, None)[0], cluster, layout)
          for p in ("bf16", "int8")}
    assert ev["int8"].step_time_s < ev["bf16"].step_time_s
    assert ev["int8"].memory.total_bytes == pytest.approx(ev["bf16"].memory.total_bytes)


@pytest.mark.parametrize("device_id, cluster_id, labelled", [
    ("tpu-v5p", "tpu-v5p-pod", True), ("tpu-v5e", "tpu-v5e-pod", True), ("tpu-v6e", "tpu-v6e-pod", False)])
def test_borrowed_int8_rates_are_labelled_unvalidated(device_id, cluster_id, labelled):
    """v6e's INT8 GEMM rate was measured (the same sweep as its bf16 one); v5e and v5p borrow its
    INT8-over-bf16 ratio and say so."""
    cluster = build_cluster(cluster_id, 64)
    job = build_job("llama3-8b", get_model("llama3-8b"), cluster, None, None, "int8", None)[0]
    lines = caveats(job, cluster)["unvalidated"]
    assert any("no measured INT8 GEMM rate" in line for line in lines) == labelled


def test_maxtext_export_writes_the_quantization_flag():
    args = ["export", "--format", "maxtext", "--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "64"]
    int8 = CliRunner().invoke(main, [*args, "--precision", "int8"])
    assert int8.exit_code == 0, int8.output
    assert "quantization=int8" in int8.stdout.splitlines()
    bf16 = CliRunner().invoke(main, args)
    assert bf16.exit_code == 0 and "quantization=" not in bf16.stdout
