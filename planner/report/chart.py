"""Charts of what-if rows (``compare``, ``sweep``), drawn with matplotlib.

matplotlib is an optional extra (``pip install 'clusterplan[chart]'``): it is imported only when a
chart is asked for, with the Agg backend (no display needed). The charts read the rows that
``planner.studies.whatif`` builds; nothing here computes a figure.
"""

from __future__ import annotations

import textwrap

from pathlib import Path
from typing import Any

from clusterplan.models.errors import SpecError

INSTALL_HINT = "install matplotlib (pip install 'clusterplan[chart]')"
CHART_SUFFIXES = (".png", ".svg", ".pdf")
SECONDS_PER_DAY = 86400
TIME_COLOR, MFU_COLOR = "tab:blue", "tab:orange"


def check_chart_path(path: str) -> None:
    """Fail before any search: a format matplotlib will not write, no such folder, a directory in
    the way, or matplotlib missing (checked last: a wrong name is worth saying first)."""
    target = Path(path)
    if target.suffix.lower() not in CHART_SUFFIXES:
        raise SpecError(f"--chart: {path!r} has no chart extension; allowed: {', '.join(CHART_SUFFIXES)} "
                        "(e.g. --chart sweep.png)")
    if not target.parent.is_dir():
        raise SpecError(f"--chart: folder {str(target.parent)!r} does not exist; create it or write elsewhere")
    if target.is_dir():
        raise SpecError(f"--chart: {path!r} is a directory; give a file name (e.g. --chart sweep.png)")
    _pyplot()


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SpecError(f"--chart: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


JOULES_PER_MWH = 3.6e9
METRICS = {  # objective -> (whole training, per step): (row key, axis label, unit)
    "time": (("time_to_train_s", "time to train (days)", SECONDS_PER_DAY), ("step_time_s", "step time (s)", 1.0)),
    "cost": (("cost_usd", "cost to train (USD)", 1.0), ("cost_per_step_usd", "cost per step (USD)", 1.0)),
    "energy": (("energy_j", "energy to train (MWh)", JOULES_PER_MWH),
               ("energy_per_step_j", "energy per step (kWh)", 3.6e6)),
}


def _left_metric(rows: list[dict]) -> tuple[str, str, float]:
    """What the rows were searched and ranked for (``--objective``, in each row's ``search``): to
    train when every row that ran has that figure (a token count), else per step; time where some
    row lacks the price or power the objective needs (it was searched for time)."""
    ran = [r for r in rows if "error" not in r]
    objective = next((r.get("search", {}).get("objective") for r in ran), None) or "time"
    for key, label, unit in METRICS.get(objective, METRICS["time"]):
        if ran and all(r.get(key) is not None for r in ran):
            return key, label, unit
    whole, step = METRICS["time"]
    return whole if ran and all(r["time_to_train_s"] is not None for r in ran) else step


def sweep_chart(rows: list[dict], path: str, title: str, xlabel: str) -> None:
    """x: the swept value (categorical unless every value is a number); left: time, right: MFU."""
    plt = _pyplot()
    key, ylabel, unit = _left_metric(rows)
    numeric = all(isinstance(r["value"], (int, float)) for r in rows)
    positions = [r["value"] for r in rows] if numeric else list(range(len(rows)))
    ran = [(x, r) for x, r in zip(positions, rows) if "error" not in r]
    if numeric:
        ran.sort(key=lambda point: point[0])  # the line runs along x, whatever order the values came in
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    ax.plot([x for x, _ in ran], [r[key] / unit for _, r in ran], "o-", color=TIME_COLOR)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.yaxis.label.set_color(TIME_COLOR)
    ax.set_ylim(bottom=0)
    if numeric and min(positions) > 0 and max(positions) / min(positions) >= 4:
        ax.set_xscale("log", base=2)  # sizes and rates in doublings: equal spacing per doubling
    ax.set_xticks(positions, [_tick(r["value"]) for r in rows])
    ax.minorticks_off()
    _mfu_axis(ax, ran, "s--")
    _mark_failures(ax, [(x, r) for x, r in zip(positions, rows) if "error" in r])
    _save(plt, fig, path)


def grid_heatmap(rows: list[dict], path: str, title: str, first: tuple[str, tuple], second: tuple[str, tuple]) -> None:
    """A two-knob grid (``sweep --over A=... --over B=...``): a cell per pair of values, coloured and
    labelled by time to train (else step time); a point that could not run is left blank with an x.
    ``first`` and ``second``: (axis label, values) of the rows' and the columns' knob."""
    import numpy as np

    plt = _pyplot()
    key, label, unit = _left_metric(rows)
    (ylabel, ys), (xlabel, xs) = first, second
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        if "error" not in r:
            a, b = r["value"]
            grid[ys.index(a), xs.index(b)] = r[key] / unit
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(xs) + 3), max(4.0, 0.6 * len(ys) + 2)), layout="constrained")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", aspect="auto", origin="lower")
    fig.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(xs)), [_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_tick(v) for v in ys])
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    middle = np.nanmean([np.nanmin(grid), np.nanmax(grid)]) if np.isfinite(grid).any() else 0.0
    for i in range(len(ys)):
        for j in range(len(xs)):
            value = grid[i, j]
            text = "x" if np.isnan(value) else f"{value:.3g}"
            dark_cell = not np.isnan(value) and value > middle  # viridis_r: large values are dark
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark_cell else "black")
    _save(plt, fig, path)


def compare_chart(rows: list[dict], path: str, title: str) -> None:
    """A bar per candidate (time to train, else step time) with its MFU as a marker on the right axis."""
    plt = _pyplot()
    key, ylabel, unit = _left_metric(rows)
    positions = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows) + 2), 4.8), layout="constrained")
    heights = [0.0 if "error" in r else r[key] / unit for r in rows]
    ax.bar(positions, heights, color=TIME_COLOR, alpha=0.8)
    ax.set(ylabel=ylabel, title=title)
    ax.yaxis.label.set_color(TIME_COLOR)
    ax.set_xticks(positions, [r["cluster"] for r in rows], rotation=20, ha="right")
    _mfu_axis(ax, [(x, r) for x, r in zip(positions, rows) if "error" not in r], "s")
    _mark_failures(ax, [(x, r) for x, r in zip(positions, rows) if "error" in r])
    _save(plt, fig, path)


def _mfu_axis(ax, ran: list[tuple[Any, dict]], style: str) -> None:
    """MFU in percent on the right axis, from 0 with room above the highest point."""
    mfu = ax.twinx()
    percent = [r["mfu"] * 100 for _, r in ran]
    mfu.plot([x for x, _ in ran], percent, style, color=MFU_COLOR)
    mfu.set_ylabel("MFU (%)", color=MFU_COLOR)
    mfu.set_ylim(0, min(100.0, 1.25 * max(percent, default=80.0)))


def _mark_failures(ax, failed: list[tuple[Any, dict]]) -> None:
    """A point without a layout gets a label at the foot of the axis, not a gap nobody explains."""
    for x, _ in failed:
        ax.annotate("no layout", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 4),
                    textcoords="offset points", ha="center", color="tab:red", fontsize=8)


def _tick(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _save(plt, fig, path: str, option: str = "--chart") -> None:
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise SpecError(f"{option}: cannot write {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)


def timeline_png(timeline, path: str, title: str) -> None:
    """The step's timeline (:func:`planner.report.timeline.build_timeline`) as a PNG: the critical
    path on top, then each stage drawn, a block per term, what the overlaps hide as a thin lane."""
    from clusterplan.planner.report.timeline import TERMS

    plt = _pyplot()
    rows = [timeline.path] + timeline.rows
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)), layout="constrained")
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        for term in dict.fromkeys(b.term for b in row.blocks):
            spans = [(b.start_s, b.duration_s) for b in row.blocks if b.term == term]
            ax.broken_barh(spans, (y - 0.35, 0.7), color=TERMS[term][1], label=TERMS[term][0])
        if row.hidden:
            ax.broken_barh([(b.start_s, b.duration_s) for b in row.hidden], (y - 0.5, 0.12),
                           color=TERMS["hidden"][1], label=TERMS["hidden"][0])
    ax.set_yticks(range(len(rows)), [r.label for r in reversed(rows)])
    ax.set_xlim(0, timeline.step_time_s)
    ax.set(xlabel="seconds into the step")
    ax.set_title(textwrap.fill(title, 110), fontsize=10)  # a long layout wraps instead of running off the figure
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    # below the axis label, in the constrained layout's own space (matplotlib >= 3.7), not over it
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    _save(plt, fig, path, "--timeline")
