"""The text of ``clusterplan validate``: predicted against measured step time per run, then the
summaries (by family and framework, ZeRO-3, peak memory, fit/OOM facts, the planner's best against
the published layout, ranking agreement), written from the validation result alone."""

from __future__ import annotations

from rich.console import Console

from clusterplan.planner.report.text import make_table
from clusterplan.planner.studies.validate import memory_line, unpublished_rows


def validation_report(result: dict, console: Console) -> None:
    intervals = any(r.get("step_time_interval_s") for r in result["runs"])
    table = make_table("run", "hardware", "framework", ("predicted s", "right"), ("measured s", "right"),
                       ("error", "right"), *((("80% range s", "right"),) if intervals else ()), "fits",
                       ("best s", "right"), title=f"validation: {result['file']}")
    for r in result["runs"]:
        if r["reason"]:
            table.add_row(r["id"], f"{r['device']} x {r['count']}", "-", "-", "-", "-", *(("-",) if intervals else ()),
                          "-", f"not evaluated: {r['reason']}")
            continue
        meas = "-" if not r["measured_step_time_s"] else f"{r['measured_step_time_s']:.3f}"
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        best = "-" if r["best_step_time_s"] is None else f"{r['best_step_time_s']:.3f}"
        table.add_row(r["id"], f"{r['device']} x {r['count']}", r["framework"].split(" ")[0],
                      f"{r['predicted_step_time_s']:.3f}", meas, err, *((_interval_cell(r),) if intervals else ()),
                      "yes" if r["fits"] else "NO", best)
    console.print(table)
    _validation_summary(result["summary"], console)
    for key in ("sweeps", "memory", "families"):
        part = result.get(key)
        if not part:
            continue
        ps = part["summary"]
        console.print(f"\n{key} ({part['file']}): {part['what']}")
        rows = [("all runs", ps["overall"])] + (sorted(ps["by_family"].items()) if key == "families" else [])
        _step_time_lines(rows, console)
        _memory_lines(ps, console)
    _ranking_lines(result["summary"].get("ranking") or {}, console)
    _trust_lines({**(result["summary"].get("every_measured") or {}), "memory": result["summary"].get("every_measured_memory"),
                  "cross_validated": result["summary"].get("cross_validated")}, console)
    user = result["summary"].get("interval") or {}
    if user.get("runs"):
        console.print(f"{'80% intervals':>22}: as a plan quotes them (from the repository's published runs): "
                      f"{user['coverage']:.1%} of these {user['runs']} measured step times inside")


def _interval_cell(r: dict) -> str:
    """A run's 80% interval from the other sources' runs, marked where its measured time falls outside."""
    if not r.get("step_time_interval_s"):
        return "-"
    low_s, high_s = r["step_time_interval_s"]
    outside = r["measured_step_time_s"] and not low_s <= r["measured_step_time_s"] <= high_s
    return f"{low_s:.3f}-{high_s:.3f}{' out' if outside else ''}"


def _trust_lines(e: dict, console: Console) -> None:
    """The headline every plan's interval rests on: every measured step time of the repository, and
    how often the 80% intervals, each taken from the other sources' runs, held the measured time."""
    if not e.get("runs"):
        return
    if e.get("cross_validated"):
        cv_lines(e["cross_validated"], console)
    iv = e["interval"]
    console.print(f"\n{'every measured step':>22}: {e['runs']} runs from {e['sources']} sources (the bundled files and, "
                  f"from the repository, the hold-outs): median |error| {e['median_abs_error']:.1%}, "
                  f"p90 {e['p90_abs_error']:.1%}, median signed {e['median_signed_error']:+.1%}")
    if (mv := e.get("memory") or {}).get("runs"):
        console.print(memory_line(mv, f"{'every measured peak':>22}: "))
    console.print(f"{'80% intervals':>22}: each run's from the other sources' runs: {iv['coverage']:.1%} of "
                  f"{iv['runs']} measured step times inside (target 75-85%), median width {iv['median_width']:.2f}x")
    console.print(f"{'':>22}  by family: " + ", ".join(f"{f} {v['coverage']:.0%} of {v['runs']}"
                                                       for f, v in iv["by_family"].items()))


def cv_lines(cv: dict, console: Console, detail: bool = False) -> None:
    """The cross-validated headline: every measured step time, each source predicted with the
    constants derived without it (``planner.studies.derived``); by family and framework with ``detail``."""
    derived = "; ".join(f"{dev} {d['value']:.3f} (without {', '.join(f'{s}: {v:.3f}' for s, v in d['without'].items())})"
                        for dev, d in cv["derived"].items() if d["value"] is not None)
    console.print(f"\n{'cross-validated':>22}: {cv['runs']} measured step times from {cv['sources']} sources, each "
                  f"source predicted with the constants derived without it: median |error| {cv['median_abs_error']:.1%}, "
                  f"p90 {cv['p90_abs_error']:.1%}, median signed {cv['median_signed_error']:+.1%} (constants "
                  f"derived from runs: {derived or 'none'})")
    if detail:
        for key in ("by_family", "by_framework"):
            for name, st in cv[key].items():
                if st.get("runs"):
                    console.print(f"{name:>22}: {st['runs']} runs, median |error| {st['median_abs_error']:.1%}, "
                                  f"p90 {st['p90_abs_error']:.1%}, median signed {st['median_signed_error']:+.1%}")


def _step_time_lines(rows: list[tuple[str, dict]], console: Console) -> None:
    for name, st in rows:
        if st.get("runs"):
            console.print(f"{name:>22}: {st['runs']} runs, median |error| {st['median_abs_error']:.1%}, "
                          f"p90 {st['p90_abs_error']:.1%}, max {st['max_abs_error']:.1%}, "
                          f"{st['fits']}/{st['evaluated']} published layouts fit")


def _validation_summary(s: dict, console: Console) -> None:
    _step_time_lines([("all runs", s["overall"])] + sorted(s["by_family"].items())
                     + [(f"framework {k}", v) for k, v in sorted(s.get("by_framework", {}).items())], console)
    if s.get("zero3"):
        z = s["zero3"]
        console.print(f"{'ZeRO-3 / FSDP runs':>22}: {z['runs']} runs, median signed error {z['median_signed_error']:+.1%}")
    _memory_lines(s, console)
    if s.get("best_vs_published"):
        b = s["best_vs_published"]
        above = f"; above 1.3x: {', '.join(b['above_1_3'])}" if b["above_1_3"] else ""
        console.print(f"{'best vs published':>22}: planner's best predicted a median {b['median_speedup']:.2f}x "
                      f"(max {b['max_speedup']:.2f}x) faster than the published layout, {b['runs']} runs{above}")
        if b.get("unpublished_layout"):
            console.print(f"{'':>22}  left out, no published tp/pp/dp: {unpublished_rows(b)} (with them: median "
                          f"{b['all_runs_median_speedup']:.2f}x)")
    if s["not_evaluated"]:
        console.print(f"{'not evaluated':>22}: {s['not_evaluated']} run(s), reason in the table")


def _memory_lines(s: dict, console: Console) -> None:
    if s.get("memory"):
        m = s["memory"]
        console.print(f"{'peak memory':>22}: {m['runs']} runs measured, median |error| {m['median_abs_error']:.1%}, "
                      f"p90 {m['p90_abs_error']:.1%}, max {m['max_abs_error']:.1%}")
    if s.get("fit_facts"):
        f = s["fit_facts"]
        wrong = f"; wrong: {', '.join(f['wrong'])}" if f["wrong"] else ""
        console.print(f"{'fit / OOM facts':>22}: {f['agreed']} of {f['facts']} reproduced{wrong}")


def knob_tally(by_knob: dict) -> str:
    """``cp_comm 1/1 (1 group), pp+tp 12/14 (3 groups)``: the ranking agreement per knob."""
    return ", ".join(f"{k} {v['agreed']}/{v['pairs']} ({v['groups']} group{'s' if v['groups'] != 1 else ''})"
                     for k, v in by_knob.items())


def _ranking_lines(rk: dict, console: Console) -> None:
    if not rk.get("pairs"):
        return
    console.print(f"{'ranking':>22}: {rk['agreed']} of {rk['pairs']} pairs ordered as measured "
                  f"({rk['agreement']:.1%}) in {rk['groups']} groups of runs of one job; {rk['ties']} pairs measured "
                  f"within {rk['tie_threshold']:.0%} of each other are ties, not counted")
    console.print(f"{'':>22}  by source: " + ", ".join(f"{k} {v['agreed']}/{v['pairs']}"
                                                       for k, v in rk["by_source"].items()))
    if rk.get("by_knob"):
        console.print(f"{'':>22}  by knob (the settings a group's runs differ in): " + knob_tally(rk["by_knob"]))
    rg = rk.get("regret") or {}
    if rg.get("groups"):
        above = "; ".join(f"{r['group']} {r['regret']:.2f}x ({r['first']})" for r in rg["above"])
        console.print(f"{'':>22}  the run ranked first, measured against each group's best (groups of 3 or more runs, "
                      f"{rg['groups']}): median {rg['median']:.3f}x, worst {rg['max']:.2f}x; above {rg['limit']:.2f}x: "
                      + (above or "none"))
    for g in rk["by_group"]:
        if g["wrong"]:
            console.print(f"{'':>22}  {g['group']}: {g['agreed']}/{g['pairs']}; wrong: {'; '.join(g['wrong'][:3])}"
                          + (" ..." if len(g["wrong"]) > 3 else ""))
