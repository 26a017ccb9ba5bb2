"""Plans from Redis: the only module of router_client that imports redis (the routers'
shared conversation memory, router_client.redis_history, borrows its client and errors).

Follows `router_client.layout`. One server, Redis Cluster or a Sentinel-managed primary,
named by one URL (router_client.redis_topology); `connect` makes the redis-py client for
it, for the routers here and for the planner's publisher alike. One command connection
(GET / MGET / status writes) and one pub/sub connection for change hints (sharded pub/sub
on a cluster). Every Redis or socket
error is translated once, here, into `SourceUnavailable`; the client then keeps
routing on its last good plan and calls again after a jittered backoff.

Dead or half-open connections: every command has a socket timeout (1 s by
default) and the client re-checks the pointer every second, so a connection that
stops answering is noticed within about 2 s; the pub/sub connection is pinged
each second as well and is rebuilt when a ping goes unanswered. Connection
options (password, ACL user, TLS via ``rediss://`` and ``ssl_*`` options) pass
straight through to redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from google.protobuf.message import DecodeError
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from cacheroute.v1 import plan_pb2
from router_client.layout import (
    DEFAULT_NAMESPACE,
    ROUTER_STATUS_TTL_S,
    Layout,
    Pointer,
    version_member,
)
from router_client.plan import Version
from router_client.redis_topology import CLUSTER, SENTINEL, RedisTopology, parse_redis_url
from router_client.source import SourceUnavailable

log = logging.getLogger("router_client")
# (a cluster that lost a slot's every node raises RedisClusterException, not a RedisError)
REDIS_ERRORS = (redis.RedisError, OSError, redis.exceptions.RedisClusterException)

def _delta_members(layout: Layout, after: Version, upto: Version) -> tuple[str, str, str]:
    """ZRANGEBYLEX bounds of the versions in (after, upto] on the versions index."""
    return layout.versions, "(" + version_member(after), "[" + version_member(upto)


def _deltas(layout: Layout, members: list[bytes], limit: int) -> list[str] | None:
    """The delta keys of `members`, or None when the chain is empty or longer than `limit`
    (the caller then fetches the full plan). Two plain reads instead of a script: routers
    may not run Lua (a script is a way to hang Redis for everyone), and a delta trimmed
    between the two reads comes back as None, which `_chain` treats like a missing delta."""
    if not members or len(members) > limit:
        return None
    prefix = layout.version_prefix()
    return [prefix + m.decode("ascii", "replace") + ":delta" for m in members]


def _chain(blobs: list[bytes | None]) -> list[bytes] | None:
    return None if any(b is None for b in blobs) else [b for b in blobs if b is not None]


PING_EVERY_S = 1.0


def _options(extra: dict[str, Any], timeout_s: float, retry: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry_on_timeout": False,
        # redis-py retries failed commands itself by default (10 times, backoff up to
        # 1 s): that would hide an outage for seconds and bypass our own backoff
        # (jittered, capped at 250 ms), so it is off unless the caller sets one.
        "retry": retry,
        **extra,
    }
    opts["decode_responses"] = False
    return opts


def connect(url: str, *, asyncio_client: bool = False, **options: Any) -> Any:
    """A redis-py client for the Redis the URL names (see router_client.redis_topology):
    `redis.Redis`, `RedisCluster` (following MOVED / ASK and slot migrations, the slot map
    refreshed after a failover) or a Sentinel's `master_for` (re-resolving the primary
    after a failover); the asyncio variants with `asyncio_client`."""
    t = parse_redis_url(url)
    if t.kind == CLUSTER:
        return _cluster(t, asyncio_client, options)
    if t.kind == SENTINEL:
        return _sentinel(t, asyncio_client, options)
    cls = aioredis.Redis if asyncio_client else redis.Redis
    return cls.from_url(url, **options)


def _credentials(t: RedisTopology) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.username:
        out["username"] = t.username
    if t.password:
        out["password"] = t.password
    if t.tls:
        out["ssl"] = True
    return out


def _cluster(t: RedisTopology, asyncio_client: bool, options: dict[str, Any]) -> Any:
    if asyncio_client:
        from redis.asyncio.cluster import ClusterNode as AioNode
        from redis.asyncio.cluster import RedisCluster as AioCluster

        return AioCluster(startup_nodes=[AioNode(h, p) for h, p in t.hosts],
                          **_credentials(t), **options)
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in t.hosts],
                        **_credentials(t), **options)


def _sentinel(t: RedisTopology, asyncio_client: bool, options: dict[str, Any]) -> Any:
    # Sentinels answer only where the primary is: short timeouts, no data credentials.
    sentinel_options: dict[str, Any] = {
        k: options[k] for k in ("socket_timeout", "socket_connect_timeout") if k in options}
    if "sentinel_password" in options:
        sentinel_options["password"] = options.pop("sentinel_password")
    cls: Any
    if asyncio_client:
        from redis.asyncio.sentinel import Sentinel as cls
    else:
        from redis.sentinel import Sentinel as cls
    sentinel = cls(list(t.hosts), sentinel_kwargs=sentinel_options)
    return sentinel.master_for(t.service, db=t.db, **_credentials(t), **options)


def disconnect(client: Any) -> None:
    """Drop every pooled connection (the next command reconnects). A cluster client also
    re-reads the slot map: after a failover its sharded subscription must go to the
    promoted node, and a subscribe (unlike a command) does not refresh the map itself."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
        return
    client.disconnect_connection_pools()  # RedisCluster: a pool per node
    with contextlib.suppress(*REDIS_ERRORS):
        client.nodes_manager.initialize()


async def disconnect_async(client: Any) -> None:
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        await pool.disconnect()
        return
    with contextlib.suppress(*REDIS_ERRORS):
        await client.nodes_manager.initialize()


def _pointer(raw: bytes | None) -> Pointer | None:
    # Anyone with write access to Redis can put junk here: junk reads as "no pointer"
    # (the router keeps its plan), never as an error that would look like an outage.
    if not raw:
        return None
    try:
        return Pointer.decode(raw)
    except ValueError:
        log.warning("ignoring an undecodable plan pointer: %r", raw[:80])
        return None


def _hint(message: dict[str, Any] | None) -> Version | None:
    if not message or message.get("type") not in ("message", "smessage"):
        return None
    note = plan_pb2.PlanNotification()
    try:
        note.ParseFromString(message["data"])
    except DecodeError:
        return None  # a notification is only a hint; a bad one is ignored
    return Version(note.version.epoch, note.version.seq)


class _RedisSourceBase:
    """What the blocking and asyncio sources share: layout, client options, counters.

    redis-py's own retries are off (`Retry(NoBackoff(), 0)`): they would hide an outage
    for seconds behind the client's capped backoff.
    """

    _asyncio = False

    def __init__(
        self,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = 1.0,
        status_ttl_s: int = ROUTER_STATUS_TTL_S,
        **redis_options: Any,
    ) -> None:
        self.layout = Layout(namespace)
        self.status_ttl_s = status_ttl_s
        self.reconnects = 0
        self.topology = parse_redis_url(url)
        # A cluster client keeps its own retries: they follow MOVED / ASK and refresh the
        # slot map after a failover, which is what a router wants there.
        retry_class = AsyncRetry if self._asyncio else Retry  # redis-py warns at the other
        retry = None if self.topology.kind == CLUSTER else retry_class(NoBackoff(), 0)
        options = _options(redis_options, timeout_s, retry)
        if retry is None:
            options.pop("retry")
            options.pop("retry_on_timeout")  # (deprecated in the cluster client)
        self._redis: Any = connect(url, asyncio_client=self._asyncio, **options)
        self._pubsub: Any = None
        self._last_ping = 0.0

    def _since_ms(self, status: plan_pb2.RouterStatus) -> int:
        return int(status.reported_at_ms - self.status_ttl_s * 1000)

    def _queue_report(self, pipe: Any, status: plan_pb2.RouterStatus) -> Any:
        """A status report on `pipe`: the status key (with its TTL), then the count of
        routers in the planner's registry within the TTL and this router's own entry
        (`_others` reads both). The registry is the planner's: a router writes only its own
        key, so it cannot push another router out of the fleet view."""
        lay = self.layout
        pipe.set(
            lay.router_status(status.router_id), status.SerializeToString(), ex=self.status_ttl_s
        )
        pipe.zcount(lay.routers, self._since_ms(status), "+inf")
        pipe.zscore(lay.routers, status.router_id)
        return pipe


class RedisPlanSource(_RedisSourceBase):
    """Blocking source for `RouterClient`."""

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except REDIS_ERRORS as exc:
            self._reset()
            raise SourceUnavailable(f"redis: {exc}") from exc

    def _reset(self) -> None:
        self.reconnects += 1
        disconnect(self._redis)
        self._drop_pubsub()

    def _drop_pubsub(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                self._pubsub.close()
        self._pubsub = None

    def subscribe(self) -> None:
        """(Re)subscribe; the client subscribes before it reads the pointer."""
        if self._pubsub is None:
            ps = self._redis.pubsub(ignore_subscribe_messages=True)
            if self.topology.sharded_pubsub:
                self._call(ps.ssubscribe, self.layout.channel)
            else:
                self._call(ps.subscribe, self.layout.channel)
            self._pubsub = ps
            self._last_ping = time.monotonic()

    def current(self) -> Pointer | None:
        self.subscribe()
        return _pointer(self._call(self._redis.get, self.layout.current))

    def fetch_deltas(self, after: Version, upto: Version, limit: int) -> list[bytes] | None:
        members = self._call(self._redis.zrangebylex, *_delta_members(self.layout, after, upto))
        keys = _deltas(self.layout, members, limit)
        return None if keys is None else _chain(self._call(self._redis.mget, keys))

    def fetch_plan(self, version: Version) -> bytes | None:
        return self._call(self._redis.get, self.layout.plan(version))  # type: ignore[no-any-return]

    def wait_for_change(self, timeout_s: float) -> Version | None:
        if self._pubsub is None:
            time.sleep(timeout_s)
            return None
        try:
            if self.topology.sharded_pubsub:
                # (a sharded subscription lives on the slot's node; the per-second
                # pointer re-check covers a connection that went quiet)
                return _hint(self._pubsub.get_sharded_message(timeout=timeout_s))
            self._ping_pubsub()
            return _hint(self._pubsub.get_message(timeout=timeout_s))
        except REDIS_ERRORS:
            self._drop_pubsub()  # the next round re-subscribes; the re-check covers the gap
            self.reconnects += 1
            return None

    def _ping_pubsub(self) -> None:
        # A half-open pub/sub socket never errors by itself: ping it, and the pong
        # must come back within the socket timeout or the read raises.
        now = time.monotonic()
        if now - self._last_ping >= PING_EVERY_S:
            self._pubsub.ping()
            self._last_ping = now

    def report(self, status: plan_pb2.RouterStatus) -> int | None:
        """Write this router's status; returns how many *other* routers reported on the
        plan within the status TTL (a hostile writer can only inflate it), None if the
        count was refused (an ACL without `+zcount`): the status is written either way."""
        pipe = self._queue_report(self._redis.pipeline(transaction=False), status)
        return _others(self._call(pipe.execute, False), self._since_ms(status))

    def close(self) -> None:
        self._drop_pubsub()
        self._redis.close()


class AsyncRedisPlanSource(_RedisSourceBase):
    """The same source on redis.asyncio, for `AsyncRouterClient`."""

    _asyncio = True

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except REDIS_ERRORS as exc:
            await self._reset()
            raise SourceUnavailable(f"redis: {exc}") from exc

    async def _reset(self) -> None:
        self.reconnects += 1
        await disconnect_async(self._redis)
        await self._drop_pubsub()

    async def _drop_pubsub(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._pubsub.aclose()
        self._pubsub = None

    async def current(self) -> Pointer | None:
        if self._pubsub is None:
            ps = self._redis.pubsub(ignore_subscribe_messages=True)
            if self.topology.sharded_pubsub:
                await self._call(ps.ssubscribe(self.layout.channel))
            else:
                await self._call(ps.subscribe(self.layout.channel))
            self._pubsub = ps
            self._last_ping = time.monotonic()
        return _pointer(await self._call(self._redis.get(self.layout.current)))

    async def fetch_deltas(self, after: Version, upto: Version, limit: int) -> list[bytes] | None:
        bounds = _delta_members(self.layout, after, upto)
        keys = _deltas(self.layout, await self._call(self._redis.zrangebylex(*bounds)), limit)
        return None if keys is None else _chain(await self._call(self._redis.mget(keys)))

    async def fetch_plan(self, version: Version) -> bytes | None:
        return await self._call(self._redis.get(self.layout.plan(version)))  # type: ignore[no-any-return]

    async def wait_for_change(self, timeout_s: float) -> Version | None:
        if self._pubsub is None:
            await asyncio.sleep(timeout_s)
            return None
        try:
            if self.topology.sharded_pubsub:
                return _hint(await self._pubsub.get_sharded_message(timeout=timeout_s))
            now = time.monotonic()
            if now - self._last_ping >= PING_EVERY_S:
                await self._pubsub.ping()
                self._last_ping = now
            return _hint(await self._pubsub.get_message(timeout=timeout_s))
        except REDIS_ERRORS:
            await self._drop_pubsub()
            self.reconnects += 1
            return None

    async def report(self, status: plan_pb2.RouterStatus) -> int | None:
        """As `RedisPlanSource.report`."""
        pipe = self._queue_report(self._redis.pipeline(transaction=False), status)
        return _others(await self._call(pipe.execute(raise_on_error=False)), self._since_ms(status))

    async def close(self) -> None:
        await self._drop_pubsub()
        await self._redis.aclose()


def _others(results: list[Any], since_ms: int) -> int | None:
    """The routers the registry counts within the TTL, less this router if it is among them;
    the status write's own error is raised, as `_call` would have. None when the counts were
    refused (an ACL without `+zcount`) or the registry is not a sorted set."""
    if results and isinstance(results[0], Exception):
        raise SourceUnavailable(f"redis: {results[0]}") from results[0]
    if len(results) < 3:
        return None
    count, own = results[1], results[2]
    if not isinstance(count, int) or isinstance(own, Exception):
        return None
    try:
        counted_self = own is not None and float(own) >= since_ms
    except (TypeError, ValueError):
        counted_self = False
    return max(0, count - int(counted_self))
