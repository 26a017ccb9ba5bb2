"""The routing decision as the endpoint picker needs it: the plan's choice, then fallbacks,
all expressed as `ip:port` endpoints, within the gateway's subset and below each
destination's in-flight cap.

The decision itself is the router client's, through the request lifecycle the gateway
uses too (`router_client.lifecycle.Request`: the plan, health and drain, history,
queue-aware moves, the cold tail); this module only maps destinations to endpoints and
back, and offers the gateway fallbacks. Single-threaded by design: the EPP serves on one
asyncio loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from router_client.client_base import BaseRouterClient
from router_client.lifecycle import Request


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
    # The primary's way through the core (started, first token, finished, what it served).
    request: Request

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
             prompt_tokens: int = 0, cacheable_tokens: int = 0,
             reusable_tokens: int = 0) -> Pick | None:
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
        # path's choice among what is left (router_client.lifecycle).
        request = Request(core, key, affinity, prompt_tokens=prompt_tokens,
                          cacheable_tokens=cacheable_tokens, reusable_tokens=reusable_tokens)
        primary = request.route(time.monotonic(), avoid)
        if primary is None:
            return None
        chosen = [primary]
        for _ in range(self.fallbacks):
            more = core.route_avoiding(key, avoid.union(chosen))
            if more is None:
                break
            chosen.append(more)
        return Pick(tuple(chosen), tuple(endpoints[s] for s in chosen), request)

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

    def destination(self, slot: int) -> str:
        return self.core.destination_ids[slot]
