"""`cacheroute epp`: CacheRoute as the endpoint picker of a Gateway API Inference Extension
gateway (Envoy's ext_proc protocol; see docs/deploy.md).

    cacheroute epp --destinations 10.0.0.5:8000,10.0.0.6:8000 \\
        --redis-url redis://redis:6379/0 --public-key planner-signing-key.pub.pem \\
        --bootstrap kafka:9092 --port 9002 --metrics-port 9090

Answers each request with `x-gateway-destination-endpoint: <ip:port>[,fallbacks]` (header
and `envoy.lb` metadata) from the planner's plan; without `--redis-url` it picks by
power-of-two-choices over `--destinations`. Health: the gRPC health service (`liveness`,
`readiness`, and the ext_proc service name); metrics on `--metrics-port`. Every flag can
also be given as `CACHEROUTE_EPP_<FLAG>` (upper case, `-` as `_`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from planner_svc.cli.console import command
from planner_svc.cli.edge_args import (
    ROUTING_FLAGS,
    Flags,
    add_flags,
    build_client,
    build_sink,
    key_rule,
    router_id,
    serve_until_signalled,
)

log = logging.getLogger("cacheroute.epp")

FLAGS: Flags = {
    "host": (str, "127.0.0.1", "listen address of the ext_proc gRPC server"),
    "port": (int, 9002, "ext_proc gRPC port (0: any free port, printed at start)"),
    "metrics-port": (int, 0, "Prometheus /metrics port (0: no metrics server)"),
    **ROUTING_FLAGS,
    "fallbacks": (int, 2, "endpoints after the primary the gateway may retry, in order"),
    "body-mode": (str, "full_duplex_streamed", "request body mode assumed when the gateway "
                  "sends no protocol_config: full_duplex_streamed, buffered, streamed or none"),
    "shutdown-grace-s": (float, 10.0, "how long open streams may finish at shutdown"),
    "max-streams": (int, 4096, "ext_proc streams served at once (past it: RESOURCE_EXHAUSTED)"),
    "max-buffered-bytes": (int, 256 << 20, "request-body bytes all streams may hold while "
                           "bodies arrive (past it a request is refused with 503)"),
    "request-timeout-s": (float, 30.0, "a stream's request must be routed within this of the "
                          "stream's start, else the stream is ended (DEADLINE_EXCEEDED)"),
    "stream-timeout-s": (float, 600.0, "the longest a stream (the whole HTTP request, streamed "
                         "answer included) is followed; then it is ended and counted out"),
    "otlp-endpoint": (str, "", "export OpenTelemetry traces over OTLP gRPC to this endpoint "
                      "(e.g. http://collector:4317; default: $OTEL_EXPORTER_OTLP_ENDPOINT, "
                      "else off); needs the tracing extra"),
}


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(sub, "epp", help="the endpoint picker for Gateway API Inference Extension "
                       "gateways (Envoy ext_proc)", description=__doc__)
    add_flags(p, FLAGS, "CACHEROUTE_EPP_")
    p.set_defaults(func=cmd_epp)


def cmd_epp(args: argparse.Namespace) -> int:
    return asyncio.run(run_epp(args))


async def run_epp(args: argparse.Namespace, ready: asyncio.Event | None = None) -> int:
    from planner_svc.cli.gateway_cmd import otlp_endpoint
    from router_client.epp import protocol
    from router_client.epp.exchange import EppSettings
    from router_client.epp.server import EndpointPickerServer

    rid = router_id(args, "epp")
    mode = protocol.BODY_MODES.get(args.body_mode)
    if mode is None or mode == protocol.BUFFERED_PARTIAL:
        raise SystemExit(f"cacheroute epp: --body-mode {args.body_mode!r}: use "
                         "full_duplex_streamed, buffered, streamed or none")
    try:
        settings = EppSettings(router_id=rid, keys=key_rule(args),
                               max_body_bytes=args.max_body_bytes,
                               max_inflight_per_destination=args.max_inflight,
                               fallbacks=args.fallbacks, default_request_mode=mode,
                               max_streams=args.max_streams,
                               max_buffered_bytes=args.max_buffered_bytes,
                               request_timeout_s=args.request_timeout_s,
                               stream_timeout_s=args.stream_timeout_s,
                               otlp_endpoint=otlp_endpoint(args.otlp_endpoint, "epp"))
    except ValueError as exc:
        raise SystemExit(f"cacheroute epp: {exc}") from None
    client = build_client(args, rid, "epp")
    sink = build_sink(args, rid)
    await client.start()
    epp = EndpointPickerServer(client, settings, sink=sink)
    port = await epp.start(f"{args.host}:{args.port}")
    print(f"CACHEROUTE_EPP={args.host}:{port}", flush=True)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.host, registry=epp.metrics.registry)
    return await serve_until_signalled(
        client, sink, lambda: epp.stop(args.shutdown_grace_s),
        f"endpoint picker {rid} (grace {args.shutdown_grace_s:.0f} s)", ready)
