"""Model descriptions: the spec, the bundled library, file and Hugging Face import."""

from clusterplan.models.errors import ClusterplanError, InfeasibleError, SolverError, SpecError
from clusterplan.models.spec import MLASpec, MoESpec, ModelSpec, model_from_mapping
from clusterplan.models.library import (
    ModelEntry,
    get_model,
    job_defaults,
    list_models,
    load_model,
    load_model_file,
    load_model_library,
)
from clusterplan.models.hf import from_hf_config

__all__ = [
    "ClusterplanError", "InfeasibleError", "SolverError", "SpecError", "MLASpec", "MoESpec", "ModelSpec",
    "ModelEntry", "get_model", "job_defaults", "list_models", "load_model", "load_model_file",
    "load_model_library", "model_from_mapping", "from_hf_config",
]
