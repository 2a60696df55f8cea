"""Per-rank layers by kind and the activations each rank holds in flight (cost.stages), checked
against a direct simulation of Megatron-Core's interleaved 1F1B schedule; and the rank whose peak
binds (issue 41: NVIDIA's own DeepSeek-V3 recipe on 256 GB200 was called "does not fit")."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.stages import inflight, rank_layers
from clusterplan.cost.step import inflight_layers


def _simulate(pp: int, vp: int, m: int, n: int, rank: int) -> list[Counter]:
    """Chunk passes in flight on ``rank`` after each steady-state forward, by brute force: forwards
    run the chunks in groups of ``n`` micro-batches, backwards the same groups in reverse chunk order."""
    def chunk(k: int, backward: bool) -> tuple[int, int]:
        j = (k // n) % vp
        return (vp - 1 - j if backward else j), (k // (n * vp)) * n + k % n
    total = m * vp
    warm = min(total, 2 * (pp - rank - 1) + (vp - 1) * n)
    held = [chunk(k, False) for k in range(warm)]
    moments = []
    for step, f in enumerate(range(warm, total)):
        held.append(chunk(f, False))
        moments.append(Counter(j for j, _ in held))
        held.remove(chunk(step, True))
    return moments or [Counter(j for j, _ in held)]


@pytest.mark.parametrize("pp,vp,m", [(p, v, m) for p, v, m in itertools.product((2, 3, 4, 8), (2, 4), (8, 16, 64))
                                      if m % p == 0])
def test_inflight_peak_matches_the_schedule(pp, vp, m):
    for rank in range(pp):
        layers = rank_layers(61, 3, pp, vp, rank)
        moments = _simulate(pp, vp, m, pp, rank)
        full = max(sum(c.values()) for c in moments)
        pairs = {(sum(c[j] * d for j, d in enumerate(layers.dense)),
                  sum(c[j] * (s - d) for j, (s, d) in enumerate(zip(layers.sizes, layers.dense))))
                 for c in moments if sum(c.values()) == full}
        got = inflight(layers, pp, vp, m, pp, rank)
        for a_dense, a_moe in ((1.0, 2.0), (2.0, 1.0), (1.0, 1.0), (0.0, 1.0)):
            assert got.bytes(a_dense, a_moe) == pytest.approx(max(d * a_dense + e * a_moe for d, e in pairs))


def test_inflight_at_full_occupancy_is_the_count_at_every_larger_batch():
    """The cap that lets a sweep over the batch share one cached answer (``_full_occupancy``) changes
    nothing: every micro-batch count gives what the schedule's own count gives without the cap, for
    1F1B, interleaving with and without micro-batch groups, and the named schedules."""
    from clusterplan.cost.stages import _inflight
    for pp, vp, group, schedule in itertools.product((2, 3, 4, 8), (1, 2, 4), (None, 2, 5), ("", "zb1p", "zbv", "looped")):
        for rank, m in itertools.product(range(pp), range(1, 70)):
            layers = rank_layers(61, 3, pp, vp, rank)
            assert inflight(layers, pp, vp, m, group, rank, schedule) == _inflight.__wrapped__(
                layers, pp, vp, m, group, rank, schedule), (pp, vp, group, schedule, rank, m)


@pytest.mark.parametrize("layers,pp,vp,m", [(64, 4, 2, 32), (96, 8, 4, 12), (80, 4, 1, 64), (32, 2, 4, 8)])
def test_one_kind_holds_what_the_schedule_formula_says(layers, pp, vp, m):
    """A model of one layer kind: the first and last ranks' layers in flight are the in-flight counts
    the cost model always used (Korthikanti et al.'s interleaved warm-up)."""
    first, last = inflight_layers(layers, pp, vp, m)
    assert inflight(rank_layers(layers, 0, pp, vp, 0), pp, vp, m, pp, 0).layers == first
    assert inflight(rank_layers(layers, 0, pp, vp, pp - 1), pp, vp, m, pp, pp - 1).layers == last


def test_dense_layers_sit_on_the_first_rank():
    """DeepSeek-V3's three dense layers: rank 0's first chunk; every other rank all MoE."""
    assert rank_layers(61, 3, 4, 4, 0).dense == (3, 0, 0, 0)
    assert all(rank_layers(61, 3, 4, 4, r).num_dense == 0 for r in (1, 2, 3))
    assert rank_layers(61, 3, 1, 1, 0).num_dense == 3 and rank_layers(61, 3, 1, 1, 0).layers == 61


def test_nvidias_deepseek_v3_recipe_on_256_gb200_fits():
    """Megatron-Bridge 25.11's DeepSeek-V3 BF16 recipe on 256 GB200 (family_runs.yaml
    mbridge2511-dsv3-256gb200-bf16) trained; averaging the light dense layers into every rank's
    in-flight activations and charging rank 1 the vocabulary matrix called it 11.7 GiB over."""
    out = CliRunner().invoke(main, [
        "evaluate", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--devices", "256", "--domain-devices", "64",
        "--global-batch", "4096", "--precision", "bf16",
        "--layout", "tp=1,pp=4,dp=64,ep=64,vp=4,mbs=1,zero=1,recompute=selective,recompute_modules=mla_up_proj"])
    assert out.exit_code == 0, out.output
    assert "DOES NOT FIT" not in out.stdout and "fits:" in out.stdout
