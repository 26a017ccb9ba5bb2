"""The endpoint picker's Prometheus metrics (prometheus_client), in a registry of its own.

cacheroute_epp_decisions_total{mode}          requests routed (mode: planned / fallback)
cacheroute_epp_decision_seconds               key + pick, inside the picker (histogram)
cacheroute_epp_refused_total{kind}            immediate responses: overloaded (no endpoint),
                                              invalid_request_error (bad or oversized body)
cacheroute_epp_completed_total{code}          requests whose response ended, by status class
cacheroute_epp_usage_seen_total               responses that reported usage (cached tokens)
cacheroute_epp_streams_failed_total           ext_proc streams that broke (gateway gone)
cacheroute_epp_streams_expired_total          ext_proc streams ended at their deadline
cacheroute_epp_inflight{destination}          requests in flight per destination
plus the router client's cacheroute_router_* (router_client.prom).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router_client.prom import RouterCollector

if TYPE_CHECKING:
    from router_client.client_base import BaseRouterClient

_DECISION_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)


class _Inflight(Collector):
    def __init__(self, client: BaseRouterClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("cacheroute_epp_inflight",
                                   "Requests in flight per destination.", labels=["destination"])
        core = self.client.core
        for dest, n in zip(core.destination_ids, core.inflight, strict=False):
            family.add_metric([dest], n)
        yield family


class EppMetrics:
    def __init__(self, client: BaseRouterClient | None = None) -> None:
        self.registry = r = CollectorRegistry()
        self.decisions = Counter("cacheroute_epp_decisions", "Requests routed, by mode.",
                                 ["mode"], registry=r)
        self.seconds = Histogram("cacheroute_epp_decision_seconds",
                                 "Key derivation and pick, per request.",
                                 buckets=_DECISION_BUCKETS, registry=r)
        self.refused = Counter("cacheroute_epp_refused", "Immediate responses, by kind.",
                               ["kind"], registry=r)
        self.completed = Counter("cacheroute_epp_completed",
                                 "Requests whose response ended, by status class.", ["code"],
                                 registry=r)
        self.usage_seen = Counter("cacheroute_epp_usage_seen",
                                  "Responses that reported usage.", registry=r)
        self.streams_failed = Counter("cacheroute_epp_streams_failed",
                                      "ext_proc streams that broke.", registry=r)
        self.streams_expired = Counter("cacheroute_epp_streams_expired",
                                       "ext_proc streams ended at their deadline.", registry=r)
        if client is not None:
            r.register(_Inflight(client))
            r.register(RouterCollector(client))
        self._mode: dict[str, Counter] = {}

    def decided(self, mode: str, seconds: float) -> None:
        child = self._mode.get(mode)
        if child is None:  # label lookups cost a lock and a dict: cache the children
            child = self._mode[mode] = self.decisions.labels(mode)
        child.inc()
        self.seconds.observe(seconds)
