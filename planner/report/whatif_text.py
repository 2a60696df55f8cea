"""The text of the what-if studies (``compare``, ``sweep``): one line per candidate or point, the
failures below the table, and each row's trust (its hardware family's validated step-time error and
the unvalidated assumptions behind it), written from the rows alone; and the check, before any
search runs, that the files asked for (``--csv``, ``--chart``) can be written."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rich.console import Console

from clusterplan.cost.layout import recompute_text
from clusterplan.models.errors import SpecError
from clusterplan.planner.caveats import NO_PUBLISHED_RUN
from clusterplan.planner.report.chart import check_chart_path
from clusterplan.planner.report.text import duration, gib, keep_whole, make_table


def whatif_table(rows: list[dict], label: str, title: str, console: Console) -> None:
    """One line per row, failures below the table. ``label`` is the key naming each row (``cluster``,
    or ``point`` of a sweep, where the column shows the value under the knob's name)."""
    header = rows[0]["knob"] if label == "point" and rows else label
    table = make_table(header, "devices", ("step s", "right"), ("MFU", "right"), ("used GiB", "right"),
                       ("to train", "right"), ("energy MWh", "right"), ("cost", "right"), "best layout", title=title)

    def name(r: dict) -> str:
        return r[label].split("=", 1)[1] if label == "point" else r[label]

    errors = []
    for r in rows:
        if "error" in r:
            errors.append(f"{r[label]}: {r['error']}")
            table.add_row(name(r), "-", "-", "-", "-", "-", "-", "-", "no layout (below)")
            continue
        train = "-" if r["time_to_train_s"] is None else duration(r["time_to_train_s"])
        energy = "-" if r["energy_j"] is None else f"{r['energy_j'] / 3.6e9:,.0f}"
        cost = "-" if r["cost_usd"] is None else f"${r['cost_usd']:,.0f}"
        table.add_row(name(r), f"{r['num_devices']:,} x {r['device']}", f"{r['step_time_s']:.3f}",
                      f"{r['mfu']:.1%}", gib(r["fit_memory_bytes"]), train, energy, cost, _compact(r["layout"]))
    keep_whole(table)  # a candidate's name and its device are never cut short or broken
    keep_whole(table, 1)
    console.print(table)
    if any("error" not in r for r in rows):
        console.print("used GiB: the peak allocated with the runtime, what must fit (the caching allocator may "
                      "reserve more; plan shows both)")
        _print_row_trust(rows, name, console)
    for line in errors:
        console.print(line)


def _print_row_trust(rows: list[dict], name: Callable[[dict], str], console: Console) -> None:
    """Per row: its hardware family's validated step-time error, and how many placeholders its
    prediction rests on (``plan`` lists them)."""
    console.print("trust per row: the step time's 80% interval, the hardware family's validated step-time error "
                  "(clusterplan validate), and the unvalidated assumptions behind the prediction (plan lists them)")
    for r in rows:
        if "error" in r:
            continue
        more = [line for line in r.get("unvalidated", []) if not line.startswith(NO_PUBLISHED_RUN)]
        extra = f"; {len(more)} unvalidated assumption{'s' if len(more) != 1 else ''}" if more else ""
        interval = r.get("step_time_interval_s")
        step = f"step {interval[0]:.3f} s to {interval[1]:.3f} s; " if interval else ""
        console.print(f"  {name(r)}: {step}{r['validated_error']}{extra}")


def _compact(layout: dict) -> str:
    """The degrees and micro-batch of a layout, for narrow tables."""
    parts = [f"{k}{layout[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "vp") if layout[k] > 1 or k in ("tp", "pp", "dp")]
    return " ".join(parts + [f"mbs{layout['micro_batch_size']}", recompute_text(layout), f"z{layout['zero_stage']}"])


def check_outputs(as_json: bool, csv_path: str | None, chart_path: str | None) -> None:
    """Refuse output options that cannot work before any search runs."""
    if csv_path == "-" and as_json:
        raise SpecError("--csv -: stdout already carries the --json rows; write the CSV to a file (--csv rows.csv)")
    if csv_path and csv_path != "-" and not Path(csv_path).parent.is_dir():
        raise SpecError(f"--csv: folder {str(Path(csv_path).parent)!r} does not exist; create it or write elsewhere")
    if csv_path and csv_path != "-" and Path(csv_path).is_dir():
        raise SpecError(f"--csv: {csv_path!r} is a directory; give a file name (e.g. --csv rows.csv)")
    if csv_path and chart_path and csv_path != "-" and Path(csv_path).resolve() == Path(chart_path).resolve():
        raise SpecError(f"--csv and --chart both name {csv_path!r}: the chart would overwrite the rows; "
                        "give each its own file (e.g. --csv rows.csv --chart rows.png)")
    if chart_path:
        check_chart_path(chart_path)
