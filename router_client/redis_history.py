"""The routers' shared conversation memory over Redis pub/sub (the shell of
router_client.shared_history).

Every `period_s` the exchange drains the router core's new conversation placements and
publishes them on the plan namespace's history channel; it subscribes to the same channel
and hands other routers' placements to the core. Both directions are hints: a message lost
to a Redis outage costs only what it costs a router without sharing (the turn is placed by
load), so nothing is retried or queued beyond the core's bounded outbox, and neither loop
ever ends on an error: a bad message is counted and skipped, a Redis error drops the
connection and the loop reconnects after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from router_client.layout import DEFAULT_NAMESPACE, Layout
from router_client.redis_source import PING_EVERY_S, REDIS_ERRORS, connect, disconnect_async
from router_client.redis_topology import parse_redis_url
from router_client.routing import RouterCore
from router_client.shared_history import (
    MAX_MOVES_PER_MESSAGE,
    SharedHistoryError,
    decode_moves,
    encode_moves,
)

log = logging.getLogger("cacheroute.router")

DEFAULT_PERIOD_S = 0.05
MAX_BACKOFF_S = 5.0


class RedisHistoryExchange:
    """Shares one router core's conversation placements with every router of its plan."""

    def __init__(self, core: RouterCore, url: str, *, router_id: str,
                 namespace: str = DEFAULT_NAMESPACE, period_s: float = DEFAULT_PERIOD_S,
                 timeout_s: float = 1.0, **redis_options: Any) -> None:
        if not period_s > 0:
            raise ValueError("period_s must be > 0")
        self.core, self.period_s = core, period_s
        # The sender id: the router id plus this incarnation, so replicas given one id by
        # their deployment still hear each other (and a router never hears itself).
        self.router_id = f"{router_id}/{secrets.token_hex(4)}"
        self.channel = Layout(namespace).history_channel
        self._sharded = parse_redis_url(url).sharded_pubsub
        self._redis: Any = connect(url, asyncio_client=True, socket_timeout=timeout_s,
                                   socket_connect_timeout=timeout_s, **redis_options)
        self._tasks: list[asyncio.Task[None]] = []
        self.moves_sent = 0
        self.moves_lost = 0  # drained but not published (Redis unreachable)
        self.moves_received = 0
        self.moves_learned = 0
        self.messages_rejected = 0
        self.errors = 0
        self._last_rejection = ""

    async def start(self) -> RedisHistoryExchange:
        self.core.share_history(True)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._publishing(), name="history-publish"),
                       loop.create_task(self._listening(), name="history-listen")]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        with contextlib.suppress(*REDIS_ERRORS):  # the last placements, best effort
            await self.publish_pending()
        self.core.share_history(False)
        with contextlib.suppress(*REDIS_ERRORS):
            await self._redis.aclose()

    def metrics(self) -> dict[str, float]:
        return {"history_moves_sent": self.moves_sent, "history_moves_lost": self.moves_lost,
                "history_moves_learned": self.moves_learned,
                "history_messages_rejected": self.messages_rejected,
                "history_errors": self.errors,
                "history_moves_unshared": self.core.history_unshared}

    # --- publishing -----------------------------------------------------------------------

    async def publish_pending(self) -> int:
        """Publish what the core placed since the last call; the moves sent."""
        moves = self.core.drain_history()
        if not moves:
            return 0
        publish = self._redis.spublish if self._sharded else self._redis.publish
        sent = 0
        try:
            for message in encode_moves(self.router_id, moves):
                await publish(self.channel, message)
                sent = min(len(moves), sent + MAX_MOVES_PER_MESSAGE)
        finally:
            self.moves_sent += sent
            self.moves_lost += len(moves) - sent
        return sent

    async def _publishing(self) -> None:
        backoff = self.period_s
        while True:
            await asyncio.sleep(backoff)
            try:
                await self.publish_pending()
                backoff = self.period_s
            except REDIS_ERRORS as exc:
                self.errors += 1
                log.warning("history exchange: publish failed (%s); retrying", exc)
                await disconnect_async(self._redis)
                backoff = min(MAX_BACKOFF_S, max(backoff * 2, 0.5))

    # --- listening ------------------------------------------------------------------------

    async def _listening(self) -> None:
        backoff = 0.5
        while True:
            pubsub = None
            try:
                # A cluster client learns its slot map on its first command; a subscription
                # is not one, so it would not know where the channel's slot lives.
                await self._redis.initialize()
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                if self._sharded:
                    await pubsub.ssubscribe(self.channel)
                else:
                    await pubsub.subscribe(self.channel)
                backoff = 0.5
                await self._read(pubsub)
            except REDIS_ERRORS as exc:
                self.errors += 1
                log.warning("history exchange: subscription lost (%s); resubscribing", exc)
                await disconnect_async(self._redis)  # (a cluster re-reads its slot map)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*REDIS_ERRORS):
                        await pubsub.aclose()
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    async def _read(self, pubsub: Any) -> None:
        pinged = time.monotonic()
        while True:
            if self._sharded:
                message = await pubsub.get_sharded_message(timeout=1.0)
            else:
                # A half-open socket never errors by itself: a ping must come back in time.
                if time.monotonic() - pinged >= PING_EVERY_S:
                    await pubsub.ping()
                    pinged = time.monotonic()
                message = await pubsub.get_message(timeout=1.0)
            # The pings' pongs arrive on this socket too; only published messages count.
            if message is not None and message.get("type") in ("message", "smessage"):
                self.receive(message.get("data"))

    def receive(self, data: object) -> int:
        """Apply one message's placements (from another router); the moves learned."""
        try:
            if not isinstance(data, bytes | str):
                raise SharedHistoryError(f"not a message payload: {type(data).__name__}")
            sender, moves = decode_moves(data)
        except SharedHistoryError as exc:
            self.messages_rejected += 1
            if str(exc) != self._last_rejection:  # once per kind of error, not per message
                log.warning("history exchange: message on %s skipped: %s", self.channel, exc)
                self._last_rejection = str(exc)
            return 0
        if sender == self.router_id:
            return 0
        self.moves_received += len(moves)
        learned = self.core.learn_history(moves)
        self.moves_learned += learned
        return learned
