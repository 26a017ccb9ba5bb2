"""`cacheroute gateway`: the reference edge gateway in front of the engines.

    cacheroute gateway --destinations e0=http://10.0.0.5:8000,e1=http://10.0.0.6:8000 \\
        --redis-url redis://redis:6379/0 --public-key planner-signing-key.pub.pem \\
        --bootstrap kafka:9092 --port 8000

Follows the planner's plan from Redis (verified with the pinned key); without
`--redis-url` it routes by power-of-two-choices over `--destinations` alone. With
`--bootstrap` it emits request, usage and error events to Kafka for the stream. Every
flag can also be given as `CACHEROUTE_GATEWAY_<FLAG>` (upper case, `-` as `_`).
Destination addresses come from `--destinations` first, else from the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

log = logging.getLogger("cacheroute.gateway")

# flag -> (type, default, help)
FLAGS: dict[str, tuple[type, Any, str]] = {
    "host": (str, "127.0.0.1", "listen address"),
    "port": (int, 8000, "listen port (0: any free port, printed at start)"),
    "router-id": (str, "", "this gateway's id in events and router status (default: host-pid)"),
    "destinations": (str, "", "comma-separated id[=http://host:port][*weight]"),
    "redis-url": (str, "", "follow the planner's plan from this Redis (else P2C only)"),
    "redis-namespace": (str, "cacheroute", "the planner's Redis namespace"),
    "public-key": (str, "", "the planner's public key (PEM) that plans must be signed with"),
    "cache-path": (str, "", "keep the last good plan here across restarts"),
    "bootstrap": (str, "", "Kafka bootstrap servers for telemetry events (else none)"),
    "events-topic": (str, "cacheroute.events", "Kafka topic for events"),
    "key-header": (str, "x-routing-key", "request header that names the routing key"),
    "prefix-chars": (int, 8192, "characters of leading content hashed into the key"),
    "prefix-user-turns": (int, 0, "user turns after the system prompt included in the key"),
    "session-header": (str, "x-session-id", "request header naming the conversation inside "
                       "a key ('' to use the first user turn only)"),
    "cold-tail": (str, "hash", "keys the plan does not admit: 'hash' (consistent hashing with "
                  "bounded loads) or 'p2c' (the paper's power-of-two-choices)"),
    "set-slack": (float, 0.5, "a conversation stays on its member of a replicated key's set "
                  "until that member's load is more than (1 + this) x the set's mean"),
    "tail-slack": (float, 0.25, "a cold-tail key stays on its hash owner until its load is more "
                   "than (1 + this) x the mean"),
    "connect-timeout-s": (float, 2.0, "upstream connect timeout"),
    "first-byte-timeout-s": (float, 300.0, "upstream time to the first response byte"),
    "idle-timeout-s": (float, 60.0, "longest silence between streamed chunks"),
    "max-inflight": (int, 256, "requests in flight per destination before it counts as full"),
    "max-retries": (int, 2, "attempts on other destinations when nothing was generated"),
    "max-body-bytes": (int, 8 << 20, "largest request body accepted"),
    "shutdown-grace-s": (float, 30.0, "how long in-flight requests may finish at shutdown"),
    "probe-path": (str, "/health", "active health probe path ('' disables probes)"),
    "probe-period-s": (float, 5.0, "seconds between probes of each destination"),
    "eject-after": (int, 5, "consecutive failures that eject a destination"),
    "ejection-s": (float, 30.0, "base ejection time (grows with repeated ejections)"),
    "max-plan-age-s": (float, 300.0, "route by P2C when the plan is older than this"),
}


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("gateway", help="the OpenAI-compatible edge gateway routed by the plan",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, (kind, default, text) in FLAGS.items():
        env = "CACHEROUTE_GATEWAY_" + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", type=kind, default=_env(env, kind, default),
                       help=f"{text} (default {default!r}; env {env})")
    p.set_defaults(func=cmd_gateway)


def _env(name: str, kind: type, default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: not a valid {kind.__name__}") from None


def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_gateway(args))
    return uvloop.run(run_gateway(args))


async def run_gateway(args: argparse.Namespace, ready: asyncio.Event | None = None) -> int:
    from router_client import signing
    from router_client.aio import AsyncRouterClient
    from router_client.gateway import Gateway, GatewaySettings
    from router_client.health import HealthPolicy, ProbeSettings
    from router_client.keys import KeyRule
    from router_client.plan import parse_destinations
    from router_client.source import AsyncStaticPlanSource, StaticPlanSource

    try:
        destinations = parse_destinations(args.destinations)
        settings = GatewaySettings(
            host=args.host, port=args.port,
            router_id=args.router_id or f"gateway-{os.uname().nodename}-{os.getpid()}",
            keys=KeyRule(header=args.key_header.lower(), prefix_chars=args.prefix_chars,
                         prefix_user_turns=args.prefix_user_turns,
                         affinity_header=args.session_header.lower()),
            connect_timeout_s=args.connect_timeout_s,
            first_byte_timeout_s=args.first_byte_timeout_s,
            idle_timeout_s=args.idle_timeout_s,
            max_inflight_per_destination=args.max_inflight, max_retries=args.max_retries,
            max_body_bytes=args.max_body_bytes, shutdown_grace_s=args.shutdown_grace_s)
        health = HealthPolicy(consecutive_failures=args.eject_after,
                              base_ejection_s=args.ejection_s,
                              max_ejection_s=max(args.ejection_s, 300.0))
        probe = (ProbeSettings(path=args.probe_path, period_s=args.probe_period_s)
                 if args.probe_path else None)
        if args.cold_tail not in ("hash", "p2c"):
            raise ValueError(f"--cold-tail {args.cold_tail!r}: use hash or p2c")
        if not (args.set_slack >= 0 and args.tail_slack >= 0):
            raise ValueError("--set-slack and --tail-slack must be >= 0")
    except ValueError as exc:
        raise SystemExit(f"cacheroute gateway: {exc}") from None
    source: Any
    if args.redis_url:
        if not args.public_key:
            raise SystemExit("cacheroute gateway: --redis-url needs --public-key (the planner's)")
        from router_client.redis_source import AsyncRedisPlanSource

        source = AsyncRedisPlanSource(args.redis_url, namespace=args.redis_namespace)
        keys = signing.pin([signing.load_public_key(args.public_key)])
    else:
        if not destinations:
            raise SystemExit("cacheroute gateway: give --destinations (or --redis-url)")
        static = StaticPlanSource()  # no plan ever: P2C over the destinations
        source = AsyncStaticPlanSource(static, poll_s=0.5)
        keys = static.public_keys
    client = AsyncRouterClient(
        source, router_id=settings.router_id, public_keys=keys,
        destination_ids=[d.id for d in destinations],
        addresses={d.id: d.address for d in destinations if d.address},
        cache_path=args.cache_path or None, max_plan_age_s=args.max_plan_age_s,
        health=health, probe=probe, cold_tail=args.cold_tail)
    client.core.set_slack, client.core.tail_slack = args.set_slack, args.tail_slack
    sink = None
    if args.bootstrap:
        from streams.emitter import EventEmitter

        sink = EventEmitter(args.bootstrap, args.events_topic, producer_id=settings.router_id)
    await client.start()
    gateway = Gateway(client, settings, sink=sink)
    await gateway.start()
    print(f"CACHEROUTE_GATEWAY={gateway.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("gateway %s: shutting down (grace %.0f s)", settings.router_id,
             settings.shutdown_grace_s)
    await gateway.stop()
    await client.stop()
    if sink is not None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(sink.close, 10.0)
    return 0

