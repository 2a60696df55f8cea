"""``--format torchtitan-0.2``: a torchtitan 0.2.2 TOML job config (``--job.config_file``), for a plan
searched under the torchtitan profile as of 0.2.2's month."""

from __future__ import annotations

import json

from clusterplan.cost.framework import load_profile
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import PINNED, _job, _layout_line, hsdp_degrees, model_spec
from clusterplan.planner.report.export.torchtitan import (TORCHTITAN_FORMAT_DATES, _torchtitan_header,
                                                          _torchtitan_pipeline, torchtitan_flavor)


TORCHTITAN_CONVERTERS = {
    "fp8": ['converters = ["quantize.linear.float8"]'],
    "mxfp8": ['converters = ["quantize.linear.mx"]'],  # [quantize.linear.mx] recipe_name defaults to mxfp8_cublas
}
"""torchtitan's model converters per job precision (job_config.py Float8Linear, MXLinear; 0.2.2)."""


def torchtitan_toml(doc: dict, model=None) -> str:
    """A torchtitan 0.2.2 job config (TOML, for ``--job.config_file``), for a plan searched under the
    torchtitan profile as of 0.2.2's month (``export --format torchtitan-0.2`` plans so)."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    _check_plan_date(doc, "torchtitan-0.2", TORCHTITAN_FORMAT_DATES["torchtitan-0.2"])
    problem = load_profile("torchtitan").at(TORCHTITAN_FORMAT_DATES["torchtitan-0.2"]).cp_problem(model)
    if L["cp"] > 1 and problem:
        raise SpecError(f"--format torchtitan-0.2: {problem}; --format torchtitan writes 0.3's config, which runs it")
    name, flavor = torchtitan_flavor(model)
    mbs, gbs, dp = L["micro_batch_size"], job["global_batch_size"], L["dp"]
    # torchtitan: gradient accumulation = global / (local x dp); with a pipeline the local batch is
    # cut into local / pipeline_parallel_microbatch_size micro-batches instead.
    local = gbs // dp if L["pp"] > 1 else mbs
    lines = _torchtitan_header(doc, L, job, "torchtitan-0.2") + [
        "[job]",
        f'description = "clusterplan: {doc["inputs"]["model"]["name"]}, {_layout_line(L)}"',
        "",
        "[model]",
        f'name = "{name}"',
        f'flavor = "{flavor}"',
    ]
    lines += TORCHTITAN_CONVERTERS.get(job["precision"], [])
    lines += [
        "",
        "[training]",
        f"local_batch_size = {local}",
        f"global_batch_size = {gbs}",
        f"seq_len = {job['seq_len']}",
        'mixed_precision_param = "bfloat16"',
        "",
    ] + _torchtitan_parallelism(L, model.num_layers)
    lines += ["", "[activation_checkpoint]"] + _torchtitan_ac(L, model.num_layers)
    if job.get("compiled"):  # the plan was priced compiled (--compile); async TP is offered only then
        lines += ["", "[compile]", "enable = true", 'components = ["model", "loss"]']
    if L.get("param_gather", "bf16") != "bf16":  # FSDP2 gathers the weights cast to float8, amaxes in one all-reduce
        lines += ["", "[quantize.linear.float8]", "enable_fsdp_float8_all_gather = true",
                  "precompute_float8_dynamic_scale_for_fsdp = true"]
    return "\n".join(lines)


def _torchtitan_ac(L: dict, num_layers: int) -> list[str]:
    """``[activation_checkpoint]``: the recompute mode, or for ``recompute_layers`` of a stage its
    layer SAC, which checkpoints every k-th block whole (``selective_ac_option = "k"``)."""
    k = L.get("recompute_layers", 0)
    if not k:
        return [f'mode = "{L["recompute"]}"']
    stage = num_layers // L["pp"]
    if num_layers % L["pp"] or stage % k:
        raise SpecError(f"recompute_layers={k}: torchtitan checkpoints every k-th block of a stage, and {k} is not "
                        f"{stage} layers divided by a whole k; use a divisor of {stage}")
    return ['mode = "selective"', f'selective_ac_option = "{stage // k}"  # every {stage // k}th block, {k} of {stage}']


def _torchtitan_parallelism(L: dict, num_layers: int) -> list[str]:
    """The [parallelism] table. FSDP2 shards for ZeRO 2 and 3 (ZeRO-2 is reshard_after_forward
    off: weights stay gathered from forward to backward); ZeRO-0 is plain replication; torchtitan
    has no ZeRO-1 (its profile)."""
    shard, replicate = hsdp_degrees(L, "torchtitan-0.2", (2, 3))
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {L['tp']}",
        f"pipeline_parallel_degree = {L['pp']}",
        f"context_parallel_degree = {L['cp']}",
        f"expert_parallel_degree = {L['ep']}",
        f"expert_tensor_parallel_degree = {L['tp'] if L.get('expert_tp', True) else 1}",
        f"enable_async_tensor_parallel = {'true' if L['tp_overlap'] else 'false'}",
        f'fsdp_reshard_after_forward = "{"never" if L["zero_stage"] == 2 else "default"}"',
        *_torchtitan_comm_backend(L),
    ]
    if L["pp"] > 1:
        schedule, parts = _torchtitan_pipeline(num_layers, L["pp"], L["vp"], bool(L.get("head_slots")),
                                               schedule=L.get("schedule", ""))
        lines += [f'pipeline_parallel_schedule = "{schedule}"', f"pipeline_parallel_microbatch_size = {L['micro_batch_size']}",
                  f"module_fqns_per_model_part = {json.dumps(parts)}"]
    return lines


def _torchtitan_comm_backend(L: dict) -> list[str]:
    """0.2.2's ``expert_parallel_comm_backend`` for ``Layout.moe_dispatcher`` (``standard``, PyTorch's
    all-to-all, is its default: nothing to write for alltoall and auto; ``deepep`` since 36a4b6942,
    2025-12). Hybrid-EP came after 0.2.2 (156db2ead, 2026-03): refused."""
    dispatcher = L.get("moe_dispatcher", "auto") if L["ep"] > 1 else "auto"
    if dispatcher == "hybridep":
        raise SpecError("--format torchtitan-0.2: torchtitan 0.2.2 has no Hybrid-EP dispatcher (its "
                        "expert_parallel_comm_backend is standard or deepep); use moe_dispatcher=deepep or alltoall")
    if dispatcher == "deepep" and L.get("expert_tp", True) and L["tp"] > 1:  # parallelize.py raises on it
        raise SpecError(f"--format torchtitan-0.2: moe_dispatcher=deepep with expert_tensor_parallel_degree={L['tp']}: "
                        "torchtitan 0.2.2's DeepEP does not run expert tensor parallelism; allowed: etp=1 "
                        "(--fix etp=1), tp=1, or moe_dispatcher=alltoall")
    return ['expert_parallel_comm_backend = "deepep"'] if dispatcher == "deepep" else []


def _check_plan_date(doc: dict, fmt: str, latest: str) -> None:
    """A plan searched as of a later release may use what ``fmt``'s release lacks: refused."""
    date = (doc["inputs"].get("framework") or {}).get("date")
    if date and date > latest:
        raise SpecError(f"--format {fmt}: this plan was searched under torchtitan as of {date}; the {PINNED[fmt]} form "
                        f"needs a plan as of {latest} or earlier (export --format {fmt} searches so)")
