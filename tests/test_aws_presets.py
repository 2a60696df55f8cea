"""AWS GPU presets on EFA: p5 (H100, EFAv2), p5en (H200, EFAv3), p6-b200 and p6-b300 (EFAv4).

Each builds, its scale-out rate per GPU is the instance's EFA bandwidth as AWS states it divided
by its 8 GPUs (restated here so that a silent edit of clusters.yaml fails), that rate reaches a
group across instances at the EFA link's achieved fraction, and the CLI plans on it.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.topologies.cluster import SCALE_OUT_LEVELS
from clusterplan.topologies.library import _links, build_cluster, resolve_cluster_id

# preset -> (EFA Gb/s per instance, EFA link class, device), from the cited sources:
# aws_efa_inst_types (p5 3,200; P6-B200 8 x 400; P6-B300 6,400) and aws_p5_page (p5en 3,200 EFAv3)
AWS = {
    "aws-p5": (3200, "efa_v2", "h100-sxm5-80gb"),
    "aws-p5en": (3200, "efa_v3", "h200-sxm-141gb"),
    "aws-p6-b200": (3200, "efa_v4", "b200"),
    "aws-p6-b300": (6400, "efa_v4", "b300"),
}
GPUS_PER_INSTANCE = 8


def _nic_bytes_per_s(cluster, rank: int) -> list[float]:
    g = cluster.graph
    return [d["bytes_per_s"] for _, _, d in g.edges(rank, data=True) if d["level"] in SCALE_OUT_LEVELS]


@pytest.mark.parametrize("preset", sorted(AWS))
def test_aws_preset_builds_with_its_instance(preset):
    c = build_cluster(preset, num_devices=32)
    _, _, device = AWS[preset]
    assert c.num_devices == 32 and c.devices_per_node == GPUS_PER_INSTANCE and c.device.id == device
    assert all("<http" in s for s in c.sources)
    assert build_cluster(preset).num_devices == c.reference_size


@pytest.mark.parametrize("preset", sorted(AWS))
def test_aws_scale_out_per_gpu_is_the_cited_efa_rate(preset):
    gbit_per_instance, link, _ = AWS[preset]
    per_gpu_bytes_per_s = gbit_per_instance * 1e9 / 8 / GPUS_PER_INSTANCE
    c = build_cluster(preset, num_devices=16)
    for rank in range(16):  # one EFA port per GPU into its rail leaf
        assert _nic_bytes_per_s(c, rank) == [pytest.approx(per_gpu_bytes_per_s)]
    fraction = _links()[link].achieved_fraction
    across = c.group_profile([0, 8])  # the same GPU slot of two instances: one EFA port each
    assert across.inter_bytes_per_s == pytest.approx(per_gpu_bytes_per_s * fraction)


def test_efa_calibration_is_marked_assumed():
    """No published EFA busbw pins the fraction (docs/calibration-sources.md): the data says so."""
    for link in {link for _, link, _ in AWS.values()}:
        assert "unvalidated: assumed" in _links()[link].note, link


@pytest.mark.parametrize("alias,preset", [("p5.48xlarge", "aws-p5"), ("p5en", "aws-p5en"),
                                          ("p6-b200.48xlarge", "aws-p6-b200"), ("p6-b300", "aws-p6-b300")])
def test_instance_type_names_are_aliases(alias, preset):
    assert resolve_cluster_id(alias) == preset


def test_plan_on_aws_p5_through_the_cli():
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "aws-p5", "--devices", "64"])
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == 0, result.stderr
    assert "aws-p5" in result.stdout and "step time" in result.stdout


def test_assumed_efa_calibration_is_printed_as_unvalidated():
    """A link class whose fraction and latency are assumed (note: unvalidated) says so in every plan
    on the presets that use it; measured links (InfiniBand NDR) add no line."""
    from clusterplan.cost.layout import Job
    from clusterplan.planner.caveats import caveats
    from clusterplan.topologies.library import build_cluster
    job = Job(global_batch_size=64, seq_len=4096)
    aws = caveats(job, build_cluster("aws-p5", num_devices=64))["unvalidated"]
    assert any("efa_v2 links' achieved bandwidth and latency are assumed" in line for line in aws)
    dgx = caveats(job, build_cluster("dgx-h100-superpod", num_devices=64))["unvalidated"]
    assert not any("links' achieved bandwidth" in line for line in dgx)
