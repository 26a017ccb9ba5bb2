"""What every edge process that routes by the plan shares on its command line: where the
plan comes from, the engines, the key rule, health and telemetry (`cacheroute gateway` and
`cacheroute epp`). Every flag can also be given as `<PREFIX><FLAG>` in the environment
(upper case, `-` as `_`); a bad value there is a one-line error, not a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from router_client.ring import DEFAULT_TAIL_SLACK
from router_client.routing import (
    BALANCES,
    DEFAULT_HISTORY_SLACK,
    DEFAULT_IDLE_REHOME_S,
    DEFAULT_QUEUE_AWARE,
)

log = logging.getLogger("cacheroute.edge")

# flag -> (type, default, help)
Flags = dict[str, tuple[Callable[[str], Any], Any, str]]


def boolean(raw: str) -> bool:
    """An on/off flag's value: on/off, true/false, yes/no, 1/0."""
    value = raw.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise ValueError(f"{raw!r} is not on or off")

ROUTING_FLAGS: Flags = {
    "router-id": (str, "", "this router's id in events and router status (default: host-pid)"),
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
    "history-slack": (float, DEFAULT_HISTORY_SLACK,
                      "a conversation's next turn goes back to where its last turn went (its "
                      "history is cached there) until that destination's load is more than "
                      "(1 + this) x the mean; < 0 turns this off"),
    "history-share-period-s": (float, 0.05, "with --redis-url: tell the plan's other routers "
                               "where this one's conversations went, this often, and learn "
                               "where theirs did, so a turn that reaches another replica "
                               "still meets its history (0 = off)"),
    "idle-rehome-s": (float, DEFAULT_IDLE_REHOME_S,
                      "a key not planned on several destinations and idle this long is cold "
                      "wherever it was: it goes where the balance sends it and stays there "
                      "while it comes back sooner (with --idle-rehome-learn, where the "
                      "learned window starts; 0 = off, the paper's). Paused while other "
                      "routers report on the same plan (see --idle-rehome-with-peers)"),
    "idle-rehome-with-peers": (boolean, False,
                               "keep idle re-homing on while other routers report on the "
                               "same plan: only behind a front that sends each key to one "
                               "router (each router keeps its own idle clocks, and replicas "
                               "that each see part of a key's traffic scatter it; "
                               "docs/gateway.md)"),
    "idle-rehome-learn": (boolean, True, "with --idle-rehome-s: learn the window from "
                          "what comes back: a key sent home after an idle gap either finds "
                          "its prefix cached there or not (the response's cached tokens), "
                          "and the window moves to the gap that separates the two; "
                          "--idle-rehome-s is where it starts ('off': keep it as given)"),
    "spill-planned": (boolean, True,
                      "with --idle-rehome-s: a planned key back within the window to its "
                      "plan's destination, now over its bound, sends this request elsewhere "
                      "and keeps its home there ('off': it re-homes where the request went)"),
    "queue-aware": (boolean, DEFAULT_QUEUE_AWARE,
                    "weigh each request's queue at the destination its plan, home or "
                    "conversation picks against a recompute elsewhere: the prefill work this "
                    "router's requests awaiting a first token owe each destination (prompt "
                    "sizes from the bodies, the history's share taken as cached where the "
                    "conversation went), and the request goes to the least-owed one (of its "
                    "key's replicas, for a key the plan replicates) when that would finish "
                    "prefilling it clearly sooner (its conversation follows, its key keeps "
                    "its home; 'off': the plan, home and conversation alone "
                    "decide)"),
    "tail-slack": (float, DEFAULT_TAIL_SLACK, "a cold-tail key stays on its hash owner (where "
                   "its prefix is cached) until that owner's load is more than (1 + this) x "
                   "the mean"),
    "balance": (str, "first-token", "where no plan or key decides (fallback, no plan, the "
                "cold tail's overflow): 'first-token' (the destination with the fewest of this "
                "router's requests awaiting a first token) or 'p2c' (the paper's "
                "power-of-two-choices on in-flight requests)"),
    "max-inflight": (int, 256, "requests in flight per destination before it counts as full"),
    "max-body-bytes": (int, 8 << 20, "largest request body accepted"),
    "probe-path": (str, "/health", "active health probe path ('' disables probes)"),
    "probe-period-s": (float, 5.0, "seconds between probes of each destination"),
    "eject-after": (int, 5, "consecutive failures that eject a destination"),
    "ejection-s": (float, 30.0, "base ejection time (grows with repeated ejections)"),
    "max-plan-age-s": (float, 300.0, "route by P2C when the plan is older than this"),
}


def add_flags(parser: argparse.ArgumentParser, flags: Flags, env_prefix: str) -> None:
    for flag, (kind, default, text) in flags.items():
        env = env_prefix + flag.upper().replace("-", "_")
        parser.add_argument(f"--{flag}", type=kind, default=_env(env, kind, default),
                            help=f"{text} (env {env})")


def _env(name: str, kind: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        what = getattr(kind, "__name__", "value")
        raise SystemExit(f"{name}={raw!r}: not a valid {what}") from None


def router_id(args: argparse.Namespace, role: str) -> str:
    return str(args.router_id or f"{role}-{os.uname().nodename}-{os.getpid()}")


def key_rule(args: argparse.Namespace) -> Any:
    from router_client.keys import KeyRule

    return KeyRule(header=args.key_header.lower(), prefix_chars=args.prefix_chars,
                   prefix_user_turns=args.prefix_user_turns,
                   affinity_header=args.session_header.lower())


def build_client(args: argparse.Namespace, rid: str, command: str) -> Any:
    """The started-later AsyncRouterClient the flags describe; SystemExit with a one-line
    reason when they do not fit together."""
    from router_client import signing
    from router_client.aio import AsyncRouterClient
    from router_client.eviction_window import EvictionWindow
    from router_client.health import HealthPolicy, ProbeSettings
    from router_client.plan import parse_destinations
    from router_client.source import AsyncStaticPlanSource, StaticPlanSource

    try:
        destinations = parse_destinations(args.destinations)
        health = HealthPolicy(consecutive_failures=args.eject_after,
                              base_ejection_s=args.ejection_s,
                              max_ejection_s=max(args.ejection_s, 300.0))
        probe = (ProbeSettings(path=args.probe_path, period_s=args.probe_period_s)
                 if args.probe_path else None)
        if args.cold_tail not in ("hash", "p2c"):
            raise ValueError(f"--cold-tail {args.cold_tail!r}: use hash or p2c")
        if args.balance not in BALANCES:
            raise ValueError(f"--balance {args.balance!r}: use {' or '.join(BALANCES)}")
        if not (args.set_slack >= 0 and args.tail_slack >= 0):
            raise ValueError("--set-slack and --tail-slack must be >= 0")
        if args.history_slack != args.history_slack:
            raise ValueError("--history-slack must be a number")
        if not (args.idle_rehome_s >= 0 and args.idle_rehome_s < float("inf")):
            raise ValueError("--idle-rehome-s must be a finite number >= 0 (0 = off)")
        if not args.history_share_period_s >= 0:
            raise ValueError("--history-share-period-s must be >= 0 (0 = off)")
    except ValueError as exc:
        raise SystemExit(f"cacheroute {command}: {exc}") from None
    source: Any
    if args.redis_url:
        if not args.public_key:
            raise SystemExit(f"cacheroute {command}: --redis-url needs --public-key "
                             "(the planner's)")
        from router_client.redis_source import AsyncRedisPlanSource

        source = AsyncRedisPlanSource(args.redis_url, namespace=args.redis_namespace)
        keys = signing.pin([signing.load_public_key(args.public_key)])
    else:
        if not destinations:
            raise SystemExit(f"cacheroute {command}: give --destinations (or --redis-url)")
        static = StaticPlanSource()  # no plan ever: P2C over the destinations
        source = AsyncStaticPlanSource(static, poll_s=0.5)
        keys = static.public_keys
    client = AsyncRouterClient(
        source, router_id=rid, public_keys=keys,
        destination_ids=[d.id for d in destinations],
        addresses={d.id: d.address for d in destinations if d.address},
        cache_path=args.cache_path or None, max_plan_age_s=args.max_plan_age_s,
        health=health, probe=probe, cold_tail=args.cold_tail)
    client.core.set_slack, client.core.tail_slack = args.set_slack, args.tail_slack
    client.core.balance = args.balance
    client.core.history_slack = args.history_slack if args.history_slack >= 0 else None
    client.core.idle_rehome_s = args.idle_rehome_s or None
    if args.idle_rehome_s and args.idle_rehome_learn:
        client.core.learn_idle_rehome(EvictionWindow(args.idle_rehome_s))
    client.core.spill_planned = args.spill_planned
    client.core.queue_aware = args.queue_aware
    client.rehome_with_peers = args.idle_rehome_with_peers
    # With a plan in Redis other routers may share it: paused until the first status
    # report says how many (`_note_peers`, within a second).
    client.core.rehome_paused = bool(args.redis_url) and not args.idle_rehome_with_peers
    if args.redis_url and args.history_share_period_s > 0 and client.core.history_slack is not None:
        from router_client.redis_history import RedisHistoryExchange

        client.companions.append(RedisHistoryExchange(
            client.core, args.redis_url, router_id=rid, namespace=args.redis_namespace,
            period_s=args.history_share_period_s))
    return client


def build_pool_clients(args: argparse.Namespace, rid: str,
                       command: str) -> tuple[dict[str, Any], Any, list[Any]]:
    """One router client per pool of `--pools-file` (only those `--pools` names, if given),
    each on its pool's Redis namespace and destinations, the routes from model to pool and
    the pools read; without a pools file, the one client of the flags and every model."""
    from router_client.pools import DEFAULT_POOL, PoolRoutes, PoolsError

    if not args.pools_file:
        if args.pools:
            raise SystemExit(f"cacheroute {command}: --pools needs --pools-file")
        return {DEFAULT_POOL: build_client(args, rid, command)}, PoolRoutes.single(), []
    try:
        specs = read_pools(args)
    except (OSError, PoolsError) as exc:
        raise SystemExit(f"cacheroute {command}: --pools-file: {exc}") from None
    unknown = set(wanted_pools(args)) - {s.name for s in specs}
    if unknown:
        raise SystemExit(f"cacheroute {command}: --pools: no pool {sorted(unknown)} in "
                         f"{args.pools_file}")
    # Routes from every pool (a model of a pool served elsewhere is told so, never sent to
    # the '*' pool's engines); clients for the wanted ones.
    clients = {spec.name: pool_client(args, spec, rid, command)
               for spec in served_pools(args, specs)}
    return clients, PoolRoutes(specs), specs


def read_pools(args: argparse.Namespace) -> Any:
    """The pools of `--pools-file` (PoolsError / OSError with the reason)."""
    from router_client.pools import parse_pools

    with open(args.pools_file, "rb") as f:
        return parse_pools(f.read(), source=args.pools_file,
                           base_namespace=args.redis_namespace)


def wanted_pools(args: argparse.Namespace) -> list[str]:
    return [p.strip() for p in args.pools.split(",") if p.strip()]


def served_pools(args: argparse.Namespace, specs: Any) -> list[Any]:
    """The pools of `specs` this router serves (`--pools`, default all)."""
    wanted = wanted_pools(args)
    return [s for s in specs if not wanted or s.name in wanted]


def pool_client(args: argparse.Namespace, spec: Any, rid: str, command: str) -> Any:
    """The (not yet started) router client of one pool: its namespace and destinations."""
    from router_client.pools import DEFAULT_POOL

    pool_args = argparse.Namespace(**{
        **vars(args), "destinations": ",".join(spec.destinations),
        "redis_namespace": spec.namespace_of(args.redis_namespace),
        "cache_path": (f"{args.cache_path}.{spec.name}"
                       if args.cache_path and spec.name != DEFAULT_POOL else args.cache_path)})
    return build_client(pool_args, rid, command)


def build_sink(args: argparse.Namespace, rid: str) -> Any:
    """The Kafka event emitter, or None without --bootstrap."""
    if not args.bootstrap:
        return None
    from streams.emitter import EventEmitter

    return EventEmitter(args.bootstrap, args.events_topic, producer_id=rid)


async def serve_until_signalled(client: Any, sink: Any, stop_server: Callable[[], Awaitable[Any]],
                                what: str, ready: asyncio.Event | None = None) -> int:
    """Run a started edge server until SIGTERM / SIGINT, then stop it (its own grace),
    the router client (or each of a list or pool -> client dict), and flush the event
    emitter."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("%s: shutting down", what)
    await stop_server()
    clients = list(client.values()) if isinstance(client, dict) else (
        client if isinstance(client, list) else [client])
    for each in clients:  # (a dict: the gateway's pools as they are at the end)
        await each.stop()
    if sink is not None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(sink.close, 10.0)
    return 0
