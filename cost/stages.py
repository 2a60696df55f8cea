"""Which layers each pipeline rank holds, by kind, and what its memory peak holds in flight.

A model's first ``num_dense_layers`` layers are dense and the others MoE (``ModelSpec``). The
pipeline split charges the ranks as ``cost.terms.stage_split`` does: every virtual stage (chunk)
``ceil(L / (pp vp))`` layer slots; with ``head_slots`` the embedding takes a slot of rank 0's first
chunk and the head one of the last rank's last chunk (``stage_split``'s first, middle and last
ranks). Layers fill the chunks in the order Megatron-Core and torchtitan number virtual stages
(rank ``r``'s ``j``-th chunk is virtual stage ``j pp + r``), dense layers first; a slot past the
last layer is charged as a layer of the model's last kind, as the even split charges every rank
its full share.

So DeepSeek-V3's three dense layers all sit in rank 0's first chunk: that rank's micro-batches in
flight hold lighter activations than an all-MoE rank's (a third of the bytes a token leaves in an MoE
layer), and its first chunk has the most micro-batches in flight of any chunk. The memory peak of a
rank is taken over the moments of its steady state at full occupancy (:func:`inflight`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from clusterplan.cost.layout import interleaved_warmup

RANKS = ("first", "second", "last")
"""The ranks whose memory peaks bound every rank's: rank 0 (the most micro-batches in flight, the
embedding, the dense layers), rank 1 (the most in flight among ranks without the vocabulary matrix,
where pp > 2) and the last (the output layer and the logits)."""


@dataclass(frozen=True, slots=True)
class RankLayers:
    """The layer slots a pipeline rank is charged, per chunk, and the dense layers among them."""

    sizes: tuple[int, ...]  # slots per local chunk
    dense: tuple[int, ...]  # dense layers per local chunk
    vocab: bool  # holds the embedding or the output layer

    @property
    def layers(self) -> int:
        return sum(self.sizes)

    @property
    def num_dense(self) -> int:
        return sum(self.dense)


def rank_index(pp: int, which: str) -> int | None:
    """The rank of ``which`` (:data:`RANKS`); None for ``second`` where there is no middle rank."""
    if which == "first":
        return 0
    if which == "last":
        return pp - 1
    return 1 if pp > 2 else None


@lru_cache(maxsize=65536)
def rank_layers(num_layers: int, num_dense: int, pp: int, vp: int, rank: int, head_slots: bool = False,
                last_kind_dense: bool = False) -> RankLayers:
    """Rank ``rank``'s chunks: slots and dense layers (module docstring). ``last_kind_dense``: the
    model's last layers are dense (no MoE layer), so slots past them are charged as dense."""
    sizes = _chunk_sizes(num_layers, pp, vp, head_slots)
    filled, dense = 0, []
    for g in range(pp * vp):
        r, j = g % pp, g // pp
        size = sizes[r][j]
        if r == rank:
            real_dense = max(0, min(num_dense, filled + size) - filled)
            phantom = min(size, max(0, filled + size - num_layers))
            dense.append(real_dense + (phantom if last_kind_dense else 0))
        filled += size
    return RankLayers(tuple(sizes[rank]), tuple(dense), rank in (0, pp - 1))


def _chunk_sizes(num_layers: int, pp: int, vp: int, head_slots: bool) -> list[list[int]]:
    """Slots per rank per local chunk, summing per rank to ``cost.terms.stage_split``'s charges."""
    if not head_slots or pp == 1:
        k = math.ceil(num_layers / (pp * vp))
        return [[k] * vp for _ in range(pp)]
    high = math.ceil((num_layers + 2) / (pp * vp))
    low = (num_layers + 2) // (pp * vp)
    sizes = [[high] * vp for _ in range(pp)]
    sizes[0][0] = high - 1  # the embedding's slot
    sizes[-1] = [low] * vp
    sizes[-1][-1] = low - 1  # the head's slot
    return sizes


@dataclass(frozen=True, slots=True)
class InFlight:
    """Layers' activations a rank holds at its peak, by kind, at up to two moments of its steady
    state: ``(dense, moe)`` pairs. The peak for per-layer bytes ``(a_dense, a_moe)`` is the larger of
    ``dense * a_dense + moe * a_moe`` over the moments (exact: a moment the two do not dominate is
    replaced by their componentwise maximum, an upper bound)."""

    moments: tuple[tuple[int, int], ...]

    def bytes(self, dense_bytes: float, moe_bytes: float) -> float:
        return max(d * dense_bytes + e * moe_bytes for d, e in self.moments)

    @property
    def layers(self) -> int:
        """The most layers in flight at any of the moments."""
        return max(d + e for d, e in self.moments)


def inflight(layers: RankLayers, pp: int, vp: int, m: int, group: int | None, rank: int, schedule: str = "") -> InFlight:
    """The layers ``layers`` (rank ``rank``) holds in flight at its memory peak under 1F1B (``vp`` 1:
    ``min(m, pp - rank)`` micro-batches of every layer, Narayanan et al. 2021) or interleaved 1F1B
    (Megatron-Core's schedule: a warm-up of ``interleaved_warmup`` forwards, then one forward and
    one backward at a time, forwards through the chunks in groups of ``group`` micro-batches and
    backwards through them in reverse; the peak is at full occupancy, over its moments), or the
    ``schedule`` given by name where it holds otherwise (:func:`schedule_inflight`)."""
    return _inflight(layers, pp, vp, min(m, _full_occupancy(pp, vp, m, group, rank, schedule)), group, rank, schedule)


def _full_occupancy(pp: int, vp: int, m: int, group: int | None, rank: int, schedule: str) -> int:
    """The micro-batch count from which on :func:`inflight` no longer depends on it (``m`` itself
    where it always does), so that the counts of a sweep over the batch share one cached answer:
    1F1B holds ``min(m, pp - rank)``; interleaving reaches its full period, ``N vp`` passes after a
    warm-up of ``w`` (``interleaved_warmup``), once ``m vp >= w + 1 + N vp``. The named schedules
    keep ``m``."""
    if schedule_inflight(schedule, pp, vp, 1) is not None:
        return m
    if vp == 1:
        return pp - rank
    n = group or pp
    return -(-(interleaved_warmup(pp, vp, n, rank=rank) + 1 + n * vp) // vp)


@lru_cache(maxsize=65536)
def _inflight(layers: RankLayers, pp: int, vp: int, m: int, group: int | None, rank: int, schedule: str) -> InFlight:
    counts = schedule_inflight(schedule, pp, vp, m)
    if counts is not None:
        return _moments([counts], layers)
    if vp == 1:
        c = min(m, pp - rank)
        return _moments([(c,)], layers)
    n = group or pp
    total = m * vp
    warm = min(total, interleaved_warmup(pp, vp, n, rank=rank))
    if total <= warm + 1:
        return _moments([(m,) * vp], layers)
    period = n * vp
    steps = min(total - warm - 1, period) + 1  # the pattern repeats with the period of the schedule
    counts = []
    for i in range(steps):
        ahead, done = warm + 1 + i, i
        counts.append(tuple(_passes(ahead, j, n, vp) - _passes(done, vp - 1 - j, n, vp) for j in range(vp)))
    return _moments(counts, layers)


def schedule_inflight(schedule: str, pp: int, vp: int, m: int) -> tuple[int, ...] | None:
    """Micro-batches in flight on each local chunk of every rank at its peak, for the schedules whose
    count does not follow 1F1B's or interleaving's warm-up (``cost.stages.inflight``); None for those.
    ZB-V: ``pp`` per chunk, the same activations as 1F1B's first rank on every rank (Qi et al. sec. 6:
    the V keeps memory balanced). DualPipe and DualPipeV: ``pp + 1`` (DeepSeek-V3 Table 2; DualPipe at
    vp 1 by stage, each rank's own and its mirror: :func:`dualpipe_inflight`, what ``cost.step.rank_inflight`` takes). Looped
    (breadth-first): every micro-batch of every chunk, as jax autodiff of MaxText's circular pipeline
    and torchtitan's ``LoopedBFS`` keep them until the backward. ZB-H1 keeps 1F1B's (Qi et al.
    sec. 2.1: the same peak memory)."""
    if schedule == "zbv":
        return (min(m, pp),) * vp
    if schedule in ("dualpipe", "dualpipev"):
        return (min(m, pp + 1),) * vp
    if schedule == "looped":
        return (m,) * vp
    return None


@lru_cache(maxsize=4096)
def dualpipe_inflight(num_layers: int, num_dense: int, pp: int, m: int, rank: int, head_slots: bool = False,
                      last_kind_dense: bool = False) -> InFlight:
    """DualPipe's peak on rank ``rank``: each rank holds stage ``h = min(rank, pp - 1 - rank)`` and its
    mirror ``pp - 1 - h``, and at full occupancy ``pp - h`` micro-batches of the chunk whose direction
    it enters first and ``h + 1`` of the other, ``pp + 1`` in all (DeepSeek-V3 report Table 2).
    Counted from deepseek-ai/DualPipe ``dualpipe.py`` ``step()``: ``2 (pp/2 - h - 1)`` forwards of phase
    0, then ``h + 1`` pairs of phase-0 and phase-1 forwards, then one forward before each backward in
    the main step. The ranks of the second half enter the reverse direction first, whose first stage
    holds the model's first layers: the last rank, like rank 0, holds ``pp`` micro-batches of stage 0
    (with the dense layers) and one of stage ``pp - 1``. ``m``: micro-batches of both directions."""
    h = min(rank, pp - 1 - rank)
    own = rank_layers(num_layers, num_dense, pp, 1, h, head_slots, last_kind_dense)
    mirror = rank_layers(num_layers, num_dense, pp, 1, pp - 1 - h, head_slots, last_kind_dense)
    half = max(1, m // 2)
    first, second = min(half, pp - h), min(half, h + 1)
    dense = first * own.num_dense + second * mirror.num_dense
    moe = first * (own.layers - own.num_dense) + second * (mirror.layers - mirror.num_dense)
    return InFlight(((dense, moe),))


def _passes(k: int, chunk: int, n: int, vp: int) -> int:
    """Passes of local chunk ``chunk`` among the first ``k`` of a schedule that runs the chunks in
    order, ``n`` micro-batches each, round after round (for backwards: pass ``vp - 1 - chunk``)."""
    rounds, rest = divmod(k, n * vp)
    return rounds * n + min(n, max(0, rest - chunk * n))


def _moments(counts: list[tuple[int, ...]], layers: RankLayers) -> InFlight:
    """The ``(dense, moe)`` layer counts over the moments ``counts`` (chunk passes in flight) that
    can hold the peak for some non-negative bytes per layer: the corners of their upper-right hull.
    One or two corners are kept exactly (a constant total in flight gives two at most); more are
    replaced by their componentwise maximum, an upper bound."""
    pairs = {(sum(c * d for c, d in zip(cs, layers.dense)),
              sum(c * (s - d) for c, s, d in zip(cs, layers.sizes, layers.dense))) for cs in counts}
    top = sorted(p for p in pairs if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in pairs))
    hull: list[tuple[int, int]] = []  # dense ascending, moe descending: keep the concave corners
    for p in top:
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) >= 0:
            hull.pop()
        hull.append(p)
    if len(hull) > 2:
        hull = [(max(d for d, _ in hull), max(e for _, e in hull))]
    return InFlight(tuple(hull))


def _cross(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
    """The z of (a - o) x (b - o): >= 0 where ``a`` lies on or below the segment from ``o`` to ``b``."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
