"""The explanation of a plan moved to :mod:`planner.explain`: it evaluates the winner's one-step
neighbours, and the report layer computes nothing. Its names stay importable from here."""

from clusterplan.planner.explain import (  # noqa: F401 (re-exported: the import path before planner.explain)
    GIB, binding, changed_knobs, explain, placement, sensitivities, versus)
