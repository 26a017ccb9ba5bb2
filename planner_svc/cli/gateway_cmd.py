"""`cacheroute gateway`: the reference edge gateway in front of the engines.

    cacheroute gateway --destinations e0=http://10.0.0.5:8000,e1=http://10.0.0.6:8000 \\
        --redis-url redis://redis:6379/0 --public-key planner-signing-key.pub.pem \\
        --bootstrap kafka:9092 --port 8000

Follows the planner's plan from Redis (verified with the pinned key); without
`--redis-url` it routes by power-of-two-choices over `--destinations` alone. With
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
import logging
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

log = logging.getLogger("cacheroute.gateway")

FLAGS: Flags = {
    "host": (str, "127.0.0.1", "listen address"),
    "port": (int, 8000, "listen port (0: any free port, printed at start)"),
    **ROUTING_FLAGS,
    "connect-timeout-s": (float, 2.0, "upstream connect timeout"),
    "first-byte-timeout-s": (float, 300.0, "upstream time to the first response byte"),
    "idle-timeout-s": (float, 60.0, "longest silence between streamed chunks"),
    "max-retries": (int, 2, "attempts on other destinations when nothing was generated"),
    "shutdown-grace-s": (float, 30.0, "how long in-flight requests may finish at shutdown"),
    "pools-file": (str, "", "route by pool: the planner's pools file (TOML); each request "
                   "goes to the pool that claims its model, with that pool's plan"),
    "pools": (str, "", "with --pools-file: only these pools (comma-separated; default all)"),
    "engine-load-period-s": (float, 0.0, "read each engine's running + waiting requests from "
                                         "its /metrics this often and route on the larger of "
                                         "that and the gateway's own count (0 = off)"),
}


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
            idle_timeout_s=args.idle_timeout_s,
            max_inflight_per_destination=args.max_inflight, max_retries=args.max_retries,
            max_body_bytes=args.max_body_bytes, shutdown_grace_s=args.shutdown_grace_s,
            engine_load_period_s=args.engine_load_period_s)
    except ValueError as exc:
        raise SystemExit(f"cacheroute gateway: {exc}") from None
    clients, routes = build_pool_clients(args, rid, "gateway")
    sink = build_sink(args, rid)
    for client in clients.values():
        await client.start()
    # Without a pools file: the one client, routed and reported exactly as before pools.
    gateway = (Gateway(clients, settings, sink=sink, routes=routes) if args.pools_file
               else Gateway(next(iter(clients.values())), settings, sink=sink))
    await gateway.start()
    following = (asyncio.get_running_loop().create_task(follow_pools_file(args, gateway, rid))
                 if args.pools_file else None)
    print(f"CACHEROUTE_GATEWAY={gateway.url}", flush=True)

    async def stop() -> None:
        if following is not None:
            following.cancel()
        await gateway.stop()

    return await serve_until_signalled(
        gateway.clients, sink, stop,
        f"gateway {rid} (grace {settings.shutdown_grace_s:.0f} s)", ready)


async def follow_pools_file(args: argparse.Namespace, gateway: Any, rid: str,
                            period_s: float = 2.0) -> None:
    """Re-read `--pools-file` when it changes: clients for new pools (and pools whose
    namespace or destinations changed) are started, removed pools' clients stopped once
    their requests in flight had the shutdown grace to finish. A file that does not parse,
    or a pool whose client cannot be built, changes nothing (the error is logged)."""
    from router_client.pools import PoolRoutes, PoolsError

    path = Path(args.pools_file)
    seen = _stat(path)
    held = {s.name: s for s in served_pools(args, read_pools(args))}
    while True:
        await asyncio.sleep(period_s)
        now = _stat(path)
        if now == seen:
            continue
        seen = now
        try:
            specs = read_pools(args)
            clients: dict[str, Any] = {}
            fresh = []
            for spec in served_pools(args, specs):
                old = held.get(spec.name)
                same = (old is not None and old.destinations == spec.destinations
                        and old.namespace_of(args.redis_namespace)
                        == spec.namespace_of(args.redis_namespace))
                if same and spec.name in gateway.clients:
                    clients[spec.name] = gateway.clients[spec.name]
                else:
                    clients[spec.name] = pool_client(args, spec, rid, "gateway")
                    fresh.append(clients[spec.name])
            for client in fresh:
                await client.start()
            gone = await gateway.set_pools(clients, PoolRoutes(specs))
        except (OSError, PoolsError, ValueError, SystemExit) as exc:
            log.error("pools file not applied (the gateway serves as before): %s", exc)
            continue
        held = {s.name: s for s in served_pools(args, specs)}
        log.info("pools file %s applied: serving %s", path, ", ".join(clients))
        for client in gone:
            asyncio.get_running_loop().create_task(
                _stop_after(client, gateway.settings.shutdown_grace_s))


async def _stop_after(client: Any, grace_s: float) -> None:
    await asyncio.sleep(grace_s)
    await client.stop()


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
