"""The text of ``clusterplan calibrate`` (the factors fitted per device and framework, what each run
left undetermined, the error before, after and leave-one-out) and of ``validate --calibrate-one``."""

from __future__ import annotations

from rich.console import Console

from clusterplan.planner.report.text import make_table
from clusterplan.planner.studies.calibration import PARAMETERS


def _error_text(e: dict) -> str:
    if not e.get("runs"):
        return "-"
    return (f"median {e['median_abs_error']:.1%}, p90 {e['p90_abs_error']:.1%}, signed {e['median_signed_error']:+.1%}"
            f" ({e['runs']} runs)")


def _prior_text(p: dict) -> str:
    line = (f"prior: site parameters' effect on a step spread {p['site_log']:.1%}; a run scatters "
            f"{p['within_job_log']:.1%} about its group (runs of one job published together), "
            f"{p['between_jobs_log']:.1%} about other groups' runs (groups share {p['job_log']:.1%}; from {p['runs']} "
            f"runs, {p['jobs']} groups, {p['cells']} families under a framework, {p['sources']} sources)")
    if "moves_other_job" in p:
        line += (f": the site-level fit moves a run of another job {p['moves_other_job']:.0%} of the way; a job it was "
                 f"fitted on gets its job-level fit, which takes its runs at their word")
    return line


def _factor_table(e: dict):
    """An entry's factors: fitted (with their standard error and 80% interval), measured, or kept and why."""
    table = make_table("parameter", ("factor", "right"), "status", "what it multiplies")
    for p in PARAMETERS:
        value = e["values"].get(p.name, 1.0)
        got = e["fitted"].get(p.name) or {}
        if got.get("measured") is not None:
            status = f"measured {got['measured']:.4g} against the bundled {got['bundled']:.4g}"
        elif p.name in e["fitted"]:
            se = got.get("stderr_log")
            iv = got.get("interval")
            status = "fitted" + (f", +/- {se:.0%} (1 s.e.)" if se is not None else ", exactly (no run to spare)") + (
                f", 80% {iv[0]:.3f} to {iv[1]:.3f}" if iv else "")
        else:
            status = f"kept: {e['kept'].get(p.name, 'bundled figure')}"
        table.add_row(p.name, f"{value:.3f}", status, p.what)
    return table


def _job_lines(e: dict, console: Console) -> None:
    """The job-level fits of an entry: what plans of each of those jobs use instead of the site-level factors."""
    for j in e.get("jobs") or []:
        job, err = j["job"], j["error"]
        factors = ", ".join(f"{k} {j['values'][k]:.3f}" for k in j["fitted"]) or "none fitted"
        iv = j.get("interval")
        console.print(f"  job-level fit, {job['model']} in {job['precision']} ({len(j['runs'])} runs; {job['model_shape']}): "
                      f"{factors}; error after {_error_text(err['after'])}"
                      + (f", 80% interval {iv[0]:.3f} to {iv[1]:.3f}" if iv else ""))


def calibration_report(entries: list[dict], skipped: list[tuple[str, str]], path: str, console: Console) -> None:
    """One block per entry: its scope, the factors (fitted with their standard error, or kept and
    why), the error before, after and leave-one-out, and the interval; then the runs left out."""
    for e in entries:
        console.print(f"{e['device']} under {e['framework']} on {e['cluster']}: {len(e['runs'])} runs"
                      + (", site-level fit (the jobs below get their own)" if e.get("jobs") else ""))
        console.print(_factor_table(e))
        err = e["error"]
        if "before" not in err:  # a probe's entry: no runs
            probe = err.get("probe") or {}
            console.print(f"  measured on: {probe.get('device') or 'an unnamed device'}; host time of a tiny eager op: "
                          + (f"{probe['kernel_launch_s'] * 1e6:.1f} us" if probe.get("kernel_launch_s") else "-")
                          + " (recorded; runs calibrate the host factor)")
            console.print()
            continue
        if e.get("prior"):
            console.print(f"  {_prior_text(e['prior'])}")
        console.print(f"  error before: {_error_text(err['before'])}")
        console.print(f"  error after:  {_error_text(err['after'])} (on the runs it was fitted on)")
        console.print(f"  leave-one-out: {_error_text(err['leave_one_out'])} (each run predicted by a fit without it)")
        iv = e.get("interval")
        console.print("  80% interval of measured / predicted: "
                      + (f"{iv[0]:.3f} to {iv[1]:.3f}" if iv else "none (fewer than three runs: plans keep the "
                                                                 "uncalibrated interval)"))
        _job_lines(e, console)
        console.print()
    for run_id, reason in skipped:
        console.print(f"left out: {run_id}: {reason}")
    console.print(f"written: {path} (use it with --calibration on plan, evaluate, fit, compare, sweep, export, "
                  f"validate)")


def calibrate_one_report(study: dict, console: Console) -> None:
    """Per group of runs of one job and per family under one framework: the median |error| of the
    other runs before and after calibrating on one run, then the summary."""
    table = make_table("cell", ("runs", "right"), ("calibrated on", "right"), ("before", "right"),
                       ("after", "right"), "fitted", title="calibrated on one run, the others predicted")
    for c in study["cells"]:
        table.add_row(f"{c['kind']}: {c['name']}", str(c["runs"]), str(c["calibrated_on"]),
                      f"{c['median_abs_error_before']:.1%}", f"{c['median_abs_error_after']:.1%}",
                      ", ".join(f"{k} {v}" for k, v in c["fitted"].items()) or "-")
    console.print(table)
    if study.get("scatter"):
        console.print(_prior_text(study["scatter"]) + " (re-derived for each calibrating run without its "
                      "source's runs, where the others determine it)")
    for kind, s in study["summary"].items():
        if s.get("cells"):
            levels = s.get("levels") or {}
            console.print(f"{kind} cells: {s['cells']}, median |error| of the others {s['median_before']:.1%} "
                          f"uncalibrated -> {s['median_after']:.1%} calibrated on one run; {s['within_6pct']} of "
                          f"{s['cells']} within 6% (predictions priced as --calibration prices them: "
                          f"{levels.get('job', 0)} with the job-level fit of the calibrating run's job, "
                          f"{levels.get('site', 0)} with the site-level fit, {levels.get('not applied', 0)} not "
                          f"calibrated: another device or framework)")
