"""Model descriptions: the spec, the bundled library, file and Hugging Face import."""

from models.errors import ClusterplanError, InfeasibleError, SolverError, SpecError
from models.spec import MLASpec, MoESpec, ModelSpec
from models.library import (
    ModelEntry,
    get_model,
    job_defaults,
    list_models,
    load_model,
    load_model_file,
    load_model_library,
    model_from_mapping,
)
from models.hf import from_hf_config

__all__ = [
    "ClusterplanError", "InfeasibleError", "SolverError", "SpecError", "MLASpec", "MoESpec", "ModelSpec",
    "ModelEntry", "get_model", "job_defaults", "list_models", "load_model", "load_model_file",
    "load_model_library", "model_from_mapping", "from_hf_config",
]
