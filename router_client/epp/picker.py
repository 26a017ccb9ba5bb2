"""The routing decision as the endpoint picker needs it: the plan's choice, then fallbacks,
all expressed as `ip:port` endpoints, within the gateway's subset and below each
destination's in-flight cap.

The decision itself is the router client's (`RouterCore.route_index` / `route_avoiding`:
the plan, health and drain, P2C or bounded-load hashing for the cold tail), the same one
the gateway makes; this module only maps destinations to endpoints and back, and counts
what is in flight. Single-threaded by design: the EPP serves on one asyncio loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from router_client.client_base import BaseRouterClient
from router_client.health import Outcome
from router_client.routing import cold_owed


def endpoint_of(address: str, destination_id: str) -> str:
    """`ip:port` for a destination: its address without scheme and path (an address
    `http://10.0.0.5:8000` gives `10.0.0.5:8000`), else its id when that already is one
    (pods are often planned by their `ip:port`). "" when neither says where it is."""
    for text in (address, destination_id):
        if not text:
            continue
        parts = urlsplit(text if "://" in text else f"//{text}")
        try:
            port = parts.port
        except ValueError:
            continue
        if parts.hostname and port:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"{host}:{port}"
    return ""


@dataclass(frozen=True, slots=True)
class Pick:
    slots: tuple[int, ...]  # primary first, then fallbacks
    endpoints: tuple[str, ...]
    # The primary was the key's home after an idle gap (RouterCore.last_return): its cache
    # outcome teaches the re-homing window (`RouterCore.observe_return`).
    returned: tuple[float, float, int] | None = None
    # The primary came from `route_index` with a clock: the core counts it open for its key
    # there until `key_finished` (a constrained pick, by `route_avoiding`, is not counted).
    counted: bool = False
    # The prefill work the core counts the request as owing the primary (`queue_aware`),
    # given back at its first token or its end.
    owed: float = 0.0

    @property
    def header_value(self) -> str:
        return ",".join(self.endpoints)


class EndpointPicker:
    def __init__(self, client: BaseRouterClient, *, max_inflight: int = 256,
                 fallbacks: int = 2) -> None:
        if max_inflight < 1 or fallbacks < 0:
            raise ValueError("max_inflight must be >= 1 and fallbacks >= 0")
        self.client = client
        self.core = client.core
        self.max_inflight = max_inflight
        self.fallbacks = fallbacks
        self._endpoints: list[str] = []
        self._slot_of_endpoint: dict[str, int] = {}
        self._built_for: tuple[object, int] | None = None
        self._unusable_for: tuple[object, object] | None = None
        self._unusable_cache: frozenset[int] = frozenset()

    # --- endpoints ---------------------------------------------------------------------

    def _refresh(self) -> None:
        """Rebuild the endpoint maps when the plan (its addresses) or the destination list
        changed: once per plan install, not per request."""
        marker = (self.client.table, len(self.core.destination_ids))
        if self._built_for is not None and self._built_for[0] is marker[0] \
                and self._built_for[1] == marker[1]:
            return
        ids = self.core.destination_ids
        self._endpoints = [endpoint_of(self.client.address_of(d), d) for d in ids]
        self._slot_of_endpoint = {e: s for s, e in enumerate(self._endpoints) if e}
        self._built_for = marker

    def endpoint(self, slot: int) -> str:
        self._refresh()
        return self._endpoints[slot]

    def slot_of_endpoint(self, endpoint: str) -> int | None:
        self._refresh()
        return self._slot_of_endpoint.get(endpoint)

    def usable_endpoints(self) -> list[str]:
        self._refresh()
        core = self.core
        return [e for d, e in zip(core.destination_ids, self._endpoints, strict=True)
                if e and core.is_usable(d)]

    # --- the decision ------------------------------------------------------------------

    def pick(self, key: str, affinity: str | None, subset: Sequence[str] | None = None, *,
             prompt_tokens: int = 0, cacheable_tokens: int = 0) -> Pick | None:
        """Where `key` goes, and where the gateway may retry; None when no endpoint can
        take it (none usable, none in the subset, or every one at its in-flight cap).
        `prompt_tokens` / `cacheable_tokens`: what `queue_aware` weighs (as the gateway's)."""
        self._refresh()
        core, endpoints = self.core, self._endpoints
        avoid = set(self._unusable())
        if subset is not None:
            allowed = {self._slot_of_endpoint[e] for e in subset if e in self._slot_of_endpoint}
            avoid.update(s for s in range(len(endpoints)) if s not in allowed)
        cap = self.max_inflight
        avoid.update(s for s, n in enumerate(core.inflight) if n >= cap)
        # The plan's own choice first, as the gateway's; where it is ruled out, the retry
        # path's choice among what is left (not counted open for its key, owing a cold
        # prefill where it lands).
        now = time.monotonic() if core.idle_rehome_s is not None else None
        planned = core.route_index(key, affinity, now, prompt_tokens, cacheable_tokens)
        primary = planned
        counted = now is not None
        owed = core.last_owed if core.queue_aware else 0.0
        if planned in avoid:
            if now is not None:  # not sent there after all: not open there
                core.key_finished(key, planned, now)
            moved = core.route_avoiding(key, avoid)
            if moved is None:
                return None
            primary = moved
            if affinity is not None:
                core.remember(affinity, primary)  # its history will be there
            counted = False
            owed = cold_owed(prompt_tokens) if core.queue_aware else 0.0
        returned = core.last_return if counted else None
        chosen = [primary]
        for _ in range(self.fallbacks):
            more = core.route_avoiding(key, avoid.union(chosen))
            if more is None:
                break
            chosen.append(more)
        return Pick(tuple(chosen), tuple(endpoints[s] for s in chosen), returned, counted,
                    owed)

    def _unusable(self) -> frozenset[int]:
        """Slots never to answer: unknown address, ejected or draining (with none left the
        protocol's answer is a 503, not the router's last-resort pick of any member).
        Cached until health, drain, the plan or the destination list change."""
        usable = self.core.usable_slots
        key = (usable, self._built_for)
        held = self._unusable_for
        if held is None or held[0] is not usable or held[1] is not self._built_for:
            n = len(usable)
            self._unusable_cache = frozenset(
                s for s, e in enumerate(self._endpoints) if not e or s >= n or not usable[s])
            self._unusable_for = key
        return self._unusable_cache

    # --- accounting --------------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether a request could be routed now: some usable endpoint is below its in-flight
        cap (readiness; the gateway's subset is not known here)."""
        self._refresh()
        unusable, cap = self._unusable(), self.max_inflight
        return any(n < cap and s not in unusable for s, n in enumerate(self.core.inflight))

    def started(self, slot: int, owed: float = 0.0) -> None:
        self.core.started(slot, owed)

    def first_token(self, slot: int, owed: float = 0.0) -> None:
        self.core.first_token(slot, owed)

    def finished(self, slot: int, outcome: Outcome | None, *, answered: bool = False,
                 owed: float = 0.0) -> None:
        """`answered`: `first_token` was called for this request; `owed`: as `started`."""
        self.core.finished(slot, answered=answered, owed=owed)
        if outcome is not None:
            self.client.report(self.core.destination_ids[slot], outcome)

    def destination(self, slot: int) -> str:
        return self.core.destination_ids[slot]
