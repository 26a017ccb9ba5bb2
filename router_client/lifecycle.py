"""One request's way through a router: route -> started -> first token -> finished, or
failed -> retried elsewhere.

The gateway (`router_client.gateway.proxy`), the endpoint picker (`router_client.epp`) and
the simulator's CacheRoute router (`planner_svc.simulator.cacheroute_policy`) each hold one
`Request` per request and call these steps, so the three take the same decision for the
same request and keep the same books: the core's in-flight, awaiting-first-token and owed
counts, the key's open requests at its home (idle re-homing), the conversation's history
after a move, and what a return home teaches the re-homing window.

A request is placed by `RouterCore.decide` unless the caller rules that slot out (`avoid`:
the gateway's subset, a destination at its in-flight cap); then, as for a retry, by
`RouterCore.route_avoiding` among the rest: such a placement is not counted open for its
key, owes a whole (cold) prefill where it lands, and takes the conversation's history with
it.
"""

from __future__ import annotations

from collections.abc import Collection

from router_client.eviction_window import prefix_hit
from router_client.routing import Return, RouterCore, cold_owed


class AtCap:
    """The slots whose in-flight count is at `cap`, as a collection for `avoid` (a check of
    one slot on the hot path, not a set built per request)."""

    __slots__ = ("cap", "inflight")

    def __init__(self, inflight: list[int], cap: int) -> None:
        self.inflight, self.cap = inflight, cap

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and self.inflight[slot] >= self.cap

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (s for s, n in enumerate(self.inflight) if n >= self.cap)

    def __len__(self) -> int:
        return sum(1 for n in self.inflight if n >= self.cap)


class Request:
    """One request of `key` (and, within it, `affinity`: a conversation) on `core`."""

    __slots__ = ("affinity", "answered", "cacheable_tokens", "core", "counted", "key", "owed",
                 "prompt_tokens", "returned", "reusable_tokens", "slot", "tried")

    def __init__(self, core: RouterCore, key: str, affinity: str | None = None, *,
                 prompt_tokens: int = 0, cacheable_tokens: int = 0,
                 reusable_tokens: int = 0) -> None:
        self.core = core
        self.key, self.affinity = key, affinity
        # The prompt's size and the part of it the affinity's slot holds cached: what
        # queue-aware routing weighs.
        self.prompt_tokens, self.cacheable_tokens = prompt_tokens, cacheable_tokens
        # The key's reusable prefix: what a return home hopes to find cached (`served`).
        self.reusable_tokens = reusable_tokens
        self.slot = -1  # where the current attempt goes (-1: nowhere yet)
        self.owed = 0.0  # the prefill work it owes there, given back at the first token
        self.returned: Return | None = None  # a return home after an idle gap
        self.counted = False  # the core counts it open for its key there (idle re-homing)
        self.answered = False  # the current attempt's first token came
        self.tried: list[int] = []  # slots of failed attempts

    def route(self, now: float | None = None, avoid: Collection[int] = ()) -> int | None:
        """The first attempt's slot (None: no usable slot outside `avoid`). `now`: the
        caller's clock, which idle re-homing needs (ignored without it)."""
        core = self.core
        if core.idle_rehome_s is None:
            now = None
        d = core.decide(self.key, self.affinity, now, self.prompt_tokens, self.cacheable_tokens)
        if d.slot not in avoid:
            self.slot, self.owed, self.returned = d.slot, d.owed, d.returned
            self.counted = now is not None
            return d.slot
        if now is not None:  # not sent there after all: not open there
            core.key_finished(self.key, d.slot, now)
        return self._elsewhere(avoid)

    def retry(self, avoid: Collection[int] = ()) -> int | None:
        """After `failed`: a slot neither tried nor in `avoid` (None: none left)."""
        return self._elsewhere(avoid)

    def _elsewhere(self, avoid: Collection[int]) -> int | None:
        core = self.core
        blocked = set(avoid)
        blocked.update(self.tried)
        moved = core.route_avoiding(self.key, blocked)
        self.returned, self.counted, self.answered = None, False, False
        if moved is None:
            self.slot, self.owed = -1, 0.0
            return None
        if self.affinity is not None:
            core.remember(self.affinity, moved)  # its history will be there
        self.slot = moved
        # It lands where its prompt is not known to be cached.
        self.owed = cold_owed(self.prompt_tokens) if core.queue_aware else 0.0
        return moved

    def started(self) -> None:
        """The attempt is sent: in flight at its slot, owing its prefill there."""
        self.answered = False
        self.core.started(self.slot, self.owed)

    def first_token(self) -> None:
        """Its first token came (the prefill it owed is done); once per attempt."""
        if not self.answered:
            self.answered = True
            self.core.first_token(self.slot, self.owed)

    def finished(self, now: float | None = None) -> None:
        """The attempt ended (answered or not): out of flight, and, if the core counted it
        open for its key (idle re-homing), the key's prefix last touched there at `now`."""
        core = self.core
        core.finished(self.slot, answered=self.answered, owed=self.owed)
        if self.counted and now is not None:
            core.key_finished(self.key, self.slot, now)
            self.counted = False

    def failed(self, now: float | None = None) -> None:
        """The attempt failed: ended as `finished`, and its slot is not tried again."""
        self.finished(now)
        self.tried.append(self.slot)

    def served(self, cached_tokens: int, at: int | None = None) -> None:
        """What the engine at `at` (default: the attempt's slot; the picker's gateway may
        have retried elsewhere) served from cache: a return home teaches the re-homing
        window whether the key's reusable prefix was still there."""
        if self.returned is not None:
            self.core.observe_return(self.returned, self.slot if at is None else at,
                                     prefix_hit(cached_tokens, self.reusable_tokens))
