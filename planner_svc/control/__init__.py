"""The planner's control loop core: drift, staleness vs rewarm, ski-rental decision, guard.

Pure: numpy, plain data and `router_client.plan` types; time is an argument.
The service converts a stream window into `Traffic` + `Telemetry`, asks the
planning core for a candidate, and calls `ControlLoop.step` (see `loop`).
"""

from planner_svc.control.decision import Action, Decision, DecisionSettings, Penalties
from planner_svc.control.drift import Drift, measure_drift
from planner_svc.control.guard import GuardSettings, GuardState, Mode, ValidatedRange
from planner_svc.control.loop import ControlLoop, Figures, InstallRecord, LoopSettings
from planner_svc.control.penalties import RewarmFactor, WarmAdvantage
from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Traffic

__all__ = [
    "Action",
    "ControlLoop",
    "Decision",
    "DecisionSettings",
    "Drift",
    "Figures",
    "GuardSettings",
    "GuardState",
    "InstallRecord",
    "LoopSettings",
    "Mode",
    "Penalties",
    "RewarmFactor",
    "Telemetry",
    "Traffic",
    "ValidatedRange",
    "WarmAdvantage",
    "measure_drift",
]
