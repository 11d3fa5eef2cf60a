"""The partition search: cost model, coarsening, DP, recursion over device counts, baselines.

The search sees only :class:`~tofu_mx.search.problem.Problem` values and never binds or runs
anything in MXNet; the Plan it returns is plain data.
"""
from tofu_mx.search.layouts import OpaqueOp, OpStrategy, StoredLayout
from tofu_mx.search.plan import Plan, SearchOptions, plan, plan_graph

__all__ = ["OpStrategy", "OpaqueOp", "Plan", "SearchOptions", "StoredLayout", "plan", "plan_graph"]
