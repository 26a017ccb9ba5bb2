"""Prometheus metrics of the planner, read from the `Planner` at scrape time.

`PlannerCollector` holds no copies of the planner's figures: each scrape takes one
consistent `Planner.status()` (under the planner's lock) and renders it, so a metric
can never lag the gRPC `GetStatus`. The only state it keeps is the decision counter,
which must stay monotonic although the planner keeps only its newest decisions.

Names (all `cacheroute_planner_…`; base units: seconds, requests/s, ratios in 0..1,
penalties in prefill tokens as in `planner_svc.control.units`):

plan        plan_info{version,built_by}, plan_epoch, plan_seq, plan_age_seconds,
            plan_created_timestamp_seconds, plan_build_seconds, plan_admitted_keys,
            plan_admitted_rate_ratio, plan_imbalance_ratio (as built), pinned
control     mode{mode}, decisions_total{action}, last_install_moved_traffic_ratio,
            candidate_moved_traffic_ratio, drift_total_variation,
            drift_admission_churn_ratio, drift_imbalance_change,
            staleness_rate_prefill_tokens_per_second{estimate=modelled|measured},
            staleness_accumulated_prefill_tokens, rewarm_cost_prefill_tokens
traffic     destination_expected_load_requests_per_second{destination},
            destination_measured_load_requests_per_second{destination},
            destination_draining{destination}, expected_imbalance_ratio,
            measured_imbalance_ratio, hit_ratio{traffic=all|planned|fallback},
            traffic_requests_per_second, active_keys, p99_e2e_seconds
stream      rates_age_seconds, rates_window_end_timestamp_seconds, rates_recovering
config      interval_seconds, max_plan_age_seconds, q_cap_requests_per_second,
            warm_slots_per_destination
pools       every metric above labelled {pool} (with a pools file); pool_failures_total{pool},
            pool_unclaimed_keys_total, pool_stranded_keys_total
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from planner_svc.control.delivery import CapacityVerdict, DeliveryReport
from planner_svc.control.guard import Mode
from planner_svc.control.traffic import expected_loads
from planner_svc.errors import NotFound
from planner_svc.orchestration.planner import PlannerStatus
from router_client.prom import labelled_union

PREFIX = "cacheroute_planner_"
ACTIONS = ("install", "keep", "skip", "fallback", "resume")
MODES = tuple(m.value for m in Mode)


def _delivery_of(planner: Any) -> DeliveryReport | None:
    try:
        return planner.delivery()  # type: ignore[no-any-return]
    except NotFound:
        return None  # nothing installed yet, or a fallback table (it predicts nothing)


def _delivery(r: DeliveryReport | None) -> Iterator[Metric]:
    """Did the installed plan deliver (planner_svc.control.delivery). Exported whenever a plan
    with a prediction is installed; NaN until there is a figure (a NaN gap never alerts)."""
    if r is None:
        return
    for name, help_, value in (
        ("plan_delivery_windows",
         "Windows measured against the plan's prediction (after its rewarm dip).", r.windows),
        ("plan_predicted_hit_ratio", "Served hit rate the plan predicted.", r.predicted.hit_rate),
        ("plan_realized_hit_ratio", "Served hit rate measured under the plan.", r.hit_rate),
        ("plan_hit_gap_ratio", "Realized minus predicted served hit rate.", r.hit_gap),
        ("plan_realized_imbalance_ratio", "Max/mean measured load under the plan.", r.imbalance),
    ):
        yield GaugeMetricFamily(PREFIX + name, help_,
                                value=math.nan if value is None else float(value))
    # One series per verdict, 1 on the current one: an alert can match the two misfits.
    verdicts = GaugeMetricFamily(
        PREFIX + "plan_capacity_verdict",
        "Is q_cap consistent with the p99 measured at the measured loads (1 = this verdict)?",
        labels=["verdict"])
    for v in CapacityVerdict:
        verdicts.add_metric([v.value], 1.0 if r.capacity.verdict is v else 0.0)
    yield verdicts
    utilisation = [u for u in r.utilisation if math.isfinite(u)]
    yield GaugeMetricFamily(PREFIX + "plan_realized_utilisation_ratio",
                            "Mean measured load over q_cap x weight under the plan.",
                            value=sum(utilisation) / len(utilisation) if utilisation else math.nan)


def _gauge(name: str, help_: str, value: float | None) -> Iterator[Metric]:
    if value is not None and math.isfinite(value):
        yield GaugeMetricFamily(PREFIX + name, help_, value=float(value))


def _labelled(
    name: str, help_: str, label: str, values: Mapping[str, float], counter: bool = False
) -> Metric:
    family = (CounterMetricFamily if counter else GaugeMetricFamily)(
        PREFIX + name, help_, labels=[label]
    )
    for key, value in values.items():
        if math.isfinite(value):
            family.add_metric([key], float(value))
    return family


def _ratio_max_over_mean(values: Iterable[float]) -> float | None:
    xs = [v for v in values if math.isfinite(v)]
    mean = sum(xs) / len(xs) if xs else 0.0
    return max(xs) / mean if mean > 0 else None


class PlannerCollector(Collector):
    """A custom collector over a running `planner_svc.orchestration.planner.Planner`."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner
        self._counted_through = -1  # id of the newest decision already counted
        self._decisions: Counter[str] = Counter({a: 0 for a in ACTIONS})
        self._count_lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # families depend on the planner's state; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        planner = self._planner
        with getattr(planner, "_lock", contextlib.nullcontext()):
            status = planner.status()
            decisions = list(planner.decisions)
            delivery = _delivery_of(planner)
            traffic, telemetry = planner.traffic, planner.telemetry
        yield from self._plan(status)
        yield from _delivery(delivery)
        yield from self._control(status, decisions)
        yield from self._traffic(status, traffic, telemetry)
        yield from self._stream(status, telemetry)
        yield from self._config(status.tunables)

    def _plan(self, s: PlannerStatus) -> Iterator[Metric]:
        installed = s.installed
        yield from _gauge("pinned", "1 while a rollback pins the plan.", float(s.pinned))
        if installed is None:
            return
        plan = installed.plan
        info = GaugeMetricFamily(
            PREFIX + "plan_info", "The installed plan.", labels=["version", "built_by"]
        )
        info.add_metric([str(plan.version), plan.config.built_by], 1.0)
        yield info
        yield from _gauge("plan_epoch", "Epoch of the installed plan version.", plan.version.epoch)
        yield from _gauge("plan_seq", "Sequence of the installed plan version.", plan.version.seq)
        yield from _gauge("plan_age_seconds", "Seconds since the plan was installed.",
                          s.installed_age_s)
        yield from _gauge("plan_created_timestamp_seconds", "When the plan was built (Unix).",
                          plan.created_at_ms / 1000.0)
        yield from _gauge("plan_build_seconds", "Seconds the installed plan took to build.",
                          plan.stats.build_seconds)
        yield from _gauge("plan_admitted_keys", "Keys the plan pins to destination sets.",
                          len(plan.table))
        yield from _gauge("plan_admitted_rate_ratio", "Share of traffic the plan admitted.",
                          plan.stats.admitted_rate_share)
        yield from _gauge("plan_imbalance_ratio", "Max/mean expected load when it was built.",
                          plan.stats.imbalance_max_over_mean)

    def _control(self, s: PlannerStatus, decisions: list[Any]) -> Iterator[Metric]:
        mode = str(s.mode)
        yield _labelled("mode", "1 for the mode routers are in.", "mode",
                        {m: float(m == mode) for m in MODES})
        yield _labelled("decisions", "Control decisions by action.", "action",
                        self._count(decisions), counter=True)
        installs = [d for d in decisions if str(d.action) == "install"]
        if installs:
            yield from _gauge("last_install_moved_traffic_ratio",
                              "Traffic share the latest install moved (its churn).",
                              installs[-1].moved_traffic_share)
        figures = s.figures
        if figures is not None:
            yield from self._figures(figures)
        yield from _gauge("staleness_accumulated_prefill_tokens",
                          "Staleness accumulated since the last install.", s.accumulated)

    def _figures(self, f: Any) -> Iterator[Metric]:
        yield from _gauge("candidate_moved_traffic_ratio",
                          "Traffic share the current candidate would move.", f.moved_traffic_share)
        yield from _gauge("drift_total_variation",
                          "Total variation of the admitted rate mass since the install.",
                          f.drift.total_variation)
        yield from _gauge("drift_admission_churn_ratio",
                          "Rate share that would enter or leave admission.",
                          f.drift.admission_churn_share)
        yield from _gauge("drift_imbalance_change", "Change of max/mean load since the install.",
                          f.drift.imbalance_change)
        rates = {"modelled": f.staleness_rate_modelled}
        if f.staleness_rate_measured is not None:
            rates["measured"] = f.staleness_rate_measured
        yield _labelled("staleness_rate_prefill_tokens_per_second",
                        "Prefill tokens/s lost by keeping the installed plan.", "estimate", rates)
        yield from _gauge("rewarm_cost_prefill_tokens",
                          "Prefill tokens installing the candidate would cost to rewarm.",
                          f.rewarm_cost)

    def _count(self, decisions: list[Any]) -> dict[str, float]:
        with self._count_lock:
            for d in decisions:
                if d.id > self._counted_through:
                    self._decisions[str(d.action)] += 1
            if decisions:
                self._counted_through = max(self._counted_through, decisions[-1].id)
            return {a: float(n) for a, n in self._decisions.items()}

    def _traffic(self, s: PlannerStatus, traffic: Any, telemetry: Any) -> Iterator[Metric]:
        installed = s.installed
        if installed is not None and traffic is not None:
            plan = installed.plan
            loads = dict(zip(plan.destination_ids, expected_loads(plan, traffic).tolist(),
                             strict=True))
            yield _labelled("destination_expected_load_requests_per_second",
                            "Requests/s the installed plan sends each destination at current "
                            "rates.", "destination", loads)
            yield from _gauge("expected_imbalance_ratio",
                              "Max/mean expected load at current rates.",
                              _ratio_max_over_mean(loads.values()))
            yield from _gauge("traffic_requests_per_second", "Measured total request rate.",
                              traffic.total_rate)
        yield _labelled("destination_draining", "1 while a destination drains.", "destination",
                        {d.id: float(d.draining) for d in s.destinations})
        if telemetry is None:
            return
        measured = dict(telemetry.destination_loads_per_s)
        yield _labelled("destination_measured_load_requests_per_second",
                        "Requests/s each destination received in the newest window.",
                        "destination", measured)
        yield from _gauge("measured_imbalance_ratio", "Max/mean measured destination load.",
                          _ratio_max_over_mean(measured.values()))
        hits = {"all": telemetry.hit_rate, "planned": telemetry.planned_hit_rate,
                "fallback": telemetry.fallback_hit_rate}
        yield _labelled("hit_ratio", "Token-weighted served KV hit rate in the newest window.",
                        "traffic", {k: v for k, v in hits.items() if v is not None})
        yield from _gauge("active_keys", "Keys active in the newest window.", telemetry.active_keys)
        if telemetry.p99_ms is not None:
            yield from _gauge("p99_e2e_seconds", "Worst destination's p99 end-to-end latency.",
                              telemetry.p99_ms / 1000.0)

    def _stream(self, s: PlannerStatus, telemetry: Any) -> Iterator[Metric]:
        yield from _gauge("rates_age_seconds", "Age of the newest complete rate window.",
                          s.rates_age_s)
        end_ms = getattr(self._planner, "rates_window_end_ms", 0)
        if end_ms:
            yield from _gauge("rates_window_end_timestamp_seconds",
                              "End of the newest complete rate window (Unix).", end_ms / 1000.0)
        yield from _gauge("rates_recovering", "1 while a stream worker rebuilds its state.",
                          float(s.rates_recovering))

    def _config(self, t: Any) -> Iterator[Metric]:
        yield from _gauge("interval_seconds", "Control interval.", t.interval_s)
        yield from _gauge("max_plan_age_seconds", "Plan age the guard tolerates.", t.max_plan_age_s)
        yield from _gauge("q_cap_requests_per_second", "Per-destination capacity knee.", t.q_cap)
        yield from _gauge("warm_slots_per_destination", "Warm-slot budget W.",
                          t.warm_slots_per_destination)


class PoolsCollector(Collector):
    """Every pool's planner metrics (PlannerCollector), each sample labelled with its
    `pool`, plus `pool_failures_total{pool}` and `pool_unclaimed_keys_total`. Unlabelled
    (`labelled=False`, a single pool from flags): the pool's metrics exactly as a
    single-pool planner always exposed them, so existing dashboards and alerts hold."""

    def __init__(self, pools: Any, *, labelled: bool = True) -> None:
        self._pools = pools  # planner_svc.orchestration.pools.PoolSet
        self._labelled = labelled
        self._collectors: dict[int, tuple[str, PlannerCollector]] = {}
        self._lock = threading.Lock()  # scrapes may overlap

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        units = self._pools.units()
        live = {id(u.planner): u for u in units}
        with self._lock:
            for gone in set(self._collectors) - set(live):
                del self._collectors[gone]  # a removed pool's counters go with it
            parts = [self._collectors.setdefault(
                ident, (unit.spec.name, PlannerCollector(unit.planner)))
                for ident, unit in live.items()]
        if self._labelled or len(parts) != 1:
            yield from labelled_union(parts, "pool")
        else:
            yield from parts[0][1].collect()
        failures = CounterMetricFamily(PREFIX + "pool_failures",
                                       "Failed control steps or inputs of a pool (the other "
                                       "pools carry on).", labels=["pool"])
        for unit in units:
            failures.add_metric([unit.spec.name], float(unit.failures))
        yield failures
        yield CounterMetricFamily(PREFIX + "pool_unclaimed_keys",
                                  "Window keys whose model no pool claims (not planned).",
                                  value=float(self._pools.unclaimed_keys))
        yield CounterMetricFamily(PREFIX + "pool_stranded_keys",
                                  "Window keys of a configured pool that is not running.",
                                  value=float(self._pools.stranded_keys))


def planner_registry(pools: Any, *, labelled: bool = True) -> CollectorRegistry:
    """A fresh registry holding the pools' collector (a bare Planner: its own collector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolsCollector(pools, labelled=labelled) if hasattr(pools, "units")
                      else PlannerCollector(pools))
    return registry


@dataclass
class MetricsServer:
    """A running `/metrics` HTTP endpoint; `close()` stops it."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_metrics_server(
    port: int, registry: CollectorRegistry, *, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve `registry` on http://host:port/metrics (port 0: a free one) in a daemon thread."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, int(server.server_port))


def serve_metrics(port: int, registry: CollectorRegistry, *, host: str = "127.0.0.1") -> int:
    """Start the endpoint for the life of the process; returns the bound port."""
    return start_metrics_server(port, registry, host=host).port
