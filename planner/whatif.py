"""What-if studies: one model and job planned on several clusters or sizes, side by side.

Each row is a full search (``planner.search.plan``) on one candidate cluster; the figures come
from its Plan document, so time, cost and energy to train follow from the same cost model.
A candidate that cannot run the job says why and does not stop the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from cost.energy import objective_available

from cost.layout import Job
from models.errors import ClusterplanError, SpecError
from models.spec import ModelSpec
from planner.plan import plan_document
from planner.search import SearchOptions, plan
from topologies.cluster import Cluster


@dataclass(frozen=True)
class Candidate:
    """A cluster to try: a preset or file, with an optional size (``dgx-h100-superpod:512``)."""

    cluster: str
    num_devices: int | None = None

    @property
    def label(self) -> str:
        return self.cluster if self.num_devices is None else f"{self.cluster}:{self.num_devices}"


def parse_candidate(text: str) -> Candidate:
    """``ID`` or ``ID:DEVICES``; raise :class:`SpecError` on a bad size."""
    name, _, size = text.partition(":")
    if not name:
        raise SpecError(f"--cluster: {text!r} has no cluster id; use ID or ID:DEVICES (e.g. gb200-nvl72:576)")
    if not size:
        return Candidate(name)
    if not (size.isascii() and size.isdigit()) or int(size) <= 0:
        raise SpecError(f"--cluster: {text!r}: the size after ':' must be a positive device count")
    return Candidate(name, int(size))


def compare(model: ModelSpec, candidates: list[Candidate], load: Callable[[Candidate], Cluster],
            make_job: Callable[[Cluster], Job], options: SearchOptions) -> list[dict]:
    """One row per candidate: the best layout's figures, or the reason it has none.

    ``load`` builds a candidate's cluster and ``make_job`` the job for it (the precision may fall
    back to bf16 on a device without FP8), so that the CLI's own loading rules apply. Each search
    minimises ``options.objective`` where the candidate's device has the figure it needs (a price,
    a power), else step time; such a row is ranked after those that have the figure.
    """
    rows = []
    for cand in candidates:
        row: dict = {"cluster": cand.label}
        try:
            cluster = load(cand)
            job = make_job(cluster)
            usable = objective_available(cluster, options.objective)
            doc = plan_document(plan(model, job, cluster, options if usable else replace(options, objective="time")))
        except ClusterplanError as err:
            row.update(error=str(err).splitlines()[0], exit_code=err.exit_code)
            rows.append(row)
            continue
        row.update(
            device=cluster.device.id, num_devices=cluster.num_devices, precision=job.precision,
            layout=doc["layout"], step_time_s=doc["step_time_s"], tokens_per_s=doc["tokens_per_s"],
            mfu=doc["mfu"], peak_memory_bytes=doc["peak_memory_bytes"],
            device_memory_bytes=doc["device_memory_bytes"], time_to_train_s=doc["time_to_train_s"],
            energy_per_step_j=doc["energy_per_step_j"], cost_per_step_usd=doc["cost_per_step_usd"],
            energy_j=doc["energy_j"], cost_usd=doc["cost_usd"], search=doc["search"],
        )
        rows.append(row)
    return rows


OBJECTIVES = {"time": "step_time_s", "cost": "cost_per_step_usd", "energy": "energy_per_step_j"}


def rank(rows: list[dict], objective: str = "time") -> list[dict]:
    """Rows sorted by the objective (best first); rows without that figure, then failures, last.

    Every candidate runs the same job (same tokens per step), so per-step figures rank the
    candidates as the figures to train would, and need no token count.
    """
    key = OBJECTIVES[objective]

    def order(row: dict):
        value = row.get(key)
        return ("error" in row, value is None, value if value is not None else 0.0)

    return sorted(rows, key=order)
