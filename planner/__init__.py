"""Search, plan documents, explanations, exports, what-if and validation.

The layout and job types live in ``cost.layout`` (every cost function takes them); they are
re-exported here with the search entry points.
"""

from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.planner.search import SearchOptions, SearchResult, plan
from clusterplan.planner.search.space import Bounds, parse_bounds

__all__ = ["Bounds", "Job", "Layout", "SearchOptions", "SearchResult", "parse_bounds", "parse_layout", "plan"]
