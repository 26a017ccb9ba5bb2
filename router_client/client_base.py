"""What the thread client and the asyncio client share: everything but the waiting.

Routing (the hot path) goes straight to `RouterCore`; plan following state is
a `PlanFollower`; this class adds the plan's age and the fallback switch, the
on-disk copy of the last good plan, status reports and metrics. The two
subclasses only drive `sync_round` against their source and wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheroute.v1 import plan_pb2
from router_client import cache, memory, rebase, signing
from router_client.delta import decode_delta
from router_client.errors import PlanRejected
from router_client.follow import DELTA, FULL, Applied, Ask, PlanFollower, Want
from router_client.health import HealthPolicy, HealthTracker, HealthView, Outcome, ProbeSettings
from router_client.layout import Pointer
from router_client.plan import MAX_PLAN_BYTES, Version, decode_plan, version_from_pb
from router_client.routing import FALLBACK, RouterCore, RoutingTable

log = logging.getLogger("router_client")

# Why the client routes everything by P2C (empty string: it does not).
NO_PLAN = "no_plan"
STALE = "stale"
PLANNER = "planner"
FORCED = "forced"

AppliedHook = Callable[[RoutingTable, str], None]


class BaseRouterClient:
    def __init__(
        self,
        *,
        router_id: str,
        public_keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey],
        max_plan_age_s: float = 300.0,
        cache_path: str | Path | None = None,
        destination_ids: Sequence[str] = (),
        recheck_s: float = 1.0,
        status_interval_s: float = 1.0,
        max_plan_bytes: int = MAX_PLAN_BYTES,
        seed: int | None = None,
        on_applied: AppliedHook | None = None,
        on_rejection: Callable[[str], None] | None = None,
        tune_malloc: bool = True,
        health: HealthPolicy | None = None,
        probe: ProbeSettings | None = None,
        addresses: Mapping[str, str] | None = None,
        cold_tail: str = "p2c",
    ) -> None:
        if tune_malloc:  # see router_client.memory: halves a full apply's CPU
            memory.keep_freed_memory()
        self.router_id = router_id
        self.max_plan_age_s = max_plan_age_s
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.recheck_s = recheck_s
        self.status_interval_s = status_interval_s
        self.follower = PlanFollower(public_keys, max_bytes=max_plan_bytes)
        # cold_tail: "p2c" (the paper's) or "hash" (bounded-load consistent hashing, see
        # router_client.routing)
        self.core = RouterCore(destination_ids, seed=seed, cold_tail=cold_tail)
        self._route_index = self.core.route_index
        # route(key) -> destination id: the core's own method, so the hot path is one
        # Python call (call `started`/`finished` around the request, or use `request`).
        self.route: Callable[[str], str] = self.core.route
        self._ids = self.core.destination_ids  # the same list; it only grows
        self._on_applied = on_applied
        self._inflight_lock = threading.Lock()
        self._on_rejection = on_rejection
        self._confirmed_at = 0.0  # monotonic time the plan was last seen current
        self._applied_at_ms = 0
        self._forced = False
        self.fallback_reason = NO_PLAN
        self._chain: list[bytes] = []
        self._chain_dirty = False
        self._retired: RoutingTable | None = None
        self._fetched: dict[Ask, list[bytes]] = {}
        self._last_report = 0.0
        # Other routers reporting on this plan (`_note_peers`); idle re-homing pauses
        # while there are any, unless a front keeps each key on one router.
        self.peer_routers = 0
        self.rehome_with_peers = False
        self._reported_version = Version()
        self._reported_rejections = 0
        self._notified_rejections = 0
        self.unavailable_rounds = 0
        self.failed_rounds = 0  # rounds that raised something unexpected (logged)
        self._round_cpu_start = 0.0
        # CPU seconds of this thread spent on the round that applied the current plan
        # (fetch, verify, decode, build, swap): separates cost from scheduling delay.
        self.last_apply_cpu_ms = 0.0
        # Destination health (router_client.health): outcomes reported by the host's request
        # path, active probes if `probe` is set; applied to the core as mark_down / mark_up.
        self.health = HealthTracker(health or HealthPolicy())
        self._health_lock = threading.Lock()
        self.probe = probe
        self._addresses = dict(addresses or {})  # overrides the plan's addresses
        self.ejections = 0
        self.readmissions = 0

    # --- the hot path -------------------------------------------------------------

    # In-flight counts change from many request threads at once. `x += 1` on a list
    # item is not guaranteed atomic (free-threaded builds, other interpreters), and a
    # lost decrement would leave a destination looking busy forever, so updates take
    # a small lock; the decision itself (route) only reads the counts, lock-free.

    def started(self, destination_id: str) -> None:
        slot = self.core.slot_of(destination_id)
        with self._inflight_lock:
            self.core.started(slot)

    def finished(self, destination_id: str) -> None:
        slot = self.core.slot_of(destination_id)
        with self._inflight_lock:
            self.core.finished(slot)

    def report_engine_load(self, reported: Mapping[str, float]) -> None:
        """The engines' own load (running + waiting requests, by destination id), fresh:
        decisions compare the larger of it and this router's in-flight count, moved by this
        router's requests until the next report (`RouterCore.report_engine_load`). Call it
        again with only fresh figures: a destination left out counts its own requests."""
        with self._inflight_lock:
            self.core.report_engine_load(reported)

    @contextmanager
    def request(self, key: str) -> Iterator[str]:
        """`with client.request(key) as dest:` routes and counts the request in flight."""
        slot = self._route_index(key)
        with self._inflight_lock:
            self.core.started(slot)
        try:
            yield self._ids[slot]
        finally:
            with self._inflight_lock:
                self.core.finished(slot)

    def mark_down(self, destination_id: str) -> None:
        self.core.mark_down(destination_id)

    def mark_up(self, destination_id: str) -> None:
        self.core.mark_up(destination_id)

    # --- destination health -------------------------------------------------------------

    def report(self, destination_id: str, outcome: Outcome) -> None:
        """How a request to `destination_id` ended: feeds passive outlier detection."""
        with self._health_lock:
            changes = self.health.record(destination_id, outcome, time.monotonic())
        self._apply_health(changes)

    def report_probe(self, destination_id: str, healthy: bool) -> None:
        """One active probe's verdict (the client's own prober calls this too)."""
        with self._health_lock:
            changes = self.health.probed(destination_id, healthy, time.monotonic())
        self._apply_health(changes)

    def health_views(self) -> list[HealthView]:
        with self._health_lock:
            return self.health.views(time.monotonic())

    def address_of(self, destination_id: str) -> str:
        """Where to send requests for `destination_id` ("" if unknown): the `addresses`
        given to the client win over the plan's."""
        given = self._addresses.get(destination_id)
        if given:
            return given
        table = self.follower.table
        return table.address_of(destination_id) if table is not None else ""

    def probe_targets(self) -> list[tuple[str, str]]:
        """(destination id, address) of every destination of the plan with an address."""
        table = self.follower.table
        ids = table.destination_ids if table is not None else tuple(self._addresses)
        out = []
        for i, dest in enumerate(ids):
            address = self._addresses.get(dest) or (
                table.addresses[i] if table is not None and i < len(table.addresses) else "")
            if address:
                out.append((dest, address))
        return out

    def _health_tick(self) -> None:
        with self._health_lock:
            table = self.follower.table
            now = time.monotonic()
            if table is not None:
                self.health.track(table.destination_ids, now)
            changes = self.health.tick(now)
        self._apply_health(changes)

    def _apply_health(self, changes: list[tuple[str, bool]]) -> None:
        for dest, routable in changes:
            if routable:
                self.readmissions += 1
                log.info("router %s: destination %s is routable again", self.router_id, dest)
                self.core.mark_up(dest)
            else:
                self.ejections += 1
                log.warning("router %s: destination %s is unhealthy (%s): skipped",
                            self.router_id, dest, self.health_reason(dest))
                self.core.mark_down(dest)

    def health_reason(self, destination_id: str) -> str:
        for view in self.health_views():
            if view.destination == destination_id:
                return "probe failed" if view.probed_down else (view.last_failure or "ejected")
        return ""

    def set_fallback(self, on: bool) -> None:
        """Operator override: route everything by P2C until released."""
        self._forced = on
        self.check_age()

    # --- what the router knows ---------------------------------------------------

    @property
    def version(self) -> Version:
        return self.follower.version

    @property
    def table(self) -> RoutingTable | None:
        return self.follower.table

    @property
    def plan_age_s(self) -> float:
        """Seconds since the plan was last confirmed current at the source (inf: none)."""
        if self.follower.table is None:
            return float("inf")
        return time.monotonic() - self._confirmed_at

    @property
    def mode(self) -> str:
        return self.core.mode

    def check_age(self) -> None:
        """Enter or leave fallback by plan presence, age, planner mode and override."""
        table = self.follower.table
        if table is None:
            reason = NO_PLAN
        elif self._forced:
            reason = FORCED
        elif table.planner_fallback:
            reason = PLANNER
        elif self.plan_age_s > self.max_plan_age_s:
            reason = STALE
        else:
            reason = ""
        if reason != self.fallback_reason:
            log.info(
                "router %s: fallback reason %r -> %r", self.router_id, self.fallback_reason, reason
            )
            self.fallback_reason = reason
        forced = reason in (STALE, FORCED)  # no plan / planner fallback: the core knows
        if forced != self.core.forced_fallback:
            self.core.set_fallback(forced)

    # --- shared plan-following steps -------------------------------------------------

    def _remember_fetched(
        self, want: Want, raw: Pointer | bytes | list[bytes] | None
    ) -> Pointer | bytes | list[bytes] | None:
        if isinstance(raw, bytes):
            self._fetched[want.ask] = [raw]
        elif isinstance(raw, list):
            self._fetched[want.ask] = raw
        return raw

    def _finish_round(self, result: Applied | None) -> None:
        if self.follower.confirmed:
            self._confirmed_at = time.monotonic()
        if result is not None:
            self._install(result)
        elif self.follower.rejections != self._notified_rejections:
            self._notified_rejections = self.follower.rejections
            log.warning("router %s rejected %s", self.router_id, self.follower.last_rejection)
            if self._on_rejection is not None:
                self._on_rejection(self.follower.last_rejection)
        self._fetched.clear()
        self.check_age()

    def _off_burst_work(self) -> None:
        # Called once the follower has waited a little after a round: freeing a 100k-key
        # table costs ~3 ms of CPU, flattening a delta's layered lookup ~1 ms, and
        # preparing the next full plan's edit (rebase) ~10 ms;
        # right after an apply that CPU is taken from the other routers on the host that
        # are still applying the same version.
        self._retired = None
        table = self.follower.table
        if table is None:
            return
        flat = table.flattened()
        if flat is not table:  # a delta's layered lookup: route through one dict again
            self.follower.table = flat
            if self.core.table is table:
                self.core.install(flat)
        if flat.base is not None:
            rebase.prepare(flat.base)

    def _start_round(self) -> None:
        self._round_cpu_start = time.thread_time()

    def _install(self, result: Applied) -> None:
        # Hold the old table past the swap (see `_off_burst_work`): freeing a 100k-key
        # dict costs milliseconds, which belong after the swap, not before it.
        self._retired = self.core.table
        self.follower.accept(result)
        self.core.install(result.table)  # the atomic swap
        self.last_apply_cpu_ms = (time.thread_time() - self._round_cpu_start) * 1000
        self._confirmed_at = time.monotonic()
        self._applied_at_ms = int(time.time() * 1000)
        if result.kind == FULL:
            self._chain = list(self._fetched[Ask.PLAN])
        else:
            self._chain.extend(self._fetched[Ask.DELTAS])
        self._chain_dirty = True
        if self._on_applied is not None:
            self._on_applied(result.table, result.kind)
        self._after_install()

    def _after_install(self) -> None:
        """Hook for subclasses (wake waiters)."""

    def _save_chain(self) -> None:
        if self.cache_path is None or not self._chain or not self._chain_dirty:
            return
        self._chain_dirty = False
        try:
            cache.save_chain(self.cache_path, self._chain)
        except OSError as exc:
            log.warning(
                "router %s could not save its plan to %s: %s", self.router_id, self.cache_path, exc
            )

    def _chain_too_long(self) -> bool:
        return self.cache_path is not None and len(self._chain) > cache.MAX_CHAIN

    def _restart_chain(self, raw: bytes | None) -> None:
        table = self.follower.table
        if raw is None or table is None:
            return
        try:
            _kind, _payload, digest = signing.verify_blob(raw, self.follower.public_keys)
        except PlanRejected:
            return
        if digest == table.digest:
            self._chain = [raw]
            self._chain_dirty = True

    def restore_from_disk(self) -> bool:
        """Install the plan saved by an earlier run, if there is a valid one."""
        if self.cache_path is None:
            return False
        chain = cache.load_chain(self.cache_path)
        try:
            table = _replay(self.follower, chain)
        except PlanRejected as exc:
            log.warning("router %s ignores its saved plan: %s", self.router_id, exc)
            return False
        if table is None:
            return False
        self.follower.table = table
        self.core.install(table)
        self._chain = chain
        saved_age_s = max(0.0, time.time() - cache.chain_mtime_ms(self.cache_path) / 1000)
        self._confirmed_at = time.monotonic() - saved_age_s
        self.check_age()
        return True

    def _status_due(self, now: float) -> bool:
        changed = (
            self.follower.version != self._reported_version
            or self.follower.rejections != self._reported_rejections
        )
        return changed or now - self._last_report >= self.status_interval_s

    def _note_peers(self, peers: int | None) -> None:
        """How many other routers report on this plan (from the status registry). Idle
        re-homing keeps each key's idle clock in this router, so it pauses while others
        report unless `rehome_with_peers` (a front keeps each key on one router): four
        replicas each seeing a quarter of a key's requests judge it idle four times too
        often and each re-home it their own way, scattering its prefix (the wide-active-set
        replay with four routers: hit 14.5 % against 65.9 % without re-homing)."""
        if peers is None:  # a source that cannot tell: nothing changes
            return
        self.peer_routers = peers
        self.core.rehome_paused = peers > 0 and not self.rehome_with_peers

    def _status(self, now: float) -> plan_pb2.RouterStatus:
        self._last_report = now
        self._reported_version = self.follower.version
        self._reported_rejections = self.follower.rejections
        with self._health_lock:
            # what outlier detection and probes eject, and what the integration marked down
            unhealthy = sorted(set(self.health.unroutable()) | set(self.core.unhealthy()))
        return self.follower.status(
            self.router_id,
            int(time.time() * 1000),
            self._applied_at_ms,
            self.core.counters(),
            self.mode,
            unhealthy,
        )

    # --- metrics -----------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Every counter and gauge as plain numbers."""
        f = self.follower
        m: dict[str, float] = {f"decisions_{k}": v for k, v in self.core.counters().items()}
        m.update(
            plan_epoch=self.version.epoch,
            plan_seq=self.version.seq,
            plan_age_s=self.plan_age_s,
            fallback=float(self.mode == FALLBACK),
            rejected_versions=f.rejections,
            ignored_older=f.ignored_older,
            applied_full=f.applied_full,
            applied_full_edited=f.applied_full_edited,
            applied_delta=f.applied_delta,
            delta_fallbacks=f.delta_fallbacks,
            reconnects=self._reconnects(),
            unavailable_rounds=self.unavailable_rounds,
            failed_rounds=self.failed_rounds,
            destinations_unhealthy=len(self.core.unhealthy()),
            ejections=self.ejections,
            readmissions=self.readmissions,
        )
        core = self.core
        m["peer_routers"] = self.peer_routers
        if core.idle_rehome_s is not None:
            m["rehome_paused"] = float(core.rehome_paused)
            m["rehome_window_s"] = core.idle_rehome_s
            if core.rehome_window is not None:
                m["rehome_outcomes"] = core.rehome_window.outcomes
        return m

    def _reconnects(self) -> int:
        return 0

    def metrics_text(self) -> str:
        """The metrics in the Prometheus text exposition format (prometheus_client)."""
        from prometheus_client import CollectorRegistry, generate_latest

        from router_client.prom import RouterCollector

        registry = CollectorRegistry()
        registry.register(RouterCollector(self))
        return generate_latest(registry).decode()


def _replay(follower: PlanFollower, chain: Sequence[bytes]) -> RoutingTable | None:
    if not chain:
        return None
    _k, _p, digest = signing.verify_blob(chain[0], follower.public_keys, follower.max_bytes)
    plan = decode_plan(_p)
    saved = PlanFollower(follower.public_keys, max_bytes=follower.max_bytes)
    saved.table = RoutingTable.from_plan(plan, digest)
    for raw in chain[1:]:
        target = _delta_target(raw, saved)
        saved.table = saved.table_from_delta(target, raw)
    return saved.table


def _delta_target(raw: bytes, f: PlanFollower) -> Pointer:
    _k, payload, _d = signing.verify_blob(raw, f.public_keys, f.max_bytes)
    delta = decode_delta(payload)
    return Pointer(version_from_pb(delta.target), bytes(delta.target_digest))


__all__ = ["DELTA", "FULL", "BaseRouterClient"]
