"""clusterplan: plan parallel layouts for training large models on accelerator clusters.

The installed import root (docs/api.md). The names below load on first use, so ``import
clusterplan`` stays light::

    from clusterplan import plan, evaluate, load_model, build_cluster, Job, Layout, SearchOptions

The subpackages hold the rest: ``clusterplan.models`` (model specs and the library),
``clusterplan.topologies`` (devices, clusters and their graphs), ``clusterplan.cost`` (the cost
model), ``clusterplan.planner`` (search, plan documents, exports, what-if, validation) and
``clusterplan.cli`` (the command line).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "Job": "clusterplan.cost.layout",
    "Layout": "clusterplan.cost.layout",
    "parse_layout": "clusterplan.cost.layout",
    "evaluate": "clusterplan.cost.step",
    "plan": "clusterplan.planner.search",
    "SearchOptions": "clusterplan.planner.search",
    "SearchResult": "clusterplan.planner.search",
    "Bounds": "clusterplan.planner.search.space",
    "parse_bounds": "clusterplan.planner.search.space",
    "plan_document": "clusterplan.planner.report.plan",
    "evaluation_document": "clusterplan.planner.report.plan",
    "export": "clusterplan.planner.report.export",
    "compare": "clusterplan.planner.studies.whatif",
    "sweep": "clusterplan.planner.studies.whatif",
    "validate": "clusterplan.planner.studies.validate",
    "fewest_devices": "clusterplan.planner.studies.fit",
    "load_model": "clusterplan.models.library",
    "get_model": "clusterplan.models.library",
    "list_models": "clusterplan.models.library",
    "ModelSpec": "clusterplan.models.spec",
    "SpecError": "clusterplan.models.errors",
    "build_cluster": "clusterplan.topologies.library",
    "load_device": "clusterplan.topologies.library",
    "list_devices": "clusterplan.topologies.library",
    "load_profile": "clusterplan.cost.framework",
    "build_job": "clusterplan.planner.inputs",
    "Request": "clusterplan.planner.inputs",
    "load_cluster": "clusterplan.planner.inputs",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'clusterplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
