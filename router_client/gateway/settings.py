"""What a gateway operator can configure (one frozen object, built at the entry point)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router_client.gateway import client_limits
from router_client.keys import KeyRule


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0: the OS picks; `Gateway.port` tells which
    router_id: str = "gateway"
    keys: KeyRule = field(default_factory=KeyRule)
    # Upstream timeouts: connecting; the first byte of the response (for a non-streamed
    # request that is the whole generation); then the longest silence between chunks.
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 300.0
    idle_timeout_s: float = 60.0
    # At most this many requests in flight to one destination (and keep-alive connections
    # kept open to it); past it the gateway picks another or answers 503.
    max_inflight_per_destination: int = 256
    # Extra attempts on another destination, only when nothing can have been generated.
    max_retries: int = 2
    max_body_bytes: int = 8 << 20
    # A request (headers and body) must arrive within this from its first byte (else 408):
    # a client that trickles one holds a connection and a socket while it does.
    request_timeout_s: float = 30.0
    # Client connections open at once (0: half the process's file-descriptor limit), and
    # from one client address (0: client_limits.connections_per_client; past it 503).
    max_connections: int = 0
    max_connections_per_client: int = 0
    # A new connection's first request head must be complete within this of its opening.
    header_timeout_s: float = client_limits.HEADER_TIMEOUT_S
    # Request-body bytes held at once by all clients (past it 503) and by one client address
    # (past it 413; 0: no per-client share, for a gateway behind a proxy that hides them).
    max_buffered_bytes: int = client_limits.BUFFERED_BODY_BYTES
    max_buffered_bytes_per_client: int = client_limits.CLIENT_BUFFERED_BODY_BYTES
    shutdown_grace_s: float = 30.0
    models_cache_s: float = 5.0
    # Answer with `x-cacheroute-destination` (which destination served the request).
    expose_destination: bool = True
    # Read each engine's own load from its /metrics this often and decide on the larger of
    # it and the gateway's own in-flight count (gateway.engine_load); 0 = off.
    engine_load_period_s: float = 0.0
    engine_load_timeout_s: float = 0.5
    # Traces (router_client.tracing, the `tracing` extra): a span per request and per engine
    # call, exported over OTLP gRPC to this endpoint (e.g. http://collector:4317); "" = off.
    otlp_endpoint: str = ""

    def __post_init__(self) -> None:
        positive = {
            "connect_timeout_s": self.connect_timeout_s,
            "first_byte_timeout_s": self.first_byte_timeout_s,
            "idle_timeout_s": self.idle_timeout_s,
            "max_inflight_per_destination": self.max_inflight_per_destination,
            "max_body_bytes": self.max_body_bytes,
            "request_timeout_s": self.request_timeout_s,
            "header_timeout_s": self.header_timeout_s,
            "max_buffered_bytes": self.max_buffered_bytes,
        }
        bad = [name for name, value in positive.items() if not value > 0]
        if bad:
            raise ValueError(f"must be > 0: {', '.join(bad)}")
        if not (self.engine_load_period_s >= 0 and self.engine_load_timeout_s > 0):
            raise ValueError("engine_load_period_s must be >= 0 (0 = off), "
                             "engine_load_timeout_s > 0")
        if self.max_connections < 0 or self.max_connections_per_client < 0:
            raise ValueError("max_connections must be >= 0 (0 = half the descriptor limit), "
                             "max_connections_per_client >= 0 (0 = a quarter of that)")
        if self.max_buffered_bytes_per_client < 0:
            raise ValueError("max_buffered_bytes_per_client must be >= 0 (0 = off)")
        if self.max_retries < 0 or self.shutdown_grace_s < 0:
            raise ValueError("max_retries and shutdown_grace_s must be >= 0")
