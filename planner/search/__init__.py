"""The search: the layout space (``space``), its cost tables (``tables``), the two engines that
find the optimum in them (``cpsat``, ``exhaustive``), and the entry point that runs one of them on a
problem (``engine``: :func:`plan`, re-exported here)."""

from clusterplan.planner.search.engine import ENGINES, SearchOptions, SearchResult, check_layout, objective_seconds, plan

__all__ = ["ENGINES", "SearchOptions", "SearchResult", "check_layout", "objective_seconds", "plan"]
