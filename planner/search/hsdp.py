"""Hybrid sharded data parallelism in the search (``Layout.dp_shard``, issue 38 item 2).

``dp_shard=N`` changes the data-parallel terms and the static memory of a (factorization, ZeRO
stage) cell and nothing else (``cost.terms.dp``, ``cost.terms.memory``): the stage's states shard
over N data-parallel ranks instead of all of them, its gathers and reduce-scatters run inside the
group, and the dp/N replicas all-reduce 1/N of the gradients once a step. It trades memory for time
(more states a rank, gathers on a faster tier), so no group dominates another and the choice cannot
be made cell by cell as the parameter gathers' dtype is (``planner.search.gathers``). It is not a
dimension of its own either: the ZeRO axis holds (stage, shard group) pairs, as the expert axis
holds (ep, expert_tp) pairs (``Space.zero_shard``), so every table and both engines read it through
the axis they already have, the data-parallel and static-memory tables priced per pair.

The groups offered (:func:`candidate_group`), per factorization with cp = 1 (hybrid sharding is
priced with cp = ep = 1), for the stages the framework's hybrid sharding runs
(``semantics.dp_shard_stages``), where its profile has it at its date (``features.dp_shard``) and
its search offers it (``semantics.dp_shard_searched``):

* the data-parallel ranks of one scale-up domain at the innermost data-parallel stride (tp x cp):
  one DGX node, one NVL72 rack, one TPU slice; at least 2 (with tp filling a node, two nodes'
  ranks). Each framework puts its shard group on the innermost data-parallel ranks, so a group of
  one domain's ranks keeps its gathers on the scale-up fabric: torchtitan's FSDP2 shards on the
  inner dim of its 2D (replicate, shard) mesh (docs/fsdp.md: "replication on the 0th mesh dim and
  sharding on the 1st"), Megatron-Core's partial distributed optimizer over contiguous
  data-parallel ranks (``features.dp_shard``'s note), and MaxText's base.yml puts the fsdp axis on
  ICI and the data axis on DCN;
* twice that: two domains, where one domain's share of the states does not fit, the gathers' ring
  over half the ranks or fewer.

Each only where it divides dp and is below dp (at dp the layout is the framework's own), and where
it keeps a number of copies other than the framework's own grouping (MaxText already shards inside a
slice: ``cost.terms.zero_replicas``), so no layout is offered twice. Larger groups run their
rings over the scale-out network as sharding over every rank does, keep more states than it and add
the all-reduce across replicas. ``--fix dp_shard=N`` holds any other N
(``planner.search.space.hybrid_space``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from clusterplan.cost.terms import Context, zero_replicas

if TYPE_CHECKING:  # space.py imports this module
    from clusterplan.planner.search.space import Bounds, Space

SHARD_GROUPS = 2
"""Shard groups offered per factorization and stage: one scale-up domain's data-parallel ranks, and two."""


def searched_shards(space: Space, prof, domain_devices: int, bounds: Bounds) -> Space:
    """``space`` with the ZeRO axis extended by the hybrid-sharded pairs (stage, group k) the search
    offers (module docstring), after the framework's own (group 0) so that a tie keeps it; ``space``
    itself where none is offered (held by ``--fix``, validation, not searched by the framework)."""
    if (space.dp_shard[0] or "dp_shard" in bounds.fixed or bounds.allow_unavailable or not prof.has("dp_shard")
            or not prof.profile.dp_shard_searched):
        return space
    stages = tuple(z for z in space.zero_stage if z in prof.profile.dp_shard_stages)
    if not stages:
        return space
    space = replace(space, shard_domain=domain_devices)
    groups = [k for k in range(1, SHARD_GROUPS + 1) if any(candidate_group(space, f, k) for f in space.factorizations)]
    pairs = [(z, k) for k in groups for z in stages]
    if not pairs:
        return replace(space, shard_domain=0)
    return replace(space, zero_stage=space.zero_stage + tuple(z for z, _ in pairs),
                   zero_shard=(0,) * len(space.zero_stage) + tuple(k for _, k in pairs))


def shard_index(S: Space, zi: int) -> int:
    """The shard group of ZeRO entry ``zi``: 0 the framework's own, k the k-th :func:`candidate_group`."""
    return S.zero_shard[zi] if S.zero_shard else 0


def candidate_group(S: Space, f: tuple[int, int, int, int], k: int) -> int:
    """The k-th shard group offered to factorization ``f`` (k >= 1): one scale-up domain's
    data-parallel ranks at stride tp x cp (at least 2), times ``2 ** (k - 1)``; 0 where it does not
    divide dp, is not below it, or cp > 1 (and for k = 0)."""
    tp, _, dp, cp = f
    if not k or cp > 1:
        return 0
    n = max(2, S.shard_domain // (tp * cp)) << (k - 1)
    return n if dp % n == 0 and n < dp else 0


def layout_shard(S: Space, f: tuple[int, int, int, int], ep: int, zi: int) -> int:
    """``Layout.dp_shard`` of ZeRO entry ``zi`` at factorization ``f`` and expert degree ``ep``: the
    group ``--fix`` holds, else the entry's :func:`candidate_group` (0 with expert parallelism)."""
    if S.dp_shard[0]:
        return S.dp_shard[0]
    return candidate_group(S, f, shard_index(S, zi)) if ep == 1 else 0


def priced_shard(ctx: Context, S: Space, f: tuple[int, int, int, int], ep: int, zi: int) -> int:
    """:func:`layout_shard`, or 0 where it keeps as many copies of each shard as the framework's own
    grouping (``cost.terms.zero_replicas``): the same layout, left out of the space by
    :func:`shard_mask` and priced as the framework's own so that every table entry is one of a layout."""
    n = layout_shard(S, f, ep, zi)
    if not n or S.dp_shard[0]:
        return n
    _, pp, dp, cp = f
    z = S.zero_stage[zi]
    return 0 if zero_replicas(ctx, dp, pp, cp, ep, z) == zero_replicas(ctx, dp, pp, cp, ep, z, False, n) else n


def shard_mask(ctx: Context, S: Space) -> np.ndarray | None:
    """(f, e, z): False where a hybrid-sharded ZeRO entry offers no group (:func:`priced_shard`):
    outside the space, like the layouts the framework refuses (not counted as rejected); None where
    the space holds no such entry."""
    if not any(S.zero_shard):
        return None
    out = np.ones((len(S.factorizations), len(S.ep), len(S.zero_stage)), bool)
    for zi in range(len(S.zero_stage)):
        if shard_index(S, zi):
            for i, f in enumerate(S.factorizations):
                for ei, e in enumerate(S.ep):
                    out[i, ei, zi] = priced_shard(ctx, S, f, e, zi) > 0
    return out


def narrowed_stages(S: Space, keep) -> dict:
    """The ``replace`` arguments that keep the ZeRO entries of ``S`` whose stage ``keep`` accepts,
    each with its shard group."""
    at = [zi for zi, z in enumerate(S.zero_stage) if keep(z)]
    out = {"zero_stage": tuple(S.zero_stage[zi] for zi in at)}
    if S.zero_shard:
        out["zero_shard"] = tuple(S.zero_shard[zi] for zi in at)
    return out


def with_groups(ctx: Context, S: Space, runs: np.ndarray) -> np.ndarray:
    """The framework's mask ``runs`` (f, e, s, z, do, to: ``masks.framework_mask``) less the hybrid
    entries without a group (:func:`shard_mask`): the layouts of the space."""
    shards = shard_mask(ctx, S)
    return runs if shards is None else runs & shards[:, :, None, :, None, None]
