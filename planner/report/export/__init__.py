"""Launcher configs from a Plan document: Megatron-LM arguments, a DeepSpeed config, a torchtitan
TOML job config, MaxText overrides and a Slurm batch script that starts Megatron-LM with torchrun.

Each format is written for one pinned launcher release (:data:`PINNED`) and is checked against that
release's own parser and validator by ``tests/test_launchers.py`` (``tests/launchers/``): Megatron's
``parse_args`` + ``validate_args``, DeepSpeed's ``DeepSpeedConfig``, torchtitan's ``ConfigManager``
and ``ParallelDims``, MaxText's ``pyconfig.initialize`` with its packaged ``base.yml``, and torchrun's
own argument parser for the Slurm script. Every format carries the model shape (layers, width,
heads, query groups, FFN, vocabulary, experts, latent attention), so the launcher builds the model
the plan was costed for.

Export code formats the plan; it never recomputes a cost. Knobs a launcher cannot express are
stated in a comment (or a ``_comment`` key in JSON) rather than dropped silently; a plan that the
pinned launcher would refuse is refused here with :class:`SpecError` and a hint.

One module per format: ``megatron``, ``deepspeed``, ``torchtitan`` (0.3's config registry, and what
both torchtitan formats share), ``torchtitan02`` (0.2.2's TOML), ``maxtext``, ``slurm``; ``common``
holds what they share. This package's namespace re-exports their public names.
"""

from __future__ import annotations

from clusterplan.cost.framework import check_platform
from clusterplan.cost.layout import offloads_optimizer
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import (FORMATS, GPU_FAMILIES, PINNED, ROPE_THETA_DEFAULT, cuda_arch,
                                                      model_spec, profile_line, rope_theta, shape_key, _plan_device)
from clusterplan.planner.report.export.deepspeed import MDS_ATTENTION_ARGS, deepspeed_config
from clusterplan.planner.report.export.maxtext import (MAXTEXT_AXES, MAXTEXT_MESH_ORDER, MAXTEXT_MODELS, maxtext_batch,
                                                       maxtext_mesh, maxtext_model, maxtext_overrides, torus_axes_fit)
from clusterplan.planner.report.export.megatron import (ENV_REASONS, FAMILY_NOTES, MEGATRON_PRECISION_ARGS,
                                                        megatron_args, pipeline_layout)
from clusterplan.planner.report.export.slurm import RDZV_PORT, TORCHRUN_FAMILIES, slurm_script
from clusterplan.planner.report.export.torchtitan import (TORCHTITAN_AC_03, TORCHTITAN_CONVERTERS_03,
                                                          TORCHTITAN_FLAVORS, TORCHTITAN_FORMAT_DATES,
                                                          TORCHTITAN_RECIPES, torchtitan_flavor, torchtitan_registry)
from clusterplan.planner.report.export.torchtitan02 import TORCHTITAN_CONVERTERS, torchtitan_toml

__all__ = ["ENV_REASONS", "FAMILY_NOTES", "FORMATS", "FRAMEWORK_OF_FORMAT", "GPU_FAMILIES", "MAXTEXT_AXES",
           "MAXTEXT_MESH_ORDER", "MAXTEXT_MODELS", "MDS_ATTENTION_ARGS", "MEGATRON_PRECISION_ARGS", "PINNED",
           "RDZV_PORT", "ROPE_THETA_DEFAULT", "TORCHRUN_FAMILIES", "TORCHTITAN_AC_03", "TORCHTITAN_CONVERTERS",
           "TORCHTITAN_CONVERTERS_03", "TORCHTITAN_FLAVORS", "TORCHTITAN_FORMAT_DATES", "TORCHTITAN_RECIPES",
           "cuda_arch", "deepspeed_config", "export", "export_framework", "maxtext_batch", "maxtext_mesh",
           "maxtext_model", "maxtext_overrides", "megatron_args", "model_spec", "pipeline_layout", "profile_line",
           "rope_theta", "shape_key", "slurm_script", "torchtitan_flavor", "torchtitan_registry", "torchtitan_toml",
           "torus_axes_fit"]

FRAMEWORK_OF_FORMAT = {"megatron": "megatron", "slurm": "megatron", "deepspeed": "deepspeed",
                       "torchtitan": "torchtitan", "torchtitan-0.2": "torchtitan", "maxtext": "maxtext"}
"""The framework profile a format's plan must be searched under (the slurm script runs Megatron)."""


def export_framework(fmt: str, given: str | None) -> str:
    """The framework to search under for ``fmt``; :class:`SpecError` when ``--framework`` names another
    (a plan searched for one framework may use knobs the other lacks: search again under it)."""
    want = FRAMEWORK_OF_FORMAT[fmt]
    if given and given not in FRAMEWORK_OF_FORMAT.values():
        raise SpecError(f"export --format {fmt}: --framework {given} has no launcher config clusterplan writes (its "
                        f"training loop is the user's own code; docs/frameworks.md, section {given}); plan with "
                        f"--framework {given} and set its layout by hand, or export a {want} config with --framework {want}")
    if given and given != want:
        raise SpecError(f"export --format {fmt}: the config is for {want}, but --framework {given} was given; "
                        f"drop --framework (the plan is then searched under {want}) or use --framework {want}")
    return want


SCHEDULES_WRITTEN = {"torchtitan": ("", "zb1p", "zbv", "dualpipev", "looped"),
                     "torchtitan-0.2": ("", "zb1p", "zbv", "dualpipev", "looped"), "maxtext": ("", "looped")}
"""The pipeline schedules (``Layout.schedule``, "" for the one vp implies) each format writes: torchtitan's
``pipeline_parallel_schedule``; MaxText's circular pipeline (``num_pipeline_repeats``) is its looped one."""


def _check_schedule(schedule: str, fmt: str) -> None:
    """A plan's pipeline schedule that ``fmt``'s launcher cannot run is refused, naming what it runs."""
    written = SCHEDULES_WRITTEN.get(fmt, ("",))
    if schedule not in written:
        runs = ", ".join(["1f1b", "interleaved", *filter(None, written)])
        raise SpecError(f"export --format {fmt}: schedule={schedule}: {FRAMEWORK_OF_FORMAT[fmt]} has no such pipeline "
                        f"schedule (it runs: {runs})")


def export(doc: dict, fmt: str, model=None) -> str:
    """The config for ``fmt`` (one of :data:`FORMATS`); the plan must have been searched under the
    format's framework (:func:`export_framework`). ``model`` is the plan's
    :class:`models.spec.ModelSpec` (needed for a model that is not bundled: :func:`model_spec`)."""
    fw = (doc["inputs"].get("framework") or {}).get("id")
    if doc["inputs"]["job"].get("model_code", "native") == "huggingface" and fmt != "deepspeed":
        raise SpecError(f"export --format {fmt}: the plan trains a Hugging Face transformers model class, which "
                        f"{fmt} does not run; --format deepspeed writes its ZeRO config (plan with --framework deepspeed)")
    if fw and fw != FRAMEWORK_OF_FORMAT[fmt]:
        raise SpecError(f"export --format {fmt}: this plan was searched under {fw}; a {fmt} config needs a plan "
                        f"searched under {FRAMEWORK_OF_FORMAT[fmt]}")
    check_platform(FRAMEWORK_OF_FORMAT[fmt], _plan_device(doc), f"export --format {fmt}", export=True)
    _check_schedule(doc["layout"].get("schedule", ""), fmt)
    offload = doc["layout"].get("offload", "none")
    if offloads_optimizer(offload) and fmt not in ("megatron", "slurm", "deepspeed"):
        raise SpecError(f"export --format {fmt}: offload={offload}: {FRAMEWORK_OF_FORMAT[fmt]} has no optimizer-only "
                        "offload as clusterplan prices it (torchtitan's training.enable_cpu_offload moves the parameters "
                        "and gradients too; MaxText's optimizer_memory_host_offload is not priced); --format megatron "
                        "or deepspeed writes it")
    graph = doc["layout"].get("cuda_graph", "none")
    if graph != "none" and fmt not in ("megatron", "slurm", "torchtitan"):
        raise SpecError(f"export --format {fmt}: the plan replays CUDA graphs (cuda_graph={graph}), which "
                        f"{FRAMEWORK_OF_FORMAT[fmt]} has no setting for; plan with cuda_graph=none")
    text = {"megatron": megatron_args, "deepspeed": deepspeed_config, "torchtitan": torchtitan_registry,
            "torchtitan-0.2": torchtitan_toml, "maxtext": maxtext_overrides, "slurm": slurm_script}[fmt](doc, model)
    if fmt == "deepspeed" or not text.startswith(("#", '"""')):  # JSON carries it in its comment; a shebang stays first
        return text
    first, _, rest = text.partition("\n")
    return f"{first}\n# {profile_line(doc)}\n{rest}"
