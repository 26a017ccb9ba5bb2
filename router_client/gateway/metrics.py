"""The gateway's Prometheus metrics (prometheus_client), in a registry of its own.

cacheroute_gateway_requests_total{route,code}          answered requests
cacheroute_gateway_request_seconds{route}              time to the last byte (histogram)
cacheroute_gateway_ttft_seconds                        streamed: time to the first event
cacheroute_gateway_upstream_failures_total{kind}       connect_error, reset, http_5xx, timeout
cacheroute_gateway_retries_total{kind}                 attempts sent elsewhere, by failure
cacheroute_gateway_saturated_total                     503s: every destination at its cap
cacheroute_gateway_streams_broken_total                streams cut short (upstream failure)
cacheroute_gateway_inflight{destination[,pool]}        requests in flight (at scrape time)
cacheroute_gateway_client_connections                  open client connections
cacheroute_gateway_slow_requests_total                 408s: a request not received in time
cacheroute_gateway_refused_connections_total           connections closed at --max-connections
cacheroute_gateway_refused_client_connections_total    503s: --max-connections-per-client held
cacheroute_gateway_late_heads_total                    closed: no head in --header-timeout-s
cacheroute_gateway_refused_bodies_total                413 / 503: past a body-memory budget
cacheroute_gateway_buffered_body_bytes                 request-body bytes held (at scrape time)
plus the router client's cacheroute_router_* (router_client.prom); a gateway routing by pool
(--pools-file) labels both with the pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router_client.prom import RouterCollector, labelled_union

if TYPE_CHECKING:
    from router_client.aio import AsyncRouterClient
    from router_client.gateway.http11 import HttpServer

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Inflight(Collector):
    def __init__(self, clients: Mapping[str, AsyncRouterClient], pools: bool) -> None:
        self.clients, self.pools = clients, pools

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("cacheroute_gateway_inflight",
                                   "Requests in flight per destination.",
                                   labels=["destination", "pool"] if self.pools
                                   else ["destination"])
        for pool, client in self.clients.items():
            core = client.core
            for dest, n in zip(core.destination_ids, core.inflight, strict=False):
                family.add_metric([dest, pool] if self.pools else [dest], n)
        yield family


class _Server(Collector):
    """What the client side of the HTTP server holds and refused (read at scrape time)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("cacheroute_gateway_client_connections",
                                "Open client connections.", value=self.server.connections)
        yield CounterMetricFamily("cacheroute_gateway_slow_requests",
                                  "Requests refused with 408: not received within "
                                  "--request-timeout-s of their first byte.",
                                  value=self.server.slow_requests)
        yield CounterMetricFamily("cacheroute_gateway_refused_connections",
                                  "Client connections closed at once: --max-connections "
                                  "were open.", value=self.server.refused_connections)
        yield CounterMetricFamily("cacheroute_gateway_refused_client_connections",
                                  "Client connections answered 503 and closed: their address "
                                  "held --max-connections-per-client.",
                                  value=self.server.refused_client_connections)
        yield CounterMetricFamily("cacheroute_gateway_late_heads",
                                  "Client connections closed: no complete request head within "
                                  "--header-timeout-s of opening.", value=self.server.late_heads)
        yield CounterMetricFamily("cacheroute_gateway_refused_bodies",
                                  "Requests refused past --max-buffered-bytes (503) or "
                                  "--max-buffered-bytes-per-client (413).",
                                  value=self.server.refused_bodies)
        yield GaugeMetricFamily("cacheroute_gateway_buffered_body_bytes",
                                "Request-body bytes held by client connections.",
                                value=self.server.ledger.held)


class _Routers(Collector):
    """Each pool's router client metrics (router_client.prom), labelled with the pool (a
    gateway without pools: its one client's, unlabelled, as before pools)."""

    def __init__(self, clients: Mapping[str, AsyncRouterClient], pools: bool) -> None:
        self.clients, self.pools = clients, pools  # the gateway's live view (pools change)

    def collect(self) -> Iterator[Metric]:
        parts = [(pool, RouterCollector(c)) for pool, c in list(self.clients.items())]
        if self.pools:
            yield from labelled_union(parts, "pool")
        else:
            for _, collector in parts:
                yield from collector.collect()


class GatewayMetrics:
    def __init__(self, clients: Mapping[str, AsyncRouterClient], *, pools: bool = False) -> None:
        """`pools`: the gateway routes by pool (its metrics carry a `pool` label)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("cacheroute_gateway_requests", "Answered requests.",
                                ["route", "code"], registry=r)
        self.seconds = Histogram("cacheroute_gateway_request_seconds",
                                 "Time from request to last byte.", ["route"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("cacheroute_gateway_ttft_seconds",
                              "Streamed requests: time to the first event.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.failures = Counter("cacheroute_gateway_upstream_failures",
                                "Upstream failures by kind.", ["kind"], registry=r)
        self.retries = Counter("cacheroute_gateway_retries",
                               "Attempts sent to another destination, by the failure before.",
                               ["kind"], registry=r)
        self.saturated = Counter("cacheroute_gateway_saturated",
                                 "Requests refused because every destination was at its cap.",
                                 registry=r)
        self.broken = Counter("cacheroute_gateway_streams_broken",
                              "Streams cut short by an upstream failure.", registry=r)
        r.register(_Inflight(clients, pools))
        r.register(_Routers(clients, pools))
        self._answered: dict[tuple[str, int], Counter] = {}

    def watch_server(self, server: HttpServer) -> None:
        self.registry.register(_Server(server))

    def answered(self, route: str, code: int, seconds: float) -> None:
        child = self._answered.get((route, code))
        if child is None:  # label lookups cost a lock and a dict: cache the children
            child = self._answered[(route, code)] = self.requests.labels(route, str(code))
        child.inc()
        self.seconds.labels(route).observe(seconds)
