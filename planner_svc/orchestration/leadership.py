"""Which of several planner replicas installs: a lease in the plan store, renewed by the
leader, taken over by a standby when it lapses.

    planner A  ──acquire──▶ lease "7 planner-a" (TTL lease_s) ◀──renew every period──
    planner B  ──acquire──▶ refused (held)          ... A dies, the TTL runs out ...
    planner B  ──acquire──▶ lease "8 planner-b": B takes over (reloads, new epoch)

Safety does not rest on timing: the store's install script compares the lease value
with the one the installer holds, atomically with the install (the fence), so a leader
whose lease lapsed cannot install even if it still believes it leads. Timing only decides
how soon a standby acts, and when a leader that cannot reach the store stops acting on
its own (before its lease can have passed to another: `step_down_after`).

`Leadership.step` is a pure state machine over a `LeaseStore` and a monotonic `now`; the
service's timer calls it every period.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Protocol

from planner_svc.errors import Unavailable

log = logging.getLogger("cacheroute.planner")


class LeaseStore(Protocol):
    def acquire_lease(self, holder: str, lease_ms: int, held: str) -> str | None: ...
    def release_lease(self, held: str) -> None: ...
    def lease_holder(self) -> str: ...


class Change(enum.Enum):
    NONE = "none"
    GAINED = "gained"
    LOST = "lost"


@dataclass
class Leadership:
    holder_id: str
    lease_s: float
    value: str = ""  # the lease value while this planner leads
    renewed_at: float = field(default=-math.inf)
    terms: int = 0  # leaderships gained
    last_error: str = ""

    def __post_init__(self) -> None:
        if not self.holder_id or " " in self.holder_id:
            raise ValueError("the leader id must be non-empty and contain no spaces")
        if not self.lease_s > 0:
            raise ValueError("the lease must be > 0 seconds")

    @property
    def leader(self) -> bool:
        return bool(self.value)

    @property
    def step_down_after(self) -> float:
        """A leader that could not renew for this long stops acting: two thirds of the
        lease, so it stops before the store can hand the lease to a standby."""
        return self.lease_s * 2 / 3

    @property
    def period_s(self) -> float:
        """How often to step: three renewals per lease."""
        return self.lease_s / 3

    def step(self, store: LeaseStore, now: float) -> Change:
        was = self.leader
        try:
            value = store.acquire_lease(self.holder_id, round(self.lease_s * 1000), self.value)
        except Unavailable as exc:  # the store is unreachable: no answer, not a refusal
            self.last_error = str(exc)
            if was and now - self.renewed_at >= self.step_down_after:
                log.warning("planner %s: lease not renewed for %.1f s: stepping down",
                            self.holder_id, now - self.renewed_at)
                self.value = ""
                return Change.LOST
            return Change.NONE
        self.last_error = ""
        if value is None:
            if was:
                log.warning("planner %s: lost the leader lease", self.holder_id)
            self.value = ""
            return Change.LOST if was else Change.NONE
        self.value, self.renewed_at = value, now
        if not was:
            self.terms += 1
            log.warning("planner %s: leader (lease %s)", self.holder_id, value)
            return Change.GAINED
        return Change.NONE

    def release(self, store: LeaseStore) -> None:
        if self.value:
            with contextlib.suppress(Unavailable):  # unreachable: it lapses on its own
                store.release_lease(self.value)
            self.value = ""

    def leader_id(self, store: LeaseStore) -> str:
        """Who leads now, by the store ("" if nobody or unknown)."""
        if self.value:
            return self.holder_id
        try:
            held = store.lease_holder()
        except Unavailable:
            return ""
        return held.split(" ", 1)[1] if " " in held else ""
