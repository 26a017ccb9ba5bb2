"""Where a router reads plans: the `PlanSource` seam, and a static source for tests.

A source answers four questions (the pointer, a delta blob, a plan blob, "has
anything changed?") and takes status reports. Blobs are serialized
`SignedBlob`s: the client verifies them, never the source. `RedisPlanSource`
(`router_client.redis_source`) is the production source; `StaticPlanSource`
serves plans held in memory, signed with a key it makes, so users can test
their router integration without Redis.

Errors: a source raises `SourceUnavailable` for anything that means "cannot
reach the plans now"; the client then keeps routing on its last good plan and
retries with backoff.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cacheroute.v1 import plan_pb2
from router_client import signing
from router_client.delta import make_delta
from router_client.errors import SourceUnavailable
from router_client.layout import ROUTER_STATUS_TTL_S, Pointer
from router_client.plan import RoutingPlan, Version, encode_plan

__all__ = [
    "AsyncPlanSource",
    "AsyncStaticPlanSource",
    "PlanSource",
    "SourceUnavailable",
    "StaticPlanSource",
]


class PlanSource(Protocol):
    """Blocking plan source, used by `RouterClient` from its own thread."""

    reconnects: int

    def current(self) -> Pointer | None: ...
    def fetch_deltas(self, after: Version, upto: Version, limit: int) -> list[bytes] | None:
        """Delta blobs of every retained version in (after, upto], oldest first; None if
        there are more than `limit` or one is missing."""
        ...

    def fetch_plan(self, version: Version) -> bytes | None: ...
    def wait_for_change(self, timeout_s: float) -> Version | None:
        """Block up to `timeout_s` for a change hint; the hinted version or None."""
        ...

    def report(self, status: plan_pb2.RouterStatus) -> int | None:
        """Write this router's status; the other routers that reported on the same plan
        within `ROUTER_STATUS_TTL_S` (None: the source cannot tell)."""
        ...

    def close(self) -> None: ...


class AsyncPlanSource(Protocol):
    """The same seam for `AsyncRouterClient`."""

    reconnects: int

    async def current(self) -> Pointer | None: ...
    async def fetch_deltas(
        self, after: Version, upto: Version, limit: int
    ) -> list[bytes] | None: ...
    async def fetch_plan(self, version: Version) -> bytes | None: ...
    async def wait_for_change(self, timeout_s: float) -> Version | None: ...
    async def report(self, status: plan_pb2.RouterStatus) -> int | None: ...
    async def close(self) -> None: ...


class StaticPlanSource:
    """Plans held in memory. `publish(plan)` installs a new version and wakes waiters."""

    def __init__(self, private_key: Ed25519PrivateKey | None = None) -> None:
        self._key = private_key or signing.generate_private_key()
        self.public_keys = signing.pin([self._key.public_key()])
        self._plans: dict[Version, bytes] = {}
        self._deltas: dict[Version, bytes] = {}
        self._pointer: Pointer | None = None
        self._last: RoutingPlan | None = None
        self._changed = threading.Condition()
        self.reports: dict[str, plan_pb2.RouterStatus] = {}
        self.reconnects = 0
        self.available = True  # set False to simulate an outage

    def publish(self, plan: RoutingPlan) -> Pointer:
        blob = signing.sign_blob(encode_plan(plan), signing.PLAN, self._key)
        digest = bytes(_parse(blob).digest)
        if self._last is not None and self._pointer is not None:
            delta = make_delta(self._last, plan, self._pointer.digest, digest)
            raw = delta.SerializeToString()
            self._deltas[plan.version] = signing.sign_blob(raw, signing.DELTA, self._key)
        with self._changed:
            self._plans[plan.version] = blob
            self._pointer = Pointer(plan.version, digest)
            self._last = plan
            self._changed.notify_all()
        return self._pointer

    def put_raw(self, version: Version, plan_blob: bytes, digest: bytes) -> None:
        """Install arbitrary bytes (e.g. a corrupt blob) as `version`, for negative tests."""
        with self._changed:
            self._plans[version] = plan_blob
            self._pointer = Pointer(version, digest)
            self._changed.notify_all()

    def _check(self) -> None:
        if not self.available:
            raise SourceUnavailable("static source marked unavailable")

    def current(self) -> Pointer | None:
        self._check()
        return self._pointer

    def fetch_deltas(self, after: Version, upto: Version, limit: int) -> list[bytes] | None:
        self._check()
        between = sorted(v for v in self._plans if after < v <= upto)
        if not between or len(between) > limit:
            return None
        chain = [self._deltas.get(v) for v in between]
        return None if any(d is None for d in chain) else chain  # type: ignore[return-value]

    def fetch_plan(self, version: Version) -> bytes | None:
        self._check()
        return self._plans.get(version)

    def wait_for_change(self, timeout_s: float) -> Version | None:
        with self._changed:
            before = self._pointer
            self._changed.wait_for(lambda: self._pointer != before, timeout_s)
            after = self._pointer
        return after.version if after is not None and after != before else None

    def report(self, status: plan_pb2.RouterStatus) -> int:
        self._check()
        self.reports[status.router_id] = status
        since = status.reported_at_ms - ROUTER_STATUS_TTL_S * 1000
        return sum(1 for r, s in self.reports.items()
                   if r != status.router_id and s.reported_at_ms >= since)

    def close(self) -> None:
        pass


class AsyncStaticPlanSource:
    """`StaticPlanSource` for `AsyncRouterClient`: the same data, awaitable."""

    def __init__(self, static: StaticPlanSource, poll_s: float = 0.01) -> None:
        self.static = static
        self._poll_s = poll_s
        self.reconnects = 0

    async def current(self) -> Pointer | None:
        return self.static.current()

    async def fetch_deltas(self, after: Version, upto: Version, limit: int) -> list[bytes] | None:
        return self.static.fetch_deltas(after, upto, limit)

    async def fetch_plan(self, version: Version) -> bytes | None:
        return self.static.fetch_plan(version)

    async def wait_for_change(self, timeout_s: float) -> Version | None:
        before = self.static._pointer
        waited = 0.0
        while waited < timeout_s and self.static._pointer == before:
            await asyncio.sleep(self._poll_s)
            waited += self._poll_s
        after = self.static._pointer
        return after.version if after is not None and after != before else None

    async def report(self, status: plan_pb2.RouterStatus) -> int:
        return self.static.report(status)

    async def close(self) -> None:
        pass


def _parse(blob: bytes) -> plan_pb2.SignedBlob:
    pb = plan_pb2.SignedBlob()
    pb.ParseFromString(blob)
    return pb
