"""The planner: rates in, decisions made, plans published. The service's one stateful object.

It glues the pure parts together and owns nothing clever itself:
- `planner_svc.planning` builds (`build_plan`) and repacks (`repack`) candidates;
- `planner_svc.control.ControlLoop` prices them and decides (staleness vs rewarm);
- a publisher (`planner_svc.adapters.redis_publisher.PlanPublisher`) makes an install
  visible to routers.

Thread-safety: one re-entrant lock guards all state; gRPC handlers, the snapshot
consumer and the interval timer call in from their own threads. Publishing happens
under the lock so that versions are assigned and installed in order.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from planner_svc.control import ControlLoop
from planner_svc.control.capacity import (
    SLO_BREAK_REPORTS,
    MeasuredQCap,
    learned_q_cap,
    measured_q_cap,
    slo_step,
)
from planner_svc.control.decision import Action, Decision, DecisionSettings, Penalties
from planner_svc.control.delivery import (
    DeliveryReport,
    Prediction,
    Realized,
    delivery_from_dict,
    delivery_to_dict,
    predict,
    report,
)
from planner_svc.control.drift import Drift
from planner_svc.control.guard import GuardSettings, Mode, ValidatedRange
from planner_svc.control.loop import Figures
from planner_svc.control.saturation import (
    Saturation,
    SaturationSettings,
    derated_fleet,
    effective_weight,
    observe,
)
from planner_svc.control.step import Install, Step, control_step, first_plan, pinned_step
from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Traffic, hold_noise
from planner_svc.control.warm_slots import (
    MeasuredWarmSlots,
    learned_warm_slots,
    measured_warm_slots,
)
from planner_svc.errors import (
    CorruptPointer,
    NotFound,
    NotLeader,
    Unavailable,
    VersionConflict,
    VersionRegression,
)
from planner_svc.orchestration.broadcast import Broadcast, RequestCache
from planner_svc.orchestration.destinations import edit_destinations
from planner_svc.orchestration.failpoints import failpoint
from planner_svc.orchestration.fleet_health import reported_down, with_reported_down
from planner_svc.orchestration.window_view import telemetry_from_window, traffic_from_window
from planner_svc.planning import PlanDiff, PlanningConfig, build_plan, diff, repack
from planner_svc.planning.explain import KeyExplanation, explain_key
from router_client.plan import (
    MAX_EPOCH,
    BuiltBy,
    DestinationSpec,
    KeyTable,
    PlanStats,
    RoutingPlan,
    Version,
)

log = logging.getLogger("cacheroute.planner")
_timer = time.perf_counter  # plans record how long they took to build
MAX_VERSION_SKIPS = 16


class HistorySink(Protocol):
    """The durable record (planner_svc.adapters.kafka_history.KafkaHistory); optional."""

    def record_install(self, version: Version, signed_blob: bytes) -> None: ...
    def record_decision(self, decision: dict[str, Any]) -> None: ...
    def record_config(self, config: dict[str, Any]) -> None: ...
    def record_loop(self, snapshot: dict[str, Any]) -> None: ...
    def record_delivery(self, version: Version, record: dict[str, Any]) -> None: ...
    def load(self) -> Any: ...
    def close(self) -> None: ...


class Publisher(Protocol):
    def install(self, plan: RoutingPlan, previous: RoutingPlan | None) -> Any: ...
    def prepare(self, plan: RoutingPlan, previous: RoutingPlan | None) -> Any: ...
    def stage(self, prepared: Any) -> Any: ...
    def commit(self, prepared: Any) -> Any: ...
    def current(self) -> Any: ...
    def load(self, version: Version) -> RoutingPlan: ...
    def list_versions(self) -> list[Version]: ...
    def router_statuses(self, max_age_s: float = 60.0) -> list[Any]: ...
    def decode_signed(self, blob: bytes) -> RoutingPlan: ...
    def clear_corrupt_pointer(self) -> bool: ...
    def signed_plan(self, version: Version) -> bytes: ...


# The install rule's knobs that UpdateConfig sets (the loop's DecisionSettings).
DECISION_FIELDS = ("hysteresis", "min_dwell_s")


@dataclass(frozen=True)
class Installed:
    plan: RoutingPlan
    digest: bytes
    installed_at_s: float


@dataclass(frozen=True)
class _UncertainCommit:
    plan: RoutingPlan
    digest: bytes
    blob: bytes
    forced: bool


@dataclass(frozen=True)
class ReplanResult:
    candidate: RoutingPlan
    diff: PlanDiff | None
    figures: Figures | None
    installed: Installed | None
    decision: Decision | None


@dataclass(frozen=True)
class Guard:
    """The guard's configuration: the validated range and its clocks."""

    validated: ValidatedRange
    settings: GuardSettings

    def to_dict(self) -> dict[str, Any]:
        return {"validated": dataclasses.asdict(self.validated),
                "settings": dataclasses.asdict(self.settings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Guard:
        return cls(ValidatedRange(**data["validated"]), GuardSettings(**data["settings"]))


@dataclass(frozen=True)
class PlannerStatus:
    """One consistent view of the planner (taken under its lock): GetStatus and /metrics."""

    mode: Mode
    mode_reason: str
    installed: Installed | None
    installed_age_s: float
    figures: Figures | None  # of the latest control-loop round
    accumulated: float  # staleness accumulated since the last install, tokens
    last_decision: Decision | None
    rates_age_s: float  # inf before the first window
    rates_recovering: bool
    pinned: bool
    tunables: Tunables
    decision_settings: DecisionSettings
    destinations: list[DestinationSpec]
    guard: Guard
    # "single" (no leader election), "leader" or "standby"; the leader's id when known.
    role: str = "single"
    leader_id: str = ""
    engine_signals: tuple[Any, ...] = ()  # cacheroute.v1.EngineSignals, by destination
    measured_warm_slots: MeasuredWarmSlots | None = None  # W from the engines' KV events
    # Destinations whose engines stay saturated (control.saturation): (id, record,
    # configured weight, weight planned with).
    saturated: tuple[tuple[str, Saturation, float, float], ...] = ()
    measured_q_cap: MeasuredQCap | None = None  # q_cap from the engines (control.capacity)
    q_cap_in_use: float = 0.0  # what plans are built with (learned or configured)
    warm_slots_in_use: int = 0  # W plans are built with (learned or configured)


@dataclass(frozen=True)
class Tunables:
    """What `UpdateConfig` may change at run time, besides the install rule's knobs and
    the guard: those belong to the control loop (`LoopSettings.decision`, `.guard`), which
    is their only copy."""

    q_cap: float
    warm_slots_per_destination: int
    interval_s: float
    imbalance_tolerance: float
    max_plan_age_s: float
    # Planning options (planner_svc.planning.config.PlanningConfig documents them).
    byte_aware: bool = False
    admission_hysteresis: float = 0.0
    replica_hysteresis: float = 0.0
    balance_effort: float = 1.0
    # Hold a key's rate at the installed plan's while it moved by no more than this many
    # Poisson standard errors (control.traffic.hold_noise); 0 = plan on the raw window.
    rate_noise_z: float = 0.0
    # Plan with W measured from the engines' KV events (control.warm_slots), within [W/2, 2W]
    # of `warm_slots_per_destination`.
    learn_warm_slots: bool = False
    # Plan with q_cap measured from the engines' saturation and served loads
    # (control.capacity), within [q/2, 2q] of `q_cap`.
    learn_q_cap: bool = False
    # The engines' TTFT p99 target for learning q_cap (seconds; 0 = none; control.capacity).
    q_cap_ttft_slo_s: float = 0.0
    # Plan for a consistent-hashed cold tail (planning.placement); False = the paper's.
    hashed_tail: bool = False
    # Place keys entering the plan where their newest request went (the stream's
    # last-destination column; build_plan's and repack's `warm_at`). False here, as the
    # paper plans; the planner service's default is PlannerSettings.warm_placement (on).
    warm_placement: bool = False


class Planner:
    """See the module docstring. `clock` returns seconds (wall clock: plans carry times)."""

    def __init__(
        self,
        *,
        publisher: Publisher,
        destinations: list[DestinationSpec],
        tunables: Tunables,
        loop: ControlLoop | None = None,
        clock: Callable[[], float] = time.time,
        rate_column: str = "rate",
        epoch: int = 1,
        history: HistorySink | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._publisher = publisher
        self._clock = clock
        self._destinations = list(destinations)
        # Destinations most routers report unhealthy: planned as draining until they recover.
        self.reported_down: frozenset[str] = frozenset()
        self.tunables = tunables
        self._loop = loop or ControlLoop()
        self._rate_column = rate_column
        self._epoch = epoch
        self.installed: Installed | None = None
        self.traffic: Traffic | None = None
        # The rates the installed plan was built on (keys the stream measured), which a
        # window's counting noise is held to (Tunables.rate_noise_z).
        self._reference: Traffic | None = None
        self._window_keys: frozenset[str] = frozenset()
        self.telemetry: Telemetry | None = None
        self.rates_window_end_ms = 0
        self.pinned = False
        self.mode_reason = ""
        self.decisions: deque[Decision] = deque(maxlen=1000)
        # decision id -> (version it installed, operator request id), for the API's records.
        # The version the current step installed, for the decision that step logs next.
        self._installed_by_step: Version | None = None
        # A commit whose outcome is unknown (its reply lost with the connection): settled
        # against Redis's pointer before the next install (`_settle_uncertain_commit`).
        self._uncertain: _UncertainCommit | None = None
        # The newest version ever sent to a commit. Never numbered again, landed or not:
        # routers may have fetched it before Redis lost it, and a router ignores a pointer
        # to the version it already holds, so the number must not come back with other bytes.
        self._last_committed: Version | None = None
        # What each retained plan predicted at install, and what the stream measured since.
        self.deliveries: OrderedDict[Version, tuple[Prediction, Realized, float]] = OrderedDict()
        self._last_tick_s = -math.inf
        self._once = RequestCache()  # request id -> result: a retried mutation acts once
        self.events = Broadcast()  # installs and decisions, for WatchPlans
        self._plans: OrderedDict[Version, RoutingPlan] = OrderedDict()
        self._history = history
        self.version_conflicts = 0  # installs that found their version taken in Redis
        self.uncertain_commits_landed = 0  # commits whose reply was lost, found landed
        self.pointer_repairs = 0  # times the current pointer held junk and was repaired
        # The stream's first windows may cover only part of a window of traffic (it just
        # started): the first plan waits until one full window length has passed since.
        self._first_window_end_ms: int | None = None
        self._window_ms = 0
        self._first_ready_s: float | None = None  # when rates first allowed a first plan
        # Replicated planners (orchestration.leadership): only the leader installs, writes
        # the history or takes operator changes; a standby follows the store's plan.
        self.role = "single"
        self.leader_id = ""
        # The newest signals each destination's engine reported (streams/engines), by
        # destination: only the planner's destinations, so the table stays bounded.
        self.engine_signals: dict[str, Any] = {}
        # Saturation records of destinations whose engines report queueing or a full KV
        # cache; derated ones are planned at their measured capacity (`_fleet`).
        self.saturation: dict[str, Saturation] = {}
        self.saturation_settings = SaturationSettings()
        # Per destination: the highest load per unit of weight it carried while its engine
        # reported no saturation, and when (ms); evidence that q_cap is at least that.
        self.served_peaks: dict[str, tuple[float, int]] = {}
        # With a TTFT target: per destination, the lowest recent load that broke it (load,
        # at ms), and its current run of reports over it (count, last report's time).
        self.slo_breaks: dict[str, tuple[float, int]] = {}
        self._slo_over_runs: dict[str, tuple[int, int]] = {}
        # While breaks persist: the bound they stepped q_cap down to, and when it last moved.
        self.slo_stepped: tuple[float, int] | None = None
        self.unknown_signals = 0

    # --- start-up ---------------------------------------------------------------

    def resume(self) -> None:
        """Adopt the newest installed plan (Redis or the durable history) without re-planning.

        If the history is ahead of Redis (Redis lost its data), the plan is republished.
        """
        with self._lock:
            durable = self._history.load() if self._history is not None else None
            if durable is not None:
                self._restore_durable(durable)
            try:
                current = self._publisher.current()
            except CorruptPointer as exc:
                log.error("ignoring the current pointer at start-up: %s", exc)
                current = None
            if (
                durable is not None
                and durable.current is not None
                and (current is None or current.version < durable.current)
            ):
                plan = self._publisher.decode_signed(durable.plans[durable.current])
                try:
                    current = self._publisher.install(plan, None)
                    log.warning("Redis was behind the history: republished %s",
                                durable.current)
                except NotLeader:  # a standby: the leader republishes
                    current = self._publisher.current()
            if current is None:
                return
            plan = self._publisher.load(current.version)
            self._epoch = max(self._epoch, current.version.epoch)
            self.installed = Installed(plan, current.digest, self._clock())
            self._remember(plan)
            log.info("resumed at plan version %s", current.version)
            self._record_if_unrecorded(durable)

    def on_engine_signals(self, signals: Any) -> None:
        """An engine's own report (cacheroute.v1.EngineSignals) arrived."""
        with self._lock:
            if signals.destination not in {d.id for d in self._destinations}:
                self.unknown_signals += 1  # not ours (or a typo in the watcher's ids)
                return
            held = self.engine_signals.get(signals.destination)
            if held is None or signals.observed_at_ms >= held.observed_at_ms:
                self.engine_signals[signals.destination] = signals
                self._observe_saturation(signals)

    def _observe_saturation(self, signals: Any) -> None:
        dest = signals.destination
        before = self.saturation.get(dest, Saturation())
        loads = self.telemetry.destination_loads_per_s if self.telemetry is not None else {}
        after = observe(before, signals, loads.get(dest), self.saturation_settings)
        if after.derated != before.derated:
            if after.derated:
                knee = (f"{after.knee_per_s:.3g} req/s" if after.knee_per_s is not None
                        else "unmeasured")
                log.warning("destination %s saturated since %.0f s (%s): planned at its "
                            "measured capacity (%s) until it clears", dest,
                            (signals.observed_at_ms - (after.since_ms or 0)) / 1000,
                            after.reason, knee)
            else:
                log.info("destination %s no longer saturated: planned at its configured "
                         "weight again", dest)
        if after == Saturation():
            self.saturation.pop(dest, None)
        else:
            self.saturation[dest] = after

    # --- leadership (replicated planners) ------------------------------------------------

    def take_over(self, leader_id: str) -> None:
        """This planner just became the leader: catch up on what the previous leader
        recorded (config, loop, decisions, reports) and installed, and continue in a new
        epoch, so every version it installs is above every version before it."""
        with self._lock:
            self.role, self.leader_id = "leader", leader_id
            durable = self._history.load() if self._history is not None else None
            if durable is not None:
                self._restore_durable(durable)
            self._adopt_current()
            held = self.installed.plan.version.epoch if self.installed else 0
            self._epoch = max(self._epoch, held + 1)
            self._last_tick_s = self._clock()  # a full interval before its first step
            self._record_if_unrecorded(durable)
            log.warning("took over as leader at %s; installs continue in epoch %d",
                        self.installed.plan.version if self.installed else "no plan",
                        self._epoch)

    def stand_by(self, leader_id: str = "") -> None:
        with self._lock:
            self.role, self.leader_id = "standby", leader_id

    def follow(self) -> None:
        """A standby's view of the fleet: the store's current plan, adopted read-only."""
        with self._lock:
            self._adopt_current()

    def _adopt_current(self) -> None:
        try:
            current = self._publisher.current()
        except CorruptPointer as exc:
            log.error("ignoring the current pointer: %s", exc)
            return
        if current is None or (self.installed is not None
                               and self.installed.plan.version == current.version):
            return
        plan = self._publisher.load(current.version)
        self.installed = Installed(plan, current.digest, self._clock())
        self._remember(plan)

    def _record_if_unrecorded(self, durable: Any) -> None:
        """The store's plan is newer than the newest install in the durable history: the
        previous leader (or this planner, before a crash) committed it and lost the reply,
        or failed before recording it, and routers run it. Record it and announce it, so
        the history and every watcher see each plan that served."""
        if self._history is None or self.installed is None or self.role == "standby":
            return
        recorded = durable.current if durable is not None else None
        plan, digest = self.installed.plan, self.installed.digest
        if recorded is not None and plan.version <= recorded:
            return
        try:  # best effort: taking over or starting must not fail on the record
            self._history.record_install(plan.version,
                                         self._publisher.signed_plan(plan.version))
        except Exception as exc:
            log.error("plan %s serves but could not be recorded now: %s", plan.version, exc)
            return
        self.events.publish("installed", self.version_info(plan, digest))
        log.warning("plan %s serves but was never recorded (its install's reply was lost, or "
                    "its planner stopped before recording it): recorded and announced now",
                    plan.version)

    def _require_leader(self) -> None:
        if self.role == "standby":
            who = f"the leader is {self.leader_id}" if self.leader_id else "no leader yet"
            raise NotLeader(f"this planner is a standby ({who}): send changes to the leader")

    def _restore_durable(self, durable: Any) -> None:
        decision: dict[str, float] = {}
        if durable.config is not None:
            tunables = dict(durable.config["tunables"])
            # Configs persisted before the loop owned them keep the rule's knobs here.
            decision = {k: tunables.pop(k) for k in DECISION_FIELDS if k in tunables}
            decision.update(durable.config.get("decision", {}))
            self.tunables = Tunables(**tunables)
            self._destinations = [DestinationSpec(**d) for d in durable.config["destinations"]]
        if durable.loop is not None:
            guard = self.guard  # configuration, not the loop's state
            self._loop = ControlLoop.restore(durable.loop, self._loop.settings)
            self._apply_guard(guard)
        if decision:
            self._set_decision_settings(decision)
        if durable.config is not None and "guard" in durable.config:
            self._apply_guard(Guard.from_dict(durable.config["guard"]))  # changed at run time
        for record in durable.decisions[-self.decisions.maxlen :]:  # type: ignore[operator]
            self.decisions.append(Decision.from_dict(record))
        for version in sorted(durable.deliveries)[-64:]:
            try:
                self.deliveries[version] = delivery_from_dict(durable.deliveries[version])
            except (KeyError, TypeError, ValueError) as exc:  # a record we cannot read
                log.warning("ignoring the history's delivery record of %s: %r", version, exc)

    def republish_if_missing(self) -> bool:
        """Redis came back empty or behind, or someone wrote junk into the pointer: publish
        the installed plan again (and point at it)."""
        with self._lock:
            self._settle_uncertain_commit(self._clock())
            if self.installed is None:
                return False
            try:
                current = self._publisher.current()
            except CorruptPointer as exc:
                log.error("repairing the current pointer: %s", exc)
                self.pointer_repairs += 1
                self._publisher.clear_corrupt_pointer()
                self._publisher.install(self.installed.plan, None)  # blobs and pointer again
                return True
            if current is not None and current.version >= self.installed.plan.version:
                return False
            self._publisher.install(self.installed.plan, None)
            log.warning(
                "republished plan %s: Redis was empty or behind", self.installed.plan.version
            )
            return True

    # --- inputs ------------------------------------------------------------------

    def on_window(self, window: Any) -> None:
        """A complete stream window (streams.assembly.CompleteWindow) arrived."""
        with self._lock:
            measured = traffic_from_window(window, self._rate_column)
            # (a set of every key per window only when it is used: 128k keys cost ~10 ms)
            self._window_keys = (frozenset(measured.keys) if self.tunables.rate_noise_z > 0
                                 else frozenset())
            self._window_ms = int(window.window_end_ms - window.window_start_ms)
            self.traffic = hold_noise(measured, self._reference, self._window_ms / 1000.0,
                                      self.tunables.rate_noise_z)
            self.rates_window_end_ms = int(window.window_end_ms)
            if self._first_window_end_ms is None and self.traffic.total_rate > 0:
                # The first plan waits for a full window of traffic after the first one that
                # had any: windows of an idle fleet would plan nothing.
                self._first_window_end_ms = int(window.window_end_ms)
            self.telemetry = telemetry_from_window(
                window, self._admitted_keys(), sum(not d.draining for d in self._fleet()),
                self._warm_slots_in_use())
            self._realize(self.telemetry)
            self._note_served_loads(int(window.window_end_ms))

    SERVED_MEMORY_S = 600.0  # a served load older than this no longer vouches for q_cap

    def _note_served_loads(self, now_ms: int) -> None:
        """Remember loads the engines carried without saturating, and (with a TTFT target)
        within it, and the loads that kept breaking the target (control.capacity)."""
        if self.telemetry is None:
            return
        max_age_ms = self.saturation_settings.max_age_s * 1000
        memory_ms = self.SERVED_MEMORY_S * 1000
        slo = self.tunables.q_cap_ttft_slo_s
        for d in self._destinations:
            signals = self.engine_signals.get(d.id)
            if (signals is None or not signals.metrics
                    or abs(now_ms - signals.observed_at_ms) > max_age_ms):
                continue  # no fresh report
            load = self.telemetry.destination_loads_per_s.get(d.id, 0.0) / d.capacity_weight
            ttft = signals.ttft_p99_s if signals.HasField("ttft_p99_s") else None
            over = slo > 0 and ttft is not None and ttft == ttft and ttft > slo
            run = self._slo_over_runs.get(d.id, (0, 0))
            if over and signals.observed_at_ms != run[1]:
                run = (run[0] + 1, signals.observed_at_ms)  # a new report over the target
            elif not over:
                run = (0, 0)
            self._slo_over_runs[d.id] = run
            if over and run[0] >= SLO_BREAK_REPORTS and load > 0:
                broke = self.slo_breaks.get(d.id)
                if broke is None or load <= broke[0] or now_ms - broke[1] > memory_ms:
                    self.slo_breaks[d.id] = (load, now_ms)
                stepped = self.slo_stepped
                if stepped is not None and now_ms - stepped[1] > memory_ms:
                    stepped = None  # no break for a while: that bound is history
                self.slo_stepped = slo_step(stepped, self._q_cap_in_use(), now_ms)
            if d.id in self.saturation or over:
                continue  # it did not cope
            held = self.served_peaks.get(d.id)
            if held is None or load >= held[0] or now_ms - held[1] > memory_ms:
                self.served_peaks[d.id] = (load, now_ms)

    def _realize(self, t: Telemetry) -> None:
        """Join a window with the serving plan's prediction (windows that began after it)."""
        if self.installed is None or t.recovering:
            return
        version = self.installed.plan.version
        entry = self.deliveries.get(version)
        if entry is None or t.window_start_s < entry[2]:
            return
        predicted, realized, since = entry
        # Past the dip once the loop saw it settle, or once the window began after the
        # dip's expected duration: under drift the hit rate keeps moving and the loop's
        # flatness test (for its own rewarm account) may wait several times as long.
        settling = self._loop.settling
        in_dip = settling is not None and (
            t.window_start_s < settling.since_s + settling.min_settle_s)
        self.deliveries[version] = (predicted, realized.add(t, predicted.destinations,
                                                            in_dip=in_dip), since)
        self._record_delivery(version)

    def _record_delivery(self, version: Version) -> None:
        if self.role == "standby":
            return  # the leader records it
        if self._history is not None and version in self.deliveries:
            self._history.record_delivery(version, delivery_to_dict(*self.deliveries[version]))

    def delivery(self, version: Version | None = None) -> DeliveryReport:
        """Predicted vs realized for `version` (default: the installed plan)."""
        with self._lock:
            if version is None:
                if self.installed is None:
                    raise NotFound("no plan installed yet")
                version = self.installed.plan.version
            entry = self.deliveries.get(version)
            if entry is None:
                raise NotFound(f"no prediction for plan version {version} (fallback tables "
                               "predict nothing; only retained versions are kept)")
            return report(str(version), entry[0], entry[1], self._loop.validated.p99_ms_max)

    def _serving_delivery(self) -> DeliveryReport | None:
        """Predicted vs served for the installed plan (None: it predicted nothing)."""
        if self.installed is None:
            return None
        entry = self.deliveries.get(self.installed.plan.version)
        return None if entry is None else report(str(self.installed.plan.version), *entry[:2],
                                                 self._loop.validated.p99_ms_max)

    def _admitted_keys(self) -> set[str]:
        if self.installed is None:
            return set()
        return set(self.installed.plan.table.keys)

    # --- the control step ---------------------------------------------------------

    def tick(self, now_s: float | None = None) -> Decision | None:
        """Run a control step if an interval has passed; the timer thread calls this."""
        now = self._clock() if now_s is None else now_s
        with self._lock:
            if self.installed is None:  # no interval to wait for: plan as soon as rates allow
                ready = self.traffic is not None and self._rates_cover_a_window()
                return self._install_first(now) if ready else None
            if now - self._last_tick_s < self.tunables.interval_s or self.traffic is None:
                return None
            self._last_tick_s = now
            if self.pinned:
                return self._guard_while_pinned(now)
            return self._control_step(now)

    def _guard_while_pinned(self, now: float) -> Decision | None:
        assert self.installed is not None
        step = pinned_step(self._loop, now, self.telemetry, self._serving_delivery())
        if step.decision is None:
            return None
        self._carry_out(step, now, self.installed.plan, self._serving_plan)
        return self._log(step.decision)

    def _rates_cover_a_window(self) -> bool:
        if not self._window_ms:
            return True  # rates were given directly, not by the stream
        if self._first_window_end_ms is None:
            return False  # windows came, but with no traffic yet
        return self.rates_window_end_ms - self._first_window_end_ms >= self._window_ms

    def _install_first(self, now: float) -> Decision | None:
        """The first plan, gated by the guard (`control.step.first_plan`)."""
        assert self.traffic is not None
        if self._first_ready_s is None:
            self._first_ready_s = now
        window_s = (self._window_ms / 1000.0) or self.tunables.interval_s
        step = first_plan(self._loop, now, self.telemetry, ready_since_s=self._first_ready_s,
                          window_s=window_s)
        if step.install is Install.WAIT:
            return None
        self._epoch_above_the_fleet()
        plan = self._candidate(fresh=True)
        self._last_tick_s = now
        self._carry_out(step, now, plan, lambda: plan)
        if step.decision is not None:
            return self._log(step.decision)
        return self._record(now, Action.INSTALL, step.reason, None)

    def _control_step(self, now: float) -> Decision:
        assert self.installed is not None and self.traffic is not None
        installed = self.installed.plan
        candidate = None if self.mode == Mode.FALLBACK else self._candidate(fresh=False)
        step = control_step(self._loop, now, installed=self._serving_plan(),
                            traffic=self.traffic, candidate=candidate,
                            telemetry=self.telemetry, fleet=self._fleet(),
                            delivery=self._serving_delivery(),
                            fleet_change=self._drain_changed())
        self._carry_out(step, now, candidate if step.install is Install.CANDIDATE
                        else installed, lambda: self._candidate(fresh=False))
        if step.decision is None:
            return self._record(now, Action.INSTALL, step.reason, None)
        return self._log(step.decision)

    def _carry_out(self, step: Step, now: float, plan: RoutingPlan | None,
                   resumed: Callable[[], RoutingPlan]) -> None:
        """Publish what `step` installs: `plan` itself, its fallback table, or on resume
        the plan `resumed` gives."""
        if step.install is Install.CANDIDATE and plan is not None:
            self._install(plan, now, forced=False)
        elif step.install is Install.FALLBACK and plan is not None:
            self._install(self._fallback_plan(plan), now, forced=False)
        elif step.install is Install.RESUME:
            self._install(resumed(), now, forced=False)

    def _drain_changed(self) -> str:
        """Why the serving plan's draining destinations are not the fleet's ("" if they are)."""
        planned = {d.id for d in self._serving_plan().destinations if d.draining}
        wanted = {d.id for d in self._fleet() if d.draining}
        if planned == wanted:
            return ""
        parts = []
        if wanted - planned:
            down = sorted((wanted - planned) & self.reported_down)
            drained = sorted(wanted - planned - self.reported_down)
            if drained:
                parts.append(f"drained {', '.join(drained)}")
            if down:
                parts.append(f"reported down by most routers: {', '.join(down)}")
        if planned - wanted:
            parts.append(f"back in service: {', '.join(sorted(planned - wanted))}")
        return "fleet changed: " + "; ".join(parts)

    def _epoch_above_the_fleet(self) -> None:
        """Nothing installed, nothing durable: if routers still hold versions from before
        (Redis and the history were both lost), start a new epoch above every version they
        report, so versions never go backwards for them."""
        try:
            statuses = self._publisher.router_statuses()
        except Exception as exc:  # no reports is no information: keep the epoch
            log.warning("could not read router statuses before the first plan: %s", exc)
            return
        # (statuses are validated when read; the bound is checked again here because the
        # next epoch is this + 1, and one beyond what a version can hold wedges installs)
        held = [s.applied.epoch for s in statuses
                if (s.applied.epoch or s.applied.seq) and s.applied.epoch < MAX_EPOCH]
        if held and max(held) >= self._epoch:
            self._epoch = max(held) + 1
            log.warning("routers hold versions up to epoch %d: starting epoch %d",
                        max(held), self._epoch)

    def _serving_plan(self) -> RoutingPlan:
        """The planned table routers follow (in fallback: the last planned one)."""
        assert self.installed is not None
        plan = self.installed.plan
        if plan.config.is_fallback:
            for older in reversed(self._plans.values()):
                if not older.config.is_fallback:
                    return older
        return plan

    def _candidate(self, *, fresh: bool) -> RoutingPlan:
        assert self.traffic is not None
        config = self.planning_config()
        t = self.traffic
        warm_at = (t.warm_at([d.id for d in config.destinations])
                   if self.tunables.warm_placement else None)
        if fresh or self.installed is None or self._serving_plan().config.is_fallback:
            return build_plan(t.keys, t.rates, config, prefix_tokens=t.prefix_tokens,
                              clock=_timer, warm_at=warm_at)
        return repack(self._serving_plan(), t.keys, t.rates, config,
                      prefix_tokens=t.prefix_tokens, clock=_timer, warm_at=warm_at)

    # --- installs -------------------------------------------------------------------

    def _next_version(self, after: Version | None = None) -> Version:
        last = self.installed.plan.version if self.installed else Version(self._epoch, 0)
        last = max(last, after) if after is not None else last
        if self._last_committed is not None:
            last = max(last, self._last_committed)
        if last.epoch < self._epoch:
            return Version(self._epoch, 1)
        return Version(last.epoch, last.seq + 1)

    def _publish(
        self, plan: RoutingPlan, previous: RoutingPlan | None, forced: bool = False
    ) -> tuple[RoutingPlan, Any, bytes]:
        """Install `plan` under the next free version.

        Redis refuses a version it already holds with other bytes, or one behind its
        pointer. Only someone else writing under our names causes that (another planner,
        or tampering): skip past it, count it, and say so, rather than wedge forever.
        Returns the plan as installed, the published version and its signed blob (which the
        durable history records without reading it back from Redis).
        """
        version = plan.version
        for _ in range(MAX_VERSION_SKIPS):
            try:
                # staged first: the atomic install then moves no megabytes
                prepared = self._publisher.stage(self._publisher.prepare(plan, previous))
                # Uncertain until the install is recorded (`_install` clears it): a reply
                # lost, or a failure between the commit and the record, is settled later.
                self._uncertain = _UncertainCommit(plan, prepared.digest, prepared.plan_blob,
                                                   forced)
                self._last_committed = max(plan.version, self._last_committed or plan.version)
                published = self._publisher.commit(prepared)
                return plan, published, prepared.plan_blob
            except (VersionConflict, VersionRegression) as exc:
                self._uncertain = None  # refused: it did not land
                self.version_conflicts += 1
                current = self._publisher.current()
                version = self._next_version(max(version, current.version if current else version))
                log.error("plan version taken in Redis (%s): publishing as %s", exc, version)
                plan = dataclasses.replace(plan, version=version)
        raise Unavailable(f"could not find a free plan version after {MAX_VERSION_SKIPS} tries")

    def _settle_uncertain_commit(self, now: float) -> None:
        """A commit whose reply never came (Redis killed, the connection cut mid-call) may
        have landed, and routers may be running it: if Redis's pointer names that very plan
        (version and digest), it is installed, recorded as if the reply had come. Else it
        did not land and is forgotten. Redis errors propagate (the caller retries)."""
        pending = self._uncertain
        if pending is None:
            return
        try:
            current = self._publisher.current()
        except CorruptPointer:
            current = None
        if (current is None or current.version != pending.plan.version
                or current.digest != pending.digest):
            self._uncertain = None  # it did not land (its version is not reused)
            return
        if self.installed is None or self.installed.plan.version != pending.plan.version:
            log.warning("plan %s was published after all (its commit's reply was lost)",
                        pending.plan.version)
            self._record_installed(pending.plan, pending.digest, pending.blob, now,
                                   forced=pending.forced)
            self.uncertain_commits_landed += 1
        self._uncertain = None  # recorded: settled

    def _install(self, plan: RoutingPlan, now: float, *, forced: bool) -> Installed:
        self._settle_uncertain_commit(now)
        previous = self.installed.plan if self.installed else None
        versioned = dataclasses.replace(
            plan,
            version=self._next_version(),
            created_at_ms=int(now * 1000),
            rates_window_end_ms=self.rates_window_end_ms or plan.rates_window_end_ms,
        )
        failpoint("publish.before_redis")
        versioned, published, blob = self._publish(versioned, previous, forced)
        failpoint("publish.after_redis")
        installed = self._record_installed(versioned, published.digest, blob, now, forced=forced)
        self._uncertain = None  # landed and recorded
        return installed

    def _record_installed(self, versioned: RoutingPlan, digest: bytes, blob: bytes,
                          now: float, *, forced: bool) -> Installed:
        """Everything that follows a plan landing in Redis."""
        if self._history is not None:
            self._history.record_install(versioned.version, blob)
            failpoint("publish.after_history")
        self.installed = Installed(versioned, digest, now)
        self._installed_by_step = versioned.version
        self._remember(versioned)
        if not versioned.config.is_fallback:
            self._reference = self._measured_part(self.traffic)
            self._loop.record_install(now, forced=forced)
            self._predict(versioned, now)
        self.events.publish("installed", self.version_info(versioned, digest))
        log.info(
            "installed plan %s (%s, %d keys)",
            versioned.version,
            versioned.config.built_by,
            len(versioned.table),
        )
        return self.installed

    def _measured_part(self, t: Traffic | None) -> Traffic | None:
        """`t` without the keys held only because their silence was within the noise: the
        next plan's reference does not carry them again."""
        if t is None or not self._window_keys:
            return t
        keep = np.fromiter((k in self._window_keys for k in t.keys), bool, count=len(t.keys))
        if keep.all():
            return t
        keys = [k for k, ok in zip(t.keys, keep, strict=True) if ok]
        return Traffic(keys, t.rates[keep], t.tokens[keep], t.window_end_s,
                       t.default_prefix_tokens)

    def _predict(self, plan: RoutingPlan, now: float) -> None:
        serving = [i for i, d in enumerate(plan.destinations) if not d.draining]
        loads = plan.stats.expected_load_per_s
        prediction = predict(
            [plan.destinations[i].id for i in serving],
            [plan.destinations[i].capacity_weight for i in serving],
            [loads[i] for i in serving] if loads else [0.0] * len(serving),
            plan.stats.admitted_rate_share, self.telemetry, plan.config.q_cap)
        self.deliveries[plan.version] = (prediction, Realized(), now)
        while len(self.deliveries) > 64:
            self.deliveries.popitem(last=False)
        self._record_delivery(plan.version)

    def _remember(self, plan: RoutingPlan) -> None:
        self._plans[plan.version] = plan
        while len(self._plans) > 64:
            self._plans.popitem(last=False)

    def _fallback_plan(self, base: RoutingPlan) -> RoutingPlan:
        """Flat-LB for every key: the same destinations and an empty key table."""
        config = dataclasses.replace(base.config, built_by=BuiltBy.FALLBACK, fallback=True)
        stats = PlanStats(cold_tail_rate_per_s=self.traffic.total_rate if self.traffic else 0.0)
        return RoutingPlan(
            config=config, destinations=base.destinations, table=KeyTable.empty(), stats=stats
        )

    # --- operator actions -------------------------------------------------------------

    def replan(
        self, *, fresh: bool, force: bool, dry_run: bool, request_id: str = ""
    ) -> ReplanResult:
        with self._lock:
            self._require_leader()
            cached = self._once.get("replan", request_id)
            if cached is not None:
                return cached  # type: ignore[no-any-return]
            if self.traffic is None:
                raise Unavailable("no complete rate window yet: nothing to plan on")
            candidate = self._candidate(fresh=fresh)
            base = self.installed.plan if self.installed else None
            figures = self._price(candidate)
            plan_diff = diff(self._serving_plan(), candidate) if base is not None else None
            result = ReplanResult(candidate, plan_diff, figures, None, None)
            if not dry_run:
                result = self._operator_install(result, force=force, request_id=request_id)
            return self._once.remember("replan", request_id, result)

    def _price(self, candidate: RoutingPlan) -> Figures | None:
        if self.installed is None or self.traffic is None:
            return None
        return self._loop.price(
            self._serving_plan(), self.traffic, candidate, self.telemetry, fleet=self._fleet()
        )

    def _operator_install(
        self, result: ReplanResult, *, force: bool, request_id: str
    ) -> ReplanResult:
        now = self._clock()
        figures = result.figures
        action, why, _smaller = (Action.INSTALL, "", False) if figures is None \
            else self._loop.rule(now, figures)
        if not force and action is not Action.INSTALL:
            reason = f"operator replan not installed: {why} (use force)"
            return dataclasses.replace(
                result,
                decision=self._record(now, Action.KEEP, reason, figures, request_id=request_id),
            )
        installed = self._install(result.candidate, now, forced=force)
        self.pinned = False
        reason = "operator replan" + (" (forced)" if force else "")
        decision = self._record(now, Action.INSTALL, reason, figures, request_id=request_id)
        return dataclasses.replace(result, installed=installed, decision=decision)

    def rollback(self, version: Version, request_id: str = "") -> Installed:
        """Install the retained `version` again as a new version, and pin it."""
        with self._lock:
            self._require_leader()
            cached = self._once.get("rollback", request_id)
            if cached is not None:
                return cached  # type: ignore[no-any-return]
            target = self.plan(version)
            now = self._clock()
            installed = self._install(
                dataclasses.replace(
                    target,
                    config=dataclasses.replace(target.config, built_by=BuiltBy.rollback(version)),
                ),
                now,
                forced=True,
            )
            self.pinned = True
            self._record(
                now,
                Action.INSTALL,
                f"operator rollback to {version}; plan pinned",
                None,
                request_id=request_id,
            )
            return self._once.remember("rollback", request_id, installed)  # type: ignore[no-any-return]

    def release_pin(self) -> None:
        with self._lock:
            self._require_leader()
            self.pinned = False
            self._record(self._clock(), Action.KEEP, "operator released the rollback pin", None)

    def set_mode(self, mode: Mode | None, reason: str) -> Mode:
        """Force `mode` (None releases the override). Installs the matching table."""
        with self._lock:
            self._require_leader()
            if self.installed is None:
                raise Unavailable("no plan installed yet")
            now = self._clock()
            decision = self._loop.force_mode(now, mode, reason or "no reason given")
            if decision.action is Action.FALLBACK:
                self._install(self._fallback_plan(self.installed.plan), now, forced=True)
            elif decision.action is Action.RESUME:
                self._install(self._serving_plan(), now, forced=True)
            self._log(decision)
            self.mode_reason = reason
            return self.mode

    def update_config(
        self,
        *,
        tunables: dict[str, Any],
        add: list[DestinationSpec],
        drain: list[str],
        remove: list[str],
        request_id: str = "",
        guard: Guard | None = None,
        weights: dict[str, float] | None = None,
    ) -> Tunables:
        """Change tunables, destinations and the guard together, or not at all (validated
        first). A new guard acts at the next control step."""
        with self._lock:
            self._require_leader()
            cached = self._once.get("update_config", request_id)
            if cached is not None:
                return cached  # type: ignore[no-any-return]
            decision = {k: v for k, v in tunables.items() if k in DECISION_FIELDS}
            planning = {k: v for k, v in tunables.items() if k not in DECISION_FIELDS}
            new_tunables = dataclasses.replace(self.tunables, **planning)
            new_destinations = edit_destinations(self._destinations, add, drain, remove,
                                                 weights)
            self._planning_config(new_tunables, new_destinations)  # refuse a bad edit now
            self.tunables, self._destinations = new_tunables, new_destinations
            if decision:
                self._set_decision_settings(decision)
            if guard is not None:
                self._apply_guard(guard)
                log.info("guard configuration changed: %s", guard.to_dict())
            if self._history is not None:
                self._history.record_config(
                    {
                        "tunables": dataclasses.asdict(self.tunables),
                        "decision": {k: getattr(self.decision_settings, k)
                                     for k in DECISION_FIELDS},
                        "guard": self.guard.to_dict(),
                        "destinations": [dataclasses.asdict(d) for d in self._destinations],
                    }
                )
            self._last_tick_s = -math.inf  # act on the change at the next tick
            if self.installed is not None and self.traffic is not None and self._drain_changed():
                # A destination drained or removed: move its keys now, not at the next tick.
                self.tick()
            return self._once.remember("update_config", request_id, self.tunables)  # type: ignore[no-any-return]

    @property
    def decision_settings(self) -> DecisionSettings:
        """The install rule's knobs, as the loop applies them."""
        return self._loop.settings.decision

    def _set_decision_settings(self, changes: dict[str, float]) -> None:
        s = self._loop.settings
        self._loop.settings = dataclasses.replace(
            s, decision=dataclasses.replace(s.decision, **changes))

    # --- views --------------------------------------------------------------------------

    def current(self) -> Installed | None:
        """The installed plan, consistent with Redis (waits for an install in progress)."""
        with self._lock:
            return self.installed

    @property
    def mode(self) -> Mode:
        return self._loop.guard.mode

    @property
    def destinations(self) -> list[DestinationSpec]:
        return list(self._destinations)

    @property
    def history(self) -> HistorySink | None:
        return self._history

    @property
    def loop(self) -> ControlLoop:
        return self._loop

    def explain(self, key: str, history: int = 5) -> KeyExplanation:
        """Why `key` is (or is not) where the serving plan puts it (planning.explain)."""
        with self._lock:
            if self.installed is None:
                raise NotFound("no plan installed yet")
            plan = self._serving_plan()
            t = self.traffic
            keys, rates = (t.keys, t.rates) if t is not None else ([], np.zeros(0))
            candidate = self._candidate(fresh=False) if t is not None else None
            older = [p for v, p in reversed(self._plans.items()) if v != plan.version]
            older = [p for p in older if not p.config.is_fallback][:history]
            return explain_key(key, plan, keys, rates, self.planning_config(),
                               candidate=candidate, history=older)

    def planning_config(self) -> PlanningConfig:
        return self._planning_config(self.tunables, self._fleet(), self._warm_slots_in_use(),
                                     self._q_cap_in_use())

    def _measured_q_cap(self) -> MeasuredQCap | None:
        by_id = {d.id: d for d in self._destinations}
        now_ms = int(self._clock() * 1000)
        # Only a saturation that lasted (derated: `dwell_s` on end) shows a knee: a few
        # seconds of queue are a burst, and made the learned q_cap jump (bench/learning.py).
        knees = [rec.knee_per_s / by_id[dest].capacity_weight
                 for dest, rec in self.saturation.items()
                 if dest in by_id and rec.derated and rec.knee_per_s is not None]
        memory_ms = self.SERVED_MEMORY_S * 1000
        served = [load for dest, (load, at_ms) in self.served_peaks.items()
                  if dest in by_id and now_ms - at_ms <= memory_ms]
        breaks = [load for dest, (load, at_ms) in self.slo_breaks.items()
                  if dest in by_id and now_ms - at_ms <= memory_ms]
        stepped = self.slo_stepped
        return measured_q_cap(knees, served, breaks,
                              stepped[0] if stepped is not None
                              and now_ms - stepped[1] <= memory_ms else None)

    def _q_cap_in_use(self) -> float:
        """The configured q_cap, or (learn_q_cap) the measured one within [q/2, 2q]."""
        q = self.tunables.q_cap
        return learned_q_cap(q, self._measured_q_cap()) if self.tunables.learn_q_cap else q

    def _warm_slots_in_use(self) -> int:
        """The configured W, or (learn_warm_slots) the measured one within [W/2, 2W]."""
        w = self.tunables.warm_slots_per_destination
        if not self.tunables.learn_warm_slots:
            return w
        measured = measured_warm_slots(self.engine_signals.values(), self._mean_prefix_tokens(),
                                       int(self._clock() * 1000))
        return w if measured is None else learned_warm_slots(w, measured.value)

    def _fleet(self) -> list[DestinationSpec]:
        """The configured destinations as planning sees them: reported-down ones draining,
        saturated ones at their measured capacity."""
        fleet = with_reported_down(self._destinations, self.reported_down)
        return derated_fleet(fleet, self.saturation, self._q_cap_in_use(),
                             self.saturation_settings)

    def _saturated(self) -> tuple[tuple[str, Saturation, float, float], ...]:
        by_id = {d.id: d for d in self._destinations}
        q_cap = self._q_cap_in_use()  # once, not per destination
        return tuple(
            (dest, rec, by_id[dest].capacity_weight,
             effective_weight(by_id[dest], rec, q_cap, self.saturation_settings))
            for dest, rec in sorted(self.saturation.items()) if dest in by_id)

    def observe_router_health(self, reports: list[list[str]]) -> frozenset[str]:
        """Each recently reporting router's unhealthy destinations; returns the ones planned
        as draining from now on. A change makes the next tick act on it."""
        with self._lock:
            down = reported_down(reports, (d.id for d in self._destinations))
            if down != self.reported_down:
                log.warning("routers report destinations down: %s (was %s)",
                            sorted(down), sorted(self.reported_down))
                self.reported_down = down
                self._last_tick_s = -math.inf
            return down

    @staticmethod
    def _planning_config(t: Tunables, destinations: list[DestinationSpec],
                         warm_slots: int | None = None,
                         q_cap: float | None = None) -> PlanningConfig:
        return PlanningConfig(
            destinations=tuple(destinations),
            q_cap=t.q_cap if q_cap is None else q_cap,
            warm_slots_per_destination=(t.warm_slots_per_destination if warm_slots is None
                                        else warm_slots),
            imbalance_tolerance=t.imbalance_tolerance,
            byte_aware=t.byte_aware,
            admission_hysteresis=t.admission_hysteresis,
            replica_hysteresis=t.replica_hysteresis,
            balance_effort=t.balance_effort,
            hashed_tail=t.hashed_tail,
        )

    def plan(self, version: Version | None = None) -> RoutingPlan:
        with self._lock:
            if version is None or version == Version():
                if self.installed is None:
                    raise NotFound("no plan installed yet")
                return self.installed.plan
            if version in self._plans:
                return self._plans[version]
            try:
                return self._publisher.load(version)
            except Exception as exc:
                raise NotFound(f"plan version {version} is not retained") from exc

    def list_versions(self, limit: int) -> list[RoutingPlan]:
        versions = sorted(self._publisher.list_versions(), reverse=True)[: limit or None]
        return [self.plan(v) for v in versions]

    def version_info(self, plan: RoutingPlan, digest: bytes = b"") -> dict[str, Any]:
        current = self.installed is not None and self.installed.plan.version == plan.version
        return {
            "plan": plan,
            "digest": digest or (self.installed.digest if current and self.installed else b""),
            "current": current,
        }

    def status(self) -> PlannerStatus:
        with self._lock:
            now = self._clock()
            return PlannerStatus(
                mode=self.mode,
                mode_reason=self.mode_reason or self._loop.guard.reason,
                installed=self.installed,
                installed_age_s=now - self.installed.installed_at_s if self.installed else 0.0,
                figures=self._loop.last_figures,
                accumulated=self._loop.accumulated,
                last_decision=self.decisions[-1] if self.decisions else None,
                rates_age_s=now - self.traffic.window_end_s if self.traffic else math.inf,
                rates_recovering=bool(self.telemetry and self.telemetry.recovering),
                pinned=self.pinned,
                tunables=self.tunables,
                decision_settings=self.decision_settings,
                destinations=list(self.destinations),
                guard=self.guard,
                role=self.role,
                leader_id=self.leader_id,
                engine_signals=tuple(self.engine_signals[d]
                                     for d in sorted(self.engine_signals)),
                measured_warm_slots=measured_warm_slots(
                    self.engine_signals.values(), self._mean_prefix_tokens(),
                    int(now * 1000)),
                saturated=self._saturated(),
                measured_q_cap=self._measured_q_cap(),
                q_cap_in_use=self._q_cap_in_use(),
                warm_slots_in_use=self._warm_slots_in_use(),
            )

    def _mean_prefix_tokens(self) -> float:
        """Reusable prefix tokens per request, rate-weighted over the window's keys."""
        t = self.traffic
        if t is None or not len(t.keys) or not float(t.rates.sum()) > 0:
            return 0.0
        return float(np.dot(t.tokens, t.rates) / t.rates.sum())

    @property
    def guard(self) -> Guard:
        return Guard(self._loop.validated, self._loop.settings.guard)

    def _apply_guard(self, guard: Guard) -> None:
        self._loop.set_validated_range(guard.validated)
        self._loop.settings = dataclasses.replace(self._loop.settings, guard=guard.settings)

    # --- decisions and watchers ------------------------------------------------------------

    def _record(
        self,
        now: float,
        action: Action,
        reason: str,
        figures: Figures | None,
        *,
        request_id: str = "",
    ) -> Decision:
        f = figures or Figures()
        decision = Decision(
            id=0,  # assigned by _log
            at_s=now,
            action=action,
            reason=reason,
            drift=f.drift or Drift(),
            penalties=Penalties(
                staleness_rate_modelled=f.staleness_rate_modelled,
                staleness_rate_measured=f.staleness_rate_measured,
                staleness_accumulated=self._loop.accumulated,
                rewarm_cost=f.rewarm_cost,
                measured_used=f.measured_used,
            ),
            moved_traffic_share=f.moved_traffic_share,
            mode=str(self.mode),
        )
        return self._log(decision, request_id=request_id)

    def _log(self, decision: Decision, *, request_id: str = "") -> Decision:
        """Number, keep, persist and broadcast a decision (the loop's and the operator's alike).

        Call it after any install the decision caused, so the record names that version.
        """
        last = self.decisions[-1].id if self.decisions else 0
        installed, self._installed_by_step = self._installed_by_step, None
        acted = decision.action in (Action.INSTALL, Action.FALLBACK, Action.RESUME)
        decision = dataclasses.replace(
            decision, id=last + 1, request_id=request_id,
            installed=str(installed) if acted and installed is not None else "")
        self.decisions.append(decision)
        if self._history is not None:
            self._history.record_decision(decision.to_dict())
            self._history.record_loop(self._loop.snapshot())
        self.events.publish("decision", decision)
        log.info("decision %s: %s", decision.action, decision.reason)
        return decision
