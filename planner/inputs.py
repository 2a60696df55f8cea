"""The inputs of a planning problem from what a user gives: the cluster (a preset or a file, sized and
overridden), and the job (the options, then the model's published setup, then the defaults, each
with where it came from). The command line and the Python API share these rules; the CLI only
parses options and prints.

A :class:`Request` holds what the user gave, as given (ids, paths, options; None where left out).
The answers (``planner.requests``) and the studies (what-if, fit) take a request and derive the
model, the cluster and the job from it by the rules below, so a point of a sweep is built exactly as
``plan`` with that option set would build it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from clusterplan.cost.framework import (FRAMEWORKS, ProfileAt, check_platform, default_framework, device_platform,
                                        load_profile, resolve_name as resolve_framework)
from clusterplan.cost.goodput import Reliability
from clusterplan.cost.layout import MAX_TOKENS_TO_TRAIN, Job
from clusterplan.models.errors import SpecError, check_number, shown
from clusterplan.models.library import job_defaults, load_model, resolve_model_id
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.cluster import Cluster, with_what_if
from clusterplan.topologies.library import (MAX_NIC_GBIT_PER_S, MAX_OVERSUBSCRIPTION, MIN_NIC_GBIT_PER_S, build_cluster,
                                            load_cluster_file)
from clusterplan.topologies.precisions import OWN_RATE_PRECISIONS, low_precision

DEFAULT_TOKENS_PER_STEP = 4 * 2**20
# (lowest, highest, lowest excluded) of the what-if figures: the command line's option bounds (cli.py)
PRICE_RANGE = (0.0, 1e4, True)  # USD per device-hour
PUE_RANGE = (1.0, 5.0, False)
HOST_POWER_RANGE = (0.0, 1e5, False)  # watts per device
FILE_SUFFIXES = (".yaml", ".yml", ".json")


def _looks_like_file(text: str) -> bool:
    """``--cluster`` is a file by the rule ``models.library.load_model`` applies to ``--model``: it exists,
    ends in .yaml/.yml/.json, or contains a path separator."""
    return Path(text).exists() or Path(text).suffix.lower() in FILE_SUFFIXES or "/" in text or "\\" in text


def load_cluster(name_or_path: str, num_devices: int | None = None, num_nodes: int | None = None,
                 device: str | None = None, scale_out_gbit_per_s: float | None = None,
                 oversubscription: float | None = None, price_per_device_hour: float | None = None,
                 pue: float | None = None, host_power_w: float | None = None,
                 domain_devices: int | None = None) -> Cluster:
    """A preset or a cluster file, sized and overridden by the options (which win over the file),
    with a rental price, a facility PUE and a host power per device applied where given (each a
    number in the command line's range: a string or NaN is a SpecError naming it)."""
    for name, value, (low, high, above) in (("price_per_device_hour", price_per_device_hour, PRICE_RANGE),
                                            ("pue", pue, PUE_RANGE), ("host_power_w", host_power_w, HOST_POWER_RANGE)):
        if value is not None:
            check_number(name, value, low, high, above=above)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise SpecError("cluster: the name is empty; give a bundled preset id (clusterplan clusters) or a file path")
    if not _looks_like_file(name_or_path):
        cluster = build_cluster(name_or_path, num_devices=num_devices, num_nodes=num_nodes, device=device,
                                scale_out_gbit_per_s=scale_out_gbit_per_s, oversubscription=oversubscription,
                                domain_devices=domain_devices)
    else:
        cluster = load_cluster_file(name_or_path, num_devices=num_devices, num_nodes=num_nodes, device=device,
                                    scale_out_gbit_per_s=scale_out_gbit_per_s, oversubscription=oversubscription,
                                    domain_devices=domain_devices)
    return with_what_if(cluster, price_per_device_hour, pue, host_power_w)


def job_framework(framework: str | None, cluster: Cluster) -> str:
    """The profile id of ``--framework`` (any of its names), or without it the platform's default
    (maxtext on TPU, megatron elsewhere)."""
    return resolve_framework(framework) if framework else default_framework(cluster.platform)


def published_defaults(model_arg: str) -> dict[str, Any]:
    """The job a bundled model was published with; empty for a model file."""
    if Path(model_arg).exists():
        return {}
    try:
        return job_defaults(resolve_model_id(model_arg))
    except SpecError:
        return {}


def default_global_batch(seq_len: int) -> int:
    """The power of two nearest to DEFAULT_TOKENS_PER_STEP / seq_len sequences (at least 1).

    A power of two divides evenly by the data-parallel and micro-batch sizes the search tries.
    """
    return 2 ** max(0, round(math.log2(DEFAULT_TOKENS_PER_STEP / seq_len)))


def build_job(model_arg: str, model: ModelSpec, cluster: Cluster, global_batch: int | None = None,
              seq_len: int | None = None, precision: str | None = None, tokens: int | None = None,
              attention: str | None = None, framework: str | None = None,
              reliability: Reliability | None = None, compiled: bool | None = None,
              model_code: str | None = None, fp8_scaling: str | None = None,
              framework_date: str | None = None) -> tuple[Job, dict[str, str]]:
    """The job from the options, the model's published setup, then the defaults; and where each came from.

    The framework defaults to maxtext on TPU and megatron elsewhere; the attention kernel and the
    gradient dtype to that framework's (its profile's ``semantics``). ``compiled`` (``--compile``) is
    off by default, as in torchtitan, the one profile with a torch.compile switch. ``model_code``
    (``--model-code``): the framework's own modules by default, or a Hugging Face transformers model
    class (DeepSpeed or torchtitan's FSDP only). ``framework_date``: an earlier release of the framework
    (``export --format torchtitan-0.2``: 2026-02)."""
    published = published_defaults(model_arg)
    origin: dict[str, str] = {}

    def pick(key: str, given, fallback):
        if given is not None:
            origin[key] = "given"
            return given
        if published.get(key) is not None:
            origin[key] = "published"
            return published[key]
        origin[key] = "default"
        return fallback() if callable(fallback) else fallback

    seq = pick("seq_len", seq_len, model.seq_len)
    if origin["seq_len"] == "default":  # the model file's seq_len field (2048 when it has none), or why not
        origin["seq_len"] = model.seq_len_note or "model"
    batch = pick("global_batch_size", global_batch, lambda: default_global_batch(seq))
    prec = pick("precision", precision, "bf16")
    tokens_to_train = pick("tokens_to_train", tokens, 0)
    prec = _device_precision(prec, origin, cluster)
    fw = job_framework(framework, cluster)
    prof = load_profile(fw)
    check_precision_framework(prec, prof.at(framework_date))
    if framework:  # without --framework a platform no profile runs on plans under the default's, as a stand-in
        check_platform(fw, cluster.device)
    attention = attention or prof.at(framework_date).attention_on(device_platform(cluster.device))
    _check_attention(attention, cluster)
    _check_compile(compiled, fw)
    check_model_code(model_code, fw)
    return Job(global_batch_size=batch, seq_len=seq, precision=prec, tokens_to_train=tokens_to_train,
               attention=attention, framework=fw, grad_bytes=prof.grad_bytes_for(prec), compiled=bool(compiled),
               reliability=reliability or Reliability(), model_code=model_code or "native",
               fp8_scaling=_fp8_scaling(fp8_scaling, prec), framework_date=framework_date or ""), origin


def _device_precision(prec: str, origin: dict, cluster: Cluster) -> str:
    """The job's precision on this device: a low precision the device has no math for is refused
    when given (:func:`check_device_precision`), and a published one falls back to bf16 (said in
    ``origin``)."""
    if not low_precision(prec) or cluster.device.supports(prec):
        return prec
    if origin["precision"] == "given":
        check_device_precision(prec, cluster.device)
    origin["precision"] = f"bf16: published {prec}, but {cluster.device.id} has no {prec.upper()}"
    return "bf16"


def check_device_precision(precision: str, device, name: str = "--precision") -> None:
    """A low precision needs the device's math for it (``DeviceSpec.supports``); ``name``: how the
    caller spells the field (the CLI option, or a runs file's ``precision``)."""
    if not low_precision(precision) or device.supports(precision):
        return
    has = ", ".join(device.low_precisions()) or "none"
    raise SpecError(f"{name}: {precision} needs a device with {precision.upper()} math (a peak_tflops.{precision} "
                    f"in the catalogue); {device.id} has low precisions: {has}; use "
                    f"bf16{''.join(', ' + p for p in device.low_precisions())}, or a device with {precision.upper()} "
                    f"(--device, another --cluster; `clusterplan devices`)")


def _fp8_scaling(scaling: str | None, precision: str) -> str:
    """``--fp8-scaling`` only means something for an FP8 job (its default: the framework's)."""
    if scaling and precision != "fp8":
        raise SpecError(f"--fp8-scaling: {scaling} applies to --precision fp8; the job runs {precision} "
                        f"(mxfp8 and nvfp4 scale each block from itself): drop --fp8-scaling or use --precision fp8")
    return scaling or ""


def check_precision_framework(precision: str, prof: ProfileAt, name: str = "--precision") -> None:
    """MXFP8, NVFP4 and INT8 need a framework release with that recipe (the profile's features), and
    a framework that trains only in some precisions (``requires.precisions``: nanotron has no FP8
    path) runs no other."""
    allowed = prof.profile.precisions
    if allowed and precision not in allowed:
        others = [f for f in FRAMEWORKS if precision in (load_profile(f).precisions or (precision,))
                  and (precision not in OWN_RATE_PRECISIONS or load_profile(f).at(None).has(precision))]
        raise SpecError(f"{name}: {prof.profile.describe(prof.date)} trains in {', '.join(allowed)} only, not "
                        f"{precision}; use {' or '.join(allowed)}, or --framework {' or '.join(others)}")
    if precision in OWN_RATE_PRECISIONS and not prof.has(precision):
        since = prof.profile.since.get(precision)
        when = f"from {since} on" if since else "in no release clusterplan knows"
        others = [f for f in FRAMEWORKS if f != prof.profile.id and load_profile(f).at(None).has(precision)]
        other = f", or --framework {' or '.join(others)}" if others else ""
        raise SpecError(f"{name}: {precision} is not a recipe of {prof.profile.describe(prof.date)}: it has it {when}; "
                        f"use bf16 or fp8{other}")


FLASH_VENDORS = ("nvidia", "amd")  # FlashAttention 1/2 ship CUDA kernels and ROCm ports only


def _check_attention(attention: str, cluster: Cluster) -> None:
    if attention in ("flash1", "flash2") and cluster.device.vendor.lower() not in FLASH_VENDORS:
        raise SpecError(f"--attention: {attention} names FlashAttention's CUDA/ROCm kernels; {cluster.device.id} "
                        f"({cluster.device.vendor}) runs neither: use flash (its fused attention) or unfused")

HF_FRAMEWORKS = ("deepspeed", "torchtitan")
"""Profiles that run a Hugging Face transformers model class: DeepSpeed's ZeRO and PyTorch FSDP
(torchtitan's profile is the PyTorch-native FSDP2 one)."""


def _check_compile(compiled: bool | None, framework: str) -> None:
    if compiled and not load_profile(framework).at(None).has("compile"):
        with_compile = [f for f in FRAMEWORKS if load_profile(f).at(None).has("compile")]
        raise SpecError(f"--compile: {framework} has no torch.compile switch that clusterplan models; allowed with "
                        f"--framework {', '.join(with_compile)} (or drop --compile)")


def check_model_code(model_code: str | None, framework: str, names: tuple[str, str] = ("--model-code", "--framework")) -> None:
    """The frameworks a model code runs under (the value itself: ``Job``); ``names``: how the
    caller spells the two fields (the CLI options, or a runs file's ``model_code`` and ``framework``)."""
    code, fw = names
    if model_code == "huggingface" and framework not in HF_FRAMEWORKS:
        raise SpecError(f"{code}: huggingface runs a transformers model class under DeepSpeed ZeRO or FSDP; "
                        f"{framework} runs its own modules: use {fw} {' or '.join(HF_FRAMEWORKS)} "
                        f"(or {code} native)")
    if model_code == "llmfoundry" and framework != "torchtitan":
        raise SpecError(f"{code}: llmfoundry is llm-foundry's modules under Composer's FSDP, priced with the "
                        f"torchtitan profile; got {fw} {framework}: use {fw} torchtitan "
                        f"(or {code} native)")


def with_moe_routing(model: ModelSpec, capacity_factor: float | None, load_imbalance: float | None) -> ModelSpec:
    """The model with its routing's capacity factor or load imbalance replaced (``--moe-capacity-factor``,
    ``--moe-load-imbalance``); refused for a model without experts."""
    changes = {k: v for k, v in (("capacity_factor", capacity_factor), ("load_imbalance", load_imbalance))
               if v is not None}
    if not changes:
        return model
    if model.moe is None:
        option = "--moe-" + next(iter(changes)).replace("_", "-")
        raise SpecError(f"{option}: {model.name} has no experts (moe is null); the option applies to MoE models only")
    return model.model_copy(update={"moe": model.moe.model_copy(update=changes)})


_REQUEST_COUNTS = ("num_devices", "num_nodes", "domain_devices", "global_batch", "seq_len")
_REQUEST_FIGURES = {  # (lowest, highest, lowest excluded), as the command line's options take them
    "scale_out_gbit_per_s": (MIN_NIC_GBIT_PER_S, MAX_NIC_GBIT_PER_S, False),
    "oversubscription": (1.0, MAX_OVERSUBSCRIPTION, False), "tokens": (0.0, MAX_TOKENS_TO_TRAIN, False),
    "price_per_device_hour": PRICE_RANGE, "pue": PUE_RANGE, "host_power_w": HOST_POWER_RANGE,
    "moe_capacity_factor": (1.0, 64.0, False), "moe_load_imbalance": (1.0, 64.0, False),
}


@dataclass(frozen=True, kw_only=True)
class Request:
    """What a user asks about, as given: the model and the cluster (ids or file paths), then the
    options of ``plan`` that shape the problem (None: the published value or the default, by the
    rules of :func:`load_cluster` and :func:`build_job`).

    >>> Request(model="llama3-70b", cluster="dgx-h100-superpod", num_devices=64).load_cluster().num_devices
    64
    """

    model: str
    cluster: str
    num_devices: int | None = None
    num_nodes: int | None = None
    device: str | None = None
    scale_out_gbit_per_s: float | None = None
    oversubscription: float | None = None
    domain_devices: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    precision: str | None = None
    tokens: int | None = None
    attention: str | None = None
    framework: str | None = None
    compiled: bool | None = None
    model_code: str | None = None
    fp8_scaling: str | None = None
    price_per_device_hour: float | None = None
    pue: float | None = None
    host_power_w: float | None = None
    moe_capacity_factor: float | None = None
    moe_load_imbalance: float | None = None
    reliability: Reliability = field(default_factory=Reliability)
    framework_date: str | None = None  # an earlier framework release, YYYY-MM (export of an older launcher's form)
    calibration: str | None = None  # a file written by `clusterplan calibrate` (planner.studies.calibration)

    def __post_init__(self) -> None:
        """Each option of the right kind and in the command line's range: the ids as text, the counts
        as whole numbers, the figures as finite numbers (not true/false, a string, NaN or inf)."""
        for name in ("model", "cluster"):
            if not isinstance(getattr(self, name), str):
                raise SpecError(f"{name}: got {shown(getattr(self, name))}; allowed: an id or a file path")
        if self.calibration is not None and not isinstance(self.calibration, str):
            raise SpecError(f"calibration: got {shown(self.calibration)}; allowed: the path of a calibration file")
        for name in _REQUEST_COUNTS:
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 1, 2**31 - 1, whole=True)
        for name, (low, high, above) in _REQUEST_FIGURES.items():
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), low, high, above=above)
        if not isinstance(self.reliability, Reliability):
            raise SpecError(f"reliability: got {shown(self.reliability)}; allowed: a cost.goodput.Reliability")

    def with_(self, **changes: Any) -> Request:
        """This request with some options changed (a point of a sweep, a size tried by ``fit``)."""
        return replace(self, **changes)

    def given(self) -> dict[str, Any]:
        """The options as given, by keyword (the model and cluster included)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def load_model(self) -> ModelSpec:
        return with_moe_routing(load_model(self.model), self.moe_capacity_factor, self.moe_load_imbalance)

    def load_cluster(self) -> Cluster:
        """The cluster asked for, priced as the request's calibration says for its device and
        framework (``planner.studies.calibration``)."""
        cluster = load_cluster(self.cluster, self.num_devices, self.num_nodes, self.device, self.scale_out_gbit_per_s,
                               self.oversubscription, price_per_device_hour=self.price_per_device_hour, pue=self.pue,
                               host_power_w=self.host_power_w, domain_devices=self.domain_devices)
        if self.calibration is None:
            return cluster
        from clusterplan.planner.studies.calibration import job_of, load_calibration

        calibration = load_calibration(self.calibration)  # a bad file is refused before the job is built
        model = self.load_model()
        job = self.build_job(model, cluster)[0]  # which job: a job-level fit applies to its own job only
        return calibration.apply(cluster, job.framework, job_of(model, cluster.device.id, job.framework, job.precision))

    def build_job(self, model: ModelSpec, cluster: Cluster) -> tuple[Job, dict[str, str]]:
        return build_job(self.model, model, cluster, self.global_batch, self.seq_len, self.precision, self.tokens,
                         self.attention, self.framework, reliability=self.reliability, compiled=self.compiled,
                         model_code=self.model_code, fp8_scaling=self.fp8_scaling, framework_date=self.framework_date)
