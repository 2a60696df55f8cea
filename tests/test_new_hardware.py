"""Issue 10 item 1: B300/GB300, MI325X/MI355X, Trainium2, Graphcore Bow, Tenstorrent, Dojo, SN40L.

Every new preset builds at its reference size with the graph schema, plans llama3-8b and llama3-70b
(exit 0, or 3 with a reason), 2D meshes are priced from the graph at half a torus ring's bandwidth,
and only devices with a cited matmul measurement claim a validated efficiency.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.planner.inputs import build_job
from clusterplan.models.errors import InfeasibleError
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.topologies import builders
from clusterplan.topologies.cluster import SCALE_OUT_LEVELS, SCALE_UP_LEVELS
from clusterplan.topologies.library import build_cluster, load_device

NEW_PRESETS = ["dgx-b300-superpod", "gb300-nvl72", "mi355x-cluster", "trn2-cluster", "graphcore-pod",
               "tenstorrent-galaxy", "dojo-exapod", "sambanova-rack"]
REFERENCE = {"dgx-b300-superpod": 1024, "gb300-nvl72": 576, "mi355x-cluster": 1024, "trn2-cluster": 1024,
             "graphcore-pod": 64, "tenstorrent-galaxy": 32, "dojo-exapod": 3000, "sambanova-rack": 16}
# device id -> whether a cited GEMM benchmark measured it (ml-engineering MAMF table at 744d01e)
NEW_DEVICES = {"b300": True, "gb300": False, "mi325x": True, "mi355x": True, "trainium2": False,
               "graphcore-bow": False, "tenstorrent-wormhole": False, "tenstorrent-blackhole": False,
               "dojo-d1": False, "sambanova-sn40l": False}


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_new_preset_builds_at_reference_size(preset):
    c = build_cluster(preset)
    assert c.num_devices == c.reference_size == REFERENCE[preset]
    g = c.graph
    devices = [n for n, a in g.nodes(data=True) if a.get("kind") == "device"]
    assert sorted(devices) == list(range(c.num_devices))
    assert all(g.nodes[r]["domain"] == r // c.domain_size for r in devices)
    for u, v, d in g.edges(data=True):
        assert d["bytes_per_s"] > 0 and d["level"] in SCALE_UP_LEVELS | SCALE_OUT_LEVELS, (u, v, d)
    assert all(g.degree(r) > 0 for r in devices)
    assert all("<http" in s for s in c.sources) and all("<http" in s for s in c.device.sources)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b"])
@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_new_preset_plans_or_says_why(preset, model):
    """What ``plan --model M --cluster P`` runs (the CLI's default job), through the Python API: a
    plan (exit 0) or an InfeasibleError with its reason (exit 3). The CLI's exit-3 hint searches
    larger clusters, which is slow on SRAM machines, so the CLI itself is exercised once below."""
    cluster = build_cluster(preset)
    job = build_job(model, get_model(model), cluster, None, None, None, None)[0]
    try:
        result = plan(get_model(model), job, cluster, SearchOptions(top_k=0))
    except InfeasibleError as err:
        assert str(err) and err.rejections, preset
        return
    assert result.best.step_time_s > 0 and result.best.mfu <= cluster.device.matmul_ceiling(job.precision) + 1e-9


@pytest.mark.parametrize("preset", ["trn2-cluster", "tenstorrent-galaxy"])
def test_new_preset_through_the_cli(preset):
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", preset])
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == 0, result.stderr
    assert "step time" in result.stdout


def _grid(wrap: bool) -> builders.Grid:
    link = builders.Link(achieved_fraction=1.0, latency_s=1e-6)
    return builders.Grid(shape=(4, 8), wraparound=(wrap, wrap), link_bytes_per_s=(100e9, 100e9), link=link)


def test_mesh_ring_is_half_the_torus_ring():
    """A ring over one axis of k chips: a torus drives both links per chip, a mesh line one."""
    from clusterplan.topologies.cluster import Cluster

    device = load_device("tenstorrent-blackhole")
    ft = builders.FatTree(nic_bytes_per_s=100e9, link=builders.Link(achieved_fraction=1.0, latency_s=2e-6),
                          nodes_per_su=8, switch_radix=64)
    profiles = {}
    for wrap in (True, False):
        fab = builders.build_grid(device, 32, grid=_grid(wrap), devices_per_node=32, fat_tree=ft)
        c = Cluster(id=f"g{wrap}", name="g", family="grid", device=device, num_devices=32,
                    domain_size=fab.domain_size, devices_per_node=32, graph=fab.graph, torus_shape=fab.torus_shape)
        profiles[wrap] = (c.strided_profile(4, 8), c.strided_profile(8, 1))  # axis x (4 chips), axis y (8 chips)
    for torus, mesh in zip(profiles[True], profiles[False]):
        assert mesh.intra_bytes_per_s == pytest.approx(torus.intra_bytes_per_s / 2)
        assert torus.torus_wraparound and not mesh.torus_wraparound and mesh.torus_axes == 1


def test_presets_price_their_grids_from_the_graph():
    galaxy = build_cluster("tenstorrent-galaxy")           # 4x8 mesh, no wraparound
    link = 0.2 * galaxy.device.scale_up_bytes_per_s
    along_x = galaxy.strided_profile(4, 8)
    assert along_x.intra_bytes_per_s == pytest.approx(link) and not along_x.torus_wraparound
    trn2 = build_cluster("trn2-cluster", num_devices=64)   # 4x4x4 torus: ring axis x, instance torus y, z
    assert trn2.torus_shape == (4, 4, 4)
    torus_y = trn2.strided_profile(4, 4)
    assert torus_y.torus_wraparound and torus_y.intra_bytes_per_s == pytest.approx(2 * 0.2 * 640e9)
    ring_x = trn2.strided_profile(4, 16)
    assert ring_x.torus_wraparound and ring_x.intra_bytes_per_s == pytest.approx(2 * 0.1 * 640e9)
    assert build_cluster("trn2-cluster", num_devices=16).torus_shape == (1, 4, 4)  # one instance
    tile = build_cluster("dojo-exapod", num_devices=25)
    assert tile.torus_shape == (5, 5) and not tile.strided_profile(5, 1).torus_wraparound
    two_tiles = build_cluster("dojo-exapod", num_devices=50).strided_profile(2, 25)
    assert two_tiles.num_domains == 2 and two_tiles.inter_bytes_per_s > 0


@pytest.mark.parametrize("device_id", sorted(NEW_DEVICES))
def test_efficiency_validated_only_where_measured(device_id):
    d = load_device(device_id)
    assert d.efficiency_validated is NEW_DEVICES[device_id], d.gemm.source
    assert d.sources and all("<http" in s for s in d.sources)
    assert d.peak("bf16") > 0 and d.memory_bytes > 0


def test_memory_tiers_load_in_si():
    sn40l = load_device("sambanova-sn40l")
    assert sn40l.memory_bytes == 64e9 and sn40l.memory_kind == "hbm"
    tiers = {t.name: t for t in sn40l.memory_tiers}
    assert tiers["ddr"].capacity_bytes == 1.5e12 and tiers["ddr"].bytes_per_s == 100e9
    bow = load_device("graphcore-bow")
    assert bow.memory_kind == "sram" and bow.memory_bytes == 0.9e9
    assert bow.memory_tiers[0].name == "streaming" and bow.memory_tiers[0].bytes_per_s is None
    assert load_device("b300").memory_tiers == ()


def test_mi325x_runs_on_the_mi300x_fabric():
    c = build_cluster("mi300x-cluster", num_devices=16, device="mi325x")
    assert c.device.id == "mi325x" and c.device.memory_bytes == 256 * 2**30
    assert c.graph.edges[0, 1]["level"] == "xgmi"
