"""Many model pools in one planner process (router_client.pools says what a pool is).

    snapshots ──PoolSet.on_window──▶ split_by_pool ──▶ each pool's Planner.on_window
    engine signals ──────────────────▶ the Planner of the pool that holds the destination
    timer ──PoolSet.each──▶ each pool's republish / health / tick, one pool's failure logged
                              and counted, never stopping the others
    pools file changes ──PoolSet.apply──▶ pools added (built, resumed), removed (closed),
                              edited (destinations reconciled, settings applied)

Each pool is a whole Planner with its own publisher (Redis namespace) and history topic,
built by the `factory` the service gives (the adapters are the service's to choose). The
set holds no planning logic of its own: isolation is the point. A pool whose build fails
(bad settings, its Redis namespace refusing writes) is reported with its error and tried
again at the next `apply`; the others carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
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
    failures: int = 0  # control steps or inputs that raised, since the pool started
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
    def __init__(self, factory: Callable[[PoolSpec], PoolUnit], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._factory = factory
        self._clock = clock
        self._lock = threading.RLock()
        self._units: dict[str, PoolUnit] = {}
        self._specs: list[PoolSpec] = []
        self.routes = PoolRoutes([])
        self._destination_pool: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # pools configured but not running, and why
        self.unclaimed_keys = 0  # keys in windows that no pool claims (their model)

    # --- membership --------------------------------------------------------------------

    def apply(self, specs: Iterable[PoolSpec]) -> PoolChanges:
        """Move the running pools to `specs` (already checked: router_client.pools)."""
        specs = list(specs)
        with self._lock:
            wanted = {s.name: s for s in specs}
            removed = [name for name in self._units if name not in wanted]
            for name in removed:
                self._close(self._units.pop(name))
                log.warning("pool %s removed: its planner stopped (its plans stay in Redis)",
                            name)
            added, edited, failed = [], [], {}
            for spec in specs:
                unit = self._units.get(spec.name)
                try:
                    if unit is None or unit.spec.namespace != spec.namespace:
                        if unit is not None:
                            self._close(self._units.pop(spec.name))
                        self._units[spec.name] = self._factory(spec)
                        added.append(spec.name)
                    elif self._edit(unit, spec):
                        edited.append(spec.name)
                except Exception as exc:
                    failed[spec.name] = f"{type(exc).__name__}: {exc}"
                    log.error("pool %s not applied: %s", spec.name, failed[spec.name])
            self._specs = specs
            self.failed = failed
            running = [s for s in specs if s.name in self._units]
            self.routes = PoolRoutes(running)
            self._destination_pool = {d.id: s.name for s in running
                                      for d in parse_destinations(s.destinations)}
            return PoolChanges(tuple(added), tuple(removed), tuple(edited), failed)

    def _edit(self, unit: PoolUnit, spec: PoolSpec) -> bool:
        """Bring a running pool to its file entry: destinations reconciled (new ones added,
        vanished ones drained, then removed `remove_after_s` later), changed settings
        applied. True when the entry changed. A standby applies nothing: the leader does,
        and the standby takes the leader's recorded config when it takes over."""
        planner = unit.planner
        if planner.role == "standby":
            return False
        tunables = {k: v for k, v in spec.settings.items() if unit.spec.settings.get(k) != v}
        edit = None
        # Destinations only when the file's list moved (or a removal is pending): an
        # operator's drain of a listed destination is theirs until the file changes.
        if unit.spec.destinations != spec.destinations or unit.drained_since:
            edit = reconcile(planner.destinations, parse_destinations(spec.destinations),
                             drained_since=unit.drained_since, now=self._clock())
        if tunables or edit:
            planner.update_config(tunables=tunables, add=edit.add if edit else [],
                                  drain=edit.drain if edit else [],
                                  remove=edit.remove if edit else [])
        if edit is not None:
            now = self._clock()
            for ident in edit.drain:
                unit.drained_since[ident] = now
            for ident in edit.remove:
                unit.drained_since.pop(ident, None)
        changed = unit.spec != spec
        unit.spec = spec
        return changed

    def _close(self, unit: PoolUnit) -> None:
        try:
            unit.close()
        except Exception:
            log.exception("closing pool %s failed", unit.spec.name)

    def close(self) -> None:
        """Close every pool's connections (their planners stay readable, as after a stop)."""
        with self._lock:
            for unit in self._units.values():
                self._close(unit)

    # --- lookups -------------------------------------------------------------------------

    def get(self, name: str) -> PoolUnit:
        """The pool an RPC names; "" is the default pool, or the only one."""
        with self._lock:
            if not name:
                if DEFAULT_POOL in self._units:
                    return self._units[DEFAULT_POOL]
                if len(self._units) == 1:
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
        return list(self._specs)

    # --- inputs ---------------------------------------------------------------------------

    def on_window(self, window: Any) -> None:
        with self._lock:
            units = dict(self._units)
            routes, owners = self.routes, self._destination_pool
        if len(units) == 1 and routes.catch_all is not None:
            parts = dict.fromkeys(units, window)  # one pool takes every key: nothing to cut
        else:
            parts, unclaimed = split_by_pool(window, list(units), routes.pool_of_scope, owners)
            self.unclaimed_keys += unclaimed
        for name, part in parts.items():
            self._isolated(units[name], "window", _deliver(part))

    def on_engine_signals(self, signals: Any) -> None:
        owner = self._destination_pool.get(getattr(signals, "destination", ""))
        unit = self._units.get(owner) if owner is not None else None
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
