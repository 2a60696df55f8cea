"""Framework profiles: what a training framework can run, and how it runs it.

A profile (``cost/data/frameworks/<id>.yaml``, format ``clusterplan-framework/1``) says which knobs
and combinations a framework offers and since which release (``features``, ``rules``), which
communication it overlaps and with how many SMs (``overlap``), and its defaults and memory semantics
(``semantics``). The search offers only what the profile can run at the job's framework date; the
cost terms read the overlap and semantics figures; the report and exports name the profile.

A feature is available at a date when its ``since`` month is not after that date and its ``until``
month (where the framework dropped it) is after it; ``since: null`` means the framework never offered it.

The profile's data types are in :mod:`cost.profile`, the reading of its file in
:mod:`cost.profile_file`; this module asks the questions across them (the knob values a profile
offers, the combinations it refuses, the defaults it moves a layout to, the platforms it runs on)
and re-exports both, so ``cost.framework`` stays the one import for all of it.
"""

from __future__ import annotations

from clusterplan.cost.orders import split_order
from clusterplan.cost.profile import (  # noqa: F401 (re-exported: cost.framework is the profiles' one import)
    ARCHITECTURE_OF_FAMILY, FLASH_LIBRARY_KERNELS, FLASH_LIBRARY_PLATFORMS, MODEL_KINDS, Profile, ProfileAt, Rule,
    model_kinds)
from clusterplan.cost.profile_file import (  # noqa: F401 (re-exported, as above)
    EAGER_NORMS, FEATURES, FORMAT, FRAMEWORKS, OPTIMIZER_KERNELS, PLATFORM_FAMILIES, RULE_KEYS, ZERO3_COPY_FIELDS,
    ZERO3_FETCH, _zero3_copies, load_profile, parse_date)
from clusterplan.models.errors import SpecError

PLATFORM_NAMES = {"nvidia": "NVIDIA GPUs (CUDA)", "amd": "AMD Instinct GPUs (ROCm)", "gaudi": "Intel Gaudi (HPU)",
                  "tpu": "Google TPUs", "trainium": "AWS Trainium (Neuron)", "cerebras": "Cerebras CS systems",
                  "groq": "Groq LPUs", "graphcore": "Graphcore IPUs", "tenstorrent": "Tenstorrent (TT-Metalium)",
                  "dojo": "Tesla Dojo", "sambanova": "SambaNova RDUs"}


CP_COMM_FEATURES: dict[str, str | None] = {"p2p": None, "allgather": "cp_allgather", "a2a": "cp_a2a",
                                           "a2a+p2p": "cp_a2a_p2p"}
"""Each context-parallel communication kind (``Layout.cp_comm``) and the profile feature that offers it
(the ring, ``p2p``, comes with ``cp`` itself)."""


def framework_domains(prof: ProfileAt, family: str) -> dict[str, tuple]:
    """The values of each knob the framework profile (at its date) does not offer in full: a knob
    missing here is unrestricted. A degree the framework lacks is held at 1."""
    out: dict[str, tuple] = {}
    for knob in ("tp", "pp", "cp", "vp", "ep"):
        if not prof.has(knob):
            out[knob] = (1,)
    if not prof.has("sequence_parallel"):
        out["sequence_parallel"] = (False,)
    out["recompute"] = prof.recompute_modes()
    if not prof.has("recompute_layers"):
        out["recompute_layers"] = (0,)
    if not prof.has("recompute_modules"):
        out["recompute_modules"] = ((),)
    if not prof.has("head_slots"):
        out["head_slots"] = (False,)
    offloads = ("none",) + tuple(m for m in ("activations", "optimizer", "activations+optimizer")
                                 if all(prof.has(f"offload_{part}") for part in m.split("+")))
    if len(offloads) < 4:  # cost.layout.OFFLOAD_MODES: each part where the framework offloads it
        out["offload"] = offloads
    # "" is the schedule vp implies (1F1B, interleaved), under the pp and vp features
    out["schedule"] = ("", *(s for s in ("zb1p", "zbv", "dualpipe", "dualpipev", "looped") if prof.has(f"schedule_{s}")))
    kinds = tuple(kind for kind, feature in CP_COMM_FEATURES.items() if feature is None or prof.has(feature))
    if len(kinds) < len(CP_COMM_FEATURES):
        out["cp_comm"] = kinds
    out["cuda_graph"] = ("none",) + tuple(s for s in ("layer", "full") if prof.has(f"cuda_graph_{s}"))
    if prof.profile.zero3_across_domains != "replicate":  # it shards over every rank already
        out["shard_across_domains"] = (False,)
    if not prof.has("dp_shard"):
        out["dp_shard"] = (0,)
    out["zero_stage"] = prof.zero_stages()
    if not prof.has("dp_overlap"):
        out["dp_overlap"] = (False,)
    if not prof.tp_overlap_on(family):
        out["tp_overlap"] = (False,)
    if not prof.has("ep_overlap"):
        out["ep_overlap"] = (False,)
    dispatchers = ("auto",) + tuple(d for d in MOE_DISPATCHER_FEATURES if prof.has(MOE_DISPATCHER_FEATURES[d]))
    if len(dispatchers) < 1 + len(MOE_DISPATCHER_FEATURES):
        out["moe_dispatcher"] = dispatchers
    if prof.orders() is not None:
        out["order"] = prof.orders()
    return out


MOE_DISPATCHER_FEATURES = {"alltoall": "moe_alltoall", "deepep": "moe_deepep", "hybridep": "moe_hybridep"}
"""The profile feature of each explicit ``Layout.moe_dispatcher`` (``auto`` is always offered)."""


def model_code_domains(job) -> dict[str, tuple]:
    """The knobs a job's model code holds: a Hugging Face transformers model class (``Job.model_code``
    huggingface) has no tensor, pipeline, context or expert parallel modules, so DeepSpeed ZeRO and
    FSDP run it data-parallel only."""
    if job.model_code != "huggingface":
        return {}
    return {"tp": (1,), "pp": (1,), "cp": (1,), "ep": (1,), "vp": (1,), "sequence_parallel": (False,)}


def unoffered(prof: ProfileAt, family: str, values: dict, folded_experts: bool = False) -> list[str]:
    """One message per knob value (``values``: knob -> value, Layout field names) the framework does not
    offer at its date, and for folded experts (etp=1) where it has no folding."""
    name = prof.profile.describe(prof.date)
    offered = framework_domains(prof, family)
    values = {k: split_order(v)[0] if k == "order" else v for k, v in values.items()}
    out = [_unoffered_message(prof, family, name, knob, value, offered[knob])
           for knob, value in values.items() if knob in offered and value not in offered[knob]]
    if folded_experts and not prof.has("etp1"):
        out.append(f"etp=1: {name} has no expert tensor parallelism 1 (MoE parallel folding)")
    return out


def _unoffered_message(prof: ProfileAt, family: str, name: str, knob: str, value, allowed: tuple) -> str:
    if knob == "tp_overlap" and not prof.compiled and prof.at_compiled().tp_overlap_on(family):
        return (f"tp_overlap=on: {name} overlaps TP (async TP) only under torch.compile; "
                "plan with --compile (the exported config then enables it)")
    if knob == "cuda_graph":
        since = prof.profile.since.get(f"cuda_graph_{value}")
        when = f"from {since} on" if since else "in no release"
        return (f"cuda_graph={value}: {name} does not capture {'each layer' if value == 'layer' else 'the whole step'} "
                f"in CUDA graphs (it does {when}; allowed: {', '.join(allowed)})")
    if knob == "schedule":  # "" is the schedule vp implies
        since = prof.profile.since.get(f"schedule_{value}")
        runs = ", ".join(["1f1b", *(["interleaved"] if prof.has("vp") else []), *(v for v in allowed if v)])
        has = f"has it only from {since}" if since else "has no such pipeline schedule at any release"
        return f"schedule={value}: {name} {has} (it runs: {runs})"
    if knob == "offload":
        return _offload_refusal(prof, name, value, allowed)
    if knob == "dp_shard":
        since = prof.profile.since.get("dp_shard")
        when = f"since {since}" if since else "in no release"
        return (f"dp_shard={value}: {name} has no hybrid sharded data parallelism (it has it {when}); "
                "leave dp_shard out to shard over the framework's own group")
    since = prof.profile.since.get(MOE_DISPATCHER_FEATURES.get(value, "")) if knob == "moe_dispatcher" else None
    when = f"since {since}; " if since else ""
    return (f"{knob}={knob_text(value)}: {name} does not offer it "
            f"({when}allowed: {', '.join(knob_text(v) for v in allowed)})")


OFFLOAD_KNOBS = {"activations": "activation offload to host memory",
                 "optimizer": "optimizer-state offload to host memory with the Adam step on the CPU"}
"""What each part of ``Layout.offload`` is, for the refusal that names it (feature ``offload_<part>``)."""


def _offload_refusal(prof: ProfileAt, name: str, value: str, allowed: tuple) -> str:
    """Why the framework at its date cannot run ``offload=value``: the first part it lacks, with the
    month it arrived (``features.offload_<part>.since``) or that no release has it as clusterplan prices it."""
    part = next((p for p in str(value).split("+") if p in OFFLOAD_KNOBS and not prof.has(f"offload_{p}")), None)
    if part is None:
        return f"offload={value}: {name} does not offer it (allowed: {', '.join(allowed)})"
    since = prof.profile.since.get(f"offload_{part}")
    when = f"it has it from {since} on" if since else "no release has it as clusterplan prices it"
    return f"offload={value}: {name} has no {OFFLOAD_KNOBS[part]} ({when}; allowed: {', '.join(allowed)})"


def knob_text(value) -> str:
    """A knob value as the CLI takes it: switches as on/off, module lists joined with + (none: the
    framework's default)."""
    if isinstance(value, tuple):
        return "+".join(value) or "default"
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def framework_refusal(prof: ProfileAt, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int, recompute: str,
                      sp: bool, tp_overlap: bool = False, dp_overlap: bool = False,
                      ep_overlap: bool = False, data_parallel: bool = True, cuda_graph: str = "none") -> str | None:
    """The message of the first profile rule that refuses this combination at the profile's
    release, or None. Frameworks whose TP always shards the sequence (torchtitan) refuse tp > 1
    without sequence parallelism. ``dp_overlap`` and ``ep_overlap`` are the knobs as they act:
    pass False where there is no data or expert parallelism. ``data_parallel``: False where the
    layout has no data-parallel ranks (dp x cp = 1): its ZeRO stage means nothing, so no rule on the
    stage applies (torchtitan's plain-DDP rules do not refuse pp = 4 on 4 devices)."""
    if prof.profile.sequence_parallel_with_tp and tp > 1 and not sp:
        return f"{prof.profile.id} shards the sequence whenever tp > 1 (sequence parallelism is always on)"
    for rule in prof.profile.rules:
        if rule.until is not None and prof.date >= rule.until:
            continue
        if rule.refuses(tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap and tp > 1, dp_overlap, ep_overlap and ep > 1,
                        data_parallel, cuda_graph):
            return rule.message
    return None


def refuses_overlap(prof: ProfileAt, overlap: str, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int,
                    recompute: str, sp: bool, tp_overlap: bool = False) -> bool:
    """A profile rule refuses ``overlap`` (``dp_overlap`` or ``ep_overlap``) for these knobs, and
    nothing refuses them without it (DeepSpeed's ZeRO-3 before v0.6.0 on DP overlap; Megatron's EP
    overlap with full recomputation)."""
    def refusal(on: bool) -> str | None:
        return framework_refusal(prof, tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap, **{overlap: on})
    return refusal(True) is not None and refusal(False) is None


def refuses_dp_overlap(prof: ProfileAt, tp: int, pp: int, cp: int, ep: int, vp: int, zero: int, recompute: str,
                       sp: bool, tp_overlap: bool) -> bool:
    """:func:`refuses_overlap` on DP overlap."""
    return refuses_overlap(prof, "dp_overlap", tp, pp, cp, ep, vp, zero, recompute, sp, tp_overlap)


def framework_defaults(layout, given: set[str], prof: ProfileAt, family: str):
    """``layout`` with the knobs the user did not give (``given``: Layout field names) moved to a
    value the framework offers: ZeRO to its lowest sharding stage from 1 up (MaxText: its fsdp axis),
    recomputation to the first mode it has among selective, full, none, overlap off where it has none
    or where it cannot overlap this layout's data-parallel traffic (a rule on ``dp_overlap``)."""
    offered = framework_domains(prof, family)
    changes = {}
    if "zero_stage" not in given and layout.zero_stage not in offered["zero_stage"]:
        stages = offered["zero_stage"]
        changes["zero_stage"] = next((z for z in stages if z >= 1), stages[0])
    if "recompute" not in given and layout.recompute not in offered["recompute"]:
        changes["recompute"] = next(r for r in ("selective", "full", "none") if r in offered["recompute"])
    if "dp_overlap" not in given and "dp_overlap" in offered:
        changes["dp_overlap"] = False
    elif "dp_overlap" not in given and layout.dp_overlap and layout.dp * layout.cp > 1 and refuses_dp_overlap(
            prof, layout.tp, layout.pp, layout.cp, layout.ep, layout.vp, changes.get("zero_stage", layout.zero_stage),
            changes.get("recompute", layout.recompute), layout.sequence_parallel, layout.tp_overlap):
        changes["dp_overlap"] = False  # the framework cannot overlap this layout's DP traffic
    if "sequence_parallel" not in given and prof.profile.sequence_parallel_with_tp and layout.tp > 1:
        changes["sequence_parallel"] = True
    return layout.with_(**changes) if changes else layout


def resolve_name(name: str) -> str:
    """The profile id for a name or alias (``nemo`` -> ``megatron``); :class:`SpecError` if unknown."""
    key = str(name).strip().lower()
    for fid in FRAMEWORKS:
        if key == fid or key in load_profile(fid).aliases:
            return fid
    allowed = ", ".join(FRAMEWORKS)
    raise SpecError(f"framework: got {name!r}; allowed: {allowed} (NeMo and Megatron-Bridge are megatron)")


def model_domains(prof: ProfileAt, model) -> dict[str, tuple]:
    """Knob values the framework lacks for this model at its release (cp held at 1: :meth:`ProfileAt.cp_problem`)."""
    return {"cp": (1,)} if prof.cp_problem(model) else {}


def device_platform(device) -> str:
    """The platform (:data:`PLATFORM_FAMILIES`) of a device (anything with a ``family``: a
    :class:`topologies.devices.DeviceSpec`); a family no platform names is its own (a user's device
    file may name any family)."""
    for name, prefix in PLATFORM_FAMILIES.items():
        if device.family.startswith(prefix):
            return name
    return device.family


def platform_name(platform: str) -> str:
    return PLATFORM_NAMES.get(platform, platform)


def frameworks_on(platform: str) -> tuple[str, ...]:
    """The framework profiles that run on ``platform``."""
    return tuple(f for f in FRAMEWORKS if platform in load_profile(f).platforms)


def check_platform(framework: str, device, name: str = "--framework", export: bool = False) -> None:
    """:class:`SpecError` when ``framework`` does not run on ``device`` (anything with an ``id`` and a
    ``family``) by its profile's ``platforms``, naming the framework, the device and the frameworks
    that do run there. ``name``: how the caller spells the field (``--framework``, ``export --format
    F``); ``export``: the fix an export needs (another format) rather than a plan's."""
    platform = device_platform(device)
    prof = load_profile(framework)
    if platform in prof.platforms:
        return
    others = frameworks_on(platform)
    if export:
        fix = (f"use --format {' or '.join(others)}" if others else
               "no framework clusterplan exports for runs there: use the vendor's own launcher")
    else:
        fix = (f"use --framework {' or '.join(others)}" if others else
               "no framework profile runs there: plan without --framework (megatron's profile then stands in, "
               "unvalidated) and use the vendor's own launcher")
    raise SpecError(f"{name}: {framework} does not run on {device.id} ({platform_name(platform)}); {framework} runs on "
                    f"{', '.join(platform_name(p) for p in prof.platforms)}; {fix}")


def default_framework(platform: str) -> str:
    """``maxtext`` on TPU, ``megatron`` elsewhere (DESIGN.md)."""
    return "maxtext" if platform == "tpu" else "megatron"
