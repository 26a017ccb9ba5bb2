"""What one control interval installs: the first plan's gate, a fleet change, the loop's
verdict, and a pinned plan's guard. Pure: the planner service
(`orchestration.planner.Planner.tick`) and the simulator's CacheRoute router
(`simulator.cacheroute_policy`) both call these and then carry out the `Step` their own
way (publish to Redis; swap the simulated routers' table), so the simulator decides with
the production's rules instead of a description of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from planner_svc.control.decision import Action, Decision
from planner_svc.control.delivery import DeliveryReport
from planner_svc.control.loop import ControlLoop, Fleet
from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Traffic
from router_client.plan import RoutingPlan


class Install(StrEnum):
    NOTHING = "nothing"  # keep what routers follow
    WAIT = "wait"  # no first plan yet: the guard's verdict is a window or two away
    CANDIDATE = "candidate"  # install the candidate plan
    FALLBACK = "fallback"  # routers to Flat-LB (a fallback plan)
    RESUME = "resume"  # back to planned routing (a fresh candidate)


@dataclass(frozen=True, slots=True)
class Step:
    install: Install
    decision: Decision | None = None  # the loop's own decision, when it made one
    reason: str = ""  # why, when the loop did not decide (first plan, fleet change)


FIRST_PLAN = "first plan: nothing was installed"


def first_plan(loop: ControlLoop, now_s: float, telemetry: Telemetry | None, *,
               ready_since_s: float, window_s: float) -> Step:
    """The first plan, once the guard has judged the traffic. Its predicted affinity gain
    needs a few windows to send a planned fleet to Flat-LB, and after an install it waits
    out the rewarm dip as well: judged only after the first plan, low-reuse traffic was
    routed by a plan for 65 s of the arena's 100-s runs before the guard's fallback. So
    while a run of low predicted gains is under way the first plan waits (for at most that
    run's length in windows, then plans), and a fallback verdict installs Flat-LB."""
    decision = loop.guard_only(now_s, telemetry)
    if decision is None and loop.guard.gain_low_windows > 0:
        patience = (loop.settings.guard.gain_low_windows + 1) * window_s
        if now_s - ready_since_s < patience:
            return Step(Install.WAIT)
    if decision is not None and decision.action is Action.FALLBACK:
        return Step(Install.FALLBACK, decision)
    return Step(Install.CANDIDATE, reason=FIRST_PLAN)


def control_step(loop: ControlLoop, now_s: float, *, installed: RoutingPlan, traffic: Traffic,
                 candidate: RoutingPlan | None, telemetry: Telemetry | None,
                 fleet: Fleet | None = None, delivery: DeliveryReport | None = None,
                 fleet_change: str = "") -> Step:
    """One interval with a plan installed. A destination that left or came back
    (`fleet_change`, why) moves its keys now, whatever the staleness account says;
    otherwise the loop decides (`ControlLoop.step`)."""
    if fleet_change and candidate is not None:
        return Step(Install.CANDIDATE, reason=fleet_change)
    decision = loop.step(now_s, installed=installed, traffic=traffic, candidate=candidate,
                         telemetry=telemetry, fleet=fleet, delivery=delivery)
    return Step(_install_of(decision, candidate), decision)


def pinned_step(loop: ControlLoop, now_s: float, telemetry: Telemetry | None,
                delivery: DeliveryReport | None = None) -> Step:
    """A pinned plan is not replanned, but the guard still falls back and resumes (to the
    pinned plan)."""
    decision = loop.guard_only(now_s, telemetry, delivery)
    if decision is None:
        return Step(Install.NOTHING)
    return Step(_install_of(decision, None), decision)


def _install_of(decision: Decision, candidate: RoutingPlan | None) -> Install:
    if decision.action is Action.INSTALL and candidate is not None:
        return Install.CANDIDATE
    if decision.action is Action.FALLBACK:
        return Install.FALLBACK
    if decision.action is Action.RESUME:
        return Install.RESUME
    return Install.NOTHING
