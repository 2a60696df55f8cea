"""The command line's shared options: the value types (token counts, memory fractions, bounded
numbers) and the option lists several commands take (the model, cluster and job inputs, the
search, the what-if outputs), with the help ``--help`` prints. ``cli.py`` declares its commands
with them; a what-if option (price, PUE, host power, reliability) is remembered in the click
context (:func:`remember`) for the Request the command builds (:func:`remembered`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import click

from clusterplan.cost.framework import FRAMEWORKS
from clusterplan.cost.layout import MODEL_CODES
from clusterplan.models.ops import ATTENTION_KINDS
from clusterplan.planner.report.chart import INSTALL_HINT
from clusterplan.planner.search import ENGINES
from clusterplan.planner.search.engine import MAX_TOP_K
from clusterplan.planner.studies.whatif import OBJECTIVES
from clusterplan.topologies.library import MAX_NIC_GBIT_PER_S, MIN_NIC_GBIT_PER_S
from clusterplan.topologies.precisions import FP8_SCALINGS, PRECISIONS


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


FRAMEWORK_NAMES = FRAMEWORKS + ("nemo", "megatron-bridge", "megatron-lm", "megatron-core", "transformer-engine")

# ---- shared options ---------------------------------------------------------------------------------
def apply_options(options: list[Callable]) -> Callable:
    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a what-if option (price, PUE, reliability) in the context for load_cluster and build_job:
    they apply to every command that loads a cluster or a job, without threading them through each."""
    if value is not None:
        ctx.meta[f"clusterplan.{param.name}"] = value
    return value


def remembered(name: str) -> Any:
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
    expose_value=False, callback=remember,
    help="Rental price per device-hour, replacing the catalogue's and a cluster file's price_per_device_hour_usd "
         "(cost figures and --objective cost).")
CALIBRATION_OPTION = click.option(
    "--calibration", "calibration", metavar="CAL.yaml", type=click.Path(dir_okay=False),
    help="A calibration written by `clusterplan calibrate` from your own measured runs: where it was fitted for the "
         "device and framework, every figure uses it (its job-level fit where it was fitted on runs of this job: model "
         "shape, device, framework, precision; else its site-level fit; the report says which) and the interval comes "
         "from its fit; elsewhere the report says it was not applied.")


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
    CALIBRATION_OPTION,
    click.option("--domain-devices", "domain_devices", type=POSITIVE_INT, metavar="N",
                 help="Devices the job uses in each NVLink Switch domain of an NVL72 preset, a multiple of "
                      "the devices per node (e.g. 64 of a rack's 72, as SLURM --segment 16 allocates; beyond "
                      "one segment the device count is whole segments). Default: a cluster file's "
                      "domain_devices, else whole nodes, the last rack in part."),
    click.option("--global-batch", "global_batch", type=POSITIVE_INT, metavar="SEQUENCES",
                 help="Sequences per optimizer step. Default: the model's published batch, else the power "
                      "of two nearest to 4,194,304 / seq-len (about 4M tokens per step)."),
    click.option("--seq-len", "seq_len", type=POSITIVE_INT, metavar="TOKENS",
                 help="Tokens per sequence (default: the model's published training length)."),
    click.option("--precision", type=click.Choice(list(PRECISIONS)),
                 help="Training precision: bf16, fp16, or the linear layers' GEMMs in fp8 (per-tensor "
                      "scales), mxfp8 or nvfp4 (block-scaled; NVIDIA Blackwell; megatron, torchtitan "
                      "mxfp8), int8 (MaxText's AQT int8; TPU v5e, v5p, v6e). Default: the model's published "
                      "one, else bf16."),
    click.option("--tokens", "tokens", type=TokenCount(), metavar="N",
                 help="Tokens to train, for time, energy and cost to train: 300e9, 300B, 1.5T "
                      "(default: the model's published figure, if any)."),
    click.option("--framework", "framework", type=click.Choice(list(FRAMEWORK_NAMES), case_sensitive=False),
                 help="The training framework whose profile the plan must run under: megatron (also nemo, "
                      "megatron-bridge), torchtitan, deepspeed, maxtext, nanotron, te (Transformer Engine-native PyTorch, "
                      "also transformer-engine). Default: maxtext on TPU, megatron "
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
                 callback=remember,
                 help="Power usage effectiveness of the facility: energy figures are multiplied by it "
                      "(default 1.0: the cluster's own draw, host share included where the preset states it)."),
    click.option("--host-power-w", "host_power_w", type=BoundedNumber(float, 1e5, minimum=0.0), metavar="WATTS",
                 expose_value=False, callback=remember,
                 help="Host power per device (CPUs, NICs, switches, fans), replacing the preset's (default: the "
                      "DGX presets' figures; elsewhere 0.8 x board power, an assumption labelled unvalidated)."),
    click.option("--failure-rate", "failure_rate", type=BoundedNumber(float, 1.0, minimum=0.0), metavar="PER_DEVICE_HOUR",
                 expose_value=False, callback=remember,
                 help="Failures per device-hour, for the goodput in time to train (default 1.97e-5: Llama 3's 419 "
                      "unexpected interruptions in 54 days on 16,384 H100s; 0 for none)."),
    click.option("--checkpoint-gbyte-per-s", "checkpoint_gbyte_per_s", type=BoundedNumber(float, 1e4, minimum=1e-6),
                 metavar="GBYTE",
                 expose_value=False, callback=remember,
                 help="Storage write bandwidth per device for checkpoints, GB/s (default 0.122: Llama 3's 2 TB/s "
                      "for 16,384 GPUs)."),
    click.option("--restart-minutes", "restart_minutes", type=BoundedNumber(float, 1e4, minimum=0.0), metavar="MIN",
                 expose_value=False, callback=remember,
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
    click.option("--json", "as_json", is_flag=True, callback=remember,
                 help="Print the Plan document as JSON, nothing else."),
    click.option("--no-timings", "no_timings", is_flag=True, default=None, expose_value=False, callback=remember,
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
                      "search tries both splits the framework offers), offload, cp_comm (p2p, allgather, a2a, a2a+p2p: how context "
                      "parallelism communicates), moe_dispatcher (auto, alltoall, deepep, hybridep: unfixed, each expert "
                      "group takes the fastest the framework offers), cuda_graph (none, layer, full: unfixed, every layout "
                      "the framework can graph is graphed), dp_shard (hybrid sharding over N data-parallel ranks; searched over one and two scale-up domains where the framework has it, 0 holds the framework's own grouping), schedule (1f1b, "
                      "interleaved, zb1p: the pipeline schedule; unfixed, pipelines run zero bubble where the framework "
                      "has it), param_gather (bf16, fp8: unfixed, FP8 jobs gather in 8 bits where that is no slower and "
                      "takes no more memory) (repeatable, or comma-separated: --fix tp=8,pp=4)."),
    click.option("--min", "minimum", multiple=True, metavar="KNOB=VALUE",
                 help="Lower bound on a numeric knob, e.g. --min dp=4 (repeatable)."),
    click.option("--max", "maximum", multiple=True, metavar="KNOB=VALUE",
                 help="Upper bound on a numeric knob, e.g. --max pp=16 (repeatable)."),
    click.option("--memory-headroom", "memory_headroom", type=Headroom(), default=None,
                 help="Share of device memory to keep free: 10% or 0.1. Default: the framework's allocator "
                      "margin, 8.4% for megatron, torchtitan, deepspeed, nanotron and te on HBM devices (PyTorch's caching "
                      "allocator reserve, measured), 0 for maxtext and on SRAM machines."),
    click.option("--objective", type=click.Choice(list(OBJECTIVES)), default="time", show_default=True,
                 help="What to minimise per step: time; cost (rental price x time, so the same layout as "
                      "time on one cluster); energy (board power while computing, idle power while waiting "
                      "on communication or bubbles, plus the host's share)."),
]
SEARCH_OPTIONS = [TOP_OPTION] + ENGINE_OPTIONS
def distinct_output(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Each file option of a command (--csv, --chart, --html, --timeline) names its own file: two
    writing one would leave only the last."""
    if value is None or value == "-":
        return value
    seen = ctx.meta.setdefault("clusterplan.output_paths", {})
    key = str(Path(value).resolve())
    if key in seen:
        raise click.UsageError(f"{seen[key]} and {param.opts[0]} both name {value!r}; give each its own file")
    seen[key] = param.opts[0]
    return value


def writable_file(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A file option the command writes (-o CAL.yaml, --save-runs, --save-figures): its folder must
    exist, checked before any work."""
    if value is not None and not Path(value).parent.is_dir():
        raise click.UsageError(f"{param.opts[-1]}: folder {str(Path(value).parent)!r} does not exist; create it or "
                               "write elsewhere")
    return value


def view_path(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """--html FILE / --timeline FILE.png: a file that can be written (its folder exists, it is no
    folder; a .png with matplotlib installed for --timeline), checked before any search, and
    remembered for the command to write (:func:`remembered`)."""
    if value is None:
        return value
    option, target = param.opts[0], Path(value)
    if not target.parent.is_dir():
        raise click.UsageError(f"{option}: folder {str(target.parent)!r} does not exist; create it or write elsewhere")
    if target.is_dir():
        raise click.UsageError(f"{option}: {value!r} is a directory; give a file name")
    if option == "--timeline" and target.suffix.lower() != ".png":
        raise click.UsageError(f"--timeline: {value!r} is not a .png file (e.g. --timeline step.png)")
    value = distinct_output(ctx, param, value)
    if option == "--timeline":
        try:
            import matplotlib  # noqa: F401 (an optional extra: said before any search, as --chart does)
        except ImportError:
            raise click.UsageError(f"--timeline: {INSTALL_HINT}") from None
    return remember(ctx, param, value)


OUTPUT_OPTIONS = [
    click.option("--html", "html_path", metavar="FILE", expose_value=False, callback=view_path,
                 help="Also write the report as one self-contained HTML page (no external resource): the step's "
                      "timeline per pipeline stage with its critical path, memory per stage, the groups on the "
                      "fabric, the runners-up and rejections (compare/sweep: charts of the rows with their 80% "
                      "intervals)."),
    click.option("--timeline", "timeline_path", metavar="FILE.png", expose_value=False, callback=view_path,
                 help="Also draw the step's timeline per pipeline stage as a PNG (compare/sweep: the best row's; "
                      "needs matplotlib: pip install 'clusterplan[chart]')."),
]
"""The files of the HTML page and the timeline, on every command that reports a plan or rows."""
WHATIF_OUTPUT_OPTIONS = [
    click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON."),
    click.option("--csv", "csv_path", metavar="FILE", callback=distinct_output,
                 help="Also write the rows as CSV to FILE (- for stdout, instead of the table)."),
    click.option("--chart", "chart_path", metavar="FILE.png", callback=distinct_output,
                 help="Also draw the rows as a chart (.png, .svg or .pdf; needs matplotlib: "
                      "pip install 'clusterplan[chart]')."),
    click.option("--no-timings", "no_timings", is_flag=True, default=None, expose_value=False, callback=remember,
                 help="Leave each search's wall time out of the rows, so that the same input gives the same "
                      "bytes."),
]
