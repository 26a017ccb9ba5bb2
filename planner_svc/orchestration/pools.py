"""Many model pools in one planner process (router_client.pools says what a pool is).

    snapshots ──PoolSet.on_window──▶ split_by_pool ──▶ each pool's Planner.on_window
    engine signals ──────────────────▶ the Planner of the pool that plans the destination
    timer ──PoolSet.each──▶ each pool's republish / health / tick, one pool's failure logged
                              and counted, never stopping the others
    pools file changes ──PoolSet.apply──▶ pools added (built, resumed), removed (closed),
                              edited (destinations reconciled, settings applied)

Each pool is a whole Planner with its own publisher (Redis namespace) and history topic,
built by the `factory` the service gives (the adapters are the service's to choose). The
set holds no planning logic of its own: isolation is the point. A pool whose build fails
(bad settings, its Redis namespace refusing writes) is reported with its error and tried
again at the next `apply`; the others carry on.

Which pool a key belongs to comes from every configured pool, running or not: the keys of
a pool that failed to start are set aside (counted), never handed to the `*` pool, which
would then plan load its engines never see.

Threads: the Kafka consumer (windows, signals), gRPC handlers (lookups) and the timer
(steps) use the set at once; `apply` runs on one thread at a time (the pools-file thread)
and builds new pools outside the set's lock, so a slow build (a broker or Redis timing
out) holds up no window, RPC or scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from planner_svc.errors import InvalidRequest, NotFound
from planner_svc.orchestration.planner import Planner
from planner_svc.orchestration.reconcile import reconcile
from planner_svc.orchestration.window_view import split_by_pool
from router_client.plan import parse_destinations
from router_client.pools import DEFAULT_POOL, PoolRoutes, PoolSpec

log = logging.getLogger("cacheroute.planner")


@dataclass
class PoolUnit:
    """One pool's planner and its publisher (a PlanPublisher on the pool's namespace)."""

    spec: PoolSpec
    planner: Planner
    publisher: Any
    close: Callable[[], None] = lambda: None
    failures: int = 0  # control steps, inputs or edits that raised, since the pool started
    last_error: str = ""
    # When each destination that left the pool's file was first seen drained (reconcile).
    drained_since: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolChanges:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    edited: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)  # pool -> why it is not running


class PoolSet:
    """`defaults`: the process's value of every per-pool setting (a setting removed from a
    pool's entry goes back to it); `base_namespace`: the process's Redis namespace (a pool's
    own is derived from it)."""

    def __init__(self, factory: Callable[[PoolSpec], PoolUnit], *,
                 defaults: Mapping[str, Any] | None = None, base_namespace: str = "",
                 remove_after_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._factory = factory
        self._defaults = dict(defaults or {})
        self._base = base_namespace
        self._remove_after_s = remove_after_s
        self._clock = clock
        self._lock = threading.RLock()
        self._apply_lock = threading.Lock()
        self._units: dict[str, PoolUnit] = {}
        self._specs: list[PoolSpec] = []
        self.routes = PoolRoutes([])
        self._owner: dict[str, str] = {}  # destination id -> pool, from the live planners
        self.failed: dict[str, str] = {}  # pools configured but not running, and why
        self.unclaimed_keys = 0  # window keys whose model no pool claims
        self.stranded_keys = 0  # window keys of a configured pool that is not running

    # --- membership --------------------------------------------------------------------

    def apply(self, specs: Iterable[PoolSpec]) -> PoolChanges:
        """Move the running pools to `specs` (already checked: router_client.pools)."""
        specs = list(specs)
        with self._apply_lock:
            wanted = {s.name: s for s in specs}
            with self._lock:
                current = dict(self._units)
            removed = [name for name in current if name not in wanted]
            rebuild, edit = [], []
            for spec in specs:
                unit = current.get(spec.name)
                if unit is None or (unit.spec.namespace_of(self._base)
                                    != spec.namespace_of(self._base)):
                    rebuild.append(spec)
                else:
                    edit.append((unit, spec))
            # Builds and closes run outside the set's lock: they wait on Redis and Kafka.
            built: dict[str, PoolUnit] = {}
            failed: dict[str, str] = {}
            for spec in rebuild:
                try:
                    built[spec.name] = self._factory(spec)
                except Exception as exc:
                    failed[spec.name] = f"{type(exc).__name__}: {exc}"
                    log.error("pool %s not started: %s", spec.name, failed[spec.name])
            with self._lock:
                gone = [self._units.pop(name) for name in removed]
                for name, unit in built.items():
                    old = self._units.get(name)
                    if old is not None:
                        gone.append(old)  # its namespace moved: the new unit replaces it
                    self._units[name] = unit
                for name in failed:  # a pool that could not be rebuilt stops, reported
                    old = self._units.pop(name, None)
                    if old is not None:
                        gone.append(old)
                self._specs = specs
                self.failed = failed
                self.routes = PoolRoutes(specs)
                self._refresh_owners()
            for unit in gone:
                self._close(unit)
            for name in removed:
                log.warning("pool %s removed: its planner stopped (its plans stay in Redis)",
                            name)
            edited = []
            for unit, spec in edit:
                try:
                    if self._edit(unit, spec):
                        edited.append(spec.name)
                except Exception as exc:
                    unit.failures += 1
                    unit.last_error = f"pools file edit: {type(exc).__name__}: {exc}"
                    log.error("pool %s: the pools file's edit not applied: %s", spec.name, exc)
            with self._lock:
                self._refresh_owners()
            return PoolChanges(tuple(built), tuple(removed), tuple(edited), failed)

    def _edit(self, unit: PoolUnit, spec: PoolSpec) -> bool:
        """Bring a running pool to its file entry: destinations reconciled (new ones added,
        vanished ones drained, then removed `remove_after_s` later; weights changed), and
        changed settings applied (a setting removed from the entry goes back to the
        process's). True when the entry changed. A standby applies nothing: the leader
        does, and the standby takes the leader's recorded config when it takes over."""
        planner = unit.planner
        if planner.role == "standby":
            # The leader applies the edit and records the config; this replica restores that
            # when it takes over, so it keeps its view of the file in step (a stale one would
            # replay the edit over whatever operators changed since).
            changed = unit.spec != spec
            unit.spec = spec
            return changed
        before = {**self._defaults, **unit.spec.settings}
        after = {**self._defaults, **spec.settings}
        tunables = {k: v for k, v in after.items() if before.get(k) != v}
        listed_changed = unit.spec.destinations != spec.destinations
        now = self._clock()
        desired = parse_destinations(spec.destinations)
        add: list[Any] = []
        drain: list[str] = []
        remove: list[str] = []
        weights: dict[str, float] = {}
        if listed_changed or unit.drained_since:
            edit = reconcile(planner.destinations, desired, drained_since=unit.drained_since,
                             now=now, remove_after_s=self._remove_after_s)
            # Pending removals alone add and drain nothing: a listed destination an operator
            # drained stays drained, one an operator or discovery added stays, until the
            # file's list changes.
            add = edit.add if listed_changed else []
            drain = edit.drain if listed_changed else []
            remove = edit.remove
        if listed_changed:
            was = {d.id: d.capacity_weight for d in parse_destinations(unit.spec.destinations)}
            adding = {d.id for d in add}
            weights = {d.id: d.capacity_weight for d in desired
                       if d.id in was and d.id not in adding
                       and was[d.id] != d.capacity_weight}
        if tunables or add or drain or remove or weights:
            planner.update_config(tunables=tunables, add=add, drain=drain, remove=remove,
                                  weights=weights)
        wanted = {d.id for d in desired}
        planned = planner.destinations
        for d in planned:  # every unwanted drained one gets its clock
            if d.draining and d.id not in wanted:
                unit.drained_since.setdefault(d.id, now)
        held = {d.id for d in planned}
        for ident in list(unit.drained_since):
            if ident in wanted or ident not in held:
                del unit.drained_since[ident]
        changed = unit.spec != spec
        unit.spec = spec
        return changed

    def _refresh_owners(self) -> None:
        """destination -> pool from what each planner plans now (an operator's or
        discovery's additions included). A destination moving between pools is still
        draining in the old one: the pool that plans it in service owns it."""
        owner: dict[str, str] = {}
        draining: set[str] = set()
        for name, unit in self._units.items():
            for d in unit.planner.destinations:
                if d.id not in owner or (d.id in draining and not d.draining):
                    owner[d.id] = name
                    if d.draining:
                        draining.add(d.id)
                    else:
                        draining.discard(d.id)
        self._owner = owner

    def _close(self, unit: PoolUnit) -> None:
        try:
            unit.close()
        except Exception:
            log.exception("closing pool %s failed", unit.spec.name)

    def close(self) -> None:
        """Close every pool's connections (their planners stay readable, as after a stop)."""
        with self._lock:
            units = list(self._units.values())
        for unit in units:
            self._close(unit)

    # --- lookups -------------------------------------------------------------------------

    def get(self, name: str) -> PoolUnit:
        """The pool an RPC names; "" is the default pool, or the only one."""
        with self._lock:
            if not name:
                if DEFAULT_POOL in self._units:
                    return self._units[DEFAULT_POOL]
                if len(self._units) == 1 and not self.failed:
                    return next(iter(self._units.values()))
                raise InvalidRequest(
                    f"this planner runs {len(self._units)} pools and none is "
                    f"'{DEFAULT_POOL}': name one ({', '.join(sorted(self._units))})")
            unit = self._units.get(name)
            if unit is None:
                why = self.failed.get(name)
                raise NotFound(f"pool {name!r} is configured but not running: {why}" if why
                               else f"no pool {name!r} (running: "
                               f"{', '.join(sorted(self._units)) or 'none'})")
            return unit

    def units(self) -> list[PoolUnit]:
        with self._lock:
            return list(self._units.values())

    def names(self) -> list[str]:
        with self._lock:
            return list(self._units)

    @property
    def specs(self) -> list[PoolSpec]:
        with self._lock:
            return list(self._specs)

    # --- inputs ---------------------------------------------------------------------------

    def on_window(self, window: Any) -> None:
        with self._lock:
            if any(d not in self._owner for d in window.destinations):
                # added since (by an operator or discovery): ask the planners again; not
                # every window, which would wait on a planner busy with a long step
                self._refresh_owners()
            units, routes, owners = dict(self._units), self.routes, dict(self._owner)
        if len(routes.pools) == 1 and routes.catch_all in units:
            parts = {routes.catch_all: window}  # one pool takes every key: nothing to cut
        else:
            parts, unclaimed = split_by_pool(window, list(routes.pools), routes.pool_of_scope,
                                             owners)
            self.unclaimed_keys += unclaimed
            for name in [n for n in parts if n not in units]:
                self.stranded_keys += len(parts.pop(name).keys)
        for name, part in parts.items():
            self._isolated(units[name], "window", _deliver(part))

    def on_engine_signals(self, signals: Any) -> None:
        dest = getattr(signals, "destination", "")
        with self._lock:
            owner = self._owner.get(dest)
            if owner is None:
                self._refresh_owners()
                owner = self._owner.get(dest)
            units = dict(self._units)
        if owner is None and len(units) == 1:
            owner = next(iter(units))  # the one planner counts what is not its own
        unit = units.get(owner) if owner is not None else None
        if unit is None:
            return
        self._isolated(unit, "engine signals", lambda u: u.planner.on_engine_signals(signals))

    def each(self, what: str, action: Callable[[PoolUnit], object]) -> None:
        """Run `action` on every pool; one pool's failure is logged and counted on it."""
        for unit in self.units():
            self._isolated(unit, what, action)

    def _isolated(self, unit: PoolUnit, what: str, action: Callable[[PoolUnit], object]) -> None:
        try:
            action(unit)
        except Exception as exc:
            unit.failures += 1
            unit.last_error = f"{what}: {type(exc).__name__}: {exc}"
            log.exception("pool %s: %s failed; the other pools carry on", unit.spec.name, what)


def _deliver(window: Any) -> Callable[[PoolUnit], None]:
    return lambda unit: unit.planner.on_window(window)
