"""The leader-election state machine (orchestration.leadership) over an in-memory lease
store with the Redis script's rules, on a simulated clock."""

from __future__ import annotations

import pytest

from planner_svc.errors import Unavailable
from planner_svc.orchestration.leadership import Change, Leadership


class Store:
    """The lease rules of redis_publisher._LEASE_LUA, with time passed in."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.expires = 0.0
        self.term = 0
        self.now = 0.0
        self.down = False

    def acquire_lease(self, holder: str, lease_ms: int, held: str) -> str | None:
        if self.down:
            raise Unavailable("Redis is unreachable")
        if self.value is not None and self.now >= self.expires:
            self.value = None  # the TTL ran out
        if self.value is not None:
            if held and self.value == held:
                self.expires = self.now + lease_ms / 1000
                return self.value
            return None
        if held:
            return None
        self.term += 1
        self.value, self.expires = f"{self.term} {holder}", self.now + lease_ms / 1000
        return self.value

    def release_lease(self, held: str) -> None:
        if self.value == held:
            self.value = None

    def lease_holder(self) -> str:
        return self.value or ""


def run(store: Store, planners: list[Leadership], until: float, dt: float = 0.1,
        dead: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    while store.now < until:
        for p in planners:
            if p.holder_id not in dead:
                p.step(store, store.now)
        store.now = round(store.now + dt, 6)


def test_one_leader_and_a_standby_that_takes_over_after_the_lease():
    store = Store()
    a, b = Leadership("a", 3.0), Leadership("b", 3.0)
    assert a.step(store, 0.0) is Change.GAINED
    assert b.step(store, 0.0) is Change.NONE and not b.leader
    run(store, [a, b], 10.0)
    assert a.leader and not b.leader and store.term == 1  # renewals keep it
    run(store, [a, b], 12.9, dead={"a"})  # a dies at t=10: its lease lasts until ~13
    assert not b.leader
    run(store, [a, b], 13.5, dead={"a"})
    assert b.leader and store.value == "2 b" and b.leader_id(store) == "b"


def test_a_leader_that_cannot_reach_the_store_steps_down_before_its_lease_ends():
    store = Store()
    a = Leadership("a", 3.0)
    a.step(store, 0.0)
    store.down = True
    assert a.step(store, 1.0) is Change.NONE and a.leader  # a blip: still leading
    assert a.step(store, 2.0) is Change.LOST and not a.leader  # 2/3 of the lease
    assert "unreachable" in a.last_error
    store.down = False
    store.now = 2.5
    assert a.step(store, 2.5) is Change.NONE  # the old lease is not its own any more


def test_a_paused_leader_finds_its_lease_gone():
    store = Store()
    a, b = Leadership("a", 2.0), Leadership("b", 2.0)
    a.step(store, 0.0)
    store.now = 5.0  # a stalls (GC, SIGSTOP) past its lease; b takes over meanwhile
    assert b.step(store, 5.0) is Change.GAINED
    assert a.step(store, 5.1) is Change.LOST and not a.leader
    assert store.value == "2 b"


def test_release_hands_over_at_once():
    store = Store()
    a, b = Leadership("a", 30.0), Leadership("b", 30.0)
    a.step(store, 0.0)
    a.release(store)
    assert b.step(store, 0.1) is Change.GAINED


@pytest.mark.parametrize("holder, lease", [("", 3.0), ("a b", 3.0), ("a", 0.0)])
def test_bad_settings_are_refused(holder: str, lease: float):
    with pytest.raises(ValueError):
        Leadership(holder, lease)
