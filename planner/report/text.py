"""The text report of a Plan document (``plan``, ``evaluate`` and ``render`` print it; ``explain``
its explanation), written from the document alone: no model, cluster or search is loaded, and
nothing is computed but the display of figures the document holds (a ``render`` of a saved
``plan --json`` prints the same bytes as the ``plan`` that wrote it). The rich tables and the
number formats here are shared by the other text reports of this package.
"""

from __future__ import annotations

import io
import math
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from clusterplan.cost.layout import Layout
from clusterplan.cost.terms import stage_split
from clusterplan.models.errors import SpecError
from clusterplan.planner.search.space import REASONS

GIB = 2**30


def make_table(*columns, title: str | None = None) -> Table:
    """A table in the reports' style; each column a name (left-aligned) or ``(name, justify)``."""
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False)
    for column in columns:
        name, justify = column if isinstance(column, tuple) else (column, "left")
        table.add_column(name, justify=justify)
    return table


def keep_whole(table: Table, index: int = 0) -> None:
    """Column ``index`` (ids, names a user types) is never broken or cut: at least as wide as its
    widest cell, and the other columns wrap instead on a narrow terminal."""
    column = table.columns[index]
    column.no_wrap = True
    column.min_width = max([len(str(c)) for c in column._cells] + [len(str(column.header))])


MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "working": "working buffers", "reserved": "runtime (CUDA context, NCCL buffers)",
                 "allocator": "allocator cache (reserved, not allocated)",
                 "step_copies": "gradient copies at the optimizer step"}
TIME_LABELS = {"compute": "compute (forward + backward)", "recompute": "recompute",
               "tp_comm": "tensor-parallel comm (exposed)", "cp_comm": "context-parallel comm (exposed)",
               "ep_comm": "expert all-to-all (exposed)", "pp_bubble": "pipeline bubble",
               "pp_p2p": "pipeline send/recv", "dp_comm": "data-parallel comm (exposed)",
               "optimizer": "optimizer step", "offload": "host offload transfers (exposed)",
               "grad_accum": "gradient accumulation (adds per micro-batch)"}
OPTIONAL_TIME = ("offload", "grad_accum")  # terms of a knob most layouts leave off: not listed under "no time in"


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


def report_text(doc: dict, screen: Console) -> str:
    """The whole report of a saved Plan document as ``render_report`` writes it on ``screen`` (its
    width and colours), or :class:`SpecError` naming what is missing or malformed: the whole report
    or none of it, so a malformed document stops before anything is printed."""
    text = io.StringIO()
    buffered = Console(file=text, width=screen.width, force_terminal=screen.is_terminal, color_system=screen.color_system,
                       highlight=False, markup=False, emoji=False, soft_wrap=True)
    try:
        render_report(doc, buffered)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, IndexError) as err:
        raise SpecError(f"PLAN.json: a field the report reads is missing or malformed ({type(err).__name__}: {err}); "
                        "write it with plan/evaluate --json and do not edit it (if the file is unedited, this is a "
                        "bug: please report it)") from None
    return text.getvalue()


def section_text(doc: dict, name: str, width: int = 120) -> str:
    """One section of the report (``header``, ``figures``, ``memory``, ``time``, ``training``,
    ``runners_up``, ``why``, ``rejections``, ``search``) as plain text, as ``render_report`` prints
    it: the HTML page quotes the same strings."""
    sections = {"header": lambda d, c: _header(d, d["inputs"].get("origin") or {}, c), "figures": _figures,
                "memory": _memory, "time": _time, "training": _training, "runners_up": _runners_up, "why": _why,
                "rejections": _rejections, "search": _search}
    text = io.StringIO()
    sections[name](doc, Console(file=text, width=width, color_system=None, highlight=False, markup=False,
                                emoji=False, soft_wrap=True))
    return text.getvalue()


def fit_lines(fit) -> list[str]:
    """``clusterplan fit``: the answer, the best layout there and what was checked (a
    :class:`planner.requests.FitResult`)."""
    answer, best = fit.answer, fit.planned.result.best
    lines = [f"{fit.question}: {answer.num_devices:,} x {answer.device}",
             f"  best layout there: {best.layout.short()}, step {best.step_time_s:.3f} s, "
             f"peak {best.memory.fit_bytes / GIB:.1f} of {best.capacity_bytes / GIB:.1f} GiB allocated with the runtime "
             f"({best.peak_memory_bytes / GIB:.1f} reserved)"]
    lines += _offload_lines(fit)
    if answer.devices_tried is not None:
        lines.append("  devices checked, least memory first: " + ", ".join(
            f"{d} {'fits' if ok else 'no'}" for d, (_, ok) in zip(answer.devices_tried, answer.checked)))
    else:
        lines.append("\n".join(f"  {line}" for line in answer.notes()))
    return lines

OFFLOAD_FLAGS = {"maxtext": "MaxText remat_policy custom, decoder_layer_input offload",
                 "megatron": "Megatron-Core --cpu-offloading-num-layers, no recomputation, pp=1",
                 "deepspeed": "DeepSpeed activation_checkpointing cpu_checkpointing"}
"""How each framework offloads the activations (``fit``'s with-offload answer names it)."""
OPTIMIZER_OFFLOAD_FLAGS = {"megatron": "Megatron-Core --optimizer-cpu-offload --optimizer-offload-fraction 1.0",
                           "deepspeed": "DeepSpeed zero_optimization.offload_optimizer, device cpu"}
"""How each framework offloads the optimizer (``fit``'s with-offload answer names it)."""


def _offload_lines(fit) -> list[str]:
    """What host offload (of the layer inputs, the optimizer or both) changes in ``fit``'s answer (``FitResult``)."""
    n, m = fit.answer.num_devices, fit.num_devices_with_offload
    if fit.answer.devices_tried is not None:
        return []
    if m is not None and m != n:
        framework, mode = fit.planned.result.job.framework, fit.offload_mode
        how = "; ".join(flags.get(framework, "") for part, flags in (("activations", OFFLOAD_FLAGS),
                                                                     ("optimizer", OPTIMIZER_OFFLOAD_FLAGS))
                        if part in mode.split("+"))
        return [f"  fewest devices: {n:,}; with host offload: {m:,} (offload={mode}: {how}; "
                f"plan --devices {m} --fix offload={mode} for its layout)"]
    if m is not None:
        return [f"  fewest devices: {n:,}; with host offload: {m:,} (offload does not lower it)"]
    return [f"  host offload: {fit.offload_note}"]


def explain_report(doc: dict, console: Console) -> None:
    """``clusterplan explain``: the best layout, why it beat each runner-up, what binds, and the step
    time after one step in every knob (the document's ``explanation``)."""
    console.print(f"best: {layout_text(doc['layout'])}  step {doc['step_time_s']:.3f} s")
    if doc["explanation"].get("placement"):
        console.print(f"on the torus: {'; '.join(doc['explanation']['placement'])}")
    console.print()
    _why(doc, console)
    table = make_table("move", ("step time s", "right"), ("change", "right"), ("fit GiB", "right"), "note",
                       title="one step in each knob")
    for row in doc["explanation"]["sensitivity"]:
        step = row.get("step_time_s")
        table.add_row(row["move"], "-" if step is None else f"{step:.3f}",
                      "-" if step is None else f"{row['delta']:+.1%}",
                      "-" if row.get("fit_memory_bytes") is None else gib(row["fit_memory_bytes"]),
                      row.get("reason", ""))
    console.print(table)

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
    params = f"{human_count(model['num_params'])} parameters"
    if model["num_active_params"] != model["num_params"]:
        params += f", {human_count(model['num_active_params'])} active"
    console.print(f"model    {model['name']} ({params}, {model['num_layers']} layers)")
    _print_routing(console, model.get("moe_routing"))
    console.print(f"cluster  {cluster['name']} ({cluster['id']}): {doc['num_devices']:,} x {cluster['device_name']}, "
                  f"{doc['device_memory_bytes'] / GIB:.1f} GiB {cluster['device_memory_kind'].upper()} each")
    tokens = job["global_batch_size"] * job["seq_len"]
    line = (f"job      global batch {job['global_batch_size']:,} sequences x {job['seq_len']:,} tokens "
            f"= {human_count(tokens)} tokens/step, {job['precision']}")
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
        line += f", {human_count(job['tokens_to_train'])} tokens to train"
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
    _caveat_lines(doc["inputs"].get("caveats", {}), console)


def _caveat_lines(caveats: dict, console: Console) -> None:
    """The validated error, the calibration asked for, and each unvalidated assumption."""
    if caveats.get("validated_error"):
        console.print(f"         {caveats['validated_error']['line']}")
    if caveats.get("calibration"):
        console.print(f"         {caveats['calibration']}")
    for line in caveats.get("unvalidated", []):
        console.print(f"         {line}")
    console.print()


def layout_text(layout: dict) -> str:
    return Layout.from_dict(layout).short()


def _figures(doc: dict, console: Console) -> None:
    lay = doc["layout"]
    label = "best layout" if doc.get("search") else "layout"
    console.print(f"{label}  {layout_text(lay)}", style="bold")
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
    if lay.get("param_gather", "bf16") != "bf16":  # Layout.param_gather: cost.terms.param_gather_bytes
        console.print(f"{'':{len(label)}}  parameter all-gathers in {doc.get('gemm_precision') or 'fp8'} "
                      "(param_gather=fp8): the data-parallel gathers move the weights already cast to 8 bits, "
                      "and the gathered weights are kept in that format")
    copies = doc.get("zero_shard_copies") or 1
    if copies > 1 and lay.get("dp_shard"):  # hybrid sharding asked for (Layout.dp_shard)
        console.print(f"{'':{len(label)}}  hybrid sharding: ZeRO-{lay['zero_stage']} shards over {lay['dp_shard']} "
                      f"data-parallel ranks and {copies} replicas all-reduce the shards' gradients once a step")
    elif copies > 1:  # the framework shards ZeRO-3 inside each scale-up domain only (MaxText's ICI fsdp)
        console.print(f"{'':{len(label)}}  ZeRO-3 shards over the {lay['dp'] // copies} data-parallel ranks of each "
                      f"slice and the {copies} slices keep copies (fsdp on ICI, data parallelism over DCN)")
    console.print(f"step time {doc['step_time_s']:.3f} s   {doc['tokens_per_s']:,.0f} tokens/s   "
                  f"MFU {doc['mfu']:.1%}   HFU {doc['hfu']:.1%}   "
                  f"{doc['model_flops_per_s_per_device'] / 1e12:,.0f} model TFLOP/s per device")
    interval = interval_text(doc)
    if interval:
        console.print(f"{'':10}{interval}")
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


def interval_text(doc: dict) -> str | None:
    """How sure the step time is: its 80% interval, the MFU range that goes with it and the runs it
    comes from (None for a document without one)."""
    low_s, high_s = doc.get("step_time_interval_s") or (None, None)
    basis = doc.get("interval") or {}
    if low_s is None or not basis:
        return None
    mfu = doc.get("mfu_interval") or (None, None)
    mfu_text = f", MFU {mfu[0]:.1%} to {mfu[1]:.1%}" if None not in mfu else ""
    if basis.get("calibrated"):
        return (f"{basis['level']:.0%} interval {low_s:.3f} s to {high_s:.3f} s{mfu_text}: how far {basis['regime']} "
                f"fell from their predictions, each predicted by a fit without it ({basis['runs']} runs)")
    return (f"{basis['level']:.0%} interval {low_s:.3f} s to {high_s:.3f} s{mfu_text}: how far measured steps of "
            f"{basis['regime']} fell from their predictions ({basis['runs']} runs of {basis['sources']} sources, "
            f"each checked without its own source; clusterplan validate)")


def _memory_label(doc: dict, key: str) -> str:
    """A memory row's label; the runtime's is the GPU stack's (CUDA context, NCCL buffers) on NVIDIA
    and AMD devices, what the runtime keeps outside the program elsewhere (XLA on TPUs, ...)."""
    family = doc.get("inputs", {}).get("cluster", {}).get("device_family", "")
    if key == "reserved" and not family.startswith(("nvidia", "amd")):
        return "runtime (kept outside the program)"
    return MEMORY_LABELS.get(key, key)


def _memory(doc: dict, console: Console) -> None:
    capacity, peak = doc["device_memory_bytes"], doc["peak_memory_bytes"]
    table = make_table("memory per device (most loaded stage)", ("GiB", "right"), ("% of device", "right"))
    rows = sorted(doc["memory"].items(), key=lambda kv: kv[0] != "step_copies" and kv[0] not in ("weights", "gradients"))
    for key, value in rows:  # the optimizer step's copies beside the gradients they copy
        if key in ("allocator", "step_copies") and not value:
            continue  # no allocator share for this framework (said below the table), or the backward's peak
        table.add_row(_memory_label(doc, key), gib(value), f"{value / capacity:.1%}")
    table.add_row("total (reserved)", gib(peak), f"{peak / capacity:.1%}", style="bold")
    console.print(table)
    need = doc.get("fit_memory_bytes", peak)
    if doc["fits"]:
        console.print(f"fits: {gib(need)} of {gib(capacity)} GiB allocated with the runtime "
                      f"({gib(capacity - need)} GiB free)")
    else:
        console.print(f"DOES NOT FIT: needs {gib(need)} GiB allocated with the runtime, device has "
                      f"{gib(capacity)} GiB, over by {gib(doc['overflow_bytes'])} GiB", style="bold red")
    if doc["memory"].get("step_copies"):
        console.print("the peak is at the optimizer step, not in backward: no activation is left, and the rank's "
                      "16-bit gradient partition is copied flat and cast to fp32 (DeepSpeed ZeRO-1/2)")
    stages = doc.get("stage_memory_bytes")
    if stages:
        console.print(f"per stage: first {gib(stages['first_stage'])} GiB (most micro-batches in flight), "
                      f"last {gib(stages['last_stage'])} GiB (one micro-batch and the logits)")
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
                      "framework's margin: the allocator's fragmentation under PyTorch, the memory model's shortfall "
                      "against XLA's compiled peak under MaxText)")
    console.print()


def _time(doc: dict, console: Console) -> None:
    step = doc["step_time_s"]
    table = make_table("time per step", ("s", "right"), ("% of step", "right"))
    for key, value in doc["breakdown"].items():
        if value:
            table.add_row(TIME_LABELS.get(key, key), f"{value:.4f}", f"{value / step:.1%}")
    table.add_row("step time", f"{step:.4f}", "100.0%", style="bold")
    console.print(table)
    zero = [TIME_LABELS.get(k, k).split(" (")[0] for k, v in doc["breakdown"].items()
            if not v and k not in OPTIONAL_TIME]
    if zero:
        console.print(f"no time in: {', '.join(zero)}")
    names = {"tp": "TP overlap", "dp": "DP overlap", "cp": "context-parallel ring", "ep": "EP overlap"}
    for key, charge in (doc.get("overlap_charges") or {}).items():
        if key in ("offload", "optimizer_offload"):  # copy engines and the CPU, no SMs: what they take
            console.print(charge["basis"])
            continue
        console.print(f"{names.get(key, key)} costs {charge['share']:.1%} of the compute it hides behind "
                      f"while it runs: {charge['basis']}")
    console.print()


def _training(doc: dict, console: Console) -> None:
    seconds, gp = doc.get("time_to_train_s"), doc.get("goodput")
    tokens = doc["inputs"]["job"]["tokens_to_train"]
    if gp is not None and gp["goodput"] <= 0:
        console.print(f"to train {human_count(tokens)} tokens: never: the job fails every {duration(gp['mtbf_s'])} on "
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
        console.print(f"to train {human_count(tokens)} tokens: {duration(seconds)}, {energy_text}, {cost_text}")
        _training_interval(doc, console)
        console.print()
        return
    failures = not _no_failures(gp)
    with_failures = (f"{duration(seconds)} with failures ({duration(doc['time_to_train_ideal_s'])} without)" if failures
                     else f"{duration(seconds)} (no failures assumed)")
    console.print(f"to train {human_count(tokens)} tokens: {with_failures}, {doc['device_hours']:,.0f} device-hours, "
                  f"{energy_text}, {cost_text}")
    _training_interval(doc, console)
    console.print(_goodput_line(gp) if failures else f"goodput {gp['goodput']:.1%}: no failures assumed (--failure-rate "
                  "0), so no checkpoint, restart or lost work is counted")
    console.print()


def _training_interval(doc: dict, console: Console) -> None:
    """The time to train over the step time's interval (documents with one)."""
    if doc.get("time_to_train_interval_s") and doc.get("interval"):
        low_s, high_s = doc["time_to_train_interval_s"]
        console.print(f"{'':9}{duration(low_s)} to {duration(high_s)} over the step time's "
                      f"{doc['interval']['level']:.0%} interval")


def _no_failures(gp: dict) -> bool:
    """A failure rate of 0: the document's mean time between failures is null (or, in a document
    from before, infinite)."""
    return gp["mtbf_s"] is None or not math.isfinite(gp["mtbf_s"]) or not gp["failure_rate_per_device_hour"]


def _goodput_line(gp: dict) -> str:
    restart = f"restart {duration(gp['restart_s'])}" + (" (unvalidated: assumed)" if gp["restart_unvalidated"] else "")
    return (f"goodput {gp['goodput']:.1%}: a failure every {duration(gp['mtbf_s'])} on average "
            f"({gp['failure_rate_per_device_hour']:.3g} per device-hour), a {gp['checkpoint_write_s']:.1f} s "
            f"checkpoint every {duration(gp['checkpoint_interval_s'])} (Young), {restart}")


def _runners_up(doc: dict, console: Console) -> None:
    runners = doc.get("runners_up") or []
    if not runners:
        return
    best = doc["step_time_s"]
    energy = (doc.get("search") or {}).get("objective") == "energy"
    columns = [("#", "right"), "runner-up layout", ("step s", "right"), ("MFU", "right"), ("fit GiB", "right"),
               ("vs best", "right")] + ([("kWh/step", "right"), ("energy vs best", "right")] if energy else [])
    table = make_table(*columns)
    for i, ev in enumerate(runners):
        delta_ms = (ev["step_time_s"] - best) * 1e3
        row = [str(i + 2), layout_text(ev["layout"]), f"{ev['step_time_s']:.3f}", f"{ev['mfu']:.1%}",
               gib(ev["fit_memory_bytes"]), f"{delta_ms:+,.1f} ms"]
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
                rule = "no host offload" if "offload" in v["changed"] else "the least memory"  # split_spaces' order
                console.print(f"  #{i + 2} {changed}: same step time, "
                              f"{v['memory_delta_bytes'] / GIB:+,.1f} GiB to fit (ties go to {rule})")
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
    table = make_table("rejected layouts by reason", ("count", "right"))
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
def gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:,.1f}"


def human_count(n: float) -> str:
    """1.2e11 -> '120 B'; human units for parameter and token counts."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:,.{0 if value >= 100 else 1}f} {unit}"
    return f"{n:,.0f}"


def duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.1f} minutes"
