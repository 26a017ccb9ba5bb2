"""The planning core: Algorithm 1, churn-aware repacking, evaluation and plan diffs.

Pure: plain data, numpy and `router_client.plan` types in and out; no I/O, no clocks unless one is
passed in. `build_plan` plans from scratch; `repack` replans from an installed plan with minimum
churn; `diff` compares plans; `explain_key` says why a key is where a plan puts it. What an
installed plan does under new rates is `planner_svc.control.traffic` (the control loop's one load
projection).
"""

from planner_svc.planning.admission import Admission, admit, replica_counts
from planner_svc.planning.build import build_plan
from planner_svc.planning.config import PlanningConfig
from planner_svc.planning.diff import PlanDiff, diff
from planner_svc.planning.errors import PlanningError
from planner_svc.planning.explain import KeyExplanation, explain_key
from planner_svc.planning.repack import repack
from planner_svc.planning.stats import imbalance, table_loads

__all__ = [
    "Admission",
    "KeyExplanation",
    "PlanDiff",
    "PlanningConfig",
    "PlanningError",
    "admit",
    "build_plan",
    "diff",
    "explain_key",
    "imbalance",
    "repack",
    "replica_counts",
    "table_loads",
]
