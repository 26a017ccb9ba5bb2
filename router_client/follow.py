"""Plan following, shared by the thread client and the asyncio client.

Everything but the waiting lives here. One synchronisation round is written
once, as a generator (`sync_round`) that *yields* what it wants from the
source (`Want`) and is *sent* the answer; the thread client answers with
blocking calls, the asyncio client with awaits. No I/O and no clock here:
time comes in as arguments.

Rules (xDS-like):
- versions only move forward; an older hint or pointer is ignored and counted;
- a delta is used only onto the exact base it names, else the full plan;
- size, digest, signature and the plan's sanity are checked before a swap;
  a rejected version is remembered (not refetched) and reported, and the last
  good table stays installed.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheroute.v1 import plan_pb2
from router_client import signing
from router_client.delta import apply_delta, decode_delta
from router_client.errors import PlanRejected
from router_client.layout import Pointer
from router_client.plan import MAX_PLAN_BYTES, Version
from router_client.routing import RoutingTable

FULL = "full"
DELTA = "delta"


# A router that is a few versions behind applies the chain of deltas; beyond this
# length the full plan is cheaper to fetch and apply.
MAX_DELTA_CHAIN = 8


class Ask(Enum):
    CURRENT = "current"  # -> Pointer | None
    DELTAS = "deltas"  # -> list of delta blobs for (after, version], or None
    PLAN = "plan"  # -> plan blob or None


@dataclass(frozen=True, slots=True)
class Want:
    """A request a sync round makes of its source."""

    ask: Ask
    version: Version | None = None
    after: Version | None = None


@dataclass(frozen=True, slots=True)
class Applied:
    """A round's result: a table to swap in, and how it was obtained."""

    table: RoutingTable
    kind: str  # FULL or DELTA


Answer: TypeAlias = "Pointer | bytes | list[bytes] | None"
SyncRound: TypeAlias = "Generator[Want, Answer, Applied | None]"


class PlanFollower:
    """What the router holds and has refused; builds verified tables from blobs."""

    def __init__(
        self,
        public_keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey],
        *,
        max_bytes: int = MAX_PLAN_BYTES,
    ) -> None:
        self.public_keys = (
            dict(public_keys) if isinstance(public_keys, Mapping) else signing.pin(public_keys)
        )
        self.max_bytes = max_bytes
        self.table: RoutingTable | None = None
        self.rejected: tuple[Version, bytes] | None = None
        self.last_rejection = ""
        self.rejections = 0
        self.ignored_older = 0
        self.applied_full = 0
        self.applied_delta = 0
        self.applied_full_edited = 0  # full plans applied as an edit of the held table
        self.delta_fallbacks = 0  # delta unusable, fetched the full plan instead
        self.confirmed = False  # the last round saw the source name our version

    @property
    def version(self) -> Version:
        return self.table.version if self.table is not None else Version()

    def wants(self, pointer: Pointer | None) -> bool:
        """True if `pointer` names a version worth fetching."""
        if pointer is None:
            return False
        if pointer.version < self.version:
            self.ignored_older += 1
            return False
        if pointer.version == self.version:
            return False
        return self.rejected != (pointer.version, pointer.digest)

    def note_hint(self, version: Version | None) -> None:
        if version is not None and version < self.version:
            self.ignored_older += 1

    def table_from_plan(self, pointer: Pointer, raw: bytes) -> RoutingTable:
        kind, payload, digest = signing.verify_blob(raw, self.public_keys, self.max_bytes)
        if kind != signing.PLAN:
            raise PlanRejected("malformed", "expected a plan blob, got a delta")
        if digest != pointer.digest:
            raise PlanRejected("digest_mismatch", "plan digest differs from the pointer's")
        # edits the held table's lookup when it can: far cheaper than a new one
        table = RoutingTable.from_payload(payload, digest, held=self.table)
        if table.version != pointer.version:
            wrong = f"payload is {table.version}, not {pointer.version}"
            raise PlanRejected("wrong_version", wrong)
        return table

    def table_from_delta(self, pointer: Pointer, raw: bytes) -> RoutingTable:
        return self.table_from_deltas(pointer, [raw])

    def table_from_deltas(self, pointer: Pointer, raws: list[bytes]) -> RoutingTable:
        """Apply a chain of deltas onto the held table; the last must reach `pointer`."""
        table = self.table
        if table is None or not raws:
            raise PlanRejected("delta_base_mismatch", "no base to apply a delta to")
        for i, raw in enumerate(raws):
            kind, payload, _digest = signing.verify_blob(raw, self.public_keys, self.max_bytes)
            if kind != signing.DELTA:
                raise PlanRejected("malformed", "expected a delta blob, got a plan")
            delta = decode_delta(payload)
            if i == len(raws) - 1 and delta.target_digest != pointer.digest:
                raise PlanRejected("digest_mismatch", "delta target differs from the pointer's")
            table = apply_delta(table, delta)  # checks each base: version and digest
        if table.version != pointer.version:
            raise PlanRejected("wrong_version", f"deltas end at {table.version}, not {pointer}")
        return table

    def accept(self, applied: Applied) -> None:
        self.table = applied.table
        self.confirmed = True
        if applied.kind == FULL:
            self.applied_full += 1
            self.applied_full_edited += applied.table.edited
        else:
            self.applied_delta += 1

    def reject(self, pointer: Pointer, exc: PlanRejected) -> None:
        self.rejected = (pointer.version, pointer.digest)
        self.rejections += 1
        self.last_rejection = f"{pointer.version}: {exc}"

    def status(
        self,
        router_id: str,
        now_ms: int,
        applied_at_ms: int,
        counters: Mapping[str, int],
        mode: str,
        unhealthy: Iterable[str] = (),
    ) -> plan_pb2.RouterStatus:
        s = plan_pb2.RouterStatus(
            router_id=router_id,
            applied_at_ms=applied_at_ms,
            last_rejection=self.last_rejection,
            reported_at_ms=now_ms,
            decisions_planned=counters.get("planned", 0),
            # a turn kept with its conversation's history, or a key back at where idle
            # re-homing sent it, was placed by an earlier decision; a queue-aware move is
            # counted on top of the decision it overrode
            decisions_fallback=sum(v for k, v in counters.items()
                                   if k not in ("planned", "history_kept", "rehome_kept",
                                                "queue_spilled")),
            mode=mode,
            unhealthy_destinations=list(unhealthy),
        )
        s.applied.epoch, s.applied.seq = self.version.epoch, self.version.seq
        if self.rejected is not None:
            s.last_rejected.epoch, s.last_rejected.seq = (
                self.rejected[0].epoch,
                self.rejected[0].seq,
            )
        return s


def sync_round(f: PlanFollower) -> SyncRound:
    """One round: read the pointer; fetch, verify and build the newer table if any."""
    pointer = yield Want(Ask.CURRENT)
    if not isinstance(pointer, Pointer):
        f.confirmed = False
        return None
    # Only the pointer naming exactly what the router holds confirms it: an *older* pointer
    # means the planner lost its history, and counting it as confirmation would let a
    # router route on a plan nobody vouches for, forever.
    f.confirmed = pointer.version == f.version and (
        f.table is None or not f.table.digest or pointer.digest == f.table.digest)
    if not f.wants(pointer):
        return None
    if f.table is not None:
        raws = yield Want(Ask.DELTAS, pointer.version, f.version)
        if isinstance(raws, list) and raws:
            try:
                return Applied(f.table_from_deltas(pointer, raws), DELTA)
            except PlanRejected:
                f.delta_fallbacks += 1  # the full plan decides whether the version is bad
    raw = yield Want(Ask.PLAN, pointer.version)
    if not isinstance(raw, bytes):
        return None  # trimmed between pointer read and fetch: the next round retries
    try:
        return Applied(f.table_from_plan(pointer, raw), FULL)
    except PlanRejected as exc:
        f.reject(pointer, exc)
        return None


class Backoff:
    """Jittered exponential backoff: full jitter, capped (250 ms by default)."""

    def __init__(self, base_s: float = 0.01, cap_s: float = 0.25, seed: int | None = None) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.failures = 0
        self._rand = random.Random(seed).random

    def next_delay(self) -> float:
        self.failures += 1
        return self._rand() * min(self.cap_s, self.base_s * 2 ** min(self.failures, 16))

    def reset(self) -> None:
        self.failures = 0
