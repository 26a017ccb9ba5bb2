"""Assemble and run the planner service: settings in, threads and a gRPC server out.

snapshots topic ──SnapshotConsumer──▶ Planner.on_window
interval timer ─────────────────────▶ Planner.tick ──▶ PlanPublisher (Redis)
gRPC (PlannerServicer + health + reflection) ──▶ Planner
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
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
from planner_svc.settings import PlannerSettings
from router_client import signing
from router_client.plan import parse_destinations
from streams.assembly import SnapshotLimits

log = logging.getLogger("cacheroute.planner")
# Router reports older than this do not vote on destination health (routers report every
# second; a router gone for this long is not there to route).
ROUTER_REPORT_MAX_AGE_S = 10.0
MAX_WATCHERS = 8
UNARY_THREADS = 16
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
        balance_effort=settings.balance_effort,
        rate_noise_z=settings.rate_noise_z,
        learn_warm_slots=settings.learn_warm_slots,
        learn_q_cap=settings.learn_q_cap,
    )


@dataclass
class PlannerService:
    settings: PlannerSettings
    planner: Planner
    publisher: PlanPublisher
    server: grpc.Server
    health: health.HealthServicer
    consumer: SnapshotConsumer | None
    port: int
    _stop: threading.Event
    _timer: threading.Thread | None = None
    metrics: MetricsServer | None = None
    leadership: Leadership | None = None
    signals: EngineSignalsConsumer | None = None

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
        self._set_health(True)
        if self.settings.metrics_port:
            self.metrics = start_metrics_server(
                self.settings.metrics_port,
                planner_registry(self.planner),
                host=self.settings.grpc_host,
            )
        log.info("planner serving gRPC on %s:%d", self.settings.grpc_host, self.port)

    def _run_timer(self) -> None:
        period = min(1.0, self.planner.tunables.interval_s / 4)
        if self.leadership is not None:
            period = min(period, self.leadership.period_s)
        while not self._stop.wait(period):
            if self.leadership is not None and not self._elect():
                continue  # a standby: it follows, it does not act
            try:
                self.planner.republish_if_missing()
                self.planner.observe_router_health(
                    [list(r.unhealthy_destinations)
                     for r in self.publisher.router_statuses(max_age_s=ROUTER_REPORT_MAX_AGE_S)])
                self.planner.tick()
                self._set_health(True)
            except Exception:
                log.exception("control step failed; will retry next period")
                self._set_health(self._redis_ok())

    def _elect(self) -> bool:
        """One leader-election step; True when this planner leads and should act."""
        lead = self.leadership
        assert lead is not None
        change = lead.step(self.publisher, time.monotonic())
        # Installs carry the lease they were made under (the store's fence).
        self.publisher.fence = lead.value or STANDBY_FENCE
        try:
            if change is Change.GAINED:
                self.planner.take_over(lead.holder_id)
            elif not lead.leader:
                self.planner.stand_by(lead.leader_id(self.publisher))
                self.planner.follow()
        except Exception:
            log.exception("leadership step failed; will retry next period")
        self._set_health(True)
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
        self.publisher.close()
        if self.planner.history is not None:
            self.planner.history.close()

    def wait(self) -> None:
        self._stop.wait()


def build_service(
    settings: PlannerSettings, *, consume: bool = True, durable: bool | None = None
) -> PlannerService:
    """Wire every part from `settings`; nothing starts until `.start()`.

    `consume`: read rate snapshots from Kafka; `durable` (default: same as consume): keep
    plan history, config and decisions in the compacted state topic.
    """
    publisher = PlanPublisher(
        settings.redis_url,
        signing_key(settings),
        namespace=settings.redis_namespace,
        retain=settings.retain_versions,
    )
    try:
        destinations = parse_destinations(settings.destinations)
    except ValueError as exc:
        raise SystemExit(f"--destinations: {exc}") from None
    if not destinations:
        raise SystemExit("the planner needs destinations: --destinations "
                         "d0[=http://host:port][*weight],d1,...")
    history = None
    if (consume if durable is None else durable) and settings.state_topic:
        history = KafkaHistory(settings.bootstrap, settings.state_topic)
    validated = ValidatedRange(
        active_keys_max=settings.validated_active_keys_max or None,
        p99_ms_max=settings.validated_p99_ms_max or None,
        hit_rate_min=settings.validated_hit_rate_min or None,
        hit_gap_max=settings.validated_hit_gap_max or None,
    )
    try:
        guard = GuardSettings(enter_after_s=settings.guard_enter_after_s,
                              resume_dwell_s=settings.guard_resume_dwell_s,
                              min_fallback_s=settings.guard_min_fallback_s,
                              p99_resume_margin=settings.guard_p99_resume_margin)
    except ValueError as exc:
        raise SystemExit(f"--guard-* settings: {exc}") from None
    planner = Planner(
        loop=ControlLoop(LoopSettings(guard=guard, decision=DecisionSettings(
            hysteresis=settings.hysteresis, min_dwell_s=settings.min_dwell_s)),
            validated=validated),
        publisher=publisher,
        destinations=destinations,
        tunables=tunables_from(settings),
        rate_column=settings.rate_column,
        history=history,
    )
    leadership = None
    if settings.leader_lease_s > 0:
        try:
            leadership = Leadership(settings.leader_id or f"{os.uname().nodename}-{os.getpid()}",
                                    settings.leader_lease_s)
        except ValueError as exc:
            raise SystemExit(f"--leader-id / --leader-lease-s: {exc}") from None
        # Until the first election step says otherwise this replica is a standby: no
        # install (the fence refuses it), no history writes, no operator changes.
        publisher.fence = STANDBY_FENCE
        planner.stand_by()
    _retrying("Redis and the planner's history", planner.resume)
    # Watch streams hold a thread each: they get at most MAX_WATCHERS, and the pool keeps
    # UNARY_THREADS more, so GetStatus, GetCurrentVersion and health always get one.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_WATCHERS + UNARY_THREADS),
        maximum_concurrent_rpcs=MAX_WATCHERS + 4 * UNARY_THREADS,
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
    servicer = PlannerServicer(planner, publisher, max_watchers=MAX_WATCHERS)
    planner_pb2_grpc.add_PlannerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = _bind(server, settings)
    consumer = (
        SnapshotConsumer(settings.bootstrap, settings.snapshots_topic, planner.on_window,
                         events_topic=settings.events_topic,
                         limits=SnapshotLimits(window_ms=round(settings.stream_window_s * 1000),
                                               hop_ms=round(settings.stream_hop_s * 1000)))
        if consume
        else None
    )
    signals = (EngineSignalsConsumer(settings.bootstrap, settings.engine_signals_topic,
                                     planner.on_engine_signals)
               if consume and settings.engine_signals_topic else None)
    return PlannerService(
        settings, planner, publisher, server, health_servicer, consumer, port, threading.Event(),
        leadership=leadership, signals=signals,
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
