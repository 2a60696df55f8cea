"""Tests of topologies/: the device catalogue, the preset library, the builders' graph schema and
the fabric questions asked of the graph (Cluster.group_profile)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clusterplan.models.errors import SpecError

REPO = Path(__file__).resolve().parents[1]
from clusterplan.topologies.cluster import SCALE_OUT_LEVELS, SCALE_UP_LEVELS, size_step
from clusterplan.topologies.library import (
    build_cluster, list_clusters, list_devices, load_cluster_file, load_device, resolve_cluster_id,
)

# The minimum catalogue (shared/validation/README.md).
DEVICE_IDS = [
    "v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h100-sxm5-96gb",
    "h800-sxm5-80gb", "h200-sxm-141gb", "b200", "gb200", "mi250x", "mi300x", "gaudi2", "gaudi3",
    "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "cerebras-wse3", "groq-lpu",
]
PRESET_IDS = [
    "dgx-a100-superpod", "dgx-h100-superpod", "dgx-b200-superpod", "gb200-nvl72", "hgx-h800",
    "mi300x-cluster", "gaudi2-cluster", "gaudi3-cluster", "tpu-v4-pod", "tpu-v5e-pod", "tpu-v5p-pod",
    "tpu-v6e-pod", "cerebras-cs3-cluster", "groq-rack",
]
SMALL_SIZES = {
    "dgx-a100-superpod": 16, "dgx-h100-superpod": 16, "dgx-b200-superpod": 8, "gb200-nvl72": 8,
    "hgx-h800": 16, "mi300x-cluster": 16, "gaudi2-cluster": 16, "gaudi3-cluster": 8, "tpu-v4-pod": 8,
    "tpu-v5e-pod": 4, "tpu-v5p-pod": 64, "tpu-v6e-pod": 8, "cerebras-cs3-cluster": 1, "groq-rack": 8,
}
# Calibration constants of clusters.yaml, restated so that a silent edit fails a test.
NVLINK4 = 370 / 450      # nccl #1455
NDR = 0.94               # 47/50, nccl-tests #290
XGMI = 0.698             # 312.9/448, ml-engineering


def _devices(cluster):
    return [n for n, d in cluster.graph.nodes(data=True) if d.get("kind") == "device"]


# ---- devices ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device_id", DEVICE_IDS)
def test_every_device_loads_with_positive_figures(device_id):
    d = load_device(device_id)
    assert d.id == device_id
    assert d.peak("bf16") > 0 and all(v > 0 for v in d.peak_flops_per_s.values())
    assert d.memory_bytes > 0 and d.memory_bytes_per_s > 0
    assert 0 < d.memory_efficiency <= 1 and 0 < d.gemm.large <= 1
    assert d.kernel_overhead_s >= 0 and d.scale_up_bytes_per_s >= 0 and d.scale_out_bytes_per_s > 0
    assert d.power_w is None or d.power_w > 0
    # a URL, or a measurement file this repository ships (benchmarks/results/, from benchmarks/gpu_probe.py)
    assert d.sources and all("<http" in s or _shipped(s) for s in d.sources), \
        "every source id must resolve to a URL or a shipped measurement file"


def _shipped(source: str) -> bool:
    path = source.rsplit("<", 1)[-1].rstrip(">")
    return path.startswith("benchmarks/results/") and (REPO / path).is_file()


def test_catalogue_lists_every_id_once():
    ids = [d.id for d in list_devices()]
    assert sorted(ids) == sorted(set(ids)) and set(DEVICE_IDS) <= set(ids)


def test_units_converted_once_at_load():
    h100 = load_device("h100-sxm5-80gb")
    assert h100.memory_bytes == 81559 * 2**20            # nvidia-smi MiB, not decimal GB
    assert h100.scale_up_bytes_per_s == 450e9 and h100.scale_out_bytes_per_s == 400e9 / 8
    assert h100.peak("fp8") == pytest.approx(1978.9e12)
    assert load_device("a100-sxm4-80gb").memory_bytes == 80 * 2**30
    assert load_device("cerebras-wse3").memory_kind == "sram"
    assert load_device("cerebras-wse3").memory_bytes == 44e9
    assert load_device("groq-lpu").memory_bytes == 220 * 2**20
    assert load_device("h800-sxm5-80gb").scale_up_bytes_per_s == 200e9   # 8 NVLink links
    assert load_device("v100-sxm2-32gb").peak("bf16") == 125e12          # falls back to fp16


def test_one_calibration_constant_per_family():
    by_family: dict[str, set] = {}
    for d in list_devices():
        by_family.setdefault(d.family, set()).add((d.memory_efficiency, d.kernel_overhead_s))
    assert all(len(v) == 1 for v in by_family.values()), by_family


def test_tail_effect_curve_is_measured_on_hopper_borrowed_on_nvidia_and_checked():
    """The GEMM slowdown beside an NCCL-shaped kernel (calibration comm_kernel_slowdown): measured on
    Hopper, borrowed by Ampere and Blackwell (their plans say so), absent elsewhere; a curve with a
    repeated share or a falling slowdown is refused."""
    from pydantic import ValidationError

    from clusterplan.topologies.library import CalibrationEntry
    h100, a100, b200 = (load_device(d) for d in ("h100-sxm5-80gb", "a100-sxm4-80gb", "b200"))
    assert h100.comm_kernel_slowdown and h100.comm_kernel_slowdown_measured
    assert a100.comm_kernel_slowdown == b200.comm_kernel_slowdown == h100.comm_kernel_slowdown
    assert not a100.comm_kernel_slowdown_measured and not b200.comm_kernel_slowdown_measured
    assert not load_device("tpu-v5p").comm_kernel_slowdown
    base = dict(memory_efficiency=0.8, memory_efficiency_source="x", kernel_overhead_s=1e-6, kernel_overhead_source="x")
    for curve in ([[0.1, 0.2], [0.1, 0.3]], [[0.1, 0.3], [0.2, 0.2]], [[1.5, 0.1]]):
        with pytest.raises(ValidationError, match="comm_kernel_slowdown"):
            CalibrationEntry(**base, comm_kernel_slowdown=curve)


def test_device_lookup_by_name_is_case_insensitive():
    assert load_device("NVIDIA H100 SXM5 80GB").id == "h100-sxm5-80gb"
    assert load_device("H100-SXM5-80GB").id == "h100-sxm5-80gb"


# ---- presets and the graph schema --------------------------------------------------------------
def test_preset_ids_and_aliases():
    rows = {row.id: row for row in list_clusters()}
    assert set(PRESET_IDS) <= set(rows)
    assert resolve_cluster_id("dgx-superpod") == "dgx-h100-superpod"
    for row in rows.values():
        assert row.reference_size > 0 and row.description and row.name
        assert load_device(row.device).family == row.device_family


def _check_schema(cluster):
    g = cluster.graph
    ranks = _devices(cluster)
    assert sorted(ranks) == list(range(cluster.num_devices))
    for r in ranks:
        attrs = g.nodes[r]
        assert isinstance(attrs["domain"], int) and attrs["domain"] == r // cluster.domain_size
        if cluster.torus_shape is not None:
            assert len(attrs["coord"]) == len(cluster.torus_shape)
    for n, attrs in g.nodes(data=True):
        if attrs.get("kind") != "device":
            assert isinstance(n, str) and attrs["kind"] in ("switch", "host") and attrs["level"]
            if attrs.get("in_network_reduction"):
                assert 0 < attrs["nir_fraction"] <= 1
    for u, v, d in g.edges(data=True):
        assert d["bytes_per_s"] > 0 and d["latency_s"] >= 0, (u, v, d)
        assert d["level"] in SCALE_UP_LEVELS | SCALE_OUT_LEVELS, (u, v, d)
        assert 0 < d["achieved_fraction"] <= 1, (u, v, d)
    assert all(g.degree(r) > 0 for r in ranks)


@pytest.mark.parametrize("preset_id", PRESET_IDS)
def test_every_preset_builds_at_reference_size(preset_id):
    cluster = build_cluster(preset_id)
    assert cluster.num_devices == cluster.reference_size
    assert len(_devices(cluster)) == cluster.reference_size
    _check_schema(cluster)


@pytest.mark.parametrize("preset_id", PRESET_IDS)
def test_every_preset_builds_at_a_small_size(preset_id):
    cluster = build_cluster(preset_id, num_devices=SMALL_SIZES[preset_id])
    assert cluster.num_devices == SMALL_SIZES[preset_id]
    _check_schema(cluster)
    profile = cluster.group_profile(range(min(cluster.num_devices, cluster.domain_size)))
    assert profile.num_domains == 1


def test_num_nodes_counts_hosts():
    assert build_cluster("dgx-h100-superpod", num_nodes=4).num_devices == 32
    assert build_cluster("gb200-nvl72", num_nodes=18).num_devices == 72
    assert build_cluster("tpu-v5p-pod", num_nodes=16).num_devices == 64


# ---- group_profile on each fabric --------------------------------------------------------------
def test_dgx_h100_node_gets_nvlink_and_nvls():
    c = build_cluster("dgx-h100-superpod", num_devices=64)
    p = c.group_profile(range(8))
    assert (p.num_domains, p.ranks_per_domain) == (1, 8)
    assert p.intra_bytes_per_s == pytest.approx(450e9 * NVLINK4, rel=1e-3)
    assert p.intra_in_network_reduction and p.intra_nir_bytes_per_s == pytest.approx(450e9 * 0.611)
    assert p.intra_latency_s == pytest.approx(1.9e-6)          # NCCL NVLink ring LL128 step


def test_dp_group_of_stride_8_inside_one_su_gets_one_nic():
    c = build_cluster("dgx-h100-superpod", num_devices=256)
    p = c.group_profile([0, 8, 16, 24])
    assert (p.num_domains, p.ranks_per_domain) == (4, 1)
    assert p.inter_bytes_per_s == pytest.approx(50e9 * NDR)
    assert p.intra_bytes_per_s == 0 and p.inter_latency_s == pytest.approx(4e-6)


def test_oversubscription_halves_bandwidth_across_sus_but_not_inside_a_leaf():
    plain = build_cluster("dgx-h100-superpod", num_devices=512)
    over = build_cluster("dgx-h100-superpod", num_devices=512, oversubscription=2)
    across, inside = [0, 256], [0, 8]                      # SU 0 and SU 1 on rail 0; two nodes of SU 0
    assert over.oversubscription == 2
    assert plain.group_profile(across).inter_bytes_per_s == pytest.approx(50e9 * NDR)
    assert over.group_profile(across).inter_bytes_per_s == pytest.approx(50e9 * NDR / 2)
    assert over.group_profile(inside).inter_bytes_per_s == pytest.approx(50e9 * NDR)


def test_mi300x_group_gets_only_the_links_to_its_members():
    c = build_cluster("mi300x-cluster", num_devices=16)
    link = 64e9 * XGMI
    assert c.group_profile([0, 1]).intra_bytes_per_s == pytest.approx(link)
    assert c.group_profile([0, 1, 2, 3]).intra_bytes_per_s == pytest.approx(3 * link)
    assert c.group_profile(range(8)).intra_bytes_per_s == pytest.approx(7 * link)
    assert c.group_profile([0, 8]).inter_bytes_per_s == pytest.approx(50e9 * NDR)


@pytest.mark.parametrize("preset_id, pair_bytes, scale_out_bytes", [
    ("gaudi2-cluster", 37.5e9, 37.5e9), ("gaudi3-cluster", 75e9, 75e9),
])
def test_gaudi_three_ports_per_peer_and_three_scale_out_ports(preset_id, pair_bytes, scale_out_bytes):
    c = build_cluster(preset_id, num_devices=32)
    assert c.group_profile([0, 1]).intra_bytes_per_s == pytest.approx(pair_bytes)
    assert c.group_profile(range(8)).intra_bytes_per_s == pytest.approx(7 * pair_bytes)
    assert c.graph.degree(0) == 7 + 3                      # 7 peers + 3 leaves
    assert c.group_profile([0, 8]).inter_bytes_per_s == pytest.approx(scale_out_bytes)


def test_tpu_v5e_wraparound_only_on_a_full_axis():
    c = build_cluster("tpu-v5e-pod")
    assert c.torus_shape == (16, 16)
    full = c.group_profile(range(16))
    part = c.group_profile(range(4))
    assert full.torus_wraparound and full.torus_axes == 1
    assert not part.torus_wraparound and part.torus_axes == 1
    assert full.intra_bytes_per_s == pytest.approx(2 * 50e9 * 0.9)   # both ring directions
    assert part.intra_bytes_per_s == pytest.approx(50e9 * 0.9)       # a line: one link's worth
    # Where the line sits on the axis must not matter (the end chip has one link, not two).
    assert c.group_profile(range(4, 8)).intra_bytes_per_s == part.intra_bytes_per_s
    assert c.group_profile([0, 1]).intra_bytes_per_s == c.group_profile([5, 6]).intra_bytes_per_s
    assert c.group_profile(range(256)).torus_axes == 2


def test_tpu_slice_shapes_and_multislice():
    assert build_cluster("tpu-v5p-pod", num_devices=64).torus_shape == (4, 4, 4)
    assert build_cluster("tpu-v5p-pod", num_devices=128).torus_shape == (4, 4, 8)
    assert build_cluster("tpu-v4-pod").torus_shape == (16, 16, 16)
    v4_small = build_cluster("tpu-v4-pod", num_devices=8)
    assert v4_small.torus_shape == (2, 2, 2) and not v4_small.group_profile(range(8)).torus_wraparound
    multi = build_cluster("tpu-v5e-pod", num_devices=512)
    assert multi.num_domains == 2 and multi.torus_shape == (16, 16)
    dcn = multi.group_profile([0, 256])
    assert dcn.num_domains == 2 and dcn.inter_bytes_per_s == pytest.approx(25e9 / 8)


# ---- torus traversals: which torus axes a group of ranks lands on -------------------------------
@pytest.mark.parametrize("preset_id,num_devices", [("tpu-v5p-pod", 128), ("tpu-v5e-pod", 512), ("tpu-v4-pod", 8),
                                                   ("tpu-v5e-pod", 32)])
def test_every_traversal_maps_ranks_onto_chips_one_to_one(preset_id, num_devices):
    """Each traversal is a bijection of ranks onto devices that keeps every rank in its slice."""
    import itertools

    c = build_cluster(preset_id, num_devices=num_devices)
    ranks = list(range(c.num_devices))
    assert c.placed("") is c and c.placed(c.default_traversal) is c
    for t in map("".join, itertools.permutations(c.torus_axis_names)):
        placed = c.placed(t)
        mapping = placed.rank_to_device.tolist() if placed is not c else ranks
        assert sorted(mapping) == ranks, t
        assert all(d // c.domain_size == r // c.domain_size for r, d in enumerate(mapping)), t
        assert c.placed(t) is placed  # one view per traversal: cost caches key on it
    # the fastest axis of the traversal is walked first: ranks 0..3 of x-first are chips along x
    if c.torus_shape == (4, 4, 8):
        coords = [c.graph.nodes[d]["coord"] for d in c.placed("xyz").devices(range(4))]
        assert coords == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]


def test_tp4_on_the_full_x_ring_gets_twice_a_z_stretch():
    """On a 4x4x8 v5p slice (every axis wraps: whole 4x4x4 cubes) device ids put ranks 0-3 on half
    of z, a line: one ICI link's worth. Laid along x they close the 4-chip ring and drive both of
    its links: 2 x 100 GB/s x 0.9 achieved (How to Scale Your Model, pt 3)."""
    c = build_cluster("tpu-v5p-pod", num_devices=128)
    assert c.torus_shape == (4, 4, 8)
    link = 100e9 * 0.9
    on_z, on_x = c.group_profile(range(4)), c.placed("xyz").group_profile(range(4))
    assert on_z.intra_bytes_per_s == pytest.approx(link) and not on_z.torus_wraparound
    assert on_x.intra_bytes_per_s == pytest.approx(2 * link) and on_x.torus_wraparound
    assert c.torus_span(range(4)) == [("z", 4, 8, False)]
    assert c.placed("xyz").torus_span(range(4)) == [("x", 4, 4, True)]
    # tp=16 row-major: the whole z ring (2 links) and a y line (1);
    # x-first: the two whole 4-rings x and y (2 + 2)
    assert c.group_profile(range(16)).intra_bytes_per_s == pytest.approx(3 * link)
    assert c.placed("xyz").group_profile(range(16)).intra_bytes_per_s == pytest.approx(4 * link)


def test_congruent_traversals_are_kept_once():
    assert build_cluster("tpu-v5p-pod", num_devices=64).traversals() == ("zyx",)  # 4x4x4: all alike
    assert build_cluster("tpu-v5p-pod", num_devices=128).traversals() == ("zyx", "yzx", "yxz")  # 4x4x8
    assert build_cluster("tpu-v5e-pod").traversals() == ("yx",)  # 16x16
    assert build_cluster("tpu-v5e-pod", num_devices=32).traversals() == ("yx", "xy")  # 4x8, no wraparound
    assert build_cluster("dgx-h100-superpod", num_devices=16).traversals() == ("",)


@pytest.mark.parametrize("preset_id,traversal,words", [
    ("tpu-v5p-pod", "xy", ["'xy'", "x, y, z", "4x4x8", "@zyx"]),
    ("tpu-v5e-pod", "xyz", ["'xyz'", "x, y", "@yx"]),
    ("dgx-h100-superpod", "xyz", ["'xyz'", "not a torus"]),
])
def test_a_traversal_must_fit_the_cluster(preset_id, traversal, words):
    c = build_cluster(preset_id, num_devices=128 if preset_id == "tpu-v5p-pod" else 16)
    with pytest.raises(SpecError) as err:
        c.placed(traversal)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_gb200_nvl72_domain_and_scale_out():
    c = build_cluster("gb200-nvl72", num_devices=144)
    assert c.num_domains == 2 and c.devices_per_node == 4
    p = c.group_profile(range(72))
    assert p.intra_bytes_per_s == pytest.approx(900e9 * 0.755) and p.intra_in_network_reduction
    assert c.group_profile([0, 72]).inter_bytes_per_s == pytest.approx(50e9 * NDR)


def test_sram_machines():
    cs3 = build_cluster("cerebras-cs3-cluster", num_devices=4)
    assert cs3.weight_streaming and cs3.domain_size == 1
    p = cs3.group_profile(range(4))
    assert p.num_domains == 4 and p.inter_bytes_per_s == pytest.approx(150e9) and p.inter_in_network_reduction
    groq = build_cluster("groq-rack", num_devices=128)
    assert groq.group_profile([0, 1]).intra_bytes_per_s == pytest.approx(28e9)
    assert groq.group_profile([0, 100]).inter_bytes_per_s == pytest.approx(28e9)


def test_16384_gpu_superpod_builds():
    """The structure of the largest preset size (its build time is a benchmark figure, not an
    assertion: `benchmarks/search_speed.py` prints it as "graph s")."""
    c = build_cluster("dgx-h100-superpod", num_devices=16384)
    assert c.num_nodes == 2048 and len(_devices(c)) == 16384
    names = [n for n in c.graph if isinstance(n, str)]
    assert sum(n.startswith("nvsw/") for n in names) == 2048
    assert sum(n.startswith("leaf/") for n in names) == 512          # B200 RA table: 64 SU -> 512 leaves
    assert "core" in c.graph


def test_core_tier_from_16_sus_as_in_the_b200_table():
    eight = build_cluster("dgx-b200-superpod", num_devices=2048)
    sixteen = build_cluster("dgx-b200-superpod", num_devices=4096)
    assert "core" not in eight.graph and "core" in sixteen.graph
    assert sixteen.graph.nodes["core"]["num_switches"] == 64         # RA: 16 SU -> 64 core switches
    assert sum(sixteen.graph.nodes[n]["num_switches"] for n in sixteen.graph if str(n).startswith("spine/")) == 128


def test_preset_with_another_device_of_its_family():
    c = build_cluster("dgx-a100-superpod", num_devices=96, device="a100-sxm4-40gb")
    assert c.device.id == "a100-sxm4-40gb" and c.id == "dgx-a100-superpod"
    h800 = build_cluster("dgx-h100-superpod", num_devices=8, device="h800-sxm5-80gb")
    assert h800.group_profile(range(8)).intra_bytes_per_s == pytest.approx(200e9 * NVLINK4, rel=1e-3)


def test_scale_out_override_replaces_the_nic_rate():
    c = build_cluster("dgx-a100-superpod", num_devices=384, scale_out_gbit_per_s=50)
    assert c.device.scale_out_bytes_per_s == 50e9 / 8
    assert c.group_profile([0, 8]).inter_bytes_per_s == pytest.approx(50e9 / 8 * 0.96)


# ---- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    ({"preset_id": "dgx-h100-superpd"}, ["dgx-h100-superpod", "clusterplan clusters"]),
    ({"preset_id": "dgx-h100-superpod", "device": "h100"}, ["h100-sxm5-80gb", "clusterplan devices"]),
    ({"preset_id": "dgx-h100-superpod", "num_devices": 0}, ["num_devices", "positive"]),
    ({"preset_id": "dgx-h100-superpod", "num_devices": -8}, ["num_devices", "-8"]),
    ({"preset_id": "dgx-h100-superpod", "num_nodes": 0}, ["num_nodes"]),
    ({"preset_id": "dgx-h100-superpod", "num_devices": 12}, ["12", "multiple of 8"]),
    ({"preset_id": "dgx-h100-superpod", "num_devices": 16, "num_nodes": 4}, ["disagrees"]),
    ({"preset_id": "dgx-a100-superpod", "device": "h100-sxm5-80gb"}, ["nvidia-a100", "a100-sxm4-40gb"]),
    ({"preset_id": "tpu-v5e-pod", "num_devices": 100}, ["100", "16x16"]),
    ({"preset_id": "tpu-v5p-pod", "num_devices": 96}, ["96", "4x4x4"]),
    ({"preset_id": "tpu-v5e-pod", "oversubscription": 2}, ["oversubscription", "fat-tree"]),
    ({"preset_id": "dgx-h100-superpod", "oversubscription": 0.5}, ["oversubscription", "from 1 to 64", "0.5"]),
    ({"preset_id": "dgx-h100-superpod", "scale_out_gbit_per_s": 0}, ["scale_out_gbit_per_s"]),
    ({"preset_id": "dgx-h100-superpod", "domain_devices": 8}, ["domain_devices", "nvlink-domain"]),
    ({"preset_id": "gb200-nvl72", "domain_devices": 70}, ["domain_devices", "70", "multiple of the 4"]),
    ({"preset_id": "gb200-nvl72", "domain_devices": 80}, ["domain_devices", "80", "72"]),
])
def test_bad_input_raises_spec_error_naming_the_field(kwargs, words):
    with pytest.raises(SpecError) as err:
        build_cluster(**kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_domain_devices_use_part_of_each_nvl72_rack():
    """256 GPUs as Megatron-Bridge's GB200 executor allocates them (Slurm --segment 16): four
    NVLink domains of 64, each filling 16 of a rack's 18 trays; a 64-GPU group stays on NVLink,
    while at 72 per domain the same group would straddle two racks."""
    whole, part = build_cluster("gb200-nvl72", 256), build_cluster("gb200-nvl72", 256, domain_devices=64)
    assert (whole.domain_size, part.domain_size, part.num_domains) == (72, 64, 4)
    group = range(64, 128)
    assert part.group_profile(group).num_domains == 1 and whole.group_profile(group).num_domains == 2
    assert build_cluster("gb200-nvl72", 288, domain_devices=72).domain_size == 72
    with pytest.raises(SpecError, match="256 is not whole segments of 72 devices"):  # Slurm refuses --segment 18
        build_cluster("gb200-nvl72", 256, domain_devices=72)


def test_a_cluster_file_carries_the_segment_of_each_rack(tmp_path):
    """A cluster file's ``domain_devices`` is the segment Slurm's block topology allocates in each
    NVL72 rack (issue 36): 256 GB200 as 4 racks of 64, as --domain-devices 64 builds them, which the
    command line's value replaces; sizes step by whole segments beyond one."""
    path = tmp_path / "segments.yaml"
    path.write_text("base: gb200-nvl72\nnum_devices: 256\ndomain_devices: 64\n")
    c = load_cluster_file(path)
    assert (c.domain_size, c.num_domains, c.segment_devices) == (64, 4, 64)
    assert c.group_profile(range(64, 128)).num_domains == 1
    assert load_cluster_file(path, num_devices=288, domain_devices=72).domain_size == 72
    assert (size_step(c, 300), size_step(build_cluster("gb200-nvl72", 256), 300)) == (64, 4)


@pytest.mark.parametrize("preset,n", [("gb200-nvl72", 576), ("gb200-nvl72", 288), ("dgx-h100-superpod", 96),
                                      ("dgx-h100-superpod", 128), ("mi300x-cluster", 64)])
def test_groups_said_to_split_alike_do(preset, n):
    """The shortcut that skips listing a communicator's groups (``_splits_alike``) agrees with listing
    them, on the dp, dp x cp and tp x cp groups of every factorization and rank order."""
    import itertools
    import numpy as np
    from clusterplan.cost.layout import Layout
    from clusterplan.topologies.cluster import _progressions, _rank_domains, _splits, _splits_alike, _translates
    cluster = build_cluster(preset, num_devices=n)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    checked = 0
    for tp, cp, dp in itertools.product([1, 2, 3, 4, 6, 8, 16, 32], [1, 2, 4], divisors):
        if n % (tp * cp * dp):
            continue
        for order in ("tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp"):
            layout = Layout(tp=tp, cp=cp, dp=dp, pp=n // (tp * cp * dp), order=order)
            for ranks in (layout.group("dp"), sorted(d + c for d in layout.group("dp") for c in layout.group("cp")),
                          sorted(t + c for t in layout.group("tp") for c in layout.group("cp"))):
                axes = _progressions(tuple(ranks))
                rows = _translates(n, axes) if axes else None
                if axes and rows is not None and _splits_alike(cluster, axes):
                    checked += 1
                    assert len(np.unique(_splits(_rank_domains(cluster)[rows]), axis=0)) == 1, (tp, cp, dp, order)
    assert checked > 20


def test_unknown_device_suggests_close_names():
    with pytest.raises(SpecError, match="did you mean .*b200"):
        load_device("b250")


# ---- cluster files -------------------------------------------------------------------------------------
def test_cluster_file_from_a_base_preset(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text("base: dgx-superpod\nname: Our pod\nnum_nodes: 64\nscale_out: {oversubscription: 2}\n")
    c = load_cluster_file(path)
    assert (c.id, c.name, c.num_devices, c.oversubscription) == ("pod", "Our pod", 512, 2)
    assert c.group_profile([0, 256]).inter_bytes_per_s == pytest.approx(50e9 * NDR / 2)


def test_cluster_file_without_base_with_inline_device_and_link(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(
        "format: clusterplan-cluster/1\n"
        "family: xgmi\ndevices_per_node: 4\nnum_devices: 8\n"
        "scale_up_link: slow_mesh\n"
        "links: {slow_mesh: {achieved_fraction: 0.5, latency_us: 3, source: lab measurement}}\n"
        "scale_out: {nic_gbit_per_s: 100, link: roce_400g, nodes_per_su: 2, switch_radix: 32}\n"
        "device: {id: lab-gpu, name: Lab GPU, vendor: Lab, family: lab, memory_efficiency: 0.8,\n"
        "         kernel_overhead_s: 5.0e-6, peak_tflops: {bf16: 100}, memory_kind: hbm, memory_gib: 48,\n"
        "         memory_gbyte_per_s: 1000, scale_up_gbyte_per_s_per_dir: 90, scale_out_gbit_per_s: 100,\n"
        "         gemm: {large: 0.7, source: lab}}\n"
    )
    c = load_cluster_file(path)
    assert c.device.id == "lab-gpu" and c.num_devices == 8 and c.reference_size == 8
    assert c.group_profile([0, 1]).intra_bytes_per_s == pytest.approx(30e9 * 0.5)


@pytest.mark.parametrize("text, words", [
    ("base: dgx-superpod\nnum_nodes: [2\n", ["line", "cluster file"]),
    ("base: dgx-superpod\nscale_out: {oversubscripton: 2}\n",
     ["scale_out.oversubscripton", "did you mean 'oversubscription'"]),
    ("base: dgx-superpod\nscale_out: {oversubscription: 0.5}\n", ["scale_out.oversubscription", "0.5"]),
    ("base: dgx-superpd\n", ["dgx-h100-superpod", "clusterplan clusters"]),
    ("base: dgx-superpod\nscale_up_link: nvlink9\n", ["nvlink9", "nvlink4_nvswitch"]),
    ("base: dgx-superpod\nnum_devices: 12\n", ["12", "multiple of 8"]),
    ("format: clusterplan-cluster/9\n", ["format", "clusterplan-cluster/1"]),
    ("family: nvswitch\nnum_devices: 8\ndevice: h100-sxm5-80gb\n", ["devices_per_node", "required"]),
    ("family: nvswitch\nnum_devices: 8\ndevices_per_node: 8\ndevice: h100-sxm5-80gb\n",
     ["needs scale_up_link, scale_out"]),
    ("- just a list\n", ["mapping"]),
])
def test_malformed_cluster_files(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_cluster_file(path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_missing_cluster_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_cluster_file(tmp_path / "nope.yaml")


def test_builds_are_cached_and_profiles_reuse_them():
    a = build_cluster("dgx-h100-superpod", num_devices=64)
    assert build_cluster("dgx-superpod", num_devices=64) is a
    assert math.isclose(a.group_profile([0, 8]).inter_bytes_per_s, 50e9 * NDR)
