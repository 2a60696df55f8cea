"""What a prediction rests on: the ``unvalidated`` lines where a figure is a placeholder rather than
a measurement of this hardware, framework or model shape, the device's matmul ceiling, and the
validated step-time error of the hardware family (``planner/data/validated_error.yaml``). Every
report prints them; the Plan document carries them (``inputs.caveats``)."""

from __future__ import annotations

from clusterplan.cost.compute import UNMEASURED_ATTENTION_OVER_MAMF
from clusterplan.cost.energy import ASSUMED_HOST_OVER_BOARD, host_power_w
from clusterplan.cost.layout import Job
from clusterplan.cost.terms import UNMEASURED_OVERLAP_SHARE
from clusterplan.models.files import bundled_yaml
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster


def caveats(job: Job, cluster: Cluster, model: ModelSpec | None = None) -> dict:
    """Where the prediction rests on a placeholder rather than a measurement of this hardware or
    framework: ``unvalidated`` lines, printed by every report and carried in the JSON, and the
    device's matmul ceiling (no MFU can exceed it)."""
    dev, prof = cluster.device, job.profile.profile
    lines = [] if dev.efficiency_validated else [dev.efficiency_note]
    lines += [note] if (note := dev.low_precision_note(job.precision)) else []
    lines += shape_caveats(model) if model is not None else []
    lines += moe_caveats(model, cluster)
    lines += list(cluster.link_caveats)
    if dev.family in NO_PUBLISHED_TRAINING:
        lines.append(f"unvalidated: no training run on {dev.name} has been published; this plan is hypothetical")
    if cluster.platform == "gpu" and dev.vendor.lower() not in GPU_FRAMEWORK_VENDORS:
        lines.append(f"unvalidated: {dev.vendor}'s own software stack runs {dev.name}; no profile describes it, so the "
                     f"search used {prof.id}'s as a stand-in")
    if host_power_w(cluster)[1]:
        lines.append(f"unvalidated: no host power figure for {cluster.id}: energy counts {ASSUMED_HOST_OVER_BOARD:g} x "
                     f"board power per device for the host (the DGX systems' ratio; --host-power-w to set it)")
    validated = family_error(dev.family, None if model is None else model.moe is not None)
    if validated is None:
        lines.append(f"{NO_PUBLISHED_RUN} ({dev.family}) in clusterplan's validation data")
    elif (own := framework_runs(dev.family, prof.id)) < FRAMEWORK_MIN_RUNS:
        lines.append(f"unvalidated: {own or 'no'} published run{'' if own == 1 else 's'} under {prof.id} on {dev.family}: "
                     f"the validated error and the interval are mostly other frameworks' runs on this hardware")
    if dev.attention_efficiency is None:
        lines.append(f"unvalidated: no measured fused-attention efficiency for {dev.name}; attention runs at "
                     f"{UNMEASURED_ATTENTION_OVER_MAMF:.0%} of the matmul efficiency (assumed, docs/cost-model.md)")
    if dev.comm_kernel_slowdown and not dev.comm_kernel_slowdown_measured:
        lines.append(f"unvalidated: the slowdown overlapped NCCL kernels cause the compute on {dev.name} is the H100's "
                     f"measured curve (the tail effect of GEMMs sized for every SM), not measured on this family")
    elif dev.gemm.sm_count and not dev.comm_kernel_slowdown and prof.dp_comm_sms:
        lines.append(f"unvalidated: overlapped communication on {dev.name} is charged the share of the SMs its kernels "
                     f"hold; the tail effect measured on H100 (2-3x that share) is not measured here")
    if not dev.gemm.sm_count or not prof.dp_comm_sms:
        lines.append(f"unvalidated: overlapped communication on {dev.name} under {prof.id} is charged an assumed "
                     f"{UNMEASURED_OVERLAP_SHARE:.0%} of the compute it overlaps (no SM-count figure)")
    return {"matmul_ceiling": dev.matmul_ceiling(job.precision), "unvalidated": lines,
            "validated_error": validated, "calibration": (cluster.calibration or {}).get("note"),
            "calibration_level": (cluster.calibration or {}).get("level")}  # job, site, or None (none applied)


def moe_caveats(model: ModelSpec | None, cluster: Cluster) -> list[str]:
    """An MoE model on GPUs: its layers are priced at their device time, and what eager MoE execution
    adds on the host (a launch per kernel; Megatron's dropless all-to-all dispatcher waits for the
    host in every MoE layer) is not priced. The evidence (docs/cost-model.md, "Hold-out runs"):
    gpt-oss 120B in Megatron-Bridge 26.02-26.06 ran 1.5x to 2.2x the priced time with partial or no
    CUDA graphs, on H100 and on Blackwell, and 1.25x to 1.29x with the whole step in one graph. TPUs
    run a compiled step (XLA), with no host launch per kernel."""
    if model is None or model.moe is None or cluster.platform != "gpu":
        return []
    return ["unvalidated: MoE layers are priced at their device time; the host launches and host-device "
            "synchronizations of eager MoE layers are not (published gpt-oss runs under Megatron took 1.5x to 2.2x "
            "the priced time without full-iteration CUDA graphs, 1.25x to 1.29x with them; docs/cost-model.md)"]


def shape_caveats(model: ModelSpec) -> list[str]:
    """Model widths off the 8-element (16-byte) alignment tensor-core GEMM kernels want: the model
    prices every GEMM as aligned, and BigScience's head-size-225 trials ran 30-37% slower than
    predicted where their aligned siblings ran 9-21% slower (docs/cost-model.md)."""
    widths = {"attention head size": model.attention_dims[0], "hidden size": model.hidden_size,
              "FFN size": model.ffn_hidden_size}
    odd = [f"{name} {value}" for name, value in widths.items() if value and value % 8]
    if not odd:
        return []
    return [f"unvalidated: {', '.join(odd)} not a multiple of 8: its GEMMs leave the tensor cores' aligned "
            f"kernels, which the model does not price (predictions for such shapes ran up to 37% fast)"]


def _family_errors() -> dict:
    return (bundled_yaml("clusterplan.planner", "data", "validated_error.yaml") or {}).get("families", {})


FRAMEWORK_MIN_RUNS = 5
"""Runs under the plan's framework on its hardware family below which the plan says its validated
error is other frameworks' (issue 35's per-framework target counts profiles with 5 runs or more)."""


def framework_runs(family: str, framework: str) -> int:
    """Published runs with a measured step time under ``framework`` on ``family`` (validated_error.yaml)."""
    return int(((_family_errors().get(family) or {}).get("framework_runs") or {}).get(framework, 0))


def family_error(family: str, moe: bool | None = None) -> dict | None:
    """The validated step-time error of a hardware family: ``{runs, median_abs_error, p90_abs_error,
    median_signed_error, kind, line}`` from ``planner/data/validated_error.yaml`` (written by
    ``benchmarks/update_docs.py`` from ``clusterplan validate`` over the bundled and hold-out runs),
    or None where no published run of the family was evaluated. With the model's kind (``moe``) and
    at least :data:`KIND_MIN_RUNS` runs of that kind on the family, the figure is that kind's (its MoE
    runs can be off where its dense runs are not), the family's whole figure named beside it
    (``kind``: ``"MoE"`` or ``"dense"``; None: the family's). Where the median signed error is
    :data:`BIAS_SHOWN` or more, the line says which way the predictions ran."""
    family_entry = _family_errors().get(family)
    if not family_entry:
        return None
    kind = None if moe is None else ("moe" if moe else "dense")
    entry = family_entry.get(kind) if kind else None
    whole = f"{family_entry['runs']} published runs on {family}"
    label = None
    cv = family_entry.get("cross_validated")  # the family's matmul ceiling is derived from these runs
    checked_by = (f"; its matmul ceiling is derived from these runs: median {cv['median_abs_error']:.0%}, p90 "
                  f"{cv['p90_abs_error']:.0%} with it re-derived without each run's source; clusterplan validate --cv)"
                  if cv else "; clusterplan validate)")
    if entry and entry["runs"] >= KIND_MIN_RUNS:
        label = "MoE" if moe else "dense"
        line = (f"validated: median |step-time error| {entry['median_abs_error']:.0%} over {entry['runs']} published "
                f"{label} runs on {family} ({_bias(entry)}p90 {entry['p90_abs_error']:.0%}; all {whole}: "
                f"{family_entry['median_abs_error']:.0%}{checked_by}")
    else:
        entry = family_entry
        moe_runs = family_entry.get("moe_runs", 0)
        none_of_kind = kind and moe_runs == (0 if moe else family_entry["runs"])
        line = (f"validated: median |step-time error| {entry['median_abs_error']:.0%} over {whole}"
                + (f", none of them {'MoE' if moe else 'dense'}" if none_of_kind else "")
                + f" ({_bias(entry)}p90 {entry['p90_abs_error']:.0%}{checked_by}")
    return {"runs": entry["runs"], "median_abs_error": entry["median_abs_error"],
            "p90_abs_error": entry["p90_abs_error"], "median_signed_error": entry.get("median_signed_error"),
            "cross_validated_median_abs_error": cv["median_abs_error"] if cv else None,
            "kind": label, "line": line}


BIAS_SHOWN = 0.05
"""Median signed step-time error from which a plan's validated-error line says the predictions ran
fast (or slow): a plan on such hardware is likely optimistic (or pessimistic) by about that much."""


def prediction_bias(entry: dict) -> str | None:
    """``"fast"`` or ``"slow"``: which way a validated-error entry's predictions ran, where its median
    signed error is :data:`BIAS_SHOWN` or more; None otherwise (the plan line and the what-if rows)."""
    signed = entry.get("median_signed_error")
    if signed is None or abs(signed) < BIAS_SHOWN:
        return None
    return "fast" if signed < 0 else "slow"


def _bias(entry: dict) -> str:
    way = prediction_bias(entry)
    return f"predicted too {way}: median signed {entry['median_signed_error']:+.0%}; " if way else ""


KIND_MIN_RUNS = 2
"""Runs of one model kind on a family before a plan quotes that kind's validated error."""


NO_PUBLISHED_RUN = "unvalidated: no published run on this hardware"
"""The label of a prediction whose hardware family no validated run covers (plan's caveats, the
what-if rows' ``validated_error``)."""
NO_PUBLISHED_TRAINING = ("groq-lpu",)  # Groq publishes inference only (issue 10)
GPU_FRAMEWORK_VENDORS = ("nvidia", "amd", "intel")  # vendors whose parts Megatron/torchtitan/DeepSpeed run on
