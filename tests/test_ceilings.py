"""No layout may beat the device's matmul ceiling: MFU <= DeviceSpec.matmul_ceiling(precision).

MFU is model FLOPs (PaLM count, ``models.ops.model_flops_per_token``) over the bf16 dense peak; the
ceiling is the large-GEMM rate (dense peak x MAMF fraction x sustained fraction) over the same peak.
Every bundled cluster preset is planned for every bundled model at the preset's reference size, with
the job the ``plan`` command builds by default (``planner.inputs.build_job``), the cheap way (``top_k=0``).

The bound holds by construction for devices without a fused-attention measurement (``cost.compute``
prices their causal attention at the GEMM rate per model FLOP). Where a measured fused-attention
kernel runs above half the MAMF fraction (FlashAttention-3 on Hopper), the PaLM count, which does
not halve causal attention, can lift MFU above the ceiling at sequence lengths beyond the published
ones (Llama 3 8B at 32k tokens on H100: 68.9% against 68.2%); the published jobs stay under it.
"""

from __future__ import annotations

import pytest

from clusterplan.planner.inputs import build_job
from clusterplan.cost.compute import gemm_rate, op_time_s
from clusterplan.cost.layout import Job
from clusterplan.models.errors import InfeasibleError
from clusterplan.models.library import get_model, list_models
from clusterplan.models.ops import Op
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.topologies.library import build_cluster, list_clusters, list_devices
from grids import preset_model_grid

PRESETS = [c.id for c in list_clusters()]
MODELS = [m.id for m in list_models()]
DEVICES = list_devices()
SIXTEEN_BIT = ("bf16", "fp16")
REL = 1e-9


def published_job(model_id: str, cluster) -> Job:
    """The job ``plan --model M --cluster C`` runs with no options: the model's published setup, the
    platform's default framework and that framework's attention kernel and gradient dtype."""
    return build_job(model_id, get_model(model_id), cluster, None, None, None, None)[0]


# ---- the bound over every preset x model -------------------------------------------------------------
@pytest.mark.parametrize("preset,model_id", preset_model_grid(PRESETS, MODELS))
def test_best_layout_mfu_within_matmul_ceiling(preset, model_id):
    cluster = build_cluster(preset)
    device = cluster.device
    job = published_job(model_id, cluster)
    try:
        result = plan(get_model(model_id), job, cluster, SearchOptions(top_k=0))
    except InfeasibleError:
        pytest.skip(f"{model_id} fits no layout on {preset} at {cluster.num_devices} devices")
    ceiling = device.matmul_ceiling(job.precision)
    assert 0 < result.best.mfu_precision_peak <= 1
    assert result.best.mfu <= ceiling * (1 + REL), (
        f"{model_id} on {preset} ({job.precision}): MFU {result.best.mfu:.4f} exceeds the matmul ceiling "
        f"{ceiling:.4f} of {device.id} ({device.efficiency_note})")


def test_every_pair_is_listed():
    assert len(PRESETS) >= 14 and len(MODELS) >= 16


# ---- the ceiling itself ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.id)
def test_matmul_ceiling_at_most_peak(device):
    for precision in SIXTEEN_BIT:
        assert 0 < device.matmul_ceiling(precision) <= 1
    # FP8 is measured against the bf16 peak too: at most the FP8 / bf16 peak ratio
    fp8_ratio = device.peak("fp8") / device.peak("bf16")
    assert 0 < device.matmul_ceiling("fp8") <= fp8_ratio * (1 + REL)
    if not device.supports("fp8"):
        assert device.matmul_ceiling("fp8") == pytest.approx(device.matmul_ceiling("bf16"), rel=REL)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.id)
def test_matmul_ceiling_is_the_priced_gemm_rate(device):
    for precision in (*SIXTEEN_BIT, "fp8"):
        assert device.matmul_ceiling(precision) == pytest.approx(
            gemm_rate(device, precision) / device.peak("bf16"), rel=REL)
    expected = device.peak("bf16") * device.gemm.large * device.sustained_fraction / device.peak("bf16")
    assert device.matmul_ceiling("bf16") == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.id)
def test_placeholder_efficiencies_are_not_validated(device):
    source = device.gemm.source.lower()
    if "placeholder" in source or "borrowed" in source or "no mamf" in source:
        assert not device.efficiency_validated, device.gemm.source
    assert device.efficiency_validated == device.gemm.measured
    prefix = "measured: " if device.efficiency_validated else "unvalidated: "
    assert device.efficiency_note.startswith(prefix)
    assert device.gemm.source in device.efficiency_note


def test_validated_devices_are_the_measured_ones():
    """The devices whose MAMF a cited benchmark measured on that very part."""
    validated = {d.id for d in DEVICES if d.efficiency_validated}
    assert {"a100-sxm4-80gb", "h100-sxm5-80gb", "b200", "gb200", "mi300x", "gaudi2", "gaudi3"} <= validated
    assert not validated & {"v100-sxm2-32gb", "h100-sxm5-96gb", "h800-sxm5-80gb", "tpu-v4", "tpu-v5e",
                            "tpu-v5p", "cerebras-wse3", "groq-lpu"}


@pytest.mark.parametrize("device", [d for d in DEVICES if d.attention_efficiency is None], ids=lambda d: d.id)
def test_unmeasured_attention_no_faster_than_gemm_per_model_flop(device):
    """Without a fused-attention measurement, a causal kernel (half its FLOPs executed) costs at least
    what GEMMs of its full (PaLM-counted) FLOPs cost, so that it cannot lift MFU above the ceiling."""
    flops = 1e15
    attention = Op("a", "attention", flops, 1.0, causal_fraction=0.5)
    gemm_s = flops / gemm_rate(device, "bf16")
    for backward, factor in ((False, 1.0), (True, 2.5)):
        assert op_time_s(attention, device, "bf16", backward) >= factor * gemm_s * (1 - REL)
