"""The command line: parse options, load the inputs, call ``planner``, render a report or JSON.

Commands: ``clusterplan plan|evaluate|explain|compare|sweep|export|validate|calibrate|models|clusters|devices``;
``plan`` is also installed as a command of its own (``plan --model gpt --cluster dgx-superpod``).
Every figure printed comes from the Plan document (``planner.report.plan``); nothing here computes a cost,
and nothing here writes a report: the text of each one is in ``planner.report`` (``text``, ``whatif_text``,
``validation_text``, ``catalogue_text``). This module holds the commands and their options (the
options several commands share, and the value types, are in ``cli_options``), the loading of the
inputs (a ``Request``), the calls into the library and the exit codes.

Results go to stdout, errors to stderr as ``error: <message>``. Exit codes (DESIGN.md):

== ===========================================================================
0  success (``evaluate`` of a layout that does not fit is still a success)
1  a bug: anything unexpected (``internal error: ...``; CLUSTERPLAN_DEBUG=1 for the traceback)
2  bad input: usage, unknown name, missing or invalid file, invalid layout or bounds
3  no layout fits (the message names the shortfall, ``hint:`` what would fix it)
4  the solver stopped without any layout (raise ``--time-limit``)
== ===========================================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console

from clusterplan.cli_errors import Command, Group, _err, guarded
from clusterplan.cli_options import (CALIBRATION_OPTION, ENGINE_OPTIONS, FRAMEWORK_NAMES, INPUT_OPTIONS,
                                     MOE_ROUTING_OPTIONS, OUTPUT_OPTIONS, POSITIVE_FLOAT, POSITIVE_INT, PRICE_OPTION,
                                     PROBLEM_OPTIONS, SEARCH_OPTIONS, WHATIF_OUTPUT_OPTIONS, BoundedNumber, Headroom,
                                     TokenCount, apply_options, remembered, writable_file)
from clusterplan.cost.framework import check_platform, resolve_name as resolve_framework
from clusterplan.cost.layout import MODEL_CODES
from clusterplan.cost.goodput import Reliability
from clusterplan.models.errors import SpecError
from clusterplan.models.library import job_defaults, list_models
from clusterplan.planner.report.catalogue_text import clusters_table, devices_table, models_table
from clusterplan.planner.report.html import console_text, plan_page, saved_plan_page, whatif_page, write_views
from clusterplan.planner.report.plan import PLANNER_VERSION, read_plan_document
from clusterplan.planner.report.progress import progress_bar, searching
from clusterplan.planner.report.text import explain_report, fit_lines, render_report, report_text
from clusterplan.planner.report.validation_text import cv_lines, validation_report
from clusterplan.planner.report.calibration_text import calibrate_one_report, calibration_report
from clusterplan.planner.report.whatif_text import check_outputs, whatif_table
from clusterplan.planner.inputs import Request, default_global_batch  # noqa: F401 (re-exported: tests, API)
from clusterplan.planner.requests import Planned, evaluate_request, fit_request, plan_request
from clusterplan.planner.studies.fit import TIME_LIMIT_S
from clusterplan.planner.search import ENGINES, SearchOptions
from clusterplan.planner.search.space import parse_bounds
from clusterplan.planner.studies.validate import markdown_report, validate
from clusterplan.planner.studies.calibrate import (calibrate_one, calibration_inputs, fit, points_from_runs,
                                                   save_runs_file, study_runs)
from clusterplan.planner.studies.calibration import load_calibration, save
from clusterplan.planner.studies.probe import measure, probe_entry, read_figures
from clusterplan.planner.report.chart import compare_chart, grid_heatmap, sweep_chart
from clusterplan.planner.studies.whatif import (OBJECTIVES, SWEEP_KNOBS, Grid, check_sweep_options, compare, csv_text,
                                        check_distinct, parse_candidate, parse_grid, rank, sweep)
from clusterplan.planner.report.export import FORMATS as EXPORT_FORMATS, TORCHTITAN_FORMAT_DATES, export, export_framework
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.library import list_clusters, list_devices
from clusterplan.topologies.precisions import PRECISIONS

REPORT_WIDTH = 120
"""Report width when stdout is not a terminal (a terminal uses its own width)."""


# ---- the request (planner.inputs.Request; the what-if options come from the click context) ------------
REQUEST_OPTIONS = frozenset(f.name for f in dataclasses.fields(Request)) - {"model", "cluster"}


def _request(model_arg: str, cluster_arg: str, **options: Any) -> Request:
    """The user's request from a command's options (by keyword; others ignored) and the what-if
    options remembered in the click context (price, PUE, host power, reliability)."""
    given = {k: options[k] for k in REQUEST_OPTIONS if k in options}
    checkpoint, restart = remembered("checkpoint_gbyte_per_s"), remembered("restart_minutes")
    reliability = {"failure_rate_per_device_hour": remembered("failure_rate"),
                   "checkpoint_bytes_per_s_per_device": None if checkpoint is None else checkpoint * 1e9,
                   "restart_s": None if restart is None else restart * 60.0}
    return Request(model=model_arg, cluster=cluster_arg, **given,
                   price_per_device_hour=remembered("price_per_device_hour"), pue=remembered("pue"),
                   host_power_w=remembered("host_power_w"),
                   reliability=Reliability(**{k: v for k, v in reliability.items() if v is not None}))


# ---- commands ----------------------------------------------------------------------------------------
@click.command("plan", cls=Command)
@click.version_option(PLANNER_VERSION, prog_name="clusterplan")  # `plan --version`, as `clusterplan --version`
@apply_options(PROBLEM_OPTIONS + SEARCH_OPTIONS + OUTPUT_OPTIONS)
@guarded
def plan_command(as_json, **options):
    """Search the parallel layouts of MODEL on CLUSTER and report the fastest that fits (or the
    cheapest, or the least energy, with --objective).

    \b
    Example:  plan --model gpt --cluster dgx-superpod
              plan --model llama3-70b --cluster dgx-h100-superpod --devices 256 --fix tp=8 --top 5
    """
    planned = _load_and_search(**options)
    emit(planned.document(), planned.cluster, planned.origin, as_json)


def _load_and_search(*, model_arg, cluster_arg, top_k, engine, time_limit_s, fix, minimum, maximum, memory_headroom,
                     objective, **options) -> Planned:
    """The request and search options of ``plan``/``explain``/``export`` (their options, by name), searched."""
    request = _request(model_arg, cluster_arg, **options)
    search = SearchOptions(engine=engine, top_k=top_k, time_limit_s=time_limit_s, objective=objective,
                           bounds=parse_bounds(fix, minimum, maximum, memory_headroom))
    model = request.load_model()
    with searching(f"searching {model.name} on {cluster_arg}", not remembered("as_json")):
        return plan_request(request, search, model)


@click.command("evaluate")
@click.option("--layout", "layout_text", required=True, metavar="SPEC",
              help='The layout, e.g. "tp=8,pp=8,dp=16,vp=2,mbs=1,recompute=selective,zero=1,sp=on" '
                   "(degrees left out are 1, dp takes the devices left over; zero, recompute and overlap "
                   "left out take a value the framework offers). With recompute=full, recompute_layers=K "
                   "recomputes K layers of each stage; with recompute=selective under Megatron, "
                   "recompute_modules=layernorm+moe_act names Megatron-Core's --recompute-modules; "
                   "head_slots=on: embedding and head in layer slots; cuda_graph=layer|full: CUDA graphs.")
@apply_options(PROBLEM_OPTIONS + OUTPUT_OPTIONS)
@guarded
def evaluate_command(layout_text, as_json, **options):
    """Predict step time and memory of one given layout (no search).

    A layout that does not fit in memory is still reported, with how far it overflows (exit 0).
    """
    doc, cluster, origin = evaluate_request(_request(**options), layout_text)
    emit(doc, cluster, origin, as_json)


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@guarded
def models_command(as_json):
    """List the bundled models."""
    rows = [{**asdict(e), "job_defaults": job_defaults(e.id)} for e in list_models()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    models_table(rows, _console())


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@guarded
def clusters_command(as_json):
    """List the bundled cluster presets."""
    rows = [asdict(e) for e in list_clusters()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    clusters_table(rows, _console())


@click.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@guarded
def devices_command(as_json):
    """List the bundled accelerators."""
    devices = list_devices()
    if as_json:
        click.echo(json.dumps([d.model_dump(mode="json") for d in devices], indent=2))
        return
    devices_table(devices, _console())


@click.command("explain")
@apply_options(PROBLEM_OPTIONS + SEARCH_OPTIONS + OUTPUT_OPTIONS)
@guarded
def explain_command(as_json, **options):
    """Why the best layout won: against each runner-up, what binds, and one step in every knob."""
    doc = _load_and_search(**options).document()
    if as_json:
        click.echo(json.dumps(doc["explanation"], indent=2))
    else:
        explain_report(doc, _console())
    _write_views(lambda: plan_page(doc), doc)


@click.command("compare")
@click.option("--model", "model_arg", required=True, metavar="ID|FILE", help="Bundled model id or alias, or a model file.")
@click.option("--cluster", "clusters", required=True, multiple=True, metavar="ID[:DEVICES]",
              help="A candidate cluster, repeatable: a preset id (or file) with an optional device count, "
                   "e.g. --cluster dgx-h100-superpod:512 --cluster gb200-nvl72:576.")
@click.option("--global-batch", "global_batch", type=POSITIVE_INT, metavar="SEQUENCES", help="Sequences per step.")
@click.option("--seq-len", "seq_len", type=POSITIVE_INT, metavar="TOKENS", help="Tokens per sequence.")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), help="Training precision.")
@click.option("--tokens", "tokens", type=TokenCount(), metavar="N", help="Tokens to train (300e9, 300B, 1.5T).")
@click.option("--framework", "framework", type=click.Choice(list(FRAMEWORK_NAMES), case_sensitive=False),
              help="Training framework for every candidate (default: maxtext on TPU, megatron elsewhere).")
@click.option("--compile/--no-compile", "compiled", default=None,
              help="Run the model under torch.compile (torchtitan only; see plan --help).")
@click.option("--model-code", "model_code", type=click.Choice(list(MODEL_CODES)),
              help="A Hugging Face transformers model class under DeepSpeed or FSDP (see plan --help).")
@apply_options(MOE_ROUTING_OPTIONS)
@apply_options([PRICE_OPTION])
@click.option("--search", "engine", type=click.Choice(list(ENGINES)), default="cpsat", show_default=True,
              help="Search engine for each candidate.")
@click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="time", show_default=True,
              help="Search each candidate for, and rank the candidates by, step time, rental cost per step or "
                   "energy per step (the last two need a price/power for the device: --price-per-device-hour, or "
                   "a cluster file's price_per_device_hour_usd; a candidate without it says so in its row).")
@apply_options(WHATIF_OUTPUT_OPTIONS + OUTPUT_OPTIONS + [CALIBRATION_OPTION])
@guarded
def compare_command(model_arg, clusters, global_batch, seq_len, precision, tokens, framework, compiled, model_code,
                    moe_capacity_factor, moe_load_imbalance, engine, objective, as_json, csv_path, chart_path,
                    calibration):
    """What-if: the best layout of MODEL on each candidate cluster, side by side (step time, MFU,
    time, energy and cost to train the job's tokens).

    \b
    Example:  clusterplan compare --model llama3-70b --cluster dgx-h100-superpod:512 \\
                --cluster gb200-nvl72:576 --tokens 15T --csv compare.csv --chart compare.png

    Exits 0 when at least one candidate can run the job; otherwise with the first candidate's code.
    """
    check_outputs(as_json, csv_path, chart_path)
    candidates = [parse_candidate(c) for c in clusters]
    check_distinct(candidates)
    request = _request(model_arg, candidates[0].cluster, global_batch=global_batch, seq_len=seq_len,
                       precision=precision, tokens=tokens, framework=framework, compiled=compiled,
                       model_code=model_code, moe_capacity_factor=moe_capacity_factor,
                       moe_load_imbalance=moe_load_imbalance, calibration=calibration)
    model = request.load_model()
    with progress_bar("clusters", not as_json) as tick:
        rows = rank(compare(request, candidates, SearchOptions(engine=engine, top_k=0, objective=objective),
                            progress=tick, model=model), objective)
    title = f"what-if: {model.name}"
    _whatif_output(rows, "cluster", title, as_json, csv_path, chart_path,
                   lambda path: compare_chart(rows, path, f"{model.name}: what-if across clusters"))
    _exit_if_none_ran(rows, "cluster")


@click.command("sweep")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the points as Ray tasks: on a Ray cluster at ADDRESS (its workers need clusterplan "
                   "installed), or, with --ray alone, on a Ray instance started for the sweep. Needs the extra: "
                   "pip install 'clusterplan[ray]'.")
@click.option("--jobs", "jobs", type=BoundedNumber(int, 256), default=os.cpu_count() or 1, show_default="all cores",
              help="Points searched in parallel, in forked processes on this machine (1: one process).")
@click.option("--over", "over", required=True, multiple=True, metavar="KNOB=V1,V2,...",
              help="The knob to sweep and its values, one search per value (twice: a grid of every pair of "
                   "values of two knobs, and --chart draws a heatmap): "
                   + ", ".join([*SWEEP_KNOBS, "gpus (= devices)"])
                   + ", e.g. --over devices=256,512,1024 or --over scale-out-gbit-per-s=100,200,400. The other "
                     "options apply to every point; the swept knob's own option must not be given too.")
@apply_options(INPUT_OPTIONS + ENGINE_OPTIONS + WHATIF_OUTPUT_OPTIONS + OUTPUT_OPTIONS)
@guarded
def sweep_command(over, ray_address, jobs, model_arg, cluster_arg, engine, time_limit_s, fix, minimum, maximum,
                  memory_headroom, objective, as_json, csv_path, chart_path, **options):
    """What-if: the best layout of MODEL on CLUSTER at each value of one knob (size, link speed,
    oversubscription, batch, sequence length, device, precision), one row per value: step time,
    MFU, time, energy and cost to train the job's tokens.

    \b
    Example:  clusterplan sweep --model llama3-70b --cluster dgx-h100-superpod \\
                --over devices=256,512,1024 --tokens 15T --csv sweep.csv --chart sweep.png

    Each point is built as `plan` would build it with that option set, and searched for
    --objective. A point that cannot run (no layout fits, a size the fabric cannot take, an unknown
    device, a device without the price or power --objective needs) says why in its row.
    Exits 0 when at least one point ran; otherwise with the first point's code.
    """
    study = parse_grid(over)
    request = _request(model_arg, cluster_arg, **options)
    check_sweep_options(study, request.given())
    check_outputs(as_json, csv_path, chart_path)
    model = request.load_model()
    search = SearchOptions(engine=engine, top_k=0, time_limit_s=time_limit_s, objective=objective,
                           bounds=parse_bounds(fix, minimum, maximum, memory_headroom))
    with progress_bar("points", not as_json and csv_path != "-") as tick:
        rows = sweep(request, study, search, jobs=jobs, progress=tick, ray_address=ray_address, model=model)
    title = f"what-if: {model.name} on {cluster_arg}, over {study.knob}"
    chart_title = f"{model.name} on {cluster_arg}: sweep over {study.knob}"
    if isinstance(study, Grid):
        def draw(path):
            grid_heatmap(rows, path, chart_title, (study.first.spec.axis_label, study.first.values),
                         (study.second.spec.axis_label, study.second.values))
    else:
        def draw(path):
            sweep_chart(rows, path, chart_title, study.spec.axis_label)
    _whatif_output(rows, "point", title, as_json, csv_path, chart_path, draw)
    _exit_if_none_ran(rows, "point")


def _exit_if_none_ran(rows: list[dict], label: str) -> None:
    """Where no row could run, an error line on stderr (each row's reason is in the output) and the
    first row's exit code."""
    if rows and all("error" in r for r in rows):
        what = "candidate cluster" if label == "cluster" else "point"
        _err(f"error: no {what} can run the job ({len(rows)} tried); the first: {rows[0][label]}: {rows[0]['error']}")
        sys.exit(rows[0]["exit_code"])


def _whatif_output(rows: list[dict], label: str, title: str, as_json: bool, csv_path: str | None,
                   chart_path: str | None, draw: Callable[[str], None]) -> None:
    """The rows on stdout (table, JSON, or CSV with --csv -), then any files, each with a line on stderr."""
    if remembered("no_timings"):
        for row in rows:
            (row.get("search") or {}).pop("wall_s", None)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif csv_path != "-":
        whatif_table(rows, label, title, _console())
    if csv_path == "-":
        click.echo(csv_text(rows, label), nl=False)
    elif csv_path:
        try:
            Path(csv_path).write_text(csv_text(rows, label), encoding="utf-8")
        except OSError as err:
            raise SpecError(f"--csv: cannot write {csv_path}: {err.strerror or err}") from None
        _err(f"wrote {csv_path}")
    if chart_path:
        draw(chart_path)
        _err(f"wrote {chart_path}")
    _write_views(lambda: whatif_page(rows, label, title, console_text(lambda c: whatif_table(rows, label, title, c))),
                 next((r for r in rows if "error" not in r), None), f"{title}: one step of the best")


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(list(EXPORT_FORMATS)), required=True,
              help="megatron (Megatron-LM/NeMo arguments), deepspeed (config JSON), torchtitan (0.3's Python "
                   "config registry), torchtitan-0.2 (0.2.2's TOML, planned as of 2026-02), "
                   "maxtext (ici_*/dcn_* overrides), slurm (an sbatch script: srun torchrun pretrain_gpt.py with "
                   "the Megatron arguments; GPU clusters only).")
@apply_options(PROBLEM_OPTIONS + SEARCH_OPTIONS)
@guarded
def export_command(fmt, as_json, **options):
    """Search as plan does, under the format's framework (megatron and slurm: megatron, deepspeed,
    torchtitan, maxtext), then print the best layout as a launcher config (a starting point to
    check against your launcher's version)."""
    framework = export_framework(fmt, resolve_framework(options["framework"]) if options["framework"] else None)
    check_platform(framework, _request(**options).load_cluster().device, f"export --format {fmt}", export=True)
    # the config needs the winner only, searched under the format's framework
    planned = _load_and_search(**{**options, "top_k": 0, "framework": framework,
                                  "framework_date": TORCHTITAN_FORMAT_DATES.get(fmt)})
    text = export(planned.document(), fmt, model=planned.result.model)
    click.echo(json.dumps({"format": fmt, "config": text}, indent=2) if as_json else text)


@click.command("fit")
@apply_options(INPUT_OPTIONS)
@click.option("--memory-headroom", "memory_headroom", type=Headroom(), default=None,
              help="Share of device memory to keep free: 10% or 0.1. Default: the framework's allocator "
                      "margin, 8.4% for megatron, torchtitan, deepspeed, nanotron and te on HBM devices (PyTorch's caching "
                      "allocator reserve, measured), 0 for maxtext and on SRAM machines.")
@click.option("--time-limit", "time_limit_s", type=POSITIVE_FLOAT, default=TIME_LIMIT_S, show_default=True,
              metavar="SECONDS", help="Stop the size search after this long; without an answer by then, exit 4.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@guarded
def fit_command(model_arg, cluster_arg, memory_headroom, time_limit_s, as_json, **options):
    """The fewest devices on which some layout of MODEL fits CLUSTER (or, with --devices or --nodes,
    the device of the preset's family with the least memory on which one fits at that size), found
    by search, with the best layout there. The search starts where the gradients and optimizer
    states of every parameter fit in the devices' memory and checks the sizes the fabric accepts
    (whole nodes; whole racks beyond one NVL72 rack; TPU slices), every one up to 32 nodes, then 16
    per doubling, until one fits or --time-limit runs out (exit 4). Where the framework and the device
    offer host offload (of the activations or of the optimizer states), it answers with offload
    offered too, and names the mode that answer needs.

    \b
    Example:  clusterplan fit --model llama3-405b --cluster dgx-h100-superpod
              clusterplan fit --model llama3-405b --cluster dgx-h100-superpod --devices 64
    """
    fit = fit_request(_request(model_arg, cluster_arg, **options), parse_bounds((), (), (), memory_headroom),
                      time_limit_s)
    if as_json:
        click.echo(json.dumps(fit.document(), indent=2))
        return
    click.echo("\n".join(fit_lines(fit)))


@click.command("validate")
@click.argument("file", required=False, metavar="[FILE]")
@click.option("--json", "as_json", is_flag=True, help="Print {runs, summary} as JSON.")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (as in docs/cost-model.md).")
@click.option("--search", "engine", type=click.Choice(list(ENGINES)), default="cpsat", show_default=True,
              help="Engine for the unpublished knobs and the best layout per run.")
@click.option("--no-best", is_flag=True, help="Skip the planner's own best layout per run (faster).")
@click.option("--calibration", "calibration", metavar="CAL.yaml", type=click.Path(dir_okay=False),
              help="Price each run as this calibration (clusterplan calibrate) says for its device and framework.")
@click.option("--cv", "cv", is_flag=True,
              help="Print only the cross-validated figures of the bundled runs: each source predicted with the "
                   "constants derived from runs re-derived without it, overall, by family and by framework.")
@click.option("--calibrate-one", "calibrate_one", is_flag=True,
              help="For each group of runs of one job and each family under one framework: calibrate on one run, "
                   "predict the others as --calibration would, print their error before and after.")
@guarded
def validate_command(file, as_json, markdown, engine, no_best, calibration, cv, calibrate_one):
    """Compare predictions with published training runs (format clusterplan-runs/1).

    Each run keeps its published layout; unpublished knobs are chosen by the search. Without FILE,
    the runs bundled with clusterplan are used.
    """
    if as_json and markdown:
        raise SpecError("--json and --markdown both format the output; give one")
    if calibrate_one:
        return _calibrate_one(file, as_json, markdown, calibration)
    if cv and (file or calibration or markdown):
        raise SpecError("--cv cross-validates the bundled runs (text or --json): give it without FILE, --calibration "
                        "and --markdown")
    cal = load_calibration(calibration) if calibration else None
    with progress_bar("runs", not as_json and not markdown) as tick:
        result = validate(file, SearchOptions(engine=engine, top_k=0), best=not no_best, progress=tick,
                          calibration=cal)
    if cv:
        result = result["summary"]["cross_validated"]
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif markdown:
        click.echo(markdown_report(result))
    elif cv:
        cv_lines(result, _console(), detail=True)
    else:
        validation_report(result, _console())


def _calibrate_one(file: str | None, as_json: bool, markdown: bool, calibration: str | None) -> None:
    if markdown or calibration:
        raise SpecError("--calibrate-one prints its own table (text or --json) from the uncalibrated runs; "
                        "give it without --markdown and --calibration")
    runs, groups = study_runs(file)
    with progress_bar("runs", not as_json) as tick:
        points, _ = points_from_runs(runs, progress=tick)
    study = calibrate_one(points, groups)
    if as_json:
        click.echo(json.dumps(study, indent=2))
    else:
        calibrate_one_report(study, _console())


@click.command("calibrate")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("-o", "--output", "output", required=True, metavar="CAL.yaml", type=click.Path(dir_okay=False),
              callback=writable_file, help="Where to write the calibration (format clusterplan-calibration/1).")
@click.option("--cluster", "cluster_arg", metavar="ID|FILE", help="The cluster the logs ran on (runs files name their own).")
@click.option("--device", "device", metavar="ID", help="The device the logs ran on, where the preset has several.")
@click.option("--model", "model_arg", metavar="ID|FILE", help="The model of logs that name none (Megatron-Bridge).")
@click.option("--devices", "devices", type=POSITIVE_INT, help="The device count of logs that print none (Megatron-Bridge).")
@click.option("--seq-len", "seq_len", type=POSITIVE_INT, help="The sequence length of logs that give none (DeepSpeed).")
@click.option("--save-runs", "save_runs", metavar="RUNS.yaml", type=click.Path(dir_okay=False), callback=writable_file,
              help="Also write the runs read (from logs too) as a clusterplan-runs/1 file, for validate.")
@click.option("--json", "as_json", is_flag=True, help="Print the fitted entries as JSON.")
@guarded
def calibrate_command(inputs, output, cluster_arg, device, model_arg, devices, seq_len, save_runs, as_json):
    """Fit site parameters on your own measured runs: clusterplan-runs/1 files, or training logs of
    Megatron-LM/NeMo, torchtitan, MaxText or DeepSpeed (LOG or LOG::CONFIG; docs/logs.md). Per device
    and framework, factors on the achieved matmul rate, the memory-bound rate and the host time per
    kernel, and per fabric on the collectives' bandwidth; only those the runs determine: site-level
    factors shrunk by a prior from the repository's runs, and a job-level fit per job (model shape,
    device, framework, precision) that --calibration uses for that job, the site-level for others.
    Prints the prior, the error before, after and leave-one-out, and writes CAL.yaml for --calibration.

    \b
    Example:  clusterplan calibrate my_runs.yaml -o site.yaml
              clusterplan calibrate train.log::train.toml --cluster dgx-h100-superpod -o site.yaml
              clusterplan plan --model llama3-70b --cluster dgx-h100-superpod --calibration site.yaml
    """
    runs = calibration_inputs(inputs, cluster_arg, device=device, model=model_arg, devices=devices, seq_len=seq_len)
    if save_runs:
        save_runs_file(runs, save_runs)
    with progress_bar("runs", not as_json) as tick:
        points, results = points_from_runs(runs, progress=tick)
    entries = fit(points, results)
    save(entries, output)
    fitted = {p.id for p in points}
    skipped = [(r.id, r.reason or "no measured step time") for r in results if r.id not in fitted]
    if as_json:
        click.echo(json.dumps({"file": output, "entries": [e.as_dict() for e in entries],
                               "left_out": [{"id": i, "reason": why} for i, why in skipped]}, indent=2))
        return
    calibration_report([e.as_dict() for e in entries], skipped, output, _console())


@click.command("probe")
@click.option("-o", "--output", "output", required=True, metavar="CAL.yaml", type=click.Path(dir_okay=False),
              callback=writable_file, help="Where to write the calibration (the form clusterplan calibrate writes).")
@click.option("--cluster", "cluster_arg", required=True, metavar="ID|FILE",
              help="The cluster (preset or file) this machine belongs to: its device and fabric are what the figures "
                   "are compared with.")
@click.option("--device", "device", metavar="ID", help="Another device of the preset's family (as for plan).")
@click.option("--framework", "framework", type=click.Choice(list(FRAMEWORK_NAMES), case_sensitive=False),
              help="The framework the calibration is for (default: maxtext on TPU, megatron elsewhere).")
@click.option("--figures", "figures_path", metavar="FILE", type=click.Path(dir_okay=False),
              help="Figures recorded before (probe --save-figures, or benchmarks/gpu_probe.py's JSON) instead of "
                   "measuring this machine.")
@click.option("--save-figures", "save_path", metavar="FILE", type=click.Path(dir_okay=False), callback=writable_file,
              help="Also write the measured figures as JSON.")
@click.option("--quick", is_flag=True, help="Fewer GEMM shapes (about a minute).")
@guarded
def probe_command(output, cluster_arg, device, framework, figures_path, save_path, quick):
    """Measure this machine's GPU (matmul rate, memory copy; under torchrun, NCCL collectives inside
    and across nodes) and write a calibration of the cluster's device and fabric from it. Needs
    PyTorch and a GPU (pip install 'clusterplan[probe]'), or --figures recorded before.

    \b
    Example:  torchrun --nproc-per-node 8 -m clusterplan.cli probe --cluster dgx-h100-superpod -o site.yaml
    """
    figures = read_figures(figures_path) if figures_path else measure(quick)
    if int(os.environ.get("RANK", 0)) != 0:
        return
    entry = probe_entry(figures, cluster_arg, device, framework)
    save([entry], output)
    if save_path:
        Path(save_path).write_text(json.dumps(figures, indent=2))
    calibration_report([entry.as_dict()], [], output, _console())


@click.command("render")
@click.argument("plan_file", metavar="PLAN.json")
@apply_options(OUTPUT_OPTIONS)
@guarded
def render_command(plan_file):
    """Print the report of a saved Plan document (the JSON of `plan --json` or `evaluate --json`)
    from the document alone: no model, cluster or search is loaded again.

    Example:  clusterplan plan --model gpt --cluster dgx-superpod --json > plan.json
              clusterplan render plan.json
    """
    doc = read_plan_document(plan_file)
    sys.stdout.write(report_text(doc, _console()))
    _write_views(lambda: saved_plan_page(doc), doc)


@click.group("clusterplan", cls=Group)
@click.version_option(PLANNER_VERSION, prog_name="clusterplan")
def main():
    """Plan parallel layouts (TP, PP, DP, CP, EP, micro-batching, recomputation, ZeRO, placement on the
    fabric) for training large models on accelerator clusters, with step time, memory, energy and
    cost predicted per layout, searched within what the training framework runs (--framework
    megatron|torchtitan|deepspeed|maxtext|nanotron|te). Placeholders are labelled `unvalidated`.

    Exit codes: 0 ok, 2 bad input, 3 no layout fits, 4 solver stopped without a layout, 1 a bug.
    """


for _command in (plan_command, evaluate_command, explain_command, compare_command, sweep_command, export_command,
                 fit_command, validate_command, calibrate_command, probe_command, render_command, models_command,
                 clusters_command, devices_command):
    main.add_command(_command)

plan_main = plan_command
"""The ``plan`` command as its own entry point: the same command as ``clusterplan plan``."""


def _default_sigpipe() -> None:
    """Let a closed pipe (``plan ... | head``) end the process quietly, as ``cat`` does."""
    import signal

    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def run_clusterplan() -> None:
    """Console script ``clusterplan``."""
    _default_sigpipe()
    main()


def run_plan() -> None:
    """Console script ``plan``."""
    _default_sigpipe()
    plan_main()


def emit(doc: dict, cluster: Cluster, origin: dict[str, str], as_json: bool) -> None:
    doc["inputs"]["origin"] = dict(origin)  # where each job figure came from: `render` prints it again
    if remembered("no_timings") and doc.get("search"):
        doc["search"].pop("wall_s", None)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        render_report(doc, _console())
    _write_views(lambda: plan_page(doc), doc)


def _write_views(page: Callable[[], str], source: dict | None, title: str | None = None) -> None:
    """--html and --timeline, where given (remembered by their options), each with a line on stderr."""
    for path in write_views(remembered("html_path"), remembered("timeline_path"), page, source, title):
        _err(f"wrote {path}")


def _console() -> Console:
    # Created per call so that it writes to the current sys.stdout (tests swap it).
    options = dict(highlight=False, markup=False, emoji=False, soft_wrap=True)
    console = Console(**options)
    return console if console.is_terminal else Console(width=REPORT_WIDTH, **options)


if __name__ == "__main__":
    main()
