"""Destination health: passive outlier detection and active probe verdicts (pure).

Two independent signals decide whether a router may send new requests to a
destination, in the manner of Envoy's outlier detection and active health checks:

- **Outlier detection** (passive): every finished request reports an `Outcome`.
  `consecutive_failures` failures in a row (connect errors, resets before a
  response, 5xx, first-byte timeouts) *eject* the destination for
  `base_ejection_s × (times ejected so far)`, capped at `max_ejection_s`. When the
  time is up it is readmitted; a destination that stays healthy for one full
  `max_ejection_s` has its ejection count forgotten. At most
  `max_ejected_fraction` of the destinations are ejected at once (always at least
  one may be), so a fleet-wide outage never ejects everything.
- **Active probes**: a probe verdict per destination and period;
  `unhealthy_after` failed probes in a row mark it down, `healthy_after`
  successes in a row mark it up again.

A destination is routable when it is neither ejected nor probed down. This module
owns no clock and no I/O: callers pass `now` (monotonic seconds) and apply the
changes it returns to `RouterCore.mark_down` / `mark_up`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field


class Outcome(enum.Enum):
    """How one request to a destination ended, as far as its health is concerned."""

    SUCCESS = "success"
    CONNECT_ERROR = "connect_error"  # refused, unreachable, TLS failure
    RESET = "reset"  # the connection broke before or during the response
    HTTP_5XX = "http_5xx"  # a 5xx status (overload 503s included: they are failures too)
    TIMEOUT = "timeout"  # no first byte (or no progress) within the configured time
    CLIENT_ERROR = "client_error"  # 4xx: the request's fault, not the destination's

    @property
    def is_failure(self) -> bool:
        return self not in (Outcome.SUCCESS, Outcome.CLIENT_ERROR)


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthPolicy:
    """Thresholds of both signals. Defaults follow Envoy's outlier detection where it has one
    (5 consecutive failures, 30 s base ejection, 300 s cap); Envoy caps ejections at 10 % of
    hosts, which on a 4-engine fleet ejects none, so the cap here is a half."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5
    unhealthy_after: int = 2
    healthy_after: int = 1

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.unhealthy_after < 1 or self.healthy_after < 1:
            raise ValueError("failure and probe thresholds must be >= 1")
        if not 0 < self.base_ejection_s <= self.max_ejection_s:
            raise ValueError("need 0 < base_ejection_s <= max_ejection_s")
        if not 0.0 <= self.max_ejected_fraction <= 1.0:
            raise ValueError("max_ejected_fraction must be in [0, 1]")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSettings:
    """Active probes: GET `path` on each destination's address every `period_s`; a probe
    that does not answer 2xx within `timeout_s` failed."""

    path: str = "/health"
    period_s: float = 5.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("probe path must start with '/'")
        if self.period_s <= 0 or self.timeout_s <= 0:
            raise ValueError("probe period and timeout must be > 0")


@dataclass(slots=True)
class _State:
    failures: int = 0  # consecutive failed outcomes
    ejections: int = 0  # how many times ejected (grows the next ejection)
    ejected_until: float | None = None
    healthy_since: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0
    probed_down: bool = False
    last_failure: str = ""


@dataclass(frozen=True, slots=True)
class HealthView:
    """One destination's health as status reports and `cacheroute routers` show it."""

    destination: str
    routable: bool
    ejected_for_s: float
    probed_down: bool
    consecutive_failures: int
    ejections: int
    last_failure: str


@dataclass(slots=True)
class HealthTracker:
    """Per-destination health state; every method returns the destinations whose routability
    changed, as `(destination, routable)` pairs, for the caller to apply."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _states: dict[str, _State] = field(default_factory=dict)

    def record(self, destination: str, outcome: Outcome, now: float) -> list[tuple[str, bool]]:
        """One finished request's outcome."""
        st = self._state(destination, now)
        if not outcome.is_failure:
            st.failures = 0
            return self._forget_old_ejections(st, now)
        st.failures += 1
        st.last_failure = outcome.value
        if st.ejected_until is not None or st.failures < self.policy.consecutive_failures:
            return []
        if not self._may_eject():
            return []
        was = self._routable(st)
        st.ejections += 1
        st.failures = 0
        span = min(self.policy.base_ejection_s * st.ejections, self.policy.max_ejection_s)
        st.ejected_until = now + span
        return [(destination, False)] if was else []

    def probed(self, destination: str, healthy: bool, now: float) -> list[tuple[str, bool]]:
        """One active probe's verdict."""
        st = self._state(destination, now)
        was = self._routable(st)
        if healthy:
            st.probe_failures = 0
            st.probe_successes += 1
            if st.probed_down and st.probe_successes >= self.policy.healthy_after:
                st.probed_down = False
        else:
            st.probe_successes = 0
            st.probe_failures += 1
            if st.probe_failures >= self.policy.unhealthy_after:
                st.probed_down = True
                st.last_failure = "probe"
        now_routable = self._routable(st)
        return [(destination, now_routable)] if now_routable != was else []

    def tick(self, now: float) -> list[tuple[str, bool]]:
        """Readmit destinations whose ejection time is up."""
        changes: list[tuple[str, bool]] = []
        for dest, st in self._states.items():
            if st.ejected_until is not None and st.ejected_until <= now:
                st.ejected_until = None
                st.healthy_since = now
                if self._routable(st):
                    changes.append((dest, True))
        return changes

    def track(self, fleet: Iterable[str], now: float) -> None:
        """The destinations of the current plan: state for new ones, none for gone ones (the
        ejection cap is a fraction of this fleet)."""
        keep = set(fleet)
        for dest in [d for d in self._states if d not in keep]:
            del self._states[dest]
        for dest in keep:
            self._state(dest, now)

    def is_routable(self, destination: str) -> bool:
        st = self._states.get(destination)
        return st is None or self._routable(st)

    def unroutable(self) -> list[str]:
        return sorted(d for d, st in self._states.items() if not self._routable(st))

    def views(self, now: float) -> list[HealthView]:
        return [
            HealthView(
                destination=d,
                routable=self._routable(st),
                ejected_for_s=max(0.0, (st.ejected_until or now) - now),
                probed_down=st.probed_down,
                consecutive_failures=st.failures,
                ejections=st.ejections,
                last_failure=st.last_failure,
            )
            for d, st in sorted(self._states.items())
        ]

    # --- helpers ------------------------------------------------------------------

    def _state(self, destination: str, now: float) -> _State:
        st = self._states.get(destination)
        if st is None:
            st = self._states[destination] = _State(healthy_since=now)
        return st

    @staticmethod
    def _routable(st: _State) -> bool:
        return st.ejected_until is None and not st.probed_down

    def _may_eject(self) -> bool:
        ejected = sum(1 for st in self._states.values() if st.ejected_until is not None)
        limit = int(self.policy.max_ejected_fraction * len(self._states))
        return ejected < max(1, limit)

    def _forget_old_ejections(self, st: _State, now: float) -> list[tuple[str, bool]]:
        if st.ejections and st.ejected_until is None and (
            now - st.healthy_since >= self.policy.max_ejection_s
        ):
            st.ejections = 0
        return []
