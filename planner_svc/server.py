"""Assemble and run the planner service: settings in, threads and a gRPC server out.

snapshots topic ──SnapshotConsumer──▶ PoolSet.on_window ──▶ each pool's Planner.on_window
interval timer ─────────────────────▶ each pool's Planner.tick ──▶ its PlanPublisher (Redis)
gRPC (PlannerServicer + health + reflection) ──▶ the Planner of the request's pool
pools file (--pools-file), re-read when it changes ──▶ PoolSet.apply

One pool (named "default", every model) from --destinations, or the pools of a pools file
(router_client.pools): each its own destinations, settings, namespace and history topic,
all under one leader lease and one signing key.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.adapters.kafka_history import KafkaHistory
from planner_svc.adapters.redis_publisher import STANDBY_FENCE, PlanPublisher
from planner_svc.adapters.signals_consumer import EngineSignalsConsumer
from planner_svc.adapters.snapshot_consumer import SnapshotConsumer
from planner_svc.api.interceptors import PlannerInterceptor
from planner_svc.api.metrics import MetricsServer, planner_registry, start_metrics_server
from planner_svc.api.servicer import PlannerServicer
from planner_svc.control import (
    ControlLoop,
    DecisionSettings,
    GuardSettings,
    LoopSettings,
    ValidatedRange,
)
from planner_svc.orchestration.leadership import Change, Leadership
from planner_svc.orchestration.planner import Planner, Tunables
from planner_svc.orchestration.pools import PoolSet, PoolUnit
from planner_svc.settings import PlannerSettings
from router_client import signing
from router_client.plan import parse_destinations
from router_client.pools import (
    ANY_MODEL,
    DEFAULT_POOL,
    MAX_POOLS_FILE_BYTES,
    POOL_SETTINGS,
    PoolsError,
    PoolSpec,
    parse_pools,
)
from streams.assembly import SnapshotLimits

log = logging.getLogger("cacheroute.planner")
# Router reports older than this do not vote on destination health (routers report every
# second; a router gone for this long is not there to route).
ROUTER_REPORT_MAX_AGE_S = 10.0
MAX_WATCHERS = 8
# Plan downloads (GetPlan) hold a thread while they stream, at most this long.
MAX_PLAN_STREAMS = 4
PLAN_STREAM_DEADLINE_S = 60.0
UNARY_THREADS = 16
STREAM_THREADS = MAX_WATCHERS + MAX_PLAN_STREAMS
SERVICE_NAME = planner_pb2.DESCRIPTOR.services_by_name["Planner"].full_name
# Health service name SERVING on the leader only (replicated planners): a readiness probe
# on it keeps the Service pointed at the leader.
LEADER_HEALTH = "leader"


def signing_key(settings: PlannerSettings) -> signing.Ed25519PrivateKey:
    """Load the planner's key, or create one (and its public half for routers to pin)."""
    path = Path(settings.signing_key_path or Path(settings.data_dir) / "planner-signing-key.pem")
    if path.exists():
        return signing.load_private_key(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = signing.generate_private_key()
    signing.save_private_key(key, path)
    signing.save_public_key(key.public_key(), path.with_suffix(".pub.pem"))
    log.info("created signing key %s (routers pin %s)", path, path.with_suffix(".pub.pem"))
    return key


def tunables_from(settings: PlannerSettings) -> Tunables:
    return Tunables(
        q_cap=settings.q_cap,
        warm_slots_per_destination=settings.warm_slots_per_destination,
        interval_s=settings.interval_s,
        imbalance_tolerance=settings.imbalance_tolerance,
        max_plan_age_s=settings.max_plan_age_s,
        byte_aware=settings.byte_aware,
        admission_hysteresis=settings.admission_hysteresis,
        replica_hysteresis=settings.replica_hysteresis,
        balance_effort=settings.balance_effort,
        rate_noise_z=settings.rate_noise_z,
        learn_warm_slots=settings.learn_warm_slots,
        learn_q_cap=settings.learn_q_cap,
        q_cap_ttft_slo_s=settings.q_cap_ttft_slo_s,
        hashed_tail=settings.hashed_tail,
        warm_placement=settings.warm_placement,
    )


@dataclass
class PlannerService:
    settings: PlannerSettings
    pools: PoolSet
    publisher: PlanPublisher  # the process's namespace: the leader lease, health pings
    server: grpc.Server
    health: health.HealthServicer
    consumer: SnapshotConsumer | None
    port: int
    _stop: threading.Event
    _timer: threading.Thread | None = None
    metrics: MetricsServer | None = None
    leadership: Leadership | None = None
    signals: EngineSignalsConsumer | None = None
    pools_file: PoolsFile | None = None
    _pools_thread: threading.Thread | None = None

    @property
    def planner(self) -> Planner:
        """The default pool's planner (the only one in a single-pool deployment)."""
        return self.pools.get("").planner

    def start(self) -> None:
        self.server.start()
        if self.consumer is not None:
            _retrying("the snapshots topic", self.consumer.start)
        if self.signals is not None:
            # Optional input: the planner serves without it, so a broker that refuses the
            # topic (ACLs) delays only the signals, never the planner's start.
            threading.Thread(target=_retrying, args=("the engine-signals topic",
                                                     self.signals.start),
                             name="engine-signals-start", daemon=True).start()
        self._timer = threading.Thread(target=self._run_timer, name="planner-timer", daemon=True)
        self._timer.start()
        if self.pools_file is not None:
            self._pools_thread = threading.Thread(target=self._run_pools_file,
                                                  name="pools-file", daemon=True)
            self._pools_thread.start()
        self._set_health(True)
        if self.settings.metrics_port:
            self.metrics = start_metrics_server(
                self.settings.metrics_port,
                planner_registry(self.pools, labelled=self.pools_file is not None),
                host=self.settings.grpc_host,
            )
        log.info("planner serving gRPC on %s:%d (pools: %s)", self.settings.grpc_host,
                 self.port, ", ".join(self.pools.names()) or "none")

    def _period_s(self) -> float:
        intervals = [u.planner.tunables.interval_s for u in self.pools.units()]
        period = min(1.0, min(intervals, default=4.0) / 4)
        if self.leadership is not None:
            period = min(period, self.leadership.period_s)
        return period

    def _run_timer(self) -> None:
        # The floor keeps a tiny interval from turning the timer into a busy loop.
        while not self._stop.wait(max(0.05, self._period_s())):
            try:
                if self.leadership is not None and not self._elect():
                    continue  # a standby: it follows, it does not act
                self.pools.each("control step", self._control_step)
                units = self.pools.units()
                self._set_health(bool(units) and (self._redis_ok() if any(
                    u.last_error for u in units) else True))
            except Exception:  # an unexpected Redis reply, say: the timer must not die
                log.exception("timer step failed; will retry next period")
                self._set_health(self._redis_ok())

    def _run_pools_file(self) -> None:
        """The pools file, on its own thread: building a pool waits on Redis and Kafka,
        which must not hold up the lease renewal or the control steps."""
        assert self.pools_file is not None
        while not self._stop.wait(1.0):
            try:
                self.pools_file.reload_if_changed(self.pools)
            except Exception:
                log.exception("pools file step failed; will retry")

    @staticmethod
    def _control_step(unit: PoolUnit) -> None:
        planner, publisher = unit.planner, unit.publisher
        planner.republish_if_missing()
        planner.observe_router_health(
            [list(r.unhealthy_destinations)
             for r in publisher.router_statuses(max_age_s=ROUTER_REPORT_MAX_AGE_S)])
        planner.tick()
        unit.last_error = ""

    def _elect(self) -> bool:
        """One leader-election step; True when this planner leads and should act."""
        lead = self.leadership
        assert lead is not None
        change = lead.step(self.publisher, time.monotonic())
        # Installs carry the lease they were made under (the store's fence), in every pool.
        fence = lead.value or STANDBY_FENCE
        self.publisher.fence = fence
        for unit in self.pools.units():
            unit.publisher.fence = fence
        if change is Change.GAINED:
            self.pools.each("take over", lambda u: u.planner.take_over(lead.holder_id))
        elif not lead.leader:
            leader_id = lead.leader_id(self.publisher)

            def follow(unit: PoolUnit) -> None:
                unit.planner.stand_by(leader_id)
                unit.planner.follow()

            self.pools.each("follow", follow)
        self._set_health(bool(self.pools.units()))
        return lead.leader

    def _redis_ok(self) -> bool:
        try:
            return self.publisher.ping()
        except Exception:
            return False

    def _set_health(self, ok: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)
        if self.leadership is not None:  # "leader": SERVING on the leader only
            leading = ok and self.leadership.leader
            self.health.set(LEADER_HEALTH, health_pb2.HealthCheckResponse.SERVING if leading
                            else health_pb2.HealthCheckResponse.NOT_SERVING)

    def stop(self, grace_s: float = 2.0) -> None:
        self._stop.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()
        if self._timer is not None:
            self._timer.join(5)
        if self.leadership is not None:  # the standby need not wait the lease out
            self.leadership.release(self.publisher)
        if self.metrics is not None:
            self.metrics.close()
        if self.consumer is not None:
            self.consumer.stop()
        if self.signals is not None:
            self.signals.stop()
        if self._timer is not None:
            self._timer.join(5)
        if self._pools_thread is not None:  # an apply under way ends before pools close
            self._pools_thread.join(30)
        self.pools.close()
        self.publisher.close()

    def wait(self) -> None:
        self._stop.wait()


class PoolsFile:
    """The pools file, re-read when it changes (and re-applied every `retry_s`, so a pool
    that failed to start is tried again and drained destinations are removed on time).
    A file that does not parse changes nothing: the running pools keep planning."""

    def __init__(self, path: str, base_namespace: str, retry_s: float = 10.0) -> None:
        self.path = Path(path)
        self.base_namespace = base_namespace
        self.retry_s = retry_s
        self.error = ""
        self._seen: tuple[int, int] | None = None
        self._specs: list[PoolSpec] = []
        self._applied_at = -math.inf

    def read(self) -> list[PoolSpec]:
        """Parse the file now (raises PoolsError / OSError with the reason)."""
        stat = self.path.stat()
        seen = (stat.st_mtime_ns, stat.st_size)
        try:
            if stat.st_size > MAX_POOLS_FILE_BYTES:
                raise PoolsError(f"{self.path} is larger than {MAX_POOLS_FILE_BYTES} bytes")
            specs = parse_pools(self.path.read_bytes(), source=str(self.path),
                                base_namespace=self.base_namespace)
        except PoolsError:
            self._seen = seen  # this version of the file is not read again
            raise
        self._seen, self._specs, self.error = seen, specs, ""
        return specs

    def reload_if_changed(self, pools: PoolSet) -> None:
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self._seen:
                self.read()
                self._applied_at = -math.inf
                log.info("pools file %s changed: %d pools", self.path, len(self._specs))
        except (OSError, PoolsError) as exc:
            if str(exc) != self.error:
                log.error("pools file not applied (the running pools carry on): %s", exc)
            self.error = str(exc)
        now = time.monotonic()
        if now - self._applied_at >= self.retry_s:
            changes = pools.apply(self._specs)
            self._applied_at = now
            if changes.added or changes.removed or changes.edited:
                log.info("pools: added %s, removed %s, edited %s", list(changes.added),
                         list(changes.removed), list(changes.edited))


def pool_specs(settings: PlannerSettings) -> tuple[list[PoolSpec], PoolsFile | None]:
    """The pools to plan: the pools file's, or one default pool from the flags."""
    if settings.pools_file:
        source = PoolsFile(settings.pools_file, settings.redis_namespace)
        try:
            return source.read(), source
        except (OSError, PoolsError) as exc:
            raise SystemExit(f"--pools-file: {exc}") from None
    if not settings.destinations:
        raise SystemExit("the planner needs destinations: --destinations "
                         "d0[=http://host:port][*weight],d1,... (or --pools-file)")
    try:
        parse_destinations(settings.destinations)
    except ValueError as exc:
        raise SystemExit(f"--destinations: {exc}") from None
    return [PoolSpec(DEFAULT_POOL, (ANY_MODEL,), tuple(settings.destinations))], None


def pool_factory(settings: PlannerSettings, key: signing.Ed25519PrivateKey, *,
                 guard: tuple[GuardSettings, ValidatedRange],
                 durable: bool, leadership: Leadership | None,
                 resume: Callable[[Planner], None],
                 process_publisher: PlanPublisher) -> Callable[[PoolSpec], PoolUnit]:
    """How one pool's planner is built: the process's settings, with the pool's
    destinations, namespace, history topic and planning settings."""
    base_namespace = settings.redis_namespace

    def build(spec: PoolSpec) -> PoolUnit:
        pool_settings = replace(settings, destinations=spec.destinations,
                                redis_namespace=spec.namespace_of(base_namespace),
                                state_topic=spec.topic_of(settings.state_topic),
                                **spec.settings)
        # The pool in the process's own namespace (the default one) uses the process's
        # publisher: a single-pool planner has one Redis client, as it always had.
        shared = pool_settings.redis_namespace == base_namespace
        publisher = process_publisher if shared else PlanPublisher(
            pool_settings.redis_url, key, namespace=pool_settings.redis_namespace,
            retain=pool_settings.retain_versions, lease_namespace=base_namespace)
        history: KafkaHistory | None = None
        planner: Planner | None = None

        def close() -> None:
            if planner is not None:
                planner.events.close()  # its watchers' streams end
            if not shared:  # the process's own is closed with the process
                publisher.close()
            if history is not None:
                history.close()

        try:
            if durable and pool_settings.state_topic:
                history = KafkaHistory(settings.bootstrap, pool_settings.state_topic)
            planner = _planner(pool_settings, publisher, history, guard)
            if leadership is not None:
                # Until the election says otherwise this pool is a standby: no install (the
                # fence refuses it), no history writes, no operator changes.
                publisher.fence = leadership.value or STANDBY_FENCE
                if leadership.leader:
                    planner.take_over(leadership.holder_id)
                else:
                    planner.stand_by()
            resume(planner)
        except BaseException:
            close()
            raise
        return PoolUnit(spec, planner, publisher, close)

    return build


def guard_config(settings: PlannerSettings) -> tuple[GuardSettings, ValidatedRange]:
    """The process's guard and validated range (every pool's); ValueError if they are bad."""
    validated = ValidatedRange(
        active_keys_max=settings.validated_active_keys_max or None,
        p99_ms_max=settings.validated_p99_ms_max or None,
        hit_rate_min=settings.validated_hit_rate_min or None,
        hit_gap_max=settings.validated_hit_gap_max or None,
        affinity_gain_min=settings.validated_affinity_gain_min or None,
    )
    guard = GuardSettings(enter_after_s=settings.guard_enter_after_s,
                          resume_dwell_s=settings.guard_resume_dwell_s,
                          min_fallback_s=settings.guard_min_fallback_s,
                          p99_resume_margin=settings.guard_p99_resume_margin,
                          gain_low_windows=settings.guard_gain_low_windows)
    return guard, validated


def _planner(settings: PlannerSettings, publisher: PlanPublisher,
             history: KafkaHistory | None,
             guard: tuple[GuardSettings, ValidatedRange]) -> Planner:
    settings_of_guard, validated = guard
    return Planner(
        loop=ControlLoop(LoopSettings(guard=settings_of_guard, decision=DecisionSettings(
            hysteresis=settings.hysteresis, min_dwell_s=settings.min_dwell_s)),
            validated=validated),
        publisher=publisher,
        destinations=parse_destinations(settings.destinations),
        tunables=tunables_from(settings),
        rate_column=settings.rate_column,
        history=history,
    )


def build_service(
    settings: PlannerSettings, *, consume: bool = True, durable: bool | None = None
) -> PlannerService:
    """Wire every part from `settings`; nothing starts until `.start()`.

    `consume`: read rate snapshots from Kafka; `durable` (default: same as consume): keep
    plan history, config and decisions in the compacted state topic (one per pool).
    """
    specs, pools_file = pool_specs(settings)
    try:  # the guard's settings are the process's: refuse bad ones before anything starts
        guard = guard_config(settings)
    except ValueError as exc:
        raise SystemExit(f"--guard-* settings: {exc}") from None
    key = signing_key(settings)
    publisher = PlanPublisher(settings.redis_url, key, namespace=settings.redis_namespace,
                              retain=settings.retain_versions)
    leadership = None
    if settings.leader_lease_s > 0:
        try:
            leadership = Leadership(settings.leader_id or f"{os.uname().nodename}-{os.getpid()}",
                                    settings.leader_lease_s)
        except ValueError as exc:
            raise SystemExit(f"--leader-id / --leader-lease-s: {exc}") from None
        publisher.fence = STANDBY_FENCE
    durable_history = bool(consume if durable is None else durable)
    if pools_file is None:
        # One pool: at start it waits for Redis and its history (a supervisor starts them
        # in any order) instead of exiting.
        def resume(planner: Planner) -> None:
            _retrying("Redis and the planner's history", planner.resume)
    else:
        # Many pools: wait for Redis once, then one try per pool; a pool that cannot
        # start (its namespace holding junk, its history topic refused) is reported and
        # tried again at the next re-apply, and never holds the others back.
        _retrying("Redis", publisher.ping)

        def resume(planner: Planner) -> None:
            planner.resume()

    pools = PoolSet(pool_factory(settings, key, guard=guard, durable=durable_history,
                                 leadership=leadership, resume=resume,
                                 process_publisher=publisher),
                    defaults={k: getattr(settings, k) for k in POOL_SETTINGS},
                    base_namespace=settings.redis_namespace)
    changes = pools.apply(specs)
    if changes.failed and not pools.names():
        raise SystemExit("no pool could start: " + "; ".join(
            f"{name}: {why}" for name, why in changes.failed.items()))
    # Streams hold a thread each: watches at most MAX_WATCHERS, plan downloads at most
    # MAX_PLAN_STREAMS, and the pool keeps UNARY_THREADS more, so GetStatus,
    # GetCurrentVersion and health always get one.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=STREAM_THREADS + UNARY_THREADS),
        maximum_concurrent_rpcs=STREAM_THREADS + 4 * UNARY_THREADS,
        options=[
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_connection_idle_ms", 600_000),
            ("grpc.max_connection_age_ms", 3_600_000),
            ("grpc.max_connection_age_grace_ms", 30_000),
            ("grpc.max_receive_message_length", settings.max_request_bytes),
        ],
        interceptors=[
            PlannerInterceptor(
                operator_token=settings.operator_token, reader_token=settings.reader_token
            )
        ],
    )
    servicer = PlannerServicer(pools, max_watchers=MAX_WATCHERS,
                               max_plan_streams=MAX_PLAN_STREAMS,
                               plan_stream_deadline_s=PLAN_STREAM_DEADLINE_S,
                               pools_file=lambda: (settings.pools_file,
                                                   pools_file.error if pools_file else ""))
    planner_pb2_grpc.add_PlannerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = _bind(server, settings)
    consumer = (
        SnapshotConsumer(settings.bootstrap, settings.snapshots_topic, pools.on_window,
                         events_topic=settings.events_topic,
                         worker_key_paths=settings.snapshot_keys,
                         limits=SnapshotLimits(window_ms=round(settings.stream_window_s * 1000),
                                               hop_ms=round(settings.stream_hop_s * 1000)))
        if consume
        else None
    )
    signals = (EngineSignalsConsumer(settings.bootstrap, settings.engine_signals_topic,
                                     pools.on_engine_signals)
               if consume and settings.engine_signals_topic else None)
    return PlannerService(
        settings, pools, publisher, server, health_servicer, consumer, port, threading.Event(),
        leadership=leadership, signals=signals, pools_file=pools_file,
    )


def _retrying(what: str, fn: Callable[[], object], max_delay_s: float = 5.0,
              give_up_after_s: float = 600.0) -> None:
    """Call `fn` until it succeeds: at start the planner waits for Redis and the broker
    (a supervisor starts them in any order) instead of exiting."""
    delay, deadline = 0.2, time.monotonic() + give_up_after_s
    while True:
        try:
            fn()
            return
        except Exception as exc:  # Redis down (Unavailable), broker not up yet, ...
            if time.monotonic() > deadline:
                raise
            log.warning("waiting for %s: %s", what, exc)
            time.sleep(delay)
            delay = min(max_delay_s, delay * 2)


def _bind(server: grpc.Server, settings: PlannerSettings) -> int:
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    if settings.tls_cert and settings.tls_key:
        creds = grpc.ssl_server_credentials(
            [(Path(settings.tls_key).read_bytes(), Path(settings.tls_cert).read_bytes())]
        )
        return server.add_secure_port(address, creds)
    return server.add_insecure_port(address)


def run(settings: PlannerSettings) -> None:
    """Run until SIGTERM / SIGINT."""
    service = build_service(settings)
    service.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service._stop.set())
    service.wait()
    service.stop()
