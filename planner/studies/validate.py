"""Validation against published training runs (format ``clusterplan-runs/1``): the predictions of
``planner.studies.runs`` measured. Step-time error by family and framework, ranking agreement inside
groups of runs of one job, the planner's best against the published layout, memory and fit facts, every
measured step time of the repository and the coverage of the 80% intervals
(``planner.studies.uncertainty``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from clusterplan.cost.layout import recompute_text
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.runs import (  # FORMAT, run_framework: re-exported
    FORMAT, RunResult, bundled_data_path, bundled_runs_path, evaluate_run, load_runs, load_runs_and_groups,
    price_run, run_framework,
)
from clusterplan.planner.studies.derived import (
    DERIVED_CEILINGS, cross_validated as derived_cross_validated, cross_validated_results as derived_cross_validated_results,
)
from clusterplan.planner.studies.uncertainty import (
    LEVEL, coverage, cross_validated, error_figures, percentile, prediction_interval, ratio_cells,
)


def summarize(results: list[RunResult], groups: dict[str, list[str]] | None = None) -> dict:
    """Median, 90th percentile and max |error| overall, by hardware family and by framework; the
    signed error of the ZeRO-3/FSDP runs; pairwise order agreement inside groups of runs of one job;
    and the planner's best against each published layout."""
    def stats(rows: list[RunResult]) -> dict:
        errors = sorted(abs(r.error) for r in rows if r.error is not None)
        if not errors:
            return {"runs": 0}
        return {"runs": len(errors), "median_abs_error": statistics.median(errors),
                "p90_abs_error": percentile(errors, 0.9), "max_abs_error": errors[-1],
                "within_2x": sum(1 for r in rows if r.error is not None and 0.5 <= 1 + r.error <= 2.0),
                "fits": sum(1 for r in rows if r.fits), "evaluated": len(rows)}

    evaluated = [r for r in results if r.reason is None]
    families = sorted({r.family for r in evaluated})
    frameworks = sorted({r.framework.split("@")[0] for r in evaluated})
    summary = {"overall": stats(evaluated), "by_family": {f: stats([r for r in evaluated if r.family == f]) for f in families},
               "by_framework": {f: stats([r for r in evaluated if r.framework.split("@")[0] == f]) for f in frameworks},
               "not_evaluated": len(results) - len(evaluated)}
    zero3 = [r.error for r in evaluated if r.zero_stage == 3 and r.error is not None]
    if zero3:
        summary["zero3"] = {"runs": len(zero3), "median_signed_error": statistics.median(zero3)}
    if (mem := _memory_errors(evaluated)).get("runs"):
        summary["memory"] = mem
    facts = [r for r in evaluated if r.measured_fits is not None]
    if facts:
        summary["fit_facts"] = {"facts": len(facts), "agreed": sum(1 for r in facts if r.fits == r.measured_fits),
                                "wrong": [r.id for r in facts if r.fits != r.measured_fits]}
    summary["ranking"] = ranking(results, groups or {})
    summary.update(_best_vs_published(evaluated))
    return summary


def _memory_errors(rows: list[RunResult]) -> dict:
    """Median, p90 and max |error| of the measured peaks among ``rows`` (``{"runs": 0}`` without one)."""
    mem = sorted(abs(r.memory_error) for r in rows if r.reason is None and r.memory_error is not None)
    if not mem:
        return {"runs": 0}
    return {"runs": len(mem), "median_abs_error": statistics.median(mem), "p90_abs_error": percentile(mem, 0.9),
            "max_abs_error": mem[-1]}


def memory_verdicts(results: list[RunResult]) -> dict:
    """Over every run of ``results`` (the bundled files and the hold-outs): the measured peaks' errors
    (issue 36 states its memory target on every peak in the repository), and the runs that ran (a
    measured step time or peak, and no published out-of-memory fact) which the model says do not fit:
    each is an over-prediction of memory that would send a user to a worse layout."""
    ran = [r for r in results if r.reason is None and (r.measured_fits is True or r.measured_fits is None and (
        r.measured_step_time_s or r.measured_peak_memory_bytes))]
    return {**_memory_errors(results), "ran": len(ran), "ran_predicted_not_to_fit": [r.id for r in ran if not r.fits]}


def _best_vs_published(evaluated: list[RunResult]) -> dict:
    """The planner's best against the published layout, over the runs that published one (tp, pp and
    dp given); a run without one is compared with the layout ``validate`` itself chose under its few
    published knobs, which says nothing of the run's authors: those are listed apart
    (``unpublished_layout``) and counted in ``all_runs_median_speedup`` only."""
    every = sorted((r.predicted_step_time_s / r.best_step_time_s, r.id, r.layout_published) for r in evaluated
                   if r.best_step_time_s and r.predicted_step_time_s)
    ratios = [(x, i) for x, i, published in every if published]
    if not ratios:
        return {}
    return {"best_vs_published": {
        "runs": len(ratios), "median_speedup": statistics.median(x for x, _ in ratios),
        "max_speedup": ratios[-1][0], "above_1_3": [i for x, i in ratios if x > 1.3],
        "all_runs_median_speedup": statistics.median(x for x, _, _ in every),
        "unpublished_layout": {i: x for x, i, published in every if not published}}}


def unpublished_rows(best: dict) -> str:
    """The runs :func:`_best_vs_published` leaves out, as printed: ``id 1.11x, id 1.15x``."""
    return ", ".join(f"{i} {x:.2f}x" for i, x in best["unpublished_layout"].items())


def run_groups(runs: list[dict], extra: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Group name -> run ids: each run's ``group`` field, plus groups listed by id (``extra``)."""
    out: dict[str, list[str]] = {}
    for run in runs:
        if run.get("group"):
            out.setdefault(str(run["group"]), []).append(str(run.get("id")))
    for name, ids in (extra or {}).items():
        out.setdefault(str(name), []).extend(str(i) for i in ids)
    return out


# Two measurements of one job closer than this are a tie: the spread of repeated measurements of one
# configuration (BigScience's tr11 prequel lists DP8/TP4/PP12/MBS2 twice, 110.48 and 113.54 s: 2.8%).
RANKING_TIE = 0.03


def ranking(results: list[RunResult], groups: dict[str, list[str]]) -> dict:
    """Pairwise order agreement inside each group: a pair agrees when the predicted cost per step
    (step time x devices: the inverse of throughput per device, so runs at different sizes of one
    job compare too) orders the two runs as the measurement does. Pairs measured within
    :data:`RANKING_TIE` of each other are ties and skipped (counted in ``ties``); a pair the model prices
    the same (:func:`predicted_equal`) is not ordered by it, so it does not agree."""
    by_id = {r.id: r for r in results}
    rows, agreed, pairs, ties = [], 0, 0, 0
    for name, ids in sorted(groups.items()):
        members = _measured_members(by_id, ids)
        g_pairs = g_agreed = 0
        wrong = []
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                x, y = members[a], members[b]
                mx, my = x.measured_step_time_s * x.count, y.measured_step_time_s * y.count
                px, py = x.predicted_step_time_s * x.count, y.predicted_step_time_s * y.count
                if abs(mx - my) <= RANKING_TIE * min(mx, my):
                    ties += 1
                    continue
                g_pairs += 1
                if predicted_equal(px, py):  # the model does not order them: not agreed, whatever the rows' order
                    wrong.append(f"{x.id} vs {y.id} (predicted equal)")
                elif (mx < my) == (px < py):
                    g_agreed += 1
                else:
                    wrong.append(f"{x.id} vs {y.id}")
        if g_pairs:
            rows.append({"group": name, "runs": len(members), "pairs": g_pairs, "agreed": g_agreed, "wrong": wrong,
                         "knob": group_knob(members)})
        pairs, agreed = pairs + g_pairs, agreed + g_agreed
    return {"groups": len(rows), "pairs": pairs, "agreed": agreed, "ties": ties, "tie_threshold": RANKING_TIE,
            "agreement": agreed / pairs if pairs else None, "by_group": rows,
            "by_source": _tally(rows, lambda row: row["group"].split("-")[0]),
            "by_knob": _tally(rows, lambda row: row["knob"]), "regret": regret(results, groups)}


def group_knob(members: list[RunResult]) -> str:
    """What the runs of a group differ in: the published settings (``RunResult.settings``) whose values
    are not all equal, joined with ``+`` and sorted (``layout.cp_comm``, ``layout.pp+layout.tp``); a
    layout field is named without its ``layout.`` prefix. Read from the runs, never kept by hand."""
    keys = sorted({k for r in members for k in r.settings})
    differ = [k for k in keys if any(r.settings.get(k) != members[0].settings.get(k) for r in members[1:])]
    return "+".join(k.removeprefix("layout.") for k in differ) or "(none)"


def _tally(rows: list[dict], key: Callable[[dict], str]) -> dict[str, dict]:
    """Agreed pairs, pairs and groups of the ranking rows, per ``key(row)``."""
    out: dict[str, dict] = {}
    for row in rows:
        t = out.setdefault(key(row), {"agreed": 0, "pairs": 0, "groups": 0})
        t["agreed"], t["pairs"], t["groups"] = t["agreed"] + row["agreed"], t["pairs"] + row["pairs"], t["groups"] + 1
    return dict(sorted(out.items()))


def _measured_members(by_id: dict[str, RunResult], ids) -> list[RunResult]:
    """The runs of a group (by id) that were evaluated and have a measured step time."""
    return [by_id[i] for i in ids if i in by_id and by_id[i].reason is None and by_id[i].measured_step_time_s
            and by_id[i].predicted_step_time_s]


REGRET_LIMIT = 1.25  # issue 35: the run ranked first measured within 1.25x of the group's best

PREDICTED_EQUAL = 1e-9
"""Two predicted costs this close (relative) are the same prediction: the model prices the two runs
alike (a knob it prices the same, such as the MoE dispatchers across NICs without GPU-initiated
RDMA), so neither is ranked above the other, whatever order the runs are listed in."""


def predicted_equal(a: float, b: float) -> bool:
    return abs(a - b) <= PREDICTED_EQUAL * max(abs(a), abs(b))


def regret(results: list[RunResult], groups: dict[str, list[str]], min_runs: int = 3) -> dict:
    """In each group of ``min_runs`` or more runs of one job: the measured cost per step (step time x
    devices) of the run the model ranks first, over the best measured: what picking the planner's
    favourite would have cost (where it prices several first alike, their mean: a user would pick
    any of them). Median, worst, and the groups above :data:`REGRET_LIMIT`."""
    by_id = {r.id: r for r in results}
    rows = []
    for name, ids in sorted(groups.items()):
        members = _measured_members(by_id, dict.fromkeys(ids))
        if len(members) < min_runs:
            continue
        cheapest = min(r.predicted_step_time_s * r.count for r in members)
        firsts = [r for r in members if predicted_equal(r.predicted_step_time_s * r.count, cheapest)]
        best = min(r.measured_step_time_s * r.count for r in members)
        rows.append({"group": name, "runs": len(members), "first": ", ".join(r.id for r in firsts),
                     "regret": statistics.fmean(r.measured_step_time_s * r.count for r in firsts) / best})
    values = sorted(r["regret"] for r in rows)
    return {"groups": len(rows), "median": statistics.median(values) if values else None,
            "max": values[-1] if values else None, "limit": REGRET_LIMIT,
            "above": [r for r in rows if r["regret"] > REGRET_LIMIT]}


BUNDLED_EXTRAS = {
    "sweeps": ("sweeps.yaml", "published layout sweeps: groups of runs of one job, for the ranking measure"),
    "memory": ("memory_runs.yaml", "measured peak memory per device and published fit/OOM facts"),
    "families": ("family_runs.yaml", "runs beyond NVIDIA A100/H100 (and of nanotron), for the per-family error"),
}


def validate(path: str | Path | None = None, options: SearchOptions | None = None, best: bool = True,
             progress: Callable[[int, int], None] | None = None, calibration=None) -> dict:
    """Evaluate every run of ``path`` (the bundled runs by default); ``{"runs": [...], "summary": {...}}``.

    Without ``path`` the other bundled files are evaluated too, each under its own key with its own
    summary (:data:`BUNDLED_EXTRAS`): layout sweeps (their runs count for the ranking measure),
    memory ground truth and runs beyond A100/H100. The bundled runs' summary stays the one the
    project's step-time targets are stated on. ``progress(done, total)`` is called after each run.
    ``calibration`` (``planner.studies.calibration.Calibration``): each run is priced as calibrated for
    its device and framework where the calibration has them, with the calibration's interval."""
    opts = options or SearchOptions()
    main_path = path or bundled_runs_path()
    runs, extra = load_runs_and_groups(main_path)
    extras = [] if path is not None else [
        (key, name, what, load_runs_and_groups(bundled_data_path(name)))
        for key, (name, what) in BUNDLED_EXTRAS.items() if bundled_data_path(name).is_file()]
    extras += [] if path is not None else [
        (f"holdout:{p.stem}", p, "hold-out runs (frozen: nothing is tuned on them)", load_runs_and_groups(p))
        for p in repository_holdouts()]
    total, done = len(runs) + sum(len(e[3][0]) for e in extras), 0

    def tick(pair):
        nonlocal done
        done += 1
        if progress:
            progress(done, total)
        return pair

    pairs = [tick(price_run(run, opts, best, calibration)) for run in runs]  # (RunResult, Priced | None)
    results = [r for r, _ in pairs]
    out = {"file": str(main_path), "runs": [r.as_dict() for r in results]}
    groups = run_groups(runs, extra)
    every_run = list(runs)
    for key, name, what, (extra_runs, extra_groups) in extras:
        file = name if isinstance(name, Path) else bundled_data_path(name)
        extra_pairs = [tick(price_run(run, opts, False, calibration)) for run in extra_runs]
        extra_results = [r for r, _ in extra_pairs]
        for g, ids in run_groups(extra_runs, extra_groups).items():
            groups.setdefault(g, []).extend(ids)
        every_run, pairs = every_run + extra_runs, pairs + extra_pairs
        out[key] = {"file": str(file), "what": what, "runs": [r.as_dict() for r in extra_results],
                    "summary": summarize(extra_results)}
    ranked = [r for r, _ in pairs]  # every file's runs
    out["summary"] = summarize(results)
    out["summary"]["ranking"] = ranking(ranked, groups)
    _intervals(out, path is None, results, ranked, [out[key] for key, *_ in extras])
    if path is None and calibration is None:  # the headline: constants derived from runs re-derived without each source
        out["summary"]["cross_validated"] = derived_cross_validated(
            every_run, pairs, SearchOptions(engine=opts.engine, top_k=0), _holdout_ids(extras))
    return out


def _holdout_ids(extras: list) -> set[str]:
    """The ids of the hold-out files' runs among ``extras``: frozen, they set no derived constant."""
    return {str(run.get("id")) for key, _, _, (runs, _) in extras if key.startswith("holdout:") for run in runs}


def _intervals(out: dict, bundled: bool, results: list[RunResult], ranked: list[RunResult], sections: list[dict]) -> None:
    """Each run's 80% interval into its row, and their coverage into the summary (``interval_coverage``):
    for the bundled files, each run's from the other sources' runs; for a user's runs, the interval a
    plan would quote (the stored table, or the calibration's)."""
    if bundled:  # every measured step time of the bundled files, and their intervals' coverage
        out["summary"]["every_measured"] = trust_summary(ranked)
        out["summary"]["every_measured_memory"] = memory_verdicts(ranked)
        intervals = cross_validated_runs(ranked)
        for section in [out] + sections:
            for row in section["runs"]:
                if intervals.get(row["id"]):
                    row["step_time_interval_s"] = [intervals[row["id"]]["low_s"], intervals[row["id"]]["high_s"]]
        out["summary"]["interval_coverage"] = (out["summary"]["every_measured"].get("interval") or {}).get("coverage")
    else:
        out["summary"]["interval"] = stored_interval_check(results, out["runs"])
        out["summary"]["interval_coverage"] = out["summary"]["interval"]["coverage"]


def stored_interval_check(results: list[RunResult], rows: list[dict]) -> dict:
    """Each run's 80% interval as a plan quotes it (``planner/data/validated_error.yaml``, from the
    bundled and hold-out runs), written into its row, and the share of measured step times inside:
    how the intervals hold on runs the user brings."""
    inside = []
    for result, row in zip(results, rows):
        if not result.predicted_step_time_s:
            continue
        iv = result.step_time_interval_s or (None if (stored := prediction_interval(
            result.family, result.moe, result.framework.split("@")[0], result.predicted_step_time_s)) is None
            else [stored["low_s"], stored["high_s"]])
        if iv is None:
            continue
        row["step_time_interval_s"] = iv
        if result.measured_step_time_s:
            inside.append(iv[0] <= result.measured_step_time_s <= iv[1])
    return {"level": LEVEL, "runs": len(inside), "coverage": sum(inside) / len(inside) if inside else None}


def repository_holdouts() -> list[Path]:
    """The hold-out files (:data:`LABEL_HOLDOUT_FILES`) where clusterplan runs from its repository;
    none from an installed package, which does not ship them."""
    root = Path(__file__).resolve().parents[2]
    return [root / f for f in LABEL_HOLDOUT_FILES if (root / f).is_file()]


def trust_summary(results: list[RunResult]) -> dict:
    """Over every measured step time of ``results``: runs, sources, median and p90 |error|, the
    median signed error, and the 80% intervals' leave-one-source-out coverage
    (``planner.studies.uncertainty.coverage``). These errors use the constants derived from the runs
    themselves (``planner.studies.derived.DERIVED_CEILINGS``); ``planner.studies.derived.cross_validated`` gives
    the same figures with each source predicted by constants derived without it, the headline."""
    rows = [r for r in results if r.sample() is not None]
    if not rows:
        return {"runs": 0}
    return {**error_figures([r.error for r in rows]), "sources": len({r.source for r in rows}),
            "interval": coverage([r.sample() for r in rows])}


def cross_validated_runs(results: list[RunResult]) -> dict[str, dict]:
    """Run id -> its 80% interval from the other sources' runs, for the runs with a measured step time."""
    rows = [r for r in results if r.sample() is not None]
    return {r.id: iv for r, iv in zip(rows, cross_validated([r.sample() for r in rows])) if iv}


STEP_TIME_FILES = ("runs.yaml", "sweeps.yaml", "family_runs.yaml", "memory_runs.yaml")


LABEL_HOLDOUT_FILES = ("benchmarks/holdout_runs.yaml", "benchmarks/holdout_family_runs.yaml",
                       "benchmarks/holdout_llmfoundry.yaml")
"""The repository's hold-out files (paths from its root; the installed package does not ship them)
whose runs join the bundled ones in the validated error every plan quotes and in its intervals:
every measured step time in the repository counts (issue 35; until 2026-11-28 the memory ground
truth's 34 step times, all predicted too fast, and llm-foundry's 193-row grid were left out)."""


def error_by_family(options: SearchOptions | None = None,
                    extra_files: tuple[Path, ...] = ()) -> tuple[dict[str, dict], dict[str, dict]]:
    """Per hardware family: runs, median and p90 |step-time error| and the median signed error (negative:
    predicted too fast) over every bundled published run with a measured step time
    (:data:`STEP_TIME_FILES`) and the runs of ``extra_files`` (the repository's
    :data:`LABEL_HOLDOUT_FILES`, which ``benchmarks/update_docs.py`` passes), rounded to 0.1%, and the same for its dense and its MoE runs
    (``dense``, ``moe``) where the family has runs of both kinds, and how many of its runs are MoE
    (``moe_runs``) and under each framework (``framework_runs``); and the interval table of the same runs (:func:`interval_table`): what
    ``planner/data/validated_error.yaml`` holds (a test recomputes it)."""
    opts = options or SearchOptions(engine="exhaustive", top_k=0)
    held_out = [run for f in extra_files for run in load_runs(Path(f))]
    runs = [run for name in STEP_TIME_FILES for run in load_runs(bundled_data_path(name))] + held_out
    pairs = [price_run(run, opts, best=False) for run in runs]
    results = [r for r, _ in pairs]
    frozen = {str(run.get("id")) for run in held_out}
    held = {r.id: r for r in derived_cross_validated_results(runs, pairs, SearchOptions(engine=opts.engine, top_k=0),
                                                             frozen)[0]}

    def entry(rows: list[RunResult]) -> dict:
        return error_figures([r.error for r in rows], 3)

    out = {}
    for family in sorted({r.family for r in results if r.error is not None}):
        rows = [r for r in results if r.family == family and r.error is not None]
        frameworks = Counter(r.framework.split("@")[0] for r in rows)
        out[family] = {**entry(rows), "moe_runs": sum(r.moe for r in rows), "framework_runs": dict(sorted(frameworks.items()))}
        cv_rows = [held.get(r.id, r) for r in rows]
        if any(c.error != r.error for c, r in zip(cv_rows, rows)):  # a constant derived from these runs
            out[family]["cross_validated"] = entry(cv_rows)
        for kind, moe in (("dense", False), ("moe", True)):  # by model kind, where the family has both
            kind_rows = [r for r in rows if r.moe is moe]
            if kind_rows and len(kind_rows) < len(rows):
                out[family][kind] = entry(kind_rows)
    return out, interval_table(results)


def interval_table(results: list[RunResult]) -> dict[str, dict]:
    """The ratio bounds of every regime cell and the family biases the cells over every family are
    moved and widened by (``planner.studies.uncertainty.ratio_cells``), keyed ``part|part|...`` as
    ``planner/data/validated_error.yaml`` stores them, rounded to 0.001."""
    samples = [r.sample() for r in results if r.sample() is not None]
    return {"|".join(key): {name: round(value, 3) if isinstance(value, float) else value for name, value in cell.items()}
            for key, cell in sorted(ratio_cells(samples).items())}


def markdown_report(result: dict) -> str:
    """The validation tables as Markdown (what docs/cost-model.md embeds): runs, families,
    frameworks, the ZeRO-3 signed error, the planner's best against the published layouts, and
    ranking agreement by source; with the bundled file, the layout sweeps, the memory facts, and the
    runs beyond A100/H100 with their own per-family table."""
    lines = _markdown_runs(result["runs"]) + [""] + _markdown_stats(result["summary"])
    rk = result["summary"].get("ranking") or {}
    if rk.get("pairs"):
        lines.append(f"- ranking: {rk['agreed']} of {rk['pairs']} pairs ordered as measured ({rk['agreement']:.1%}) in "
                     f"{rk['groups']} groups; {rk['ties']} pairs within {rk['tie_threshold']:.0%} are ties; by source: "
                     + ", ".join(f"{k} {v['agreed']}/{v['pairs']}" for k, v in rk["by_source"].items()))
        if rk.get("by_knob"):
            lines.append("- ranking by knob (the settings a group's runs differ in): "
                         + ", ".join(f"`{k}` {v['agreed']}/{v['pairs']}" for k, v in rk["by_knob"].items()))
        rg = rk.get("regret") or {}
        if rg.get("groups"):
            lines.append(f"- the run ranked first against each group's best measured (groups of 3 or more runs, "
                         f"{rg['groups']}): median {rg['median']:.3f}x, worst {rg['max']:.2f}x, "
                         f"{len(rg['above'])} above {rg['limit']:.2f}x")
    if result.get("sweeps"):
        st = result["sweeps"]["summary"]["overall"]
        lines.append(f"- layout sweeps (`planner/data/sweeps.yaml`): {st['runs']} runs, median |error| "
                     f"{st['median_abs_error']:.1%}, p90 {st['p90_abs_error']:.1%}")
    if result.get("memory"):
        m, facts = result["memory"]["summary"].get("memory") or {}, result["memory"]["summary"].get("fit_facts") or {}
        if m:
            lines.append(f"- memory (`planner/data/memory_runs.yaml`): {m['runs']} measured peaks, median |error| "
                         f"{m['median_abs_error']:.1%}, p90 {m['p90_abs_error']:.1%}")
        if facts:
            lines.append(f"- fit/OOM facts: {facts['agreed']} of {facts['facts']} reproduced"
                         + (f"; wrong: {', '.join(facts['wrong'])}" if facts["wrong"] else ""))
    if result["summary"].get("every_measured", {}).get("runs"):
        lines.append(trust_line(result["summary"]["every_measured"], result["summary"].get("cross_validated")))
    if (mv := result["summary"].get("every_measured_memory") or {}).get("runs"):
        lines.append(memory_line(mv))
    if result.get("families"):
        lines += ["", "Runs beyond NVIDIA A100/H100, and of nanotron (`planner/data/family_runs.yaml`):", ""]
        lines += _markdown_runs(result["families"]["runs"]) + [""] + _markdown_stats(result["families"]["summary"])
    return "\n".join(lines)


def trust_line(e: dict, cv: dict | None = None) -> str:
    """The headline over every measured step time (:func:`trust_summary`) and its cross-validated
    figure (``planner.studies.derived``), as ``validate`` prints them."""
    iv = e["interval"]
    head = (f"- every measured step time, cross-validated ({cv['runs']} runs from {cv['sources']} sources; each "
            f"source predicted with the constants derived from runs, the {', '.join(d.device for d in DERIVED_CEILINGS)} "
            f"GEMM ceilings, re-derived without it): median |error| {cv['median_abs_error']:.1%}, p90 {cv['p90_abs_error']:.1%}, median signed "
            f"{cv['median_signed_error']:+.1%}; with the constants derived from every run: " if cv else
            f"- every measured step time ({e['runs']} runs from {e['sources']} sources: the bundled files and, from "
            f"the repository, the hold-outs): ")
    return (head + f"median |error| {e['median_abs_error']:.1%}, p90 {e['p90_abs_error']:.1%}, "
            f"median signed {e['median_signed_error']:+.1%}; 80% intervals from the other sources' runs cover "
            f"{iv['coverage']:.1%} of them (target 75-85%), median width {iv['median_width']:.2f}x")


def memory_line(mv: dict, head: str = "- every measured peak: ") -> str:
    """The memory headline over every measured peak and every run that ran (:func:`memory_verdicts`)."""
    wrong = mv["ran_predicted_not_to_fit"]
    return (f"{head}{mv['runs']} peaks (the bundled files and, from the repository, the hold-outs): "
            f"median |error| {mv['median_abs_error']:.1%}, p90 {mv['p90_abs_error']:.1%}, max {mv['max_abs_error']:.1%}; "
            f"runs that ran and are predicted not to fit: {len(wrong)} of {mv['ran']}"
            + (f" ({', '.join(wrong)})" if wrong else ""))


def _markdown_runs(runs: list[dict]) -> list[str]:
    lines = ["| run | device x count | framework | layout | predicted s | measured s | error | fits |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in runs:
        if r["reason"]:
            lines.append(f"| {r['id']} | {r['device']} x {r['count']} | | not evaluated: {r['reason']} | | | | |")
            continue
        L = r["layout"]
        lay = (f"tp{L['tp']} pp{L['pp']} dp{L['dp']} cp{L['cp']} ep{L['ep']} vp{L['vp']} mbs{L['micro_batch_size']} "
               f"{recompute_text(L)} z{L['zero_stage']}" + (" tpo" if L.get("tp_overlap") and L["tp"] > 1 else "")
               + (" epo" if L.get("ep_overlap") and L["ep"] > 1 else ""))
        meas = f"{r['measured_step_time_s']:.3f}" if r["measured_step_time_s"] else "-"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        lines.append(f"| {r['id']} | {r['device']} x {r['count']} | {r['framework'].split(' ')[0]} | {lay} | "
                     f"{r['predicted_step_time_s']:.3f} | {meas} | {err} | {'yes' if r['fits'] else 'NO'} |")
    return lines


def _markdown_stats(s: dict) -> list[str]:
    """Per family and framework, the ZeRO-3 signed error, measured peaks and best-vs-published."""
    lines = ["| hardware family or framework | runs | median abs error | p90 abs error | max abs error |",
             "|---|---:|---:|---:|---:|"]
    rows = ([("all", s["overall"])] + sorted(s["by_family"].items())
            + [(f"framework {k}", v) for k, v in sorted(s.get("by_framework", {}).items())])
    for name, st in rows:
        if st.get("runs"):
            lines.append(f"| {name} | {st['runs']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
                         f"{st['max_abs_error']:.1%} |")
    lines.append("")
    if s.get("zero3"):
        lines.append(f"- ZeRO-3 / FSDP runs: {s['zero3']['runs']}, median signed error "
                     f"{s['zero3']['median_signed_error']:+.1%}")
    if s.get("memory"):
        lines.append(f"- peak memory: {s['memory']['runs']} runs measured, median |error| "
                     f"{s['memory']['median_abs_error']:.1%}, max {s['memory']['max_abs_error']:.1%}")
    if s.get("best_vs_published"):
        b = s["best_vs_published"]
        lines.append(f"- planner's best against the published layout: median {b['median_speedup']:.2f}x, max "
                     f"{b['max_speedup']:.2f}x over {b['runs']} runs; above 1.3x: {', '.join(b['above_1_3']) or 'none'}")
        if b.get("unpublished_layout"):
            lines.append(f"  ({len(b['unpublished_layout'])} runs published no tp/pp/dp and are left out: "
                         f"{unpublished_rows(b)}; with them the median is {b['all_runs_median_speedup']:.2f}x)")
    return lines
