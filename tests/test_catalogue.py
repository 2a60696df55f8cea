"""Issue 36 item 4: the catalogue grows to hardware that ran in published training.

AMD Instinct MI350X (the MI355X's silicon at lower clocks and power), Google TPU7x (Ironwood) with
its superpod preset, and DGX H200 clusters: each id and alias resolves, carries its published
figures, and plans through the command line.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.topologies.library import build_cluster, load_device


def test_mi350x_is_the_mi355x_silicon_at_lower_clocks():
    mi350x, mi355x = load_device("mi350x"), load_device("mi355x")
    assert mi350x.family == mi355x.family == "amd-mi355x"
    assert mi350x.memory_bytes == mi355x.memory_bytes == 288 * 2**30
    assert mi350x.memory_bytes_per_s == mi355x.memory_bytes_per_s == 8e12
    assert mi350x.power_w == 1000 < mi355x.power_w
    # AMD's dense peaks scale with the engine clock, 2200 against 2400 MHz (AMD rounds to 2 digits)
    for dtype in ("bf16", "fp8", "fp32"):
        assert mi350x.peak(dtype) == pytest.approx(mi355x.peak(dtype) * 2200 / 2400, rel=0.01)
    assert mi350x.low_precisions() == ("fp8",)
    # the MAMF fraction is the MI355X's, borrowed: a plan says unvalidated
    assert not mi350x.efficiency_validated and "borrowed" in mi350x.efficiency_note
    assert mi350x.gemm.large == mi355x.gemm.large


def test_mi350x_runs_on_the_mi355x_fabric():
    c = build_cluster("mi355x-cluster", num_devices=16, device="mi350x")
    assert c.device.id == "mi350x" and c.graph.edges[0, 1]["level"] == "xgmi"


def test_tpu7x_chip_figures():
    d = load_device("tpu7x")
    assert (d.peak("bf16"), d.peak("fp8")) == (2307e12, 4614e12)
    assert d.memory_bytes == 192 * 2**30 and d.memory_bytes_per_s == 7380e9
    assert d.scale_up_bytes_per_s == 600e9  # 1200 GB/s bidirectional per chip
    assert d.scale_out_bytes_per_s == 100e9 / 8
    assert d.efficiency_validated and d.matmul_ceiling("bf16") < 1
    assert "int8" not in d.low_precisions()  # Google publishes no INT8 peak for TPU7x


@pytest.mark.parametrize("name", ["tpu7x-pod", "ironwood-pod", "tpu7x-superpod"])
def test_tpu7x_pod_is_a_3d_torus_of_cubes(name):
    c = build_cluster(name, num_devices=256)
    assert c.id == "tpu7x-pod" and c.device.id == "tpu7x"
    assert c.torus_shape == (4, 8, 8) and c.devices_per_node == 4
    ici = [d for u, v, d in c.graph.edges(data=True) if d["level"].startswith("ici_")]
    assert ici and all(d["bytes_per_s"] == 100e9 for d in ici)
    assert all(d["wraparound"] for d in ici if d.get("wraparound") is not None)
    assert sum(1 for d in ici if d.get("wraparound")) > 0  # whole cubes close every axis into a ring


def test_tpu7x_superpod_is_one_slice():
    c = build_cluster("tpu7x-pod")
    assert c.num_devices == c.reference_size == 9216
    assert sorted(c.torus_shape) == [16, 24, 24]


@pytest.mark.parametrize("name", ["dgx-h200", "h200-cluster", "dgx-h200-superpod"])
def test_dgx_h200_nodes(name):
    c = build_cluster(name, num_devices=64)
    assert c.id == "dgx-h200" and c.device.id == "h200-sxm-141gb"
    assert c.devices_per_node == 8 and c.domain_size == 8
    assert c.device.scale_out_bytes_per_s == 400e9 / 8
    assert {d["level"] for u, v, d in c.graph.edges(data=True)} >= {"nvlink", "nic", "spine"}


@pytest.mark.parametrize("args", [
    ["--cluster", "tpu7x-pod", "--devices", "256"],
    ["--cluster", "dgx-h200", "--devices", "64"],
    ["--cluster", "mi355x-cluster", "--device", "mi350x", "--devices", "16"],
])
def test_new_ids_plan_through_the_cli(args):
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", *args])
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == 0, result.stderr
    assert "step time" in result.stdout


def test_maxtext_export_refuses_tpu7x_chiplets():
    """JAX counts TPU7x's two chiplets as two devices, the plan counts chips: a per-chip mesh
    written as MaxText's would be half its device count, so the export says so (exit 2)."""
    args = ["export", "--format", "maxtext", "--model", "llama3-8b", "--cluster", "tpu7x-pod", "--devices", "256"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "2 devices per tpu7x chip" in result.stderr and "chiplet" in result.stderr
    v5p = CliRunner().invoke(main, [*args[:5], "--cluster", "tpu-v5p-pod", "--devices", "64"])
    assert v5p.exit_code == 0 and "ici_data_parallelism" in v5p.stdout
