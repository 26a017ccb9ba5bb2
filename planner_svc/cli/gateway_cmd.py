"""`cacheroute gateway`: the reference edge gateway in front of the engines.

    cacheroute gateway --destinations e0=http://10.0.0.5:8000,e1=http://10.0.0.6:8000 \\
        --redis-url redis://redis:6379/0 --public-key planner-signing-key.pub.pem \\
        --bootstrap kafka:9092 --port 8000

Follows the planner's plan from Redis (verified with the pinned key); without
`--redis-url` it routes every key by the hashed cold tail over `--destinations` alone. With
`--bootstrap` it emits request, usage and error events to Kafka for the stream. Every
flag can also be given as `CACHEROUTE_GATEWAY_<FLAG>` (upper case, `-` as `_`).
Destination addresses come from `--destinations` first, else from the plan.

Many models: `--pools-file pools.toml` (the planner's) routes each request by the pool that
claims its model, each pool with its own plan, namespace and destinations; `--pools a,b`
subscribes to some of them. A model no pool claims is answered with 404. The file is re-read
when it changes: pools added, removed or re-pointed are served from then on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from planner_svc.cli.console import command
from planner_svc.cli.edge_args import (
    ROUTING_FLAGS,
    Flags,
    add_flags,
    build_pool_clients,
    build_sink,
    key_rule,
    pool_client,
    read_pools,
    router_id,
    serve_until_signalled,
    served_pools,
)
from router_client.gateway.client_limits import (
    BUFFERED_BODY_BYTES,
    CLIENT_BUFFERED_BODY_BYTES,
    HEADER_TIMEOUT_S,
)

log = logging.getLogger("cacheroute.gateway")

FLAGS: Flags = {
    "host": (str, "127.0.0.1", "listen address"),
    "port": (int, 8000, "listen port (0: any free port, printed at start)"),
    **ROUTING_FLAGS,
    "connect-timeout-s": (float, 2.0, "upstream connect timeout"),
    "first-byte-timeout-s": (float, 300.0, "upstream time to the first response byte"),
    "idle-timeout-s": (float, 60.0, "longest silence between streamed chunks"),
    "max-connections": (int, 0, "client connections open at once; past it new ones are "
                        "closed (0: half the process's file-descriptor limit)"),
    "max-connections-per-client": (int, 0, "connections one client address may hold at once; "
                                   "past it 503 and closed (0: a quarter of --max-connections, "
                                   "at least 1,024)"),
    "header-timeout-s": (float, HEADER_TIMEOUT_S, "a new connection's first request head "
                         "must arrive within this, else it is closed (408 if part of it came)"),
    "max-buffered-bytes": (int, BUFFERED_BODY_BYTES, "request-body bytes all clients may hold "
                           "at once, from a body's first byte to its answer (past it 503)"),
    "max-buffered-bytes-per-client": (int, CLIENT_BUFFERED_BODY_BYTES, "request-body bytes one "
                                      "client address may hold at once (past it 413; 0: off, "
                                      "behind a proxy that hides client addresses)"),
    "request-timeout-s": (float, 30.0, "a client's request (headers and body) must arrive "
                          "within this from its first byte, else 408 and the connection "
                          "closes (a client trickling one holds a socket)"),
    "max-retries": (int, 2, "attempts on other destinations when nothing was generated"),
    "shutdown-grace-s": (float, 30.0, "how long in-flight requests may finish at shutdown"),
    "pools-file": (str, "", "route by pool: the planner's pools file (TOML); each request "
                   "goes to the pool that claims its model, with that pool's plan"),
    "pools": (str, "", "with --pools-file: only these pools (comma-separated; default all)"),
    "engine-load-period-s": (float, 0.0, "read each engine's running + waiting requests from "
                                         "its /metrics this often and route on the larger of "
                                         "that and the gateway's own count (0 = off)"),
    "otlp-endpoint": (str, "", "export OpenTelemetry traces over OTLP gRPC to this endpoint "
                      "(e.g. http://collector:4317; default: $OTEL_EXPORTER_OTLP_ENDPOINT, "
                      "else off); needs the tracing extra"),
}


def otlp_endpoint(given: str, command: str) -> str:
    """`--otlp-endpoint`, else OTEL_EXPORTER_OTLP_ENDPOINT ("" = tracing off); one line
    naming the extra when tracing is asked for and OpenTelemetry is not installed."""
    endpoint = given or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    try:
        found = not endpoint or importlib.util.find_spec(
            "opentelemetry.exporter.otlp.proto.grpc") is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise SystemExit(f"cacheroute {command}: --otlp-endpoint needs OpenTelemetry: "
                         "pip install 'cacheroute[tracing]'")
    return endpoint


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command(sub, "gateway", help="the OpenAI-compatible edge gateway routed by the plan",
                       description=__doc__)
    add_flags(p, FLAGS, "CACHEROUTE_GATEWAY_")
    p.set_defaults(func=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_gateway(args))
    return uvloop.run(run_gateway(args))


async def run_gateway(args: argparse.Namespace, ready: asyncio.Event | None = None) -> int:
    from router_client.gateway import Gateway, GatewaySettings

    rid = router_id(args, "gateway")
    try:
        settings = GatewaySettings(
            host=args.host, port=args.port, router_id=rid, keys=key_rule(args),
            connect_timeout_s=args.connect_timeout_s,
            first_byte_timeout_s=args.first_byte_timeout_s,
            idle_timeout_s=args.idle_timeout_s, request_timeout_s=args.request_timeout_s,
            max_connections=args.max_connections,
            max_connections_per_client=args.max_connections_per_client,
            header_timeout_s=args.header_timeout_s, max_buffered_bytes=args.max_buffered_bytes,
            max_buffered_bytes_per_client=args.max_buffered_bytes_per_client,
            max_inflight_per_destination=args.max_inflight, max_retries=args.max_retries,
            max_body_bytes=args.max_body_bytes, shutdown_grace_s=args.shutdown_grace_s,
            engine_load_period_s=args.engine_load_period_s,
            otlp_endpoint=otlp_endpoint(args.otlp_endpoint, "gateway"))
    except ValueError as exc:
        raise SystemExit(f"cacheroute gateway: {exc}") from None
    seen = _stat(Path(args.pools_file)) if args.pools_file else None
    clients, routes, specs = build_pool_clients(args, rid, "gateway")
    sink = build_sink(args, rid)
    for client in clients.values():
        await client.start()
    # Without a pools file: the one client, routed and reported exactly as before pools.
    gateway = (Gateway(clients, settings, sink=sink, routes=routes) if args.pools_file
               else Gateway(next(iter(clients.values())), settings, sink=sink))
    await gateway.start()
    follower = PoolsFollower(args, gateway, rid, specs, seen) if args.pools_file else None
    following = (asyncio.get_running_loop().create_task(follower.run())
                 if follower is not None else None)
    print(f"CACHEROUTE_GATEWAY={gateway.url}", flush=True)

    async def stop() -> None:
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        await gateway.stop()
        if follower is not None:
            await follower.stop_retiring()

    return await serve_until_signalled(
        gateway.clients, sink, stop,
        f"gateway {rid} (grace {settings.shutdown_grace_s:.0f} s)", ready)


class PoolsFollower:
    """Re-reads `--pools-file` when it changes: clients for new pools (and pools whose
    namespace changed) are started; a pool whose destinations changed keeps its client (its
    plan brings the new list; its health and in-flight counts carry on); removed pools'
    clients are stopped once their requests in flight had the shutdown grace to finish. A
    file that does not parse, or a pool whose client cannot be built or started, changes
    nothing: the error is logged (once per error) and the file read again next period."""

    def __init__(self, args: argparse.Namespace, gateway: Any, rid: str, specs: list[Any],
                 seen: tuple[int, int] | None, period_s: float = 2.0) -> None:
        self.args, self.gateway, self.rid, self.period_s = args, gateway, rid, period_s
        self.path = Path(args.pools_file)
        self.seen = seen  # the file as the running pools were built from it
        self.held = {s.name: s for s in served_pools(args, specs)}
        self.error = ""
        self.retiring: dict[Any, asyncio.Task[None]] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            now = _stat(self.path)
            if now == self.seen:
                continue
            try:
                await self.apply()
                self.seen, self.error = now, ""
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the follower must outlive any one bad change
                if str(exc) != self.error:
                    log.error("pools file not applied (the gateway serves as before): %s", exc)
                self.error = str(exc)

    async def apply(self) -> None:
        from router_client.pools import PoolRoutes

        args, gateway = self.args, self.gateway
        try:
            specs = read_pools(args)
        except SystemExit as exc:  # a flag-level refusal from build_client, as an error
            raise ValueError(str(exc)) from None
        base = args.redis_namespace
        clients: dict[str, Any] = {}
        fresh: list[Any] = []
        try:
            for spec in served_pools(args, specs):
                old = self.held.get(spec.name)
                if (old is not None and spec.name in gateway.clients
                        and old.namespace_of(base) == spec.namespace_of(base)):
                    clients[spec.name] = gateway.clients[spec.name]
                    continue
                try:
                    client = pool_client(args, spec, self.rid, "gateway")
                except SystemExit as exc:
                    raise ValueError(f"pool {spec.name}: {exc}") from None
                fresh.append(client)
                await client.start()
                clients[spec.name] = client
            gone = await gateway.set_pools(clients, PoolRoutes(specs))
        except BaseException:
            for client in fresh:  # started for a change that did not happen
                with contextlib.suppress(Exception):
                    await client.stop()
            raise
        self.held = {s.name: s for s in served_pools(args, specs)}
        log.info("pools file %s applied: serving %s", self.path, ", ".join(clients))
        for client in gone:
            self.retiring[client] = asyncio.get_running_loop().create_task(
                self._retire(client, gateway.settings.shutdown_grace_s))

    async def _retire(self, client: Any, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        self.retiring.pop(client, None)
        await client.stop()

    async def stop_retiring(self) -> None:
        """At shutdown: the clients still in their grace are stopped now."""
        for client, task in list(self.retiring.items()):
            task.cancel()
            with contextlib.suppress(Exception):
                await client.stop()
        self.retiring.clear()


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
