"""Reading a framework profile file (``cost/data/frameworks/<id>.yaml``, format
``clusterplan-framework/1``) into a :class:`~cost.profile.Profile`, every section checked: a value
outside what the format allows is a :class:`SpecError` naming the file, the field and the value."""

from __future__ import annotations

import copy
import re
from functools import lru_cache

from clusterplan.cost.orders import ORDERS
from clusterplan.cost.profile import MODEL_KINDS, SELECTIVE_RECOMPUTE_KINDS, Profile, Rule
from clusterplan.models.errors import SpecError
from clusterplan.models.files import bundled_yaml
from clusterplan.topologies.precisions import FP8_SCALINGS, PRECISIONS


FORMAT = "clusterplan-framework/1"
FRAMEWORKS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "maxtext", "nanotron", "te")
FEATURES: tuple[str, ...] = (
    "tp", "pp", "vp", "vp_groups", "grad_accumulation", "cp", "ep", "etp1", "sequence_parallel",
    "recompute_selective", "recompute_full", "recompute_layers", "recompute_modules", "head_slots",
    "zero0", "zero1", "zero2", "zero3", "dp_overlap", "tp_overlap", "ep_overlap", "flash_attention", "compile",
    "mxfp8", "nvfp4", "int8", "offload_activations", "offload_optimizer", "cp_allgather", "cp_a2a", "cp_a2a_p2p",
    "moe_alltoall", "moe_deepep", "moe_hybridep",
    "cuda_graph_layer", "cuda_graph_full", "fp8_param_gather", "mxfp8_param_gather", "dp_shard",
    "schedule_zb1p", "schedule_zbh1", "schedule_zbv", "schedule_dualpipe", "schedule_dualpipev", "schedule_looped",
)
RULE_KEYS = ("pp_min", "tp_min", "cp_min", "ep_min", "vp_min", "vp_max", "zero_stage_in", "recompute_in",
             "sequence_parallel", "tp_overlap", "dp_overlap", "ep_overlap", "cuda_graph_in")
ZERO3_FETCH = ("bucketed", "per_module_blocking")
ZERO3_LIVE = ("layers", "module_prefetch")
_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
PLATFORM_FAMILIES: dict[str, str] = {
    "nvidia": "nvidia-", "amd": "amd-", "gaudi": "intel-gaudi", "tpu": "google-tpu", "trainium": "aws-trainium",
    "cerebras": "cerebras-", "groq": "groq-", "graphcore": "graphcore-", "tenstorrent": "tenstorrent-",
    "dojo": "tesla-dojo", "sambanova": "sambanova-",
}
"""The software platforms frameworks run on (a profile's ``platforms``), each the device families
(``topologies/data/devices.yaml``) whose names start with its prefix: CUDA on NVIDIA GPUs, ROCm on
AMD Instinct, Intel Gaudi's SynapseAI, XLA on TPUs, AWS Neuron on Trainium, and the vendors' own stacks."""


def _zero3(sem: dict, where: str) -> dict:
    """The ZeRO-3 semantics: fetch and host work by release, sharding across domains, the
    persistence threshold and the reuse distance under which a module stays gathered."""
    return dict(
        zero3_fetch_history=_zero3_fetch(sem, where),
        zero3_host_copies_history=_zero3_copies(sem, where),
        zero3_across_domains=_choice(sem.get("zero3_across_domains", "shard"), ("shard", "replicate"),
                                     f"{where}: semantics.zero3_across_domains"),
        zero3_persistence_threshold=int(sem.get("zero3_persistence_threshold", 0)),
        zero3_reuse_distance_numel=int(sem.get("zero3_reuse_distance_numel", 0)),
        zero3_live_history=_choice_history(sem, where, "zero3_live_history", "live", ZERO3_LIVE),
        zero3_max_live_numel=_count(sem, "zero3_max_live_numel", where),
        zero3_reduce_bucket_numel=_count(sem, "zero3_reduce_bucket_numel", where),
        dp_shard_stages=_dp_shard_stages(sem.get("dp_shard_stages") or [], where),
        dp_shard_searched=bool(sem.get("dp_shard_searched", True)),
    )


def _count(sem: dict, key: str, where: str) -> int:
    """A non-negative element count from ``semantics`` (0 where absent)."""
    value = sem.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}: semantics.{key}: got {value!r}; allowed: a non-negative integer (elements)")
    return value


def _dp_shard_stages(stages, where: str) -> tuple[int, ...]:
    """The ZeRO stages the framework's hybrid sharding (``features.dp_shard``) runs with."""
    if not isinstance(stages, list) or any(s not in (1, 2, 3) or isinstance(s, bool) for s in stages):
        raise SpecError(f"{where}: semantics.dp_shard_stages: got {stages!r}; expected a list of ZeRO stages 1, 2, 3")
    return tuple(stages)


def _offload(sem: dict, where: str) -> dict:
    """How the framework's activation offload runs (``Profile.offload_recompute`` and the rest)."""
    pp_max = sem.get("offload_pp_max")
    return dict(
        offload_recompute=_choice(sem.get("offload_recompute", "full"), ("none", "full"),
                                  f"{where}: semantics.offload_recompute"),
        offload_pp_max=None if pp_max is None else int(pp_max),
        offload_copies_overlap=bool(sem.get("offload_copies_overlap", True)),
        offload_layers_kept=int(sem.get("offload_layers_kept", 0)),
        offload_searched=tuple(str(f) for f in sem.get("offload_searched") or ()),
        optimizer_offload_host_accumulation=_stages(sem.get("optimizer_offload_host_accumulation") or (),
                                                    f"{where}: semantics.optimizer_offload_host_accumulation"),
    )


def _step_copies(sem: dict, where: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``semantics.step_grad_copies_history``: ``{since: YYYY-MM, stages: [ZeRO stages]}`` entries, checked."""
    key = f"{where}: semantics.step_grad_copies_history"
    history = []
    for entry in sem.get("step_grad_copies_history") or ():
        if not isinstance(entry, dict) or set(entry) != {"since", "stages"}:
            raise SpecError(f"{key}: got {entry!r}; expected {{since: YYYY-MM, stages: [ZeRO stages]}}")
        since = str(entry["since"])
        parse_date(since, f"{key}.since")
        history.append((since, _stages(entry["stages"], f"{key}.stages")))
    return tuple(history)


def _stages(value, where: str) -> tuple[int, ...]:
    """A list of ZeRO stages (0 to 3)."""
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, int) or not 0 <= v <= 3 for v in value):
        raise SpecError(f"{where}: got {value!r}; expected a list of ZeRO stages 0 to 3")
    return tuple(value)


def _grad_bytes(sem: dict) -> dict:
    """``semantics.grad_bytes`` (default 4) and ``grad_bytes_fp16`` (None: as ``grad_bytes``)."""
    fp16 = sem.get("grad_bytes_fp16")
    return {"grad_bytes": int(sem.get("grad_bytes", 4)), "grad_bytes_fp16": None if fp16 is None else int(fp16)}


@lru_cache(maxsize=None)
def load_profile(framework_id: str) -> Profile:
    """Read and check one profile file."""
    if framework_id not in FRAMEWORKS:
        raise SpecError(f"framework: got {framework_id!r}; allowed: {', '.join(FRAMEWORKS)}")
    doc = copy.deepcopy(bundled_yaml("clusterplan.cost", "data", "frameworks", f"{framework_id}.yaml"))
    where = f"framework profile {framework_id}"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SpecError(f"{where}: format must be {FORMAT!r}")
    sources = doc.get("sources") or {}
    since, feature_sources, until = _features(doc.get("features") or {}, where)
    rules = _rules(doc.get("rules") or [], where)
    req = doc.get("requires") or {}
    sem = doc.get("semantics") or {}
    ov = doc.get("overlap") or {}
    date = str(doc.get("date"))
    if not _DATE.match(date):
        raise SpecError(f"{where}: date: got {date!r}; expected YYYY-MM")
    return Profile(
        id=framework_id, name=str(doc.get("name")), version=str(doc.get("version")), date=date,
        aliases=tuple(str(a).lower() for a in doc.get("aliases") or ()),
        platforms=_platforms(doc, where), since=since, until=until, feature_sources=feature_sources,
        rules=tuple(rules), **_requires(req, where), head_slots_default=bool(sem.get("head_slots_default", False)),
        **_grad_bytes(sem), **_zero_reductions(sem, where), dropout=float(sem.get("dropout") or 0.0), **_attention(sem, where),
        logit_bytes=float(sem.get("logit_bytes", 6.0)), flex_attention_history=_flex_history(sem, where),
        compiled_logit_bytes=None if sem.get("compiled_logit_bytes") is None else float(sem["compiled_logit_bytes"]),
        **_logits(sem, where),
        compiled_loss_history=_history(sem, "compiled_loss_history", "compiled", bool),
        fsdp_with_pp=str(sem.get("fsdp_with_pp", "sharded")),
        eager_norm_history=_choice_history(sem, where, "eager_norm_history", "kernel", EAGER_NORMS),
        optimizer_history=_choice_history(sem, where, "optimizer_history", "kernel", OPTIMIZER_KERNELS), **_grad_accumulation(sem, where),
        **_activations(sem, where),
        **_p2p(sem),
        **_zero3(sem, where),
        order_history=_order_history(sem, where),
        **_allocator(sem, where),
        plan_headroom=_fraction(sem.get("plan_headroom", 0.0), f"{where}: semantics.plan_headroom"),
        sharded_weight_copy=bool(sem.get("sharded_weight_copy", True)), fsdp_copies=bool(sem.get("fsdp_copies", False)),
        cuda_graph_dropless_moe=bool(sem.get("cuda_graph_dropless_moe", True)),
        grads_freed_between_steps=bool(sem.get("grads_freed_between_steps", False)), **_offload(sem, where),
        lp_grads_beside_fp32=bool(sem.get("lp_grads_beside_fp32", False)),
        step_grad_copies_history=_step_copies(sem, where),
        nccl_runtime=bool(sem.get("nccl_runtime", False)),
        fp8_saved_inputs=bool(sem.get("fp8_saved_inputs", False)), lp_param_both_layouts=bool(sem.get("lp_param_both_layouts")),
        tp_gather_quantized=bool(sem.get("tp_gather_quantized", False)),
        fp8_scaling=_choice(sem.get("fp8_scaling", "delayed"), FP8_SCALINGS, f"{where}: semantics.fp8_scaling"),
        tp_comm_sms=ov.get("tp_comm_sms"), dp_comm_sms=ov.get("dp_comm_sms"), ep_comm_sms=ov.get("ep_comm_sms"),
        tp_comm_share=None if ov.get("tp_comm_share") is None else _fraction(ov["tp_comm_share"], f"{where}: overlap.tp_comm_share"),
        tp_comm_sm_margin=bool(ov.get("tp_comm_sm_margin", False)),
        sources=sources, notes=tuple(doc.get("notes") or ()),
    )


def _requires(req: dict, where: str) -> dict:
    """The profile's ``requires`` section: what a knob needs beside it."""
    precisions = tuple(req.get("precisions") or ())
    for name in precisions:
        _choice(name, PRECISIONS, f"{where}: requires.precisions")
    return {"sequence_parallel_with_tp": bool(req.get("sequence_parallel_with_tp", False)),
            "tp_overlap_families": tuple(req.get("tp_overlap_families") or ()),
            "tp_overlap_needs_compile": bool(req.get("tp_overlap_needs_compile", False)),
            "head_slots_even": bool(req.get("head_slots_even", False)), "precisions": precisions,
            **{k: bool(req.get(k, False)) for k in ("pipeline_even_split", "pipeline_microbatches_multiple",
                                                    "pipeline_dense_layers_outside", "kv_heads_divisible_by_tp",
                                                    "pipeline_microbatches_fill_warmup")},
            "no_accumulation_precisions": tuple(req.get("no_accumulation_precisions") or ()),
            "cp_with_flex_attention_from": parse_date(req.get("cp_with_flex_attention_from"),
                                                      "requires.cp_with_flex_attention_from"),
            "ep_expert_tp_until": parse_date(req.get("ep_expert_tp_until"), "requires.ep_expert_tp_until"),
            "ep_spans_cp_from": parse_date(req.get("ep_spans_cp_from"), "requires.ep_spans_cp_from"),
            "ep_whole_cp_until": parse_date(req.get("ep_whole_cp_until"), "requires.ep_whole_cp_until"),
            "dense_placement_from": parse_date(req.get("dense_placement_from"), "requires.dense_placement_from"),
            "head_slots_moe_from": parse_date(req.get("head_slots_moe_from"), "requires.head_slots_moe_from")}


ZERO1_GRAD_REDUCES = ("reduce_scatter", "all_reduce")


def _zero_reductions(sem: dict, where: str) -> dict:
    """How ZeRO-1 reduces the gradient buffer (``semantics.zero1_grad_reduce``) and when ZeRO-2
    gathers the weights (``semantics.zero2_param_gather``)."""
    return dict(zero1_grad_reduce=_choice(sem.get("zero1_grad_reduce", "reduce_scatter"), ZERO1_GRAD_REDUCES,
                                          f"{where}: semantics.zero1_grad_reduce"),
                zero2_param_gather=sem.get("zero2_param_gather"))


def _history(sem: dict, key: str, field: str, cast) -> tuple[tuple[str, object], ...]:
    """A ``semantics`` list of ``{since: YYYY-MM, field: value}`` entries as ``(since, value)`` pairs."""
    return tuple((str(e["since"]), cast(e[field])) for e in sem.get(key) or ())


EAGER_NORMS = ("fused", "composite")
OPTIMIZER_KERNELS = ("fused", "foreach")
GRAD_ACCUMULATIONS = ("fused", "autograd", "fp32_add", "upcast_add", "carry_add")  # cost.terms.dp.GRAD_ACCUMULATION_BYTES


def _choice_history(sem: dict, where: str, key: str, field: str, allowed: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """A ``semantics`` history whose values are names from ``allowed``, each entry checked."""
    history = _history(sem, key, field, str)
    for since, value in history:
        if value not in allowed:
            raise SpecError(f"{where}: semantics.{key}: got {value!r}; allowed: {', '.join(allowed)}")
        parse_date(since, f"{where}: semantics.{key}.since")
    return history


def _grad_accumulation(sem: dict, where: str) -> dict:
    """``semantics.grad_accumulation_history``: ``{since, kind}`` entries, kinds from GRAD_ACCUMULATIONS."""
    return {"grad_accumulation_history": _choice_history(sem, where, "grad_accumulation_history", "kind",
                                                         GRAD_ACCUMULATIONS)}


def _zero3_fetch(sem: dict, where: str) -> tuple[tuple[str, str], ...]:
    return _choice_history(sem, where, "zero3_fetch_history", "fetch", ZERO3_FETCH)


ZERO3_COPY_FIELDS = ("gather_python", "gather_list", "scatter_python", "scatter_list")


def _zero3_copies(sem: dict, where: str) -> tuple[tuple[str, tuple[int, int, int, int]], ...]:
    """``semantics.zero3_host_copies_history``: ``{since, gather_python, gather_list,
    scatter_python, scatter_list}`` entries, non-negative integers (the gather fields required, the
    scatter fields default to 0)."""
    out = []
    for entry in sem.get("zero3_host_copies_history") or ():
        key = f"{where}: semantics.zero3_host_copies_history"
        since = str(entry.get("since"))
        parse_date(since, f"{key}.since")
        counts = []
        for name in ZERO3_COPY_FIELDS:
            value = entry.get(name, 0 if name.startswith("scatter") else None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{key}.{name}: got {value!r}; allowed: a non-negative integer")
            counts.append(value)
        out.append((since, tuple(counts)))
    return tuple(out)


def _activations(sem: dict, where: str) -> dict:
    """What the framework's modules keep for backward (``Profile.selective_recompute`` and the rest)."""
    keeps_all = sem.get("recompute_none", True)
    if not isinstance(keeps_all, bool):
        raise SpecError(f"{where}: semantics.recompute_none: got {keeps_all!r}; allowed: true or false")
    return dict(selective_recompute=_choice(sem.get("selective_recompute", "attention_core"), SELECTIVE_RECOMPUTE_KINDS,
                                            f"{where}: semantics.selective_recompute"),
                recompute_none=keeps_all,
                eager_activations=bool(sem.get("eager_activations", False)),
                fused_rotary=bool(sem.get("fused_rotary", False)),
                kv_repeat_until=parse_date(sem.get("kv_repeat_until"), f"{where}: semantics.kv_repeat_until"),
                op_sac_unsaved_attention_history=_history(sem, "op_sac_unsaved_attention_history",
                                                          "min_compute_capability",
                                                          lambda v: None if v is None else float(v)))


def _p2p(sem: dict) -> dict:
    """The pipeline-send semantics of a profile (``Profile.p2p_*``)."""
    return dict(p2p_scatter_gather=bool(sem.get("p2p_scatter_gather", True)),
                p2p_scatter_gather_history=_history(sem, "p2p_scatter_gather_history", "enabled", bool),
                p2p_blocking=bool(sem.get("p2p_blocking", False)),
                p2p_gathers_per_slot=int(sem.get("p2p_gathers_per_slot", 2)))


def _order_history(sem: dict, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    history = _history(sem, "order_history", "orders", tuple)
    for since, orders in history:
        parse_date(since, f"{where}: semantics.order_history.since")
        bad = [o for o in orders if o not in ORDERS]
        if bad or not orders:
            raise SpecError(f"{where}: semantics.order_history: got {list(orders)!r}; allowed: {', '.join(ORDERS)}")
    return history


def _features(features: dict, where: str) -> tuple[dict[str, str | None], dict[str, str | None], dict[str, str]]:
    """The month each feature arrived (None: never), its source, and the month it went (``until``,
    where the framework dropped it)."""
    since, feature_sources, until = {}, {}, {}
    for name in FEATURES:
        entry = features.get(name)
        if not isinstance(entry, dict) or "since" not in entry:
            raise SpecError(f"{where}: features.{name} needs a 'since' (YYYY-MM or null)")
        value = entry["since"]
        if value is not None and not _DATE.match(str(value)):
            raise SpecError(f"{where}: features.{name}.since: got {value!r}; expected YYYY-MM or null")
        since[name] = None if value is None else str(value)
        feature_sources[name] = entry.get("source")
        if entry.get("until") is not None:
            until[name] = parse_date(entry["until"], f"{where}: features.{name}.until")
    return since, feature_sources, until


def _rules(raw_rules: list, where: str) -> list[Rule]:
    """The knob combinations the framework refuses, each with its conditions and source."""
    rules = []
    for raw in raw_rules:
        when = raw.get("when") or {}
        unknown = set(when) - set(RULE_KEYS)
        if unknown:
            raise SpecError(f"{where}: rule {raw.get('id')}: unknown condition(s) {sorted(unknown)}; allowed: {RULE_KEYS}")
        frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in when.items())
        until = parse_date(raw.get("until"), f"{where}: rule {raw.get('id')}: until")
        without_dp = raw.get("without_data_parallel", False)
        if not isinstance(without_dp, bool):
            raise SpecError(f"{where}: rule {raw.get('id')}: without_data_parallel: got {without_dp!r}; allowed: true, false")
        rules.append(Rule(str(raw.get("id")), str(raw.get("message", "")), str(raw.get("source", "")), frozen, until,
                          without_dp))
    return rules


def _choice(value, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise SpecError(f"{where}: got {value!r}; allowed: {', '.join(allowed)}")
    return str(value)


def _allocator(sem: dict, where: str) -> dict:
    """The caching allocator's reserved share, and the pipeline engine's where measured apart."""
    piped = sem.get("allocator_reserved_fraction_pipeline")
    return dict(
        allocator_reserved_fraction=_fraction(sem.get("allocator_reserved_fraction", 0.0),
                                              f"{where}: semantics.allocator_reserved_fraction"),
        allocator_reserved_fraction_pipeline=None if piped is None else _fraction(
            piped, f"{where}: semantics.allocator_reserved_fraction_pipeline"))


def _fraction(value, where: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: got {value!r}; expected a number from 0 to 1") from None
    if not 0.0 <= x < 1.0:
        raise SpecError(f"{where}: got {value!r}; allowed: 0 <= value < 1")
    return x


def _flex_history(sem: dict, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    history = _history(sem, "flex_attention_history", "models", tuple)
    for since, kinds in history:
        parse_date(since, f"{where}: semantics.flex_attention_history.since")
        for kind in kinds:
            _choice(kind, MODEL_KINDS, f"{where}: semantics.flex_attention_history.models")
    return history


def _attention(sem: dict, where: str) -> dict:
    """The attention kernel (``semantics.attention``), by release (``attention_history``) and on platforms
    without FlashAttention's kernels (``attention_by_platform``: platform -> kernel, both checked)."""
    from clusterplan.models.ops import ATTENTION_KINDS

    table = sem.get("attention_by_platform") or {}
    for platform, kernel in table.items():
        _choice(platform, tuple(PLATFORM_FAMILIES), f"{where}: semantics.attention_by_platform")
        _choice(kernel, ATTENTION_KINDS, f"{where}: semantics.attention_by_platform.{platform}")
    return dict(attention=str(sem.get("attention", "flash")),
                attention_history=_history(sem, "attention_history", "kernel", str), attention_by_platform=dict(table),
                softmax_fusion_history=_softmax_history(sem, where))


SOFTMAX_BLOCK_DIMS = ("keys", "heads")


def _softmax_history(sem: dict, where: str) -> tuple[tuple[str, tuple[str, int]], ...]:
    """``semantics.softmax_fusion_history``: ``{since, block_dim: keys|heads, max_keys}`` entries, checked."""
    key = "softmax_fusion_history"
    history = _history(sem, key, "block_dim", str)
    max_keys = [e.get("max_keys") for e in sem.get(key) or ()]
    for (since, dim), longest in zip(history, max_keys):
        parse_date(since, f"{where}: semantics.{key}.since")
        _choice(dim, SOFTMAX_BLOCK_DIMS, f"{where}: semantics.{key}.block_dim")
        if not isinstance(longest, int) or isinstance(longest, bool) or longest <= 16:
            raise SpecError(f"{where}: semantics.{key}.max_keys: got {longest!r}; allowed: an integer above 16")
    return tuple((since, (dim, longest)) for (since, dim), longest in zip(history, max_keys))


def _logits(sem: dict, where: str) -> dict:
    """What the loss holds (``Profile.logit_bytes_by_platform``, ``logits_freed_before_layers``)."""
    return dict(logit_bytes_by_platform=_by_platform(sem, "logit_bytes_by_platform", where),
                logits_freed_before_layers=bool(sem.get("logits_freed_before_layers", False)))


def _by_platform(sem: dict, key: str, where: str) -> dict[str, float]:
    """A ``semantics`` table of positive figures by platform (names from :data:`PLATFORM_FAMILIES`)."""
    table = sem.get(key) or {}
    if not isinstance(table, dict):
        raise SpecError(f"{where}: semantics.{key}: got {table!r}; expected platform: number")
    out = {}
    for platform, value in table.items():
        _choice(platform, tuple(PLATFORM_FAMILIES), f"{where}: semantics.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SpecError(f"{where}: semantics.{key}.{platform}: got {value!r}; allowed: a positive number")
        out[platform] = float(value)
    return out


def _platforms(doc: dict, where: str) -> tuple[str, ...]:
    """The profile's ``platforms``: names from :data:`PLATFORM_FAMILIES`, at least one."""
    platforms = tuple(doc.get("platforms") or ())
    if not platforms:
        raise SpecError(f"{where}: platforms: name at least one of {', '.join(PLATFORM_FAMILIES)}")
    for name in platforms:
        _choice(name, tuple(PLATFORM_FAMILIES), f"{where}: platforms")
    return platforms


def parse_date(value: str | None, where: str = "framework date") -> str | None:
    """``"2021-04"`` or ``"2021-04-12"`` -> ``"2021-04"``; None stays None."""
    if value is None:
        return None
    text = str(value).strip()[:7]
    if not _DATE.match(text):
        raise SpecError(f"{where}: got {value!r}; expected YYYY-MM (the month of the framework release)")
    return text
