"""What a plan is built for: the destinations, the capacity knee and the warm-slot budget.

Capacity weights (heterogeneous replicas): destination d's knee is `q_cap · w_d`; loads are compared
relative to capacity (`load_d / w_d`). Draining destinations take no admitted key and no fallback
traffic; they stay in the plan's destination list so routers can see them leave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner_svc.planning.errors import PlanningError
from router_client.plan import DestinationSpec, PlanConfig

# The paper's bound on how far above a fresh LPT's max/mean load a plan may stay: the
# planning library's default, and the replay's and offline tools'. The planner service ships
# 0.3 (PlannerSettings.imbalance_tolerance: why there).
PAPER_IMBALANCE_TOLERANCE = 0.03


@dataclass(frozen=True)
class PlanningConfig:
    """Inputs of Algorithm 1 other than the rates.

    - `warm_slots`: the budget C; default R·W over the non-draining destinations.
    - `imbalance_tolerance`: repack stops rebalancing once max/mean load is within this of what a
      fresh LPT plan achieves.
    - `balance_effort` (churn vs balance, in [0, 1]): 1 rebalances down to that target; 0 never
      moves a key for balance (only mandatory fixes); between, the target is interpolated between
      the post-fix imbalance and the full target.
    - `byte_aware`, `token_budget`: admit by value density under a budget in tokens (see
      `planner_svc.planning.admission`); the default budget is C × the mean reusable prefix.
    - `admission_hysteresis` (repack only, default 0 = exact top-rate admission): keys the
      installed plan admits rank at λ·(1 + h), so rate noise near the admission boundary does
      not swap keys in and out (each swap rewarms a prefix).
    - `replica_hysteresis` (repack only, default 0 = k_b = ⌈λ/q⌉ exactly): a key keeps the
      replica count the installed plan gives it while its rate stays within (1 + h) above that
      count's capacity or (1 − h) below the next lower one's, so a hot key whose windowed rate
      hovers at a multiple of q_cap does not gain and lose a replica every few replans (each
      change rewarms the new replica and moves the keys that make room for it).
    - `hashed_tail` (default off = the paper's P2C cold tail): the routers consistent-hash the
      keys the plan does not admit (`cold_tail="hash"`, the gateway's default); the plan then
      models that tail on the shared ring and places keys entering the plan on their ring
      owner when balance allows, so admission moves no traffic (`planning.placement`).
    """

    destinations: tuple[DestinationSpec, ...]
    q_cap: float
    warm_slots_per_destination: int
    warm_slots: int | None = None
    imbalance_tolerance: float = PAPER_IMBALANCE_TOLERANCE
    balance_effort: float = 1.0
    byte_aware: bool = False
    token_budget: float | None = None
    admission_hysteresis: float = 0.0
    replica_hysteresis: float = 0.0
    hashed_tail: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "destinations", tuple(self.destinations))
        _check_destinations(self.destinations)
        _check_positive("q_cap", self.q_cap)
        _check_count("warm_slots_per_destination", self.warm_slots_per_destination)
        if self.warm_slots is not None:
            _check_count("warm_slots", self.warm_slots)
        if not (math.isfinite(self.imbalance_tolerance) and self.imbalance_tolerance >= 0):
            raise PlanningError(f"imbalance_tolerance must be >= 0, got {self.imbalance_tolerance}")
        if not 0.0 <= self.balance_effort <= 1.0:
            raise PlanningError(f"balance_effort must be in [0, 1], got {self.balance_effort}")
        if not (math.isfinite(self.admission_hysteresis) and self.admission_hysteresis >= 0):
            raise PlanningError(
                f"admission_hysteresis must be >= 0, got {self.admission_hysteresis}"
            )
        if not (math.isfinite(self.replica_hysteresis) and 0 <= self.replica_hysteresis < 1):
            raise PlanningError(
                f"replica_hysteresis must be in [0, 1), got {self.replica_hysteresis}"
            )
        if self.token_budget is not None:
            _check_positive("token_budget", self.token_budget)

    @classmethod
    def uniform(cls, n_destinations: int, q_cap: float, warm_slots_per_destination: int,
                **options: object) -> PlanningConfig:
        """`n_destinations` equal destinations named `d000`, `d001`, …"""
        if n_destinations <= 0:
            raise PlanningError(f"need at least one destination, got {n_destinations}")
        width = max(3, len(str(n_destinations - 1)))
        dests = tuple(DestinationSpec(f"d{i:0{width}d}") for i in range(n_destinations))
        return cls(dests, q_cap, warm_slots_per_destination, **options)  # type: ignore[arg-type]

    @property
    def active(self) -> np.ndarray:
        """Bool mask of destinations that take traffic (not draining)."""
        return np.array([not d.draining for d in self.destinations], dtype=bool)

    @property
    def weights(self) -> np.ndarray:
        """Capacity weight per destination (float64)."""
        return np.array([d.capacity_weight for d in self.destinations], dtype=np.float64)

    @property
    def n_active(self) -> int:
        return sum(not d.draining for d in self.destinations)

    @property
    def slots(self) -> int:
        """The warm-slot budget C."""
        if self.warm_slots is not None:
            return self.warm_slots
        return self.n_active * self.warm_slots_per_destination

    @property
    def reference_capacity(self) -> float:
        """q_cap of a destination of mean healthy capacity: the divisor in k_b (see admission)."""
        w = self.weights[self.active]
        return self.q_cap * float(w.mean())

    def plan_config(self, built_by: str) -> PlanConfig:
        """The config record stored in the plan."""
        return PlanConfig(
            q_cap=self.q_cap,
            warm_slots_per_destination=self.warm_slots_per_destination,
            warm_slots=self.slots,
            byte_aware=self.byte_aware,
            imbalance_tolerance=self.imbalance_tolerance,
            built_by=built_by,
            hashed_tail=self.hashed_tail,
        )


def _check_destinations(dests: tuple[DestinationSpec, ...]) -> None:
    if not dests:
        raise PlanningError("a plan needs at least one destination")
    ids = [d.id for d in dests]
    if any(not i for i in ids):
        raise PlanningError("destination ids must be non-empty")
    if len(set(ids)) != len(ids):
        raise PlanningError(f"destination ids must be unique, got {ids}")
    for d in dests:
        if not (math.isfinite(d.capacity_weight) and d.capacity_weight > 0):
            raise PlanningError(f"destination {d.id!r}: capacity_weight must be > 0")
    if all(d.draining for d in dests):
        raise PlanningError("every destination is draining: nowhere to send traffic")


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise PlanningError(f"{name} must be a finite number > 0, got {value}")


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise PlanningError(f"{name} must be an integer >= 0, got {value!r}")
