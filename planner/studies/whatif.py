"""What-if studies: one model and job planned on several clusters, sizes, link speeds or jobs.

Each row is a full search (``planner.search.plan``) on one point: a candidate cluster
(``compare``) or one value of a swept knob (``sweep``). The figures come from the point's Plan
document, so time, cost and energy to train follow from the same cost model. A point that cannot
run the job says why in its row and does not stop the others.
"""

from __future__ import annotations

import multiprocessing

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Callable

from clusterplan.topologies.precisions import PRECISIONS

from clusterplan.cost.layout import Job, Layout
from clusterplan.models.errors import ClusterplanError, SpecError
from clusterplan.topologies.library import resolve_cluster_id
from clusterplan.models.spec import ModelSpec
from clusterplan.planner.inputs import Request
from clusterplan.planner.report.plan import NO_PUBLISHED_RUN, plan_document, prediction_bias
from clusterplan.planner.results import plan_results
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.topologies.cluster import Cluster

GIB = 2**30
SECONDS_PER_DAY = 86400
JOULES_PER_MWH = 3.6e9


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
    name, colon, size = text.partition(":")
    if not name:
        raise SpecError(f"--cluster: {text!r} has no cluster id; use ID or ID:DEVICES (e.g. gb200-nvl72:576)")
    if not size and colon:
        raise SpecError(f"--cluster: {text!r} ends with ':' but no device count; use ID or ID:DEVICES (e.g. gb200-nvl72:576)")
    if not size:
        return Candidate(name)
    if not (size.isascii() and size.isdigit()) or int(size) <= 0:
        raise SpecError(f"--cluster: {text!r}: the size after ':' must be a positive device count")
    return Candidate(name, int(size))


def check_distinct(candidates: list[Candidate]) -> None:
    """Each candidate once: the same preset (by any of its names) at the same size twice is a typo,
    not a comparison."""
    seen: dict = {}
    for c in candidates:
        try:
            key = (resolve_cluster_id(c.cluster), c.num_devices)
        except ClusterplanError:
            key = (c.cluster, c.num_devices)  # a file or an unknown name: its own error comes later
        label = c.cluster + (f":{c.num_devices}" if c.num_devices else "")
        if key in seen:
            raise SpecError(f"--cluster: {label} is the same candidate as {seen[key]}; list each once")
        seen[key] = label


def point_row(model: ModelSpec, build: Callable[[], tuple[Cluster, Job]], options: SearchOptions) -> dict:
    """The best layout's figures for one (cluster, job), or the error that stopped it.

    ``build`` makes the point's cluster and job, so that its errors (an unknown device, a size the
    fabric cannot take) land in the row too. The search minimises ``options.objective``; a device
    without the figure it needs (a price, a power) is the row's error, naming the option that gives
    it, rather than a row searched for time and ranked last without a word.
    """
    try:
        cluster, job = build()
        doc = plan_document(plan_results(plan(model, job, cluster, options), explained=False))  # rows read none
    except ClusterplanError as err:
        return {"error": str(err).splitlines()[0], "exit_code": err.exit_code}
    return dict(
        device=cluster.device.id, num_devices=cluster.num_devices, precision=job.precision,
        layout=doc["layout"], step_time_s=doc["step_time_s"], step_time_interval_s=doc.get("step_time_interval_s"),
        time_to_train_interval_s=doc.get("time_to_train_interval_s"), mfu_interval=doc.get("mfu_interval"),
        cost_interval_usd=doc.get("cost_interval_usd"), tokens_per_s=doc["tokens_per_s"],
        mfu=doc["mfu"], peak_memory_bytes=doc["peak_memory_bytes"], fit_memory_bytes=doc["fit_memory_bytes"],
        device_memory_bytes=doc["device_memory_bytes"], time_to_train_s=doc["time_to_train_s"],
        energy_per_step_j=doc["energy_per_step_j"], cost_per_step_usd=doc["cost_per_step_usd"],
        energy_j=doc["energy_j"], cost_usd=doc["cost_usd"], search=doc["search"],
        goodput=None if doc.get("goodput") is None else doc["goodput"]["goodput"],
        device_hours=doc.get("device_hours"), validated_error=_validated(doc),
        unvalidated=list(doc["inputs"]["caveats"].get("unvalidated", [])),
        schedule=doc.get("schedule"),  # the timeline of the row's best layout (--html, --timeline)
    )


def _validated(doc: dict) -> str:
    """The family's validated error for a row: ``median 5% over 25 runs`` (``over 5 MoE runs`` where the
    plan's model kind has its own figure; ``, predicted fast by 35%`` where the median signed error is
    ``plan.BIAS_SHOWN`` or more: the row is likely optimistic), or ``unvalidated``."""
    entry = doc["inputs"]["caveats"].get("validated_error")
    if not entry:
        return NO_PUBLISHED_RUN
    kind = f" {entry['kind']}" if entry.get("kind") else ""
    way = prediction_bias(entry)
    bias = f", predicted {way} by {abs(entry['median_signed_error']):.0%}" if way else ""
    cv = entry.get("cross_validated_median_abs_error")
    held = f" ({cv:.0%} with its derived matmul ceiling cross-validated)" if cv is not None else ""
    return f"median {entry['median_abs_error']:.0%} over {entry['runs']}{kind} runs{held}{bias}"


def compare(request: Request, candidates: list[Candidate], options: SearchOptions,
            progress: Callable[[int, int], None] | None = None, model: ModelSpec | None = None) -> list[dict]:
    """One row per candidate: the best layout's figures, or the reason it has none.

    Each candidate is the request on that cluster (and size), built as ``plan`` builds it (the
    precision may fall back to bf16 on a device without FP8). Each search minimises
    ``options.objective``; a candidate whose device lacks the figure it needs (a price, a power) gets
    that reason in its row (exit code 2), ranked with the failures.
    """
    model = model or request.load_model()
    points = _Points(request, model)
    rows = []
    for cand in candidates:
        settings = {"cluster": cand.cluster, "num_devices": cand.num_devices, "num_nodes": None}
        rows.append({"cluster": cand.label, **point_row(model, lambda: points(settings), options)})
        if progress:
            progress(len(rows), len(candidates))
    return rows


class _Points:
    """Builds the cluster and job of each point of a study from the request with the point's
    options set; points that differ only in the job share one cluster (and so its cached terms).
    Picklable, so that it travels to Ray workers."""

    def __init__(self, request: Request, model: ModelSpec):
        self.request, self.model = request, model
        self._clusters: dict[tuple, Cluster] = {}

    def __call__(self, settings: dict[str, Any]) -> tuple[Cluster, Job]:
        r = self.request.with_(**settings)
        key = (r.cluster, r.num_devices, r.num_nodes, r.device, r.scale_out_gbit_per_s, r.oversubscription,
               r.domain_devices)
        if key not in self._clusters:
            self._clusters[key] = r.load_cluster()
        cluster = self._clusters[key]
        return cluster, r.build_job(self.model, cluster)[0]


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


# ---- sweeps --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Knob:
    """A knob ``sweep --over`` can vary: the ``plan`` option it stands for and its values' type."""

    option: str
    """The ``plan`` option (``--devices``) whose value each point sets."""
    param: str
    """The keyword that option fills (``num_devices``)."""
    kind: str
    """``int`` (positive), ``float`` (positive), ``ratio`` (>= 1), ``choice`` or ``name``."""
    axis_label: str
    """The knob on a chart's axis, with its unit."""
    choices: tuple[str, ...] = ()
    clashes: tuple[str, ...] = ()
    """Other params that set the same thing (a size by devices or by nodes)."""


SWEEP_KNOBS: dict[str, Knob] = {
    "devices": Knob(option="--devices", param="num_devices", kind="int", axis_label="devices",
                    clashes=("num_nodes",)),
    "nodes": Knob(option="--nodes", param="num_nodes", kind="int", axis_label="nodes", clashes=("num_devices",)),
    "scale-out-gbit-per-s": Knob(option="--scale-out-gbit-per-s", param="scale_out_gbit_per_s", kind="float",
                                 axis_label="scale-out NIC per device (Gbit/s)"),
    "oversubscription": Knob(option="--oversubscription", param="oversubscription", kind="ratio",
                             axis_label="leaf oversubscription (downlink : uplink)"),
    "domain-devices": Knob(option="--domain-devices", param="domain_devices", kind="int",
                           axis_label="devices used per NVLink domain"),
    "global-batch": Knob(option="--global-batch", param="global_batch", kind="int",
                         axis_label="global batch (sequences)"),
    "seq-len": Knob(option="--seq-len", param="seq_len", kind="int", axis_label="sequence length (tokens)"),
    "device": Knob(option="--device", param="device", kind="name", axis_label="device"),
    "precision": Knob(option="--precision", param="precision", kind="choice", axis_label="precision",
                      choices=PRECISIONS),
}
KNOB_ALIASES = {"gpus": "devices"}
NUMERIC_KINDS = ("int", "float", "ratio")


@dataclass(frozen=True)
class Sweep:
    """One knob and the values it takes, in the order given."""

    knob: str
    values: tuple[Any, ...]

    @property
    def spec(self) -> Knob:
        return SWEEP_KNOBS[self.knob]

    def label(self, value: Any) -> str:
        return f"{self.knob}={value:g}" if isinstance(value, float) else f"{self.knob}={value}"


def parse_over(text: str) -> Sweep:
    """``KNOB=V1,V2,...`` as a :class:`Sweep`; raise :class:`SpecError` naming what is wrong.

    Examples
    --------
    >>> parse_over("gpus=256,512")
    Sweep(knob='devices', values=(256, 512))
    >>> parse_over("scale-out-gbit-per-s=200,400.5").values
    (200.0, 400.5)
    """
    allowed = ", ".join([*SWEEP_KNOBS, *(f"{a} (= {k})" for a, k in KNOB_ALIASES.items())])
    name, sep, rest = (part.strip() for part in text.partition("="))
    if not sep:
        raise SpecError(f"--over: {text!r} is not KNOB=V1,V2,... (e.g. devices=256,512,1024); knobs: {allowed}")
    key = name.lower().replace("_", "-")
    key = KNOB_ALIASES.get(key, key)
    if key not in SWEEP_KNOBS:
        raise SpecError(f"--over: unknown knob {name!r}; allowed: {allowed}")
    raw = [v.strip() for v in rest.split(",")]
    if not rest or any(not v for v in raw):
        raise SpecError(f"--over {key}: give a comma-separated list of values with none empty "
                        f"(e.g. {key}={_example(SWEEP_KNOBS[key])}; given: {rest!r})")
    values = tuple(_knob_value(key, SWEEP_KNOBS[key], v) for v in raw)
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(f"--over {key}: {v} is given twice; list each value once")
        seen.add(v)
    return Sweep(key, values)


def _example(knob: Knob) -> str:
    return {"int": "256,512", "float": "200,400", "ratio": "1,2", "choice": ",".join(knob.choices),
            "name": "h100-sxm5-80gb,h200-sxm-141gb"}[knob.kind]


def _knob_value(key: str, knob: Knob, raw: str) -> Any:
    if knob.kind == "name":
        return raw
    if knob.kind == "choice":
        if raw.lower() not in knob.choices:
            raise SpecError(f"--over {key}: {raw!r} is not allowed; allowed: {', '.join(knob.choices)}")
        return raw.lower()
    need = {"int": "a positive whole number", "float": "a positive number", "ratio": "a number >= 1"}[knob.kind]
    try:
        number = int(raw) if knob.kind == "int" else float(raw)
    except ValueError:
        number = None
    low_ok = number is not None and math.isfinite(number) and (number >= 1 if knob.kind == "ratio" else number > 0)
    if not low_ok:
        raise SpecError(f"--over {key}: {raw!r} is not {need} (e.g. {key}={_example(knob)})")
    return number


@dataclass(frozen=True)
class Grid:
    """Two knobs crossed: every pair of their values, the first knob slowest (``sweep --over A=...
    --over B=...``). It behaves as a :class:`Sweep` whose values are pairs."""

    first: Sweep
    second: Sweep

    @property
    def knob(self) -> str:
        return f"{self.first.knob} x {self.second.knob}"

    @property
    def values(self) -> tuple[tuple[Any, Any], ...]:
        return tuple((a, b) for a in self.first.values for b in self.second.values)

    def label(self, value: tuple[Any, Any]) -> str:
        return f"{self.first.label(value[0])},{self.second.label(value[1])}"

    def settings(self, value: tuple[Any, Any]) -> dict[str, Any]:
        """The ``plan`` keywords one point sets."""
        return {self.first.spec.param: value[0], self.second.spec.param: value[1]}


MAX_GRID_POINTS = 10_000


def parse_grid(texts: tuple[str, ...] | list[str]) -> Sweep | Grid:
    """One ``--over`` as a :class:`Sweep`, two as a :class:`Grid`; raise :class:`SpecError` on more,
    on the same knob twice, or on two knobs that both set the size."""
    if not texts:
        raise SpecError("--over: give the knob to sweep, e.g. --over devices=256,512,1024")
    if len(texts) > 2:
        raise SpecError(f"--over: at most two knobs (a grid of their values); given {len(texts)}")
    studies = [parse_over(t) for t in texts]
    if len(studies) == 1:
        return studies[0]
    a, b = studies
    if a.knob == b.knob or a.spec.param in b.spec.clashes or b.spec.param in a.spec.clashes:
        raise SpecError(f"--over {a.knob} and --over {b.knob} set the same thing; give two different knobs")
    grid = Grid(a, b)
    if len(grid.values) > MAX_GRID_POINTS:
        raise SpecError(f"--over: {len(a.values)} x {len(b.values)} = {len(grid.values):,} points; allowed: up to "
                        f"{MAX_GRID_POINTS:,}")
    return grid


def study_settings(study: Sweep | Grid, value: Any) -> dict[str, Any]:
    """The ``plan`` keywords one point of a sweep or a grid sets."""
    return study.settings(value) if isinstance(study, Grid) else {study.spec.param: value}


def check_sweep_options(sweep: Sweep | Grid, given: dict[str, Any]) -> None:
    """Refuse a swept knob that the command line also sets (a cluster file takes the swept knob
    like a preset does: the command line's value wins over the file's).

    ``given`` maps each ``plan`` option's keyword (``num_devices``) to its value (None if unset).
    """
    if isinstance(sweep, Grid):
        check_sweep_options(sweep.first, given)
        check_sweep_options(sweep.second, given)
        return
    knob = sweep.spec
    for param in (knob.param, *knob.clashes):
        if given.get(param) is not None:
            flag = next(k.option for k in SWEEP_KNOBS.values() if k.param == param)
            raise SpecError(f"--over {sweep.knob}: {flag} {given[param]} is also given; the sweep sets "
                            f"{'the size' if knob.clashes else knob.option} at each point, so drop {flag}")


def sweep(request: Request, study: Sweep | Grid, options: SearchOptions, jobs: int = 1,
          progress: Callable[[int, int], None] | None = None, ray_address: str | None = None,
          model: ModelSpec | None = None) -> list[dict]:
    """One row per value of the swept knob (or pair of values of a grid), in the order given.

    Each point is the request with the knob set to that value, built as ``plan`` would build it
    with that option set; the request must not set the swept knob itself. Rows carry ``point``
    (``devices=512``), ``knob`` and ``value`` before the figures.

    ``jobs`` > 1 runs the points in that many forked processes, each on a contiguous run of points
    so that neighbouring points still share their cached terms (``cost.terms.Context``); the rows
    are the same as with one process. Where ``fork`` is not available (macOS, Windows) the points
    run in this process. ``progress(done, total)`` is called as points finish.

    ``ray_address`` runs the points as Ray tasks instead (``"local"``: a Ray instance started for
    the sweep; else the address of a running Ray cluster, whose workers must have clusterplan
    installed).
    """
    check_sweep_options(study, request.given())
    model = model or request.load_model()
    build = _Points(request, model)
    values = list(study.values)
    jobs = max(1, min(jobs, len(values)))
    report = progress or (lambda done, total: None)
    if ray_address:
        return _sweep_ray(model, study, build, options, ray_address, report)
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        return _sweep_forked(model, study, build, options, jobs, report)
    rows = []
    for value in values:
        rows.append(_sweep_point(model, study, build, options, value))
        report(len(rows), len(values))
    return rows


def _sweep_forked(model: ModelSpec, study: Sweep | Grid, build: _Points, options: SearchOptions, jobs: int,
                  report: Callable[[int, int], None]) -> list[dict]:
    """The points of :func:`sweep` in ``jobs`` forked processes, in order."""
    global _SWEEP_WORK
    values = list(study.values)
    _SWEEP_WORK = (model, study, build, options)
    # contiguous runs of points per process (neighbours share terms), several per process so
    # that progress can be reported as they finish
    size = max(1, min(-(-len(values) // jobs), 16))
    chunks = [list(range(i, min(i + size, len(values)))) for i in range(0, len(values), size)]
    rows: list[dict] = []
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for part in pool.imap(_sweep_chunk, chunks):
                rows += part
                report(len(rows), len(values))
    finally:
        _SWEEP_WORK = None
    return rows


_SWEEP_WORK: tuple | None = None  # what the forked workers of :func:`sweep` run (inherited, not pickled)

RAY_CHUNK = 8  # points per Ray task: enough to amortise a task's start, few enough to spread the work
RAY_CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """Refuse an address nothing answers at within a few seconds: Ray itself retries for minutes."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if address == "auto":
        return  # Ray looks for a cluster started on this machine and fails at once without one
    if not host or not port.isdigit():
        raise SpecError(f"--ray: {address!r} is not HOST:PORT (or ray://HOST:PORT, or auto); "
                        "give the address `ray start --head` printed, or --ray alone for a local instance")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise SpecError(f"--ray: nothing answers at {address!r} within {RAY_CONNECT_TIMEOUT_S:g} s ({err}); "
                        "start the cluster first (ray start --head) or use --ray alone for a local one") from None


def _sweep_values(model: ModelSpec, study: Sweep, build, options: SearchOptions, values: list) -> list[dict]:
    return [_sweep_point(model, study, build, options, value) for value in values]


def _sweep_ray(model: ModelSpec, study: Sweep, build, options: SearchOptions, address: str,
               report: Callable[[int, int], None]) -> list[dict]:
    """The points of :func:`sweep` as Ray tasks, in order."""
    try:
        import ray
    except ImportError:
        raise SpecError("--ray: Ray is not installed; install the extra: pip install 'clusterplan[ray]'") from None
    started = address == "local"
    if not started:
        _check_reachable(address)
    try:
        ray.init(address=None if started else address, ignore_reinit_error=True, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as err:
        raise SpecError(f"--ray: cannot connect to a Ray cluster at {address!r}: {str(err).splitlines()[0][:200]}; "
                        "give the address of a running cluster (ray start --head prints it), or --ray alone "
                        "for a local one") from None
    try:
        task = ray.remote(_sweep_values)
        values = list(study.values)
        chunks = [values[i:i + RAY_CHUNK] for i in range(0, len(values), RAY_CHUNK)]
        refs = [task.remote(model, study, build, options, chunk) for chunk in chunks]
        rows: list[dict] = []
        for ref in refs:
            rows += ray.get(ref)
            report(len(rows), len(values))
        return rows
    finally:
        if started:
            ray.shutdown()


def _sweep_chunk(indices: list[int]) -> list[dict]:
    model, study, build, options = _SWEEP_WORK
    return [_sweep_point(model, study, build, options, study.values[i]) for i in indices]


def _sweep_point(model: ModelSpec, study: Sweep | Grid, build: _Points, options: SearchOptions, value: Any) -> dict:
    head = {"point": study.label(value), "knob": study.knob, "value": value}
    return {**head, **point_row(model, lambda: build(study_settings(study, value)), options)}


# ---- CSV -----------------------------------------------------------------------------------------------
CSV_COLUMNS = ("device", "num_devices", "precision", "step_time_s", "step_time_low_s", "step_time_high_s", "tokens_per_s", "mfu", "used_gib", "reserved_gib",
               "time_to_train_days", "goodput", "device_hours", "energy_mwh", "cost_usd", "layout", "validated_error",
               "error")


def layout_string(layout: dict) -> str:
    """The layout as ``evaluate --layout`` takes it: ``tp=8,pp=4,dp=32,mbs=1,sp=on,recompute=none,zero=1``."""
    return Layout.from_dict(layout).short().replace(" ", ",")


def csv_text(rows: list[dict], label: str) -> str:
    """The rows as CSV: ``label`` (``cluster`` or ``point``) then :data:`CSV_COLUMNS`.

    Figures are in display units (GiB, days, MWh); a cell without a figure is empty. ``used_gib`` is
    the table's "used GiB" (the allocated peak with the runtime, what must fit); ``reserved_gib`` adds
    what the caching allocator keeps reserved (``plan``'s total); ``step_time_low_s`` and
    ``step_time_high_s`` bound the step time's 80% interval (``plan``'s).
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((label, *CSV_COLUMNS))
    for row in rows:
        writer.writerow([row[label], *(_cell(v) for v in _csv_values(row))])
    return out.getvalue()


def _csv_values(row: dict) -> list:
    if "error" in row:
        return [None] * (len(CSV_COLUMNS) - 1) + [row["error"]]

    def scaled(key: str, unit: float):
        return None if row[key] is None else row[key] / unit

    low_s, high_s = row.get("step_time_interval_s") or (None, None)
    return [row["device"], row["num_devices"], row["precision"], row["step_time_s"], low_s, high_s,
            row["tokens_per_s"], row["mfu"],
            row["fit_memory_bytes"] / GIB, row["peak_memory_bytes"] / GIB, scaled("time_to_train_s", SECONDS_PER_DAY), row.get("goodput"),
            row.get("device_hours"), scaled("energy_j", JOULES_PER_MWH), row["cost_usd"], layout_string(row["layout"]),
            row.get("validated_error"), None]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 6))  # sub-micro digits of a model prediction are noise
    return value
