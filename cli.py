"""The command line: parse options, load the inputs, call ``planner``, render a report or JSON.

Commands: ``clusterplan plan|evaluate|explain|compare|sweep|export|validate|models|clusters|devices``;
``plan`` is also installed as a command of its own (``plan --model gpt --cluster dgx-superpod``).
Every figure printed comes from the Plan document (``planner.report.plan``); nothing here computes a cost.

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
import functools
import io
import contextlib
import json
import math
import os
import re
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import click
from rich import box
from rich.console import Console
from rich.table import Table

from clusterplan.cost.framework import FRAMEWORKS, check_platform, resolve_name as resolve_framework
from clusterplan.cost.layout import MODEL_CODES, Layout, recompute_text
from clusterplan.cost.terms import stage_split
from clusterplan.models.ops import ATTENTION_KINDS
from clusterplan.cost.goodput import Reliability
from clusterplan.models.errors import ClusterplanError, InfeasibleError, SpecError
from clusterplan.models.library import job_defaults, list_models
from clusterplan.planner.report.plan import NO_PUBLISHED_RUN, PLANNER_VERSION, read_plan_document
from clusterplan.planner.inputs import Request, default_global_batch  # noqa: F401 (re-exported: tests, API)
from clusterplan.planner.requests import Planned, evaluate_request, fit_request, plan_request
from clusterplan.planner.studies.fit import TIME_LIMIT_S
from clusterplan.planner.search import ENGINES, SearchOptions
from clusterplan.planner.search.engine import MAX_TOP_K
from clusterplan.planner.search.space import REASONS, parse_bounds
from clusterplan.planner.studies.validate import markdown_report, unpublished_rows, validate
from clusterplan.planner.report.chart import check_chart_path, compare_chart, grid_heatmap, sweep_chart
from clusterplan.planner.studies.whatif import (OBJECTIVES, SWEEP_KNOBS, Grid, check_sweep_options, compare, csv_text,
                                        check_distinct, parse_candidate, parse_grid, rank, sweep)
from clusterplan.planner.report.export import FORMATS as EXPORT_FORMATS, TORCHTITAN_FORMAT_DATES, export, export_framework
from clusterplan.topologies.cluster import Cluster
from clusterplan.topologies.library import MAX_NIC_GBIT_PER_S, MIN_NIC_GBIT_PER_S, list_clusters, list_devices
from clusterplan.topologies.precisions import FP8_SCALINGS, PRECISIONS

EXIT_BUG = 1
GIB = 2**30
"""Tokens per optimizer step of the default global batch (about 4M, the GPT-3/Llama range)."""
REPORT_WIDTH = 120
"""Report width when stdout is not a terminal (a terminal uses its own width)."""


class _Errors:
    """Usage errors as the README's ``error: <message>`` (exit 2), not click's Usage/Error block."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            _err(f"error: {err.format_message()}{where}")
            sys.exit(2)
        except click.exceptions.ClickException as err:
            _err(f"error: {err.format_message()}")
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            _err("error: aborted")
            sys.exit(1)
        if isinstance(rv, int) and rv:  # click.exceptions.Exit with standalone_mode off
            sys.exit(rv)
        return rv


class Group(_Errors, click.Group):
    pass


class Command(_Errors, click.Command):
    pass


# ---- option types ----------------------------------------------------------------------------------
class TokenCount(click.ParamType):
    """A token count: ``300e9``, ``300000000000``, ``300B``, ``1.5T``, ``500M``."""

    name = "tokens"
    SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

    def convert(self, value: Any, param, ctx) -> int:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            match = re.fullmatch(r"\s*([0-9][0-9_.]*(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", str(value), re.I)
            try:
                number = float(match.group(1)) * self.SUFFIXES[match.group(2).lower()] if match else math.nan
            except ValueError:
                number = math.nan
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a token count; write e.g. 300e9, 300B or 1.5T", param, ctx)
        if round(number) < 1:
            self.fail(f"{value!r}: a training run has at least 1 token; write e.g. 300e9, 300B or 1.5T", param, ctx)
        return int(round(number))


class Headroom(click.ParamType):
    """A fraction of device memory kept free: ``10%`` or ``0.1``."""

    name = "fraction"

    def convert(self, value: Any, param, ctx) -> float:
        text = str(value).strip()
        percent = text.endswith("%")
        try:
            number = float(text.removesuffix("%"))
        except ValueError:
            self.fail(f"{value!r} is not a fraction; write e.g. 10% or 0.1", param, ctx)
        fraction = number / 100 if percent else number
        if not 0 <= fraction < 1:
            self.fail(f"{value!r} is out of range; give 0% to 99% (or a fraction 0 to 0.99)", param, ctx)
        return fraction


class BoundedNumber(click.ParamType):
    """A positive, finite number no larger than ``maximum``: beyond it the arithmetic of the cost
    model and the search (64-bit integers after quantization) cannot hold it, so it is bad input."""

    def __init__(self, kind: type, maximum: float, unit: str = "", minimum: float | None = None):
        self.kind, self.maximum, self.unit, self.minimum = kind, maximum, unit, minimum
        self.name = "integer" if kind is int else "number"

    def convert(self, value: Any, param, ctx):
        try:
            number = self.kind(str(value).strip()) if not isinstance(value, (int, float)) else self.kind(value)
        except (ValueError, OverflowError):
            self.fail(f"{value!r} is not a{'n integer' if self.kind is int else ' number'}", param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not finite; give a positive number up to {self.maximum:g}{self.unit}", param, ctx)
        low_ok = number > 0 if self.minimum is None else number >= self.minimum
        if not (low_ok and number <= self.maximum):
            most = f"{self.maximum:,}" if self.kind is int else f"{self.maximum:g}"
            least = "more than 0" if self.minimum is None else f"at least {self.minimum:g}"
            self.fail(f"{value!r} is out of range; allowed: {least} and at most {most}{self.unit}", param, ctx)
        return number


POSITIVE_INT = BoundedNumber(int, 2**31 - 1)  # devices, nodes, sequences, tokens per sequence
POSITIVE_FLOAT = BoundedNumber(float, 1e6)  # Gb/s per device (a petabit), seconds of solver time


# ---- errors and exit codes ---------------------------------------------------------------------------
def _err(line: str) -> None:
    click.echo(line, err=True)


def guarded(fn: Callable) -> Callable:
    """Map every exception of a command to its message on stderr and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows up here, inside the handler below
            return result
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # `plan ... | head`: the reader has gone. Point stdout at /dev/null so the interpreter's
            # final flush does not fail again, and end as a normal pipeline member would.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except InfeasibleError as err:
            _err(f"error: {err}")
            if err.rejections:
                counts = ", ".join(f"{REASONS.get(k, k)}: {n:,}"
                                   for k, n in sorted(err.rejections.items(), key=lambda kv: -kv[1]))
                _err(f"rejected layouts: {counts}")
            if err.hint:
                _err(f"hint: {err.hint}")
            sys.exit(err.exit_code)
        except ClusterplanError as err:
            _err(f"error: {err}")
            sys.exit(err.exit_code)
        except Exception as err:  # noqa: BLE001 - the last line of defence: a bug, reported as one
            _err(f"internal error: {type(err).__name__}: {err}")
            _err("this is a bug in clusterplan: please report it with the command line you ran "
                 "(CLUSTERPLAN_DEBUG=1 prints the traceback)")
            if os.environ.get("CLUSTERPLAN_DEBUG") == "1":
                traceback.print_exc()
            sys.exit(EXIT_BUG)

    return wrapper


# ---- the request (planner.inputs.Request; the what-if options come from the click context) ------------
REQUEST_OPTIONS = frozenset(f.name for f in dataclasses.fields(Request)) - {"model", "cluster"}


def _request(model_arg: str, cluster_arg: str, **options: Any) -> Request:
    """The user's request from a command's options (by keyword; others ignored) and the what-if
    options remembered in the click context (price, PUE, host power, reliability)."""
    given = {k: options[k] for k in REQUEST_OPTIONS if k in options}
    checkpoint, restart = _given("checkpoint_gbyte_per_s"), _given("restart_minutes")
    reliability = {"failure_rate_per_device_hour": _given("failure_rate"),
                   "checkpoint_bytes_per_s_per_device": None if checkpoint is None else checkpoint * 1e9,
                   "restart_s": None if restart is None else restart * 60.0}
    return Request(model=model_arg, cluster=cluster_arg, **given,
                   price_per_device_hour=_given("price_per_device_hour"), pue=_given("pue"),
                   host_power_w=_given("host_power_w"),
                   reliability=Reliability(**{k: v for k, v in reliability.items() if v is not None}))


FRAMEWORK_NAMES = FRAMEWORKS + ("nemo", "megatron-bridge", "megatron-lm", "megatron-core")

# ---- shared options ---------------------------------------------------------------------------------
def _apply(options: list[Callable]) -> Callable:
    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a what-if option (price, PUE, reliability) in the context for load_cluster and build_job:
    they apply to every command that loads a cluster or a job, without threading them through each."""
    if value is not None:
        ctx.meta[f"clusterplan.{param.name}"] = value
    return value


def _given(name: str) -> Any:
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(f"clusterplan.{name}")


MOE_ROUTING_OPTIONS = [
    click.option("--moe-capacity-factor", "moe_capacity_factor", type=BoundedNumber(float, 64.0, minimum=1.0),
                 metavar="RATIO",
                 help="MoE models: expert capacity as a multiple of the mean load, each expert's input padded "
                      "to it (Megatron-Core --moe-expert-capacity-factor); the most loaded rank computes, sends "
                      "and keeps that many routed tokens. Default: the model's (dropless)."),
    click.option("--moe-load-imbalance", "moe_load_imbalance", type=BoundedNumber(float, 64.0, minimum=1.0),
                 metavar="RATIO",
                 help="MoE models, dropless routing: the most loaded expert-parallel rank's routed tokens over "
                      "the mean (default: the model's, 1 = balanced, as benchmarks that force balance run)."),
]
PRICE_OPTION = click.option(
    "--price-per-device-hour", "price_per_device_hour", type=BoundedNumber(float, 1e4), metavar="USD",
    expose_value=False, callback=_remember,
    help="Rental price per device-hour, replacing the catalogue's and a cluster file's price_per_device_hour_usd "
         "(cost figures and --objective cost).")
INPUT_OPTIONS = [
    click.option("--model", "model_arg", required=True, metavar="ID|FILE",
                 help="Bundled model id or alias (see `clusterplan models`), or the path of a YAML/JSON "
                      "model file or of a Hugging Face config.json."),
    click.option("--cluster", "cluster_arg", required=True, metavar="ID|FILE",
                 help="Cluster preset id or alias (see `clusterplan clusters`), or the path of a YAML "
                      "cluster file."),
    click.option("--devices", "--gpus", "num_devices", type=POSITIVE_INT,
                 help="Number of accelerators (default: the preset's reference size, or the cluster file's "
                      "size; these options override a cluster file's values)."),
    click.option("--nodes", "num_nodes", type=POSITIVE_INT,
                 help="Number of nodes (hosts) instead of --devices."),
    click.option("--device", "device", metavar="ID",
                 help="Another device of the preset's family, e.g. h200-sxm-141gb on dgx-h100-superpod "
                      "(see `clusterplan devices`)."),
    click.option("--scale-out-gbit-per-s", "scale_out_gbit_per_s", metavar="GBIT",
                 type=BoundedNumber(float, MAX_NIC_GBIT_PER_S, minimum=MIN_NIC_GBIT_PER_S),
                 help="NIC bandwidth per device and direction, Gb/s, replacing the preset's."),
    click.option("--oversubscription", type=BoundedNumber(float, 64.0, minimum=1.0), metavar="RATIO",
                 help="Leaf downlink/uplink ratio of a fat-tree preset (1 = non-blocking)."),
    click.option("--domain-devices", "domain_devices", type=POSITIVE_INT, metavar="N",
                 help="Devices the job uses in each NVLink Switch domain of an NVL72 preset, a multiple of "
                      "the devices per node (e.g. 64 of a rack's 72, as SLURM --segment 16 allocates; "
                      "default: the whole domain)."),
    click.option("--global-batch", "global_batch", type=POSITIVE_INT, metavar="SEQUENCES",
                 help="Sequences per optimizer step. Default: the model's published batch, else the power "
                      "of two nearest to 4,194,304 / seq-len (about 4M tokens per step)."),
    click.option("--seq-len", "seq_len", type=POSITIVE_INT, metavar="TOKENS",
                 help="Tokens per sequence (default: the model's published training length)."),
    click.option("--precision", type=click.Choice(list(PRECISIONS)),
                 help="Training precision: bf16, fp16, or the linear layers' GEMMs in fp8 (per-tensor "
                      "scales), mxfp8 or nvfp4 (block-scaled; NVIDIA Blackwell; megatron, torchtitan "
                      "mxfp8). Default: the model's published one, else bf16."),
    click.option("--tokens", "tokens", type=TokenCount(), metavar="N",
                 help="Tokens to train, for time, energy and cost to train: 300e9, 300B, 1.5T "
                      "(default: the model's published figure, if any)."),
    click.option("--framework", "framework", type=click.Choice(list(FRAMEWORK_NAMES), case_sensitive=False),
                 help="The training framework whose profile the plan must run under: megatron (also nemo, "
                      "megatron-bridge), torchtitan, deepspeed, maxtext. Default: maxtext on TPU, megatron "
                      "elsewhere. The search offers only the knobs and combinations it has, and prices "
                      "overlap by its mechanism (see docs/frameworks.md)."),
    click.option("--compile/--no-compile", "compiled", default=None,
                 help="Run the model under torch.compile (torchtitan's compile.enable; off by default, as in "
                      "torchtitan): memory is priced as the compiled graph keeps it, and torchtitan's async TP, "
                      "which needs compile, becomes a knob. Only --framework torchtitan has this switch."),
    click.option("--fp8-scaling", "fp8_scaling", type=click.Choice(list(FP8_SCALINGS)),
                 help="With --precision fp8: delayed (scales from earlier steps' amax history; Megatron-LM's "
                      "default --fp8-recipe) or current (each tensor's own amax first: Megatron's --fp8-recipe "
                      "tensorwise, Megatron-Bridge's fp8_cs, torchao's float8), whose casts cost about twice as "
                      "much. Default: the framework's."),
    click.option("--model-code", "model_code", type=click.Choice(list(MODEL_CODES)),
                 help="Whose modules implement the model: native (default: the framework's own, e.g. Megatron's "
                      "fused layers, torchtitan's eager Llama), huggingface (a Hugging Face transformers model "
                      "class trained under DeepSpeed ZeRO or FSDP: with --framework deepspeed or torchtitan, data "
                      "parallelism only; memory and time priced as its eager ops keep and run them) or fused (a "
                      "model built from Transformer Engine layers under a framework whose own modules are eager, "
                      "e.g. NeMo Automodel's TE models with --framework torchtitan) or llmfoundry (llm-foundry's MPT "
                      "modules under Composer's FSDP, with --framework torchtitan: its fused cross-entropy holds "
                      "4 B per logit)."),
    PRICE_OPTION,
    click.option("--pue", type=BoundedNumber(float, 5.0, minimum=1.0), metavar="RATIO", expose_value=False,
                 callback=_remember,
                 help="Power usage effectiveness of the facility: energy figures are multiplied by it "
                      "(default 1.0: the cluster's own draw, host share included where the preset states it)."),
    click.option("--host-power-w", "host_power_w", type=BoundedNumber(float, 1e5, minimum=0.0), metavar="WATTS",
                 expose_value=False, callback=_remember,
                 help="Host power per device (CPUs, NICs, switches, fans), replacing the preset's (default: the "
                      "DGX presets' figures; elsewhere 0.8 x board power, an assumption labelled unvalidated)."),
    click.option("--failure-rate", "failure_rate", type=BoundedNumber(float, 1.0, minimum=0.0), metavar="PER_DEVICE_HOUR",
                 expose_value=False, callback=_remember,
                 help="Failures per device-hour, for the goodput in time to train (default 1.97e-5: Llama 3's 419 "
                      "unexpected interruptions in 54 days on 16,384 H100s; 0 for none)."),
    click.option("--checkpoint-gbyte-per-s", "checkpoint_gbyte_per_s", type=BoundedNumber(float, 1e4, minimum=1e-6),
                 metavar="GBYTE",
                 expose_value=False, callback=_remember,
                 help="Storage write bandwidth per device for checkpoints, GB/s (default 0.122: Llama 3's 2 TB/s "
                      "for 16,384 GPUs)."),
    click.option("--restart-minutes", "restart_minutes", type=BoundedNumber(float, 1e4, minimum=0.0), metavar="MIN",
                 expose_value=False, callback=_remember,
                 help="Time to restart after a failure (default 10: an assumption, labelled unvalidated)."),
    *MOE_ROUTING_OPTIONS,
    click.option("--attention", type=click.Choice(list(ATTENTION_KINDS)), default=None,
                 help="Attention kernel (default: the framework's): flash (fused, the device's best: FlashAttention-3/cuDNN on Hopper), "
                      "flash2 (FlashAttention-2 kernels, e.g. PyTorch SDPA: slower on Hopper), flash1 (FlashAttention-1-era "
                      "kernels: flash-attn 1.x, 2023 Triton ports; 0.55 of flash2's rate) or unfused "
                      "(scores written to memory, separate softmax and dropout: stacks from before "
                      "FlashAttention, e.g. Megatron-LM 2021)."),
]
PROBLEM_OPTIONS = INPUT_OPTIONS + [
    click.option("--json", "as_json", is_flag=True, callback=_remember,
                 help="Print the Plan document as JSON, nothing else."),
    click.option("--no-timings", "no_timings", is_flag=True, default=None, expose_value=False, callback=_remember,
                 help="Leave the search's wall time out of the document, so that the same input gives the same "
                      "bytes."),
]
TOP_OPTION = click.option("--top", "top_k", type=click.IntRange(0, MAX_TOP_K), default=3, show_default=True,
                          help=f"Runners-up to report (0 to {MAX_TOP_K}).")
ENGINE_OPTIONS = [
    click.option("--search", "engine", type=click.Choice(list(ENGINES)), default="cpsat", show_default=True,
                 help="cpsat: the OR-Tools CP-SAT model; exhaustive: numpy brute force over the same tables."),
    click.option("--time-limit", "time_limit_s", type=POSITIVE_FLOAT, metavar="SECONDS",
                 help="Stop CP-SAT after this long and report the best layout found and its gap."),
    click.option("--fix", multiple=True, metavar="KNOB=VALUE",
                 help="Hold a knob: tp, pp, dp, cp, ep, etp (1: whole experts, ep carved from tp*cp*dp; or "
                      "tp), vp, mbs, sp, recompute, zero, order, dp_overlap, tp_overlap, ep_overlap, head_slots "
                      "(on: the embedding and the LM head each take a layer's slot in the pipeline split; unfixed, the "
                      "search tries both splits the framework offers) (repeatable, or comma-separated: --fix tp=8,pp=4)."),
    click.option("--min", "minimum", multiple=True, metavar="KNOB=VALUE",
                 help="Lower bound on a numeric knob, e.g. --min dp=4 (repeatable)."),
    click.option("--max", "maximum", multiple=True, metavar="KNOB=VALUE",
                 help="Upper bound on a numeric knob, e.g. --max pp=16 (repeatable)."),
    click.option("--memory-headroom", "memory_headroom", type=Headroom(), default=None,
                 help="Share of device memory to keep free: 10% or 0.1. Default: the framework's allocator "
                      "margin, 8.4% for megatron, torchtitan and deepspeed on HBM devices (PyTorch's caching "
                      "allocator reserve, measured), 0 for maxtext and on SRAM machines."),
    click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="time", show_default=True,
                 help="What to minimise per step: time; cost (rental price x time, so the same layout as "
                      "time on one cluster); energy (board power while computing, idle power while waiting "
                      "on communication or bubbles, plus the host's share)."),
]
SEARCH_OPTIONS = [TOP_OPTION] + ENGINE_OPTIONS
WHATIF_OUTPUT_OPTIONS = [
    click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON."),
    click.option("--csv", "csv_path", metavar="FILE",
                 help="Also write the rows as CSV to FILE (- for stdout, instead of the table)."),
    click.option("--chart", "chart_path", metavar="FILE.png",
                 help="Also draw the rows as a chart (.png, .svg or .pdf; needs matplotlib: "
                      "pip install 'clusterplan[chart]')."),
    click.option("--no-timings", "no_timings", is_flag=True, default=None, expose_value=False, callback=_remember,
                 help="Leave each search's wall time out of the rows, so that the same input gives the same "
                      "bytes."),
]


# ---- commands ----------------------------------------------------------------------------------------
@click.command("plan", cls=Command)
@click.version_option(PLANNER_VERSION, prog_name="clusterplan")  # `plan --version`, as `clusterplan --version`
@_apply(PROBLEM_OPTIONS + SEARCH_OPTIONS)
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
    with searching(f"searching {model.name} on {cluster_arg}"):
        return plan_request(request, search, model)


@click.command("evaluate")
@click.option("--layout", "layout_text", required=True, metavar="SPEC",
              help='The layout, e.g. "tp=8,pp=8,dp=16,vp=2,mbs=1,recompute=selective,zero=1,sp=on" '
                   "(degrees left out are 1, dp takes the devices left over; zero, recompute and overlap "
                   "left out take a value the framework offers). With recompute=full, recompute_layers=K "
                   "recomputes K layers of each stage; with recompute=selective under Megatron, "
                   "recompute_modules=layernorm+moe_act names Megatron-Core's --recompute-modules; "
                   "head_slots=on gives the embedding and the LM head a layer's slot each in the pipeline split.")
@_apply(PROBLEM_OPTIONS)
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
    table = _table("id", "aliases", "name", ("params", "right"), ("active", "right"), ("batch x seq", "right"))
    for r in rows:
        d = r["job_defaults"]
        active = "" if r["num_active_params"] == r["num_params"] else _count(r["num_active_params"])
        batch = f"{d['global_batch_size'] or '?'} x {d['seq_len']}"
        table.add_row(r["id"], ", ".join(r["aliases"]), r["name"], _count(r["num_params"]), active, batch)
    _print_catalogue(table, "pass --model ID (or an alias), or the path of a YAML/JSON file or HF config.json")


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@guarded
def clusters_command(as_json):
    """List the bundled cluster presets."""
    rows = [asdict(e) for e in list_clusters()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = _table("id", "aliases", "family", "device", ("devices", "right"), ("per node", "right"))
    for r in rows:
        table.add_row(r["id"], ", ".join(r["aliases"]), r["family"], r["device"], f"{r['reference_size']:,}",
                      str(r["devices_per_node"]))
    _print_catalogue(table, "pass --cluster ID with --devices N or --nodes N, or the path of a cluster YAML file")


@click.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@guarded
def devices_command(as_json):
    """List the bundled accelerators."""
    devices = list_devices()
    if as_json:
        click.echo(json.dumps([d.model_dump(mode="json") for d in devices], indent=2))
        return
    table = _table("id", "family", ("memory", "right"), ("bf16 TFLOP/s", "right"), ("fp8 TFLOP/s", "right"),
                   ("mem TB/s", "right"), ("power W", "right"), ("$/hour", "right"))
    for d in devices:
        fp8 = d.peak_flops_per_s.get("fp8")
        table.add_row(d.id, d.family, f"{d.memory_bytes / GIB:.1f} GiB {d.memory_kind.upper()}",
                      f"{d.peak('bf16') / 1e12:,.0f}", "-" if not fp8 else f"{fp8 / 1e12:,.0f}",
                      f"{d.memory_bytes_per_s / 1e12:,.2f}", "-" if d.power_w is None else f"{d.power_w:.0f}",
                      "-" if d.price_per_hour_usd is None else f"{d.price_per_hour_usd:.2f}")
    _print_catalogue(table, "pass --device ID to swap the device of a preset (same family)")


@click.command("explain")
@_apply(PROBLEM_OPTIONS + SEARCH_OPTIONS)
@guarded
def explain_command(as_json, **options):
    """Why the best layout won: against each runner-up, what binds, and one step in every knob."""
    doc = _load_and_search(**options).document()
    if as_json:
        click.echo(json.dumps(doc["explanation"], indent=2))
        return
    console = _console()
    console.print(f"best: {_layout_text(doc['layout'])}  step {doc['step_time_s']:.3f} s")
    if doc["explanation"].get("placement"):
        console.print(f"on the torus: {'; '.join(doc['explanation']['placement'])}")
    console.print()
    _why(doc, console)
    table = _table("move", ("step time s", "right"), ("change", "right"), ("fit GiB", "right"), "note",
                   title="one step in each knob")
    for row in doc["explanation"]["sensitivity"]:
        step = row.get("step_time_s")
        table.add_row(row["move"], "-" if step is None else f"{step:.3f}",
                      "-" if step is None else f"{row['delta']:+.1%}",
                      "-" if row.get("fit_memory_bytes") is None else _gib(row["fit_memory_bytes"]),
                      row.get("reason", ""))
    console.print(table)


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
@_apply(MOE_ROUTING_OPTIONS)
@_apply([PRICE_OPTION])
@click.option("--search", "engine", type=click.Choice(list(ENGINES)), default="cpsat", show_default=True,
              help="Search engine for each candidate.")
@click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="time", show_default=True,
              help="Search each candidate for, and rank the candidates by, step time, rental cost per step or "
                   "energy per step (the last two need a price/power for the device: --price-per-device-hour, or "
                   "a cluster file's price_per_device_hour_usd; a candidate without it says so in its row).")
@_apply(WHATIF_OUTPUT_OPTIONS)
@guarded
def compare_command(model_arg, clusters, global_batch, seq_len, precision, tokens, framework, compiled, model_code,
                    moe_capacity_factor, moe_load_imbalance, engine, objective, as_json, csv_path, chart_path):
    """What-if: the best layout of MODEL on each candidate cluster, side by side (step time, MFU,
    time, energy and cost to train the job's tokens).

    \b
    Example:  clusterplan compare --model llama3-70b --cluster dgx-h100-superpod:512 \\
                --cluster gb200-nvl72:576 --tokens 15T --csv compare.csv --chart compare.png

    Exits 0 when at least one candidate can run the job; otherwise with the first candidate's code.
    """
    _check_outputs(as_json, csv_path, chart_path)
    candidates = [parse_candidate(c) for c in clusters]
    check_distinct(candidates)
    request = _request(model_arg, candidates[0].cluster, global_batch=global_batch, seq_len=seq_len,
                       precision=precision, tokens=tokens, framework=framework, compiled=compiled,
                       model_code=model_code, moe_capacity_factor=moe_capacity_factor,
                       moe_load_imbalance=moe_load_imbalance)
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
@_apply(INPUT_OPTIONS + ENGINE_OPTIONS + WHATIF_OUTPUT_OPTIONS)
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
    _check_outputs(as_json, csv_path, chart_path)
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


def _check_outputs(as_json: bool, csv_path: str | None, chart_path: str | None) -> None:
    """Refuse output options that cannot work before any search runs."""
    if csv_path == "-" and as_json:
        raise SpecError("--csv -: stdout already carries the --json rows; write the CSV to a file (--csv rows.csv)")
    if csv_path and csv_path != "-" and not Path(csv_path).parent.is_dir():
        raise SpecError(f"--csv: folder {str(Path(csv_path).parent)!r} does not exist; create it or write elsewhere")
    if csv_path and csv_path != "-" and Path(csv_path).is_dir():
        raise SpecError(f"--csv: {csv_path!r} is a directory; give a file name (e.g. --csv rows.csv)")
    if chart_path:
        check_chart_path(chart_path)
    if csv_path and chart_path and csv_path != "-" and Path(csv_path).resolve() == Path(chart_path).resolve():
        raise SpecError(f"--csv and --chart both name {csv_path!r}: the chart would overwrite the rows; "
                        "give each its own file (e.g. --csv rows.csv --chart rows.png)")


def _whatif_output(rows: list[dict], label: str, title: str, as_json: bool, csv_path: str | None,
                   chart_path: str | None, draw: Callable[[str], None]) -> None:
    """The rows on stdout (table, JSON, or CSV with --csv -), then any files, each with a line on stderr."""
    if _given("no_timings"):
        for row in rows:
            (row.get("search") or {}).pop("wall_s", None)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif csv_path != "-":
        _whatif_table(rows, label, title, _console())
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


def _whatif_table(rows: list[dict], label: str, title: str, console: Console) -> None:
    """One line per row, failures below the table. ``label`` is the key naming each row (``cluster``,
    or ``point`` of a sweep, where the column shows the value under the knob's name)."""
    header = rows[0]["knob"] if label == "point" and rows else label
    table = _table(header, "devices", ("step s", "right"), ("MFU", "right"), ("used GiB", "right"),
                   ("to train", "right"), ("energy MWh", "right"), ("cost", "right"), "best layout", title=title)

    def name(r: dict) -> str:
        return r[label].split("=", 1)[1] if label == "point" else r[label]

    errors = []
    for r in rows:
        if "error" in r:
            errors.append(f"{r[label]}: {r['error']}")
            table.add_row(name(r), "-", "-", "-", "-", "-", "-", "-", "no layout (below)")
            continue
        train = "-" if r["time_to_train_s"] is None else _duration(r["time_to_train_s"])
        energy = "-" if r["energy_j"] is None else f"{r['energy_j'] / 3.6e9:,.0f}"
        cost = "-" if r["cost_usd"] is None else f"${r['cost_usd']:,.0f}"
        table.add_row(name(r), f"{r['num_devices']:,} x {r['device']}", f"{r['step_time_s']:.3f}",
                      f"{r['mfu']:.1%}", _gib(r["fit_memory_bytes"]), train, energy, cost, _compact(r["layout"]))
    _keep_whole(table)  # a candidate's name and its device are never cut short or broken
    _keep_whole(table, 1)
    console.print(table)
    if any("error" not in r for r in rows):
        console.print("used GiB: the peak allocated with the runtime, what must fit (the caching allocator may "
                      "reserve more; plan shows both)")
        _print_row_trust(rows, name)
    for line in errors:
        console.print(line)


def _print_row_trust(rows: list[dict], name: Callable[[dict], str]) -> None:
    """Per row: its hardware family's validated step-time error, and how many placeholders its
    prediction rests on (``plan`` lists them)."""
    console = _console()
    console.print("trust per row: the hardware family's validated step-time error (clusterplan validate), and the "
                  "unvalidated assumptions behind the prediction (plan lists them)")
    for r in rows:
        if "error" in r:
            continue
        more = [line for line in r.get("unvalidated", []) if not line.startswith(NO_PUBLISHED_RUN)]
        extra = f"; {len(more)} unvalidated assumption{'s' if len(more) != 1 else ''}" if more else ""
        console.print(f"  {name(r)}: {r['validated_error']}{extra}")


def _compact(layout: dict) -> str:
    """The degrees and micro-batch of a layout, for narrow tables."""
    parts = [f"{k}{layout[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "vp") if layout[k] > 1 or k in ("tp", "pp", "dp")]
    return " ".join(parts + [f"mbs{layout['micro_batch_size']}", recompute_text(layout), f"z{layout['zero_stage']}"])


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(list(EXPORT_FORMATS)), required=True,
              help="megatron (Megatron-LM/NeMo arguments), deepspeed (config JSON), torchtitan (0.3's Python "
                   "config registry), torchtitan-0.2 (0.2.2's TOML, planned as of 2026-02), "
                   "maxtext (ici_*/dcn_* overrides), slurm (an sbatch script: srun torchrun pretrain_gpt.py with "
                   "the Megatron arguments; GPU clusters only).")
@_apply(PROBLEM_OPTIONS + SEARCH_OPTIONS)
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
@_apply(INPUT_OPTIONS)
@click.option("--memory-headroom", "memory_headroom", type=Headroom(), default=None,
              help="Share of device memory to keep free: 10% or 0.1. Default: the framework's allocator "
                      "margin, 8.4% for megatron, torchtitan and deepspeed on HBM devices (PyTorch's caching "
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
    per doubling, until one fits or --time-limit runs out (exit 4).

    \b
    Example:  clusterplan fit --model llama3-405b --cluster dgx-h100-superpod
              clusterplan fit --model llama3-405b --cluster dgx-h100-superpod --devices 64
    """
    fit = fit_request(_request(model_arg, cluster_arg, **options), parse_bounds((), (), (), memory_headroom),
                      time_limit_s)
    if as_json:
        click.echo(json.dumps(fit.document(), indent=2))
        return
    answer, best = fit.answer, fit.planned.result.best
    click.echo(f"{fit.question}: {answer.num_devices:,} x {answer.device}")
    click.echo(f"  best layout there: {best.layout.short()}, step {best.step_time_s:.3f} s, "
               f"peak {best.memory.fit_bytes / GIB:.1f} of {best.capacity_bytes / GIB:.1f} GiB allocated with the runtime "
               f"({best.peak_memory_bytes / GIB:.1f} reserved)")
    if answer.devices_tried is not None:
        click.echo("  devices checked, least memory first: " + ", ".join(
            f"{d} {'fits' if ok else 'no'}" for d, (_, ok) in zip(answer.devices_tried, answer.checked)))
    else:
        click.echo("\n".join(f"  {line}" for line in answer.notes()))


@click.command("validate")
@click.argument("file", required=False, metavar="[FILE]")
@click.option("--json", "as_json", is_flag=True, help="Print {runs, summary} as JSON.")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (as in docs/cost-model.md).")
@click.option("--search", "engine", type=click.Choice(list(ENGINES)), default="cpsat", show_default=True,
              help="Engine for the unpublished knobs and the best layout per run.")
@click.option("--no-best", is_flag=True, help="Skip the planner's own best layout per run (faster).")
@guarded
def validate_command(file, as_json, markdown, engine, no_best):
    """Compare predictions with published training runs (format clusterplan-runs/1).

    Each run keeps its published layout; unpublished knobs are chosen by the search. Without FILE,
    the runs bundled with clusterplan are used.
    """
    if as_json and markdown:
        raise SpecError("--json and --markdown both format the output; give one")
    with progress_bar("runs", not as_json and not markdown) as tick:
        result = validate(file, SearchOptions(engine=engine, top_k=0), best=not no_best, progress=tick)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if markdown:
        click.echo(markdown_report(result))
        return
    _validation_report(result, _console())


def _validation_report(result: dict, console: Console) -> None:
    table = _table("run", "hardware", "framework", ("predicted s", "right"), ("measured s", "right"),
                   ("error", "right"), "fits", ("best s", "right"), title=f"validation: {result['file']}")
    for r in result["runs"]:
        if r["reason"]:
            table.add_row(r["id"], f"{r['device']} x {r['count']}", "-", "-", "-", "-", "-", f"not evaluated: {r['reason']}")
            continue
        meas = "-" if not r["measured_step_time_s"] else f"{r['measured_step_time_s']:.3f}"
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        best = "-" if r["best_step_time_s"] is None else f"{r['best_step_time_s']:.3f}"
        table.add_row(r["id"], f"{r['device']} x {r['count']}", r["framework"].split(" ")[0],
                      f"{r['predicted_step_time_s']:.3f}", meas, err, "yes" if r["fits"] else "NO", best)
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


def _ranking_lines(rk: dict, console: Console) -> None:
    if not rk.get("pairs"):
        return
    console.print(f"{'ranking':>22}: {rk['agreed']} of {rk['pairs']} pairs ordered as measured "
                  f"({rk['agreement']:.1%}) in {rk['groups']} groups of runs of one job; {rk['ties']} pairs measured "
                  f"within {rk['tie_threshold']:.0%} of each other are ties, not counted")
    console.print(f"{'':>22}  by source: " + ", ".join(f"{k} {v['agreed']}/{v['pairs']}"
                                                       for k, v in rk["by_source"].items()))
    for g in rk["by_group"]:
        if g["wrong"]:
            console.print(f"{'':>22}  {g['group']}: {g['agreed']}/{g['pairs']}; wrong: {'; '.join(g['wrong'][:3])}"
                          + (" ..." if len(g["wrong"]) > 3 else ""))


@click.command("render")
@click.argument("plan_file", metavar="PLAN.json")
@guarded
def render_command(plan_file):
    """Print the report of a saved Plan document (the JSON of `plan --json` or `evaluate --json`)
    from the document alone: no model, cluster or search is loaded again.

    Example:  clusterplan plan --model gpt --cluster dgx-superpod --json > plan.json
              clusterplan render plan.json
    """
    doc = read_plan_document(plan_file)
    screen = _console()
    text = io.StringIO()  # the whole report or none of it: a malformed document stops before printing
    buffered = Console(file=text, width=screen.width, force_terminal=screen.is_terminal, color_system=screen.color_system,
                       highlight=False, markup=False, emoji=False, soft_wrap=True)
    try:
        render_report(doc, buffered)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, IndexError) as err:
        raise SpecError(f"PLAN.json: a field the report reads is missing or malformed ({type(err).__name__}: {err}); "
                        "write it with plan/evaluate --json and do not edit it (if the file is unedited, this is a "
                        "bug: please report it)") from None
    sys.stdout.write(text.getvalue())


@click.group("clusterplan", cls=Group)
@click.version_option(PLANNER_VERSION, prog_name="clusterplan")
def main():
    """Plan parallel layouts (TP, PP, DP, CP, EP, micro-batching, recomputation, ZeRO, placement on the
    fabric) for training large models on accelerator clusters, with step time, memory, energy and
    cost predicted per layout, searched within what the training framework runs (--framework
    megatron|torchtitan|deepspeed|maxtext). Placeholders are labelled `unvalidated`.

    Exit codes: 0 ok, 2 bad input, 3 no layout fits, 4 solver stopped without a layout, 1 a bug.
    """


for _command in (plan_command, evaluate_command, explain_command, compare_command, sweep_command, export_command,
                 fit_command, validate_command, render_command, models_command, clusters_command, devices_command):
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


# ---- output ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def progress_bar(unit: str, wanted: bool):
    """A progress bar on stderr for work of many items (sweep points, compared clusters, validated
    runs): ``tick(done, total)`` advances it. Silent unless ``wanted`` (not with --json or CSV on
    stdout) and stderr is a terminal, so pipes, files and tests see nothing."""
    if not (wanted and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[progress.description]{unit}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(unit, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


SEARCH_PROGRESS_AFTER_S = 2.0


@contextlib.contextmanager
def searching(what: str):
    """A spinner on stderr for a search that runs longer than SEARCH_PROGRESS_AFTER_S, when stderr
    is a terminal and the output is not --json; nothing otherwise (pipes, files, tests)."""
    if not sys.stderr.isatty() or _given("as_json"):
        yield
        return
    import threading

    status = Console(stderr=True).status(f"{what} (CP-SAT proves the optimum; --time-limit to cut it short)")
    timer = threading.Timer(SEARCH_PROGRESS_AFTER_S, status.start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        status.stop()


def emit(doc: dict, cluster: Cluster, origin: dict[str, str], as_json: bool) -> None:
    doc["inputs"]["origin"] = dict(origin)  # where each job figure came from: `render` prints it again
    if _given("no_timings") and doc.get("search"):
        doc["search"].pop("wall_s", None)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        render_report(doc, _console())


def _console() -> Console:
    # Created per call so that it writes to the current sys.stdout (tests swap it).
    options = dict(highlight=False, markup=False, emoji=False, soft_wrap=True)
    console = Console(**options)
    return console if console.is_terminal else Console(width=REPORT_WIDTH, **options)


def _table(*columns, title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False)
    for column in columns:
        name, justify = column if isinstance(column, tuple) else (column, "left")
        table.add_column(name, justify=justify)
    return table


def _keep_whole(table: Table, index: int = 0) -> None:
    """Column ``index`` (ids, names a user types) is never broken or cut: at least as wide as its
    widest cell, and the other columns wrap instead on a narrow terminal."""
    column = table.columns[index]
    column.no_wrap = True
    column.min_width = max([len(str(c)) for c in column._cells] + [len(str(column.header))])


def _print_catalogue(table: Table, footer: str) -> None:
    console = _console()
    _keep_whole(table)
    console.print(table)
    console.print(footer)


MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "working": "working buffers", "reserved": "runtime (CUDA context, NCCL buffers)",
                 "allocator": "allocator cache (reserved, not allocated)"}
TIME_LABELS = {"compute": "compute (forward + backward)", "recompute": "recompute",
               "tp_comm": "tensor-parallel comm (exposed)", "cp_comm": "context-parallel comm (exposed)",
               "ep_comm": "expert all-to-all (exposed)", "pp_bubble": "pipeline bubble",
               "pp_p2p": "pipeline send/recv", "dp_comm": "data-parallel comm (exposed)",
               "optimizer": "optimizer step"}


SHORT_KNOBS = {"micro_batch_size": "mbs", "sequence_parallel": "sp", "zero_stage": "zero"}


def render_report(doc: dict, console: Console) -> None:
    """The human report of a Plan document (plan or evaluate), from the document alone."""
    _header(doc, doc["inputs"].get("origin") or {}, console)
    _figures(doc, console)
    _memory(doc, console)
    _time(doc, console)
    _training(doc, console)
    if doc.get("search"):
        _runners_up(doc, console)
        _why(doc, console)
        _rejections(doc, console)
        _search(doc, console)


def _print_routing(console: Console, routing: dict | None) -> None:
    """An MoE model's routing, where it is not balanced: the load the slowest expert rank takes."""
    if not routing or routing["load_factor"] == 1:
        return
    how = (f"experts padded to capacity factor {routing['capacity_factor']:g}" if routing["capacity_factor"]
           else f"dropless, load imbalance {routing['load_imbalance']:g}")
    console.print(f"         MoE routing: {how}: the most loaded expert rank takes {routing['load_factor']:g}x "
                  "the mean's tokens, and the step waits for it")


MODEL_CODE_WORDS = {
    "huggingface": (", a Hugging Face transformers model class (memory of its eager ops; their time derived from "
                    "torchtitan's measured eager kernels, unvalidated on transformers)"),
    "fused": ", a model of fused (Transformer Engine) kernels",
    "llmfoundry": ", llm-foundry's MPT modules (fused cross-entropy; priced with the torchtitan profile)",
}
"""What the job line of a report adds for each ``--model-code`` other than native."""


def _header(doc: dict, origin: dict[str, str], console: Console) -> None:
    model, job, cluster = doc["inputs"]["model"], doc["inputs"]["job"], doc["inputs"]["cluster"]
    params = f"{_count(model['num_params'])} parameters"
    if model["num_active_params"] != model["num_params"]:
        params += f", {_count(model['num_active_params'])} active"
    console.print(f"model    {model['name']} ({params}, {model['num_layers']} layers)")
    _print_routing(console, model.get("moe_routing"))
    console.print(f"cluster  {cluster['name']} ({cluster['id']}): {doc['num_devices']:,} x {cluster['device_name']}, "
                  f"{doc['device_memory_bytes'] / GIB:.1f} GiB {cluster['device_memory_kind'].upper()} each")
    tokens = job["global_batch_size"] * job["seq_len"]
    line = (f"job      global batch {job['global_batch_size']:,} sequences x {job['seq_len']:,} tokens "
            f"= {_count(tokens)} tokens/step, {job['precision']}")
    if job.get("gemm_format") == "fp8_current":
        line += " (per-tensor current scaling)"
    elif job["precision"] == "fp8":
        line += " (delayed scaling)"
    if job.get("attention", "flash") != "flash":
        line += f", {job['attention']} attention"
    if job.get("compiled"):
        line += ", torch.compile"
    line += MODEL_CODE_WORDS.get(job.get("model_code", "native"), "")
    if job["tokens_to_train"]:
        line += f", {_count(job['tokens_to_train'])} tokens to train"
    console.print(line)
    names = {"global_batch_size": "global batch", "seq_len": "seq len", "precision": "precision",
             "tokens_to_train": "tokens to train"}
    sources = {"published": "the model's published setup", "model": "the model file",
               "default": "clusterplan's defaults"}
    for where, source in sources.items():
        keys = [names[k] for k, v in origin.items() if v == where and (k != "tokens_to_train" or job[k])]
        if keys:
            console.print(f"         {', '.join(keys)} from {source} (see --help)")
    for key, where in origin.items():
        if where not in ("given", *sources):
            console.print(f"         {names[key]} {where}")
    fw = doc["inputs"].get("framework")
    if fw:
        when = f" as of {fw['date']}" if fw.get("as_of") else ""
        console.print(f"framework {fw['id']} ({fw['version']}{when}): the search offers only what it runs "
                      "(--framework to change)")
        if fw.get("compile_switch") and not fw.get("compiled"):
            console.print("         eager, as the framework's default (its element-wise ops priced as separate "
                          "kernels): --compile prices torch.compile, which fuses them (and offers async TP)")
    caveats = doc["inputs"].get("caveats", {})
    if caveats.get("validated_error"):
        console.print(f"         {caveats['validated_error']['line']}")
    for line in caveats.get("unvalidated", []):
        console.print(f"         {line}")
    console.print()


def _layout_text(layout: dict) -> str:
    return Layout.from_dict(layout).short()


def _figures(doc: dict, console: Console) -> None:
    lay = doc["layout"]
    label = "best layout" if doc.get("search") else "layout"
    console.print(f"{label}  {_layout_text(lay)}", style="bold")
    console.print(f"{'':{len(label)}}  {lay['num_microbatches']:,} micro-batches of {lay['micro_batch_size']} "
                  f"per pipeline per step, rank order {lay['order']} (innermost first)")
    layers = doc["inputs"]["model"].get("num_layers")
    if lay.get("head_slots") is True and lay["pp"] > 1 and isinstance(layers, int) and layers >= lay["pp"] * lay["vp"]:
        split = stage_split(layers, lay["pp"], lay["vp"], True)  # the pipeline split the plan priced
        others = f", the others up to {split.middle}" if lay["pp"] > 2 else ""
        console.print(f"{'':{len(label)}}  pipeline split: the embedding and the LM head each take a layer's slot "
                      f"(first rank {split.first} layers, last {split.last}{others})")
    torus = (doc.get("explanation") or {}).get("placement")
    if torus:  # which torus axes each parallel axis uses under the order's traversal
        console.print(f"{'':{len(label)}}  on the torus: {'; '.join(torus)}")
    copies = doc.get("zero_shard_copies") or 1
    if copies > 1:  # the framework shards ZeRO-3 inside each scale-up domain only (MaxText's ICI fsdp)
        console.print(f"{'':{len(label)}}  ZeRO-3 shards over the {lay['dp'] // copies} data-parallel ranks of each "
                      f"slice and the {copies} slices keep copies (fsdp on ICI, data parallelism over DCN)")
    console.print(f"step time {doc['step_time_s']:.3f} s   {doc['tokens_per_s']:,.0f} tokens/s   "
                  f"MFU {doc['mfu']:.1%}   HFU {doc['hfu']:.1%}   "
                  f"{doc['model_flops_per_s_per_device'] / 1e12:,.0f} model TFLOP/s per device")
    low = doc.get("gemm_precision")
    if low not in (None, "bf16", "fp16"):  # MFU is over the 16-bit peak; say so where it is not the bound
        console.print(f"{'':10}MFU and HFU are over the dense bf16 peak; over the dense {low} peak the GEMMs "
                      f"run at, MFU is {doc['mfu_precision_peak']:.1%}")
    per_step = []
    if doc.get("energy_per_step_j") is not None:
        per_step.append(f"energy {doc['energy_per_step_j'] / 3.6e6:,.2f} kWh per step")
    if doc.get("cost_per_step_usd") is not None:
        per_step.append(f"cost ${doc['cost_per_step_usd']:,.2f} per step")
    if per_step:
        console.print("   ".join(per_step))
    console.print()


def _memory(doc: dict, console: Console) -> None:
    capacity, peak = doc["device_memory_bytes"], doc["peak_memory_bytes"]
    table = _table("memory per device (most loaded stage)", ("GiB", "right"), ("% of device", "right"))
    for key, value in doc["memory"].items():
        if key == "allocator" and not value:
            continue  # no allocator share for this framework: said below the table
        table.add_row(MEMORY_LABELS.get(key, key), _gib(value), f"{value / capacity:.1%}")
    table.add_row("total (reserved)", _gib(peak), f"{peak / capacity:.1%}", style="bold")
    console.print(table)
    need = doc.get("fit_memory_bytes", peak)
    if doc["fits"]:
        console.print(f"fits: {_gib(need)} of {_gib(capacity)} GiB allocated with the runtime "
                      f"({_gib(capacity - need)} GiB free)")
    else:
        console.print(f"DOES NOT FIT: needs {_gib(need)} GiB allocated with the runtime, device has "
                      f"{_gib(capacity)} GiB, over by {_gib(doc['overflow_bytes'])} GiB", style="bold red")
    stages = doc.get("stage_memory_bytes")
    if stages:
        console.print(f"per stage: first {_gib(stages['first_stage'])} GiB (most micro-batches in flight), "
                      f"last {_gib(stages['last_stage'])} GiB (one micro-batch and the logits)")
    if doc["memory"].get("allocator"):
        console.print("the allocator cache is what PyTorch's caching allocator keeps reserved beyond live "
                      "tensors (nvidia-smi and max_memory_reserved show it); it is released before an "
                      "allocation fails, so the fit counts live tensors and the runtime")
    elif need >= capacity:
        console.print("allocator cache: no room left for one (live tensors and the runtime fill the device)")
    else:
        console.print("allocator cache: none counted (XLA plans its buffers at compile time; SRAM machines have no "
                      "caching allocator): unvalidated")
    headroom = (doc.get("search") or {}).get("memory_headroom")
    if headroom:
        console.print(f"the search kept {headroom:.1%} of device memory free (--memory-headroom; by default the "
                      "framework's allocator margin), so the plan leaves room for fragmentation")
    console.print()


def _time(doc: dict, console: Console) -> None:
    step = doc["step_time_s"]
    table = _table("time per step", ("s", "right"), ("% of step", "right"))
    for key, value in doc["breakdown"].items():
        if value:
            table.add_row(TIME_LABELS.get(key, key), f"{value:.4f}", f"{value / step:.1%}")
    table.add_row("step time", f"{step:.4f}", "100.0%", style="bold")
    console.print(table)
    zero = [TIME_LABELS.get(k, k).split(" (")[0] for k, v in doc["breakdown"].items() if not v]
    if zero:
        console.print(f"no time in: {', '.join(zero)}")
    names = {"tp": "TP overlap", "dp": "DP overlap", "cp": "context-parallel ring", "ep": "EP overlap"}
    for key, charge in (doc.get("overlap_charges") or {}).items():
        console.print(f"{names.get(key, key)} costs {charge['share']:.1%} of the compute it hides behind "
                      f"while it runs: {charge['basis']}")
    console.print()


def _training(doc: dict, console: Console) -> None:
    seconds, gp = doc.get("time_to_train_s"), doc.get("goodput")
    tokens = doc["inputs"]["job"]["tokens_to_train"]
    if gp is not None and gp["goodput"] <= 0:
        console.print(f"to train {_count(tokens)} tokens: never: the job fails every {_duration(gp['mtbf_s'])} on "
                      f"average, faster than it can checkpoint and restart (goodput 0)", style="bold red")
        console.print()
        return
    if not seconds:
        console.print("time to train: pass --tokens (e.g. --tokens 300e9) for time, energy and cost to train")
        console.print()
        return
    energy = doc.get("energy_j")
    cost = doc.get("cost_usd")
    energy_text = "energy n/a (no power figure for the device)" if energy is None else f"{energy / 3.6e9:,.0f} MWh"
    if cost is None:
        cost_text = "cost n/a (no price for the device)"
    else:
        cost_text = f"${cost:,.0f} at ${doc['inputs']['cluster']['price_per_device_hour_usd']:.2f} per device-hour"
    cluster = doc["inputs"]["cluster"]
    if energy is not None:
        pue = cluster.get("pue", 1.0)
        host = cluster.get("host_power_w_per_device") or 0.0
        assumed = " assumed, unvalidated" if cluster.get("host_power_assumed") else ""
        energy_text += f" (PUE {pue:g}; host {host:,.0f} W per device{assumed})"
    if gp is None:
        console.print(f"to train {_count(tokens)} tokens: {_duration(seconds)}, {energy_text}, {cost_text}")
        console.print()
        return
    failures = not _no_failures(gp)
    with_failures = (f"{_duration(seconds)} with failures ({_duration(doc['time_to_train_ideal_s'])} without)" if failures
                     else f"{_duration(seconds)} (no failures assumed)")
    console.print(f"to train {_count(tokens)} tokens: {with_failures}, {doc['device_hours']:,.0f} device-hours, "
                  f"{energy_text}, {cost_text}")
    console.print(_goodput_line(gp) if failures else f"goodput {gp['goodput']:.1%}: no failures assumed (--failure-rate "
                  "0), so no checkpoint, restart or lost work is counted")
    console.print()


def _no_failures(gp: dict) -> bool:
    """A failure rate of 0: the document's mean time between failures is null (or, in a document
    from before, infinite)."""
    return gp["mtbf_s"] is None or not math.isfinite(gp["mtbf_s"]) or not gp["failure_rate_per_device_hour"]


def _goodput_line(gp: dict) -> str:
    restart = f"restart {_duration(gp['restart_s'])}" + (" (unvalidated: assumed)" if gp["restart_unvalidated"] else "")
    return (f"goodput {gp['goodput']:.1%}: a failure every {_duration(gp['mtbf_s'])} on average "
            f"({gp['failure_rate_per_device_hour']:.3g} per device-hour), a {gp['checkpoint_write_s']:.1f} s "
            f"checkpoint every {_duration(gp['checkpoint_interval_s'])} (Young), {restart}")


def _runners_up(doc: dict, console: Console) -> None:
    runners = doc.get("runners_up") or []
    if not runners:
        return
    best = doc["step_time_s"]
    energy = (doc.get("search") or {}).get("objective") == "energy"
    columns = [("#", "right"), "runner-up layout", ("step s", "right"), ("MFU", "right"), ("fit GiB", "right"),
               ("vs best", "right")] + ([("kWh/step", "right"), ("energy vs best", "right")] if energy else [])
    table = _table(*columns)
    for i, ev in enumerate(runners):
        delta_ms = (ev["step_time_s"] - best) * 1e3
        row = [str(i + 2), _layout_text(ev["layout"]), f"{ev['step_time_s']:.3f}", f"{ev['mfu']:.1%}",
               _gib(ev["fit_memory_bytes"]), f"{delta_ms:+,.1f} ms"]
        if energy:
            row += [f"{ev['energy_per_step_j'] / 3.6e6:,.2f}",
                    f"{ev['energy_per_step_j'] / doc['energy_per_step_j'] - 1:+.2%}"]
        table.add_row(*row)
    console.print(table)
    console.print("fit GiB: the peak allocated with the runtime, what must fit (the caching allocator may reserve more)")
    console.print()


def _why(doc: dict, console: Console) -> None:
    explanation = doc.get("explanation") or {}
    versus = explanation.get("versus_runners_up") or []
    binding = explanation.get("binding") or []
    energy = (doc.get("search") or {}).get("objective") == "energy"
    if versus:
        console.print("runners-up against the best: knobs changed, the time term that changes most, the step"
                      + (", the energy" if energy else ""))
        for i, v in enumerate(versus):
            changed = " ".join(f"{SHORT_KNOBS.get(k, k)}={_knob(x)}" for k, x in v["changed"].items())
            if energy:
                ratio = doc["runners_up"][i]["energy_per_step_j"] / doc["energy_per_step_j"] - 1
                term = TIME_LABELS.get(v["term"], v["term"]).split(" (")[0]
                console.print(f"  #{i + 2} {changed}: {term} {v['delta_s'] * 1e3:+,.1f} ms, "
                              f"step {v['step_time_delta_s'] * 1e3:+,.1f} ms, energy {ratio:+.2%}")
                continue
            if v["term"] == "tie":
                console.print(f"  #{i + 2} {changed}: same step time, "
                              f"{v['memory_delta_bytes'] / GIB:+,.1f} GiB to fit (ties go to the least memory)")
                continue
            term = TIME_LABELS.get(v["term"], v["term"]).split(" (")[0]
            console.print(f"  #{i + 2} {changed}: {term} {v['delta_s'] * 1e3:+,.1f} ms, "
                          f"step {v['step_time_delta_s'] * 1e3:+,.1f} ms")
        console.print()
    if binding:
        console.print("what binds (one-step moves from the best layout)")
        for line in binding:
            console.print(f"  {line}")
        console.print()


def _knob(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _rejections(doc: dict, console: Console) -> None:
    rejections = doc.get("rejections") or {}
    if not rejections:
        return
    reasons = doc.get("rejection_reasons") or {}
    table = _table("rejected layouts by reason", ("count", "right"))
    for key, count in sorted(rejections.items(), key=lambda kv: -kv[1]):
        table.add_row(reasons.get(key, REASONS.get(key, key)), f"{count:,}")
    console.print(table)
    console.print()


def _search(doc: dict, console: Console) -> None:
    s = doc["search"]
    gap = "" if s["status"] == "OPTIMAL" else f", gap {s['gap']:.2%}"
    objective = {"time": "least step time", "cost": "least rental cost per step (= least time on one cluster)",
                 "energy": "least energy per step"}.get(s.get("objective", "time"), s.get("objective"))
    wall = f", {s['wall_s']:.2f} s" if "wall_s" in s else ""
    console.print(f"search: {s['engine']}, {s['status']}{gap}{wall}, "
                  f"{s['layouts_considered']:,} layouts considered, {s['layouts_feasible']:,} valid and fitting; "
                  f"objective: {objective}")
    if s.get("objective") == "energy" and not s.get("idle_power_known"):
        console.print("note: no idle power figure for this device, so energy assumes board power throughout "
                      "and ranks layouts as time does")
    for hint in s.get("hints") or ():
        console.print(f"hint: {hint}")


# ---- number formatting (display only) -------------------------------------------------------------------
def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:,.1f}"


def _count(n: float) -> str:
    """1.2e11 -> '120 B'; human units for parameter and token counts."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:,.{0 if value >= 100 else 1}f} {unit}"
    return f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.1f} minutes"


if __name__ == "__main__":
    main()
