"""The Faust worker: the imperative shell around `streams.processor` (the only
module of the package that imports faust / aiokafka).

- One agent consumes the events topic (`value_serializer='raw'`); events are
  keyed by routing key at production, so there is no repartitioning. Messages
  arrive in buffers (`take_events`) and each partition's share goes through that
  partition's `PartitionProcessor` in one numpy pass.
- Recovery: a newly assigned partition's state is rebuilt by replaying its
  recent history (event-time window + eviction window + grace + margin, found by
  message timestamp) up to the log end offset H read at assignment; messages the
  agent then receives below H are skipped. The replay is exactly the state the
  lost worker held, so counts continue with no gap and no double count. Windows
  published until the replay is done say `recovering=True`.
- A timer closes windows of idle partitions by the wall clock and refreshes lag.
- `/metrics` serves the counters as Prometheus text.
- Every snapshot part is signed with the worker's key (`streams.snapshot_signing`): the
  planner accepts only parts a configured worker key signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.config import StreamConfig
from streams.metrics import StreamCounters
from streams.processor import PartitionProcessor, Rejected, dead_letter
from streams.settings import Settings
from streams.snapshot_signing import SnapshotSigner
from streams.snapshots import SnapshotContext, build_snapshots
from streams.windows import WindowResult

log = logging.getLogger(__name__)
TAKE_MESSAGES = 256
# A buffer closes after this long even if not full: at low rates it bounds the
# delay an event adds before it is counted; at high rates buffers fill first.
TAKE_WITHIN_S = 0.05


def now_ms() -> int:
    return int(time.time() * 1000)


class StreamWorker:
    """Per-partition processors, recovery, and publishing for one Faust app."""

    def __init__(self, app: faust.App, settings: Settings, signer: SnapshotSigner) -> None:
        self.app = app
        self.settings = settings
        self.signer = signer
        self.config: StreamConfig = settings.stream_config()
        self.worker_id = settings.resolved_worker_id
        self.counters = StreamCounters()
        self.processors: dict[int, PartitionProcessor] = {}
        self.recovering: dict[int, asyncio.Task[None]] = {}
        self.partition_count = 0
        # partition -> a high watermark a fresh broker query showed to be stale
        self._stale_highwater: dict[int, int] = {}
        self.events_topic = app.topic(settings.events_topic, value_type=bytes)
        self.snapshots_topic = app.topic(settings.snapshots_topic, value_type=bytes,
                                         key_type=bytes, partitions=1)
        self.deadletter_topic = app.topic(settings.deadletter_topic, value_type=bytes,
                                          key_type=bytes, partitions=1)

    # -- rebalance -----------------------------------------------------------------

    async def on_assigned(self, assigned: set[Any]) -> None:
        mine = {tp.partition for tp in assigned if tp.topic == self.settings.events_topic}
        for p in list(self.processors):
            if p not in mine:
                self._drop(p)
        for p in sorted(mine - set(self.processors)):
            self.processors[p] = PartitionProcessor(p, self.config, self.counters)
            self.recovering[p] = asyncio.ensure_future(self._recover_with_retries(p))

    def _drop(self, p: int) -> None:
        task = self.recovering.pop(p, None)
        if task is not None:
            task.cancel()
        self.processors.pop(p, None)
        self.counters.lag_by_partition.pop(p, None)
        self._stale_highwater.pop(p, None)

    async def _recover_with_retries(self, p: int) -> None:
        delay = 0.5
        while p in self.processors:
            try:
                await self._recover(p)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("partition %d: recovery failed; retrying in %.1f s", p, delay)
                self.processors[p] = PartitionProcessor(p, self.config, self.counters)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _recover(self, p: int) -> None:
        """Replay partition p's recent history into its fresh processor."""
        started = time.monotonic()
        tp = TopicPartition(self.settings.events_topic, p)
        async with self._reader() as reader:
            end = await self._log_end(reader, tp)
            await self._learn_partition_count(reader)
            start, complete_since = await self._replay_start(reader, tp, end)
            proc = self.processors.get(p)
            if proc is None:
                return  # revoked meanwhile
            proc.complete_since_ms = complete_since
            replayed = await self._replay(reader, tp, start, end)
            # below `end` everything is in the state: the consumer's copies are skipped
            proc.next_offset = max(proc.next_offset, end)
        log.info("partition %d recovered: %d messages replayed in %.1f s", p, replayed,
                 time.monotonic() - started)
        self.recovering.pop(p, None)

    async def _replay(self, reader: AIOKafkaConsumer, tp: TopicPartition, start: int,
                      end: int) -> int:
        """Process messages [start, end) of tp; returns how many there were."""
        reader.seek(tp, start)
        position, replayed = start, 0
        while position < end:
            batch = await reader.getmany(tp, timeout_ms=1000, max_records=512)
            records = [r for r in batch.get(tp, []) if r.offset < end]
            if records:
                replayed += len(records)
                await self._process(tp.partition, [(r.offset, r.value or b"") for r in records])
            # position() also steps over offsets that hold no record (control records)
            position = await reader.position(tp)
        return replayed

    async def _log_end(self, reader: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """The log end offset. A fetch's high watermark is asked too: the local broker
        (Tansu) answers ListOffsets(latest) with a stale value for batched writes."""
        listed = int((await reader.end_offsets([tp]))[tp])
        reader.assign([tp])
        reader.seek(tp, int((await reader.beginning_offsets([tp]))[tp]))
        await reader.getmany(tp, timeout_ms=1000, max_records=1)
        high = reader.highwater(tp)
        return max(listed, int(high)) if high is not None else listed

    async def _replay_start(
        self, reader: AIOKafkaConsumer, tp: TopicPartition, end: int
    ) -> tuple[int, int | None]:
        """(first offset to replay, event time from which windows are complete)."""
        cfg = self.config
        history_ms = max(cfg.window_ms, cfg.eviction_ms) + cfg.grace_ms
        since = now_ms() - history_ms - round(self.settings.replay_margin_s * 1000)
        begin = int((await reader.beginning_offsets([tp]))[tp])
        start = await self._first_offset_since(reader, tp, begin, int(end), since)
        # Replaying from offset 0 means nothing was ever missed.
        return start, None if start == 0 else since

    async def _first_offset_since(self, reader: AIOKafkaConsumer, tp: TopicPartition,
                                  lo: int, hi: int, since_ms: int) -> int:
        """Binary search by message timestamp (not every broker answers ListOffsets by
        time: Tansu returns the log start). Timestamps are only roughly ordered; the
        replay margin absorbs that."""
        while lo < hi:
            mid = (lo + hi) // 2
            reader.seek(tp, mid)
            batch = await reader.getmany(tp, timeout_ms=2000, max_records=1)
            records = batch.get(tp, [])
            if not records or records[0].timestamp >= since_ms:
                hi = mid
            else:
                lo = min(max(mid + 1, records[0].offset + 1), hi)
        return lo

    async def _learn_partition_count(self, reader: AIOKafkaConsumer) -> None:
        """The events topic's partition count, which every snapshot states, from the
        metadata of a reader assigned to the topic (a reader's metadata of all topics may
        lack one created just before it started). Without it the recovery fails and is
        retried: a window published with a wrong count would be refused."""
        if not self.partition_count:
            parts = reader.partitions_for_topic(self.settings.events_topic)
            if not parts:
                raise RuntimeError(f"no partitions known yet for {self.settings.events_topic}")
            self.partition_count = len(parts)

    # -- processing ------------------------------------------------------------------

    async def handle(self, events: list[Any]) -> None:
        """One buffer of Faust events: split by partition, count, publish."""
        by_partition: dict[int, list[tuple[int, bytes]]] = {}
        for event in events:
            m = event.message
            by_partition.setdefault(m.partition, []).append((m.offset, m.value or b""))
        for p, messages in by_partition.items():
            task = self.recovering.get(p)
            if task is not None and asyncio.current_task() is not task:
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    if not task.cancelled():
                        raise  # we are being cancelled, not the recovery
            await self._fill_gap(p, [offset for offset, _ in messages])
            await self._process(p, messages)

    async def _fill_gap(self, p: int, offsets: list[int]) -> None:
        """Replay the offsets between what partition p's state holds and the first offset
        the consumer now delivers, if there are any.

        The consumer resumes from the group's committed offset, which is not always where
        the state ends: the previous owner may have committed past the log end this worker
        read for its replay (the broker can answer that with a stale value), or a rebalance
        can drop fetched messages that were never handed to the agent. Without this, those
        messages would be counted by nobody. A gap of offsets with no records (control
        records) costs one read and then closes."""
        proc = self.processors.get(p)
        if proc is None or p in self.recovering:
            return
        first_offset = min((o for o in offsets if o >= proc.next_offset), default=None)
        if first_offset is None or first_offset == proc.next_offset:
            return
        start, tp = proc.next_offset, TopicPartition(self.settings.events_topic, p)
        async with self._reader() as reader:
            reader.assign([tp])
            begin = int((await reader.beginning_offsets([tp]))[tp])
            replayed = await self._replay(reader, tp, max(start, begin), first_offset)
        if self.processors.get(p) is proc:
            proc.next_offset = max(proc.next_offset, first_offset)
        self.counters.gaps_filled += 1
        self.counters.gap_messages += replayed
        log.warning("partition %d: the consumer resumed at offset %d, past the %d the state "
                    "holds; %d messages in between replayed", p, first_offset, start, replayed)

    async def _process(self, p: int, messages: list[tuple[int, bytes]]) -> None:
        proc = self.processors.get(p)
        if proc is None:
            return  # revoked meanwhile: the new owner counts these
        if not self.counters.first_events_at_s:
            self.counters.first_events_at_s = time.time()
        await self._check_log_reset(p, proc)
        outcome = proc.process(messages, now_ms())
        self.counters.last_events_at_s = time.time()
        await self._publish_rejects(p, outcome.rejected)
        await self._publish_windows(proc, outcome.windows)

    async def tick(self) -> None:
        """Close idle partitions' windows by the wall clock; refresh lag."""
        now = now_ms()
        self.counters.assigned_partitions = len(self.processors)
        self.counters.recovering_partitions = len(self.recovering)
        for p, proc in list(self.processors.items()):
            await self._update_lag(p, proc)
            if p not in self.recovering:
                # Unknown lag (nothing fetched since the assignment) counts as caught up,
                # except for starting the clock of a partition that never saw an event.
                lag = self.counters.lag_by_partition.get(p)
                await self._publish_windows(proc, proc.tick(now, (lag or 0) == 0,
                                                            log_known=lag is not None))

    def _highwater(self, p: int) -> int | None:
        try:
            high = self.app.consumer.highwater(TopicPartition(self.settings.events_topic, p))
        except Exception:  # consumer not ready during a rebalance
            return None
        return None if high is None else int(high)

    async def _check_log_reset(self, p: int, proc: PartitionProcessor) -> int | None:
        """The partition's high watermark, after starting over if the log is shorter.

        The consumer's high watermark can be stale: just after a (re)assignment it comes
        from a fetch older than the replay that set `next_offset`, and a stale value below
        it looks exactly like a shorter log. A reset is too costly to act on a stale value
        (every window is marked recovering for a window length), so a suspicion is
        confirmed by asking the broker afresh; a watermark already found stale is not
        asked about again."""
        high = self._highwater(p)
        read = proc.next_offset
        if high is None or p in self.recovering or high >= read:
            return high
        if self._stale_highwater.get(p) == high:
            return high
        try:
            fresh = await self._fresh_log_end(p)
        except Exception:
            log.exception("partition %d: could not confirm a possible log reset", p)
            return high
        if self.processors.get(p) is not proc:
            return high  # revoked or replaced meanwhile
        if proc.log_reset(fresh, now_ms()):
            self._stale_highwater.pop(p, None)
            log.warning("partition %d: the log ends at offset %d, below the %d already read "
                        "(topic re-created or broker storage lost): counting from the new log",
                        p, fresh, read)
            return fresh
        log.info("partition %d: a high watermark of %d (below the %d read) was stale; the "
                 "log ends at %d", p, high, read, fresh)
        self._stale_highwater[p] = high
        return high

    async def _fresh_log_end(self, p: int) -> int:
        async with self._reader() as reader:
            return await self._log_end(reader, TopicPartition(self.settings.events_topic, p))

    @contextlib.asynccontextmanager
    async def _reader(self) -> AsyncIterator[AIOKafkaConsumer]:
        """A consumer of its own (no group, no commits) for replays and log-end queries."""
        reader = AIOKafkaConsumer(bootstrap_servers=self.settings.bootstrap,
                                  enable_auto_commit=False, max_partition_fetch_bytes=8 << 20)
        await reader.start()
        try:
            yield reader
        finally:
            await reader.stop()

    async def _update_lag(self, p: int, proc: PartitionProcessor) -> None:
        high = await self._check_log_reset(p, proc)
        if high is not None:
            self.counters.lag_by_partition[p] = max(0, high - proc.next_offset)

    # -- publishing ------------------------------------------------------------------

    async def _publish_windows(self, proc: PartitionProcessor, windows: list[WindowResult]) -> None:
        for window in windows:
            ctx = SnapshotContext(
                source_partition=proc.partition,
                partition_count=self.partition_count or 1,
                worker_id=self.worker_id,
                recovering=not proc.is_complete(window),
                published_at_ms=now_ms(),
                dead_letters=proc.dead_letters,
                duplicates_dropped=proc.dedup.duplicates,
            )
            key = f"{window.window_end_ms}:{proc.partition}".encode()
            for part in build_snapshots(window, ctx, self.config.snapshot_part_bytes):
                await self.snapshots_topic.send(key=key,
                                                value=self.signer.sign(part.SerializeToString()))
                self.counters.snapshots_published += 1

    async def _publish_rejects(self, p: int, rejected: list[Rejected]) -> None:
        for r in rejected:
            letter = dead_letter(r, topic=self.settings.events_topic, partition=p,
                                 now_ms=now_ms())
            try:
                await self.deadletter_topic.send(key=r.reason.encode(),
                                                 value=letter.SerializeToString())
            except Exception:  # one letter must never stop the agent (its counts would be lost)
                self.counters.dead_letter_send_failures += 1
                log.exception("could not publish a dead letter (%s)", r.reason)


def _consumer_class(fetch_max_wait_ms: int) -> type:
    """Faust's aiokafka consumer with our fetch wait instead of its fixed 1,500 ms.

    aiokafka reads `_fetch_max_wait_ms` when the consumer starts (it builds its
    Fetcher then), so setting it on the freshly created consumer is enough.
    """

    class _Thread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class _Consumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return _Thread(self, loop=self.loop, beacon=self.beacon)

    return _Consumer


def create_app(settings: Settings, signer: SnapshotSigner) -> tuple[faust.App, StreamWorker]:
    """The Faust app and its worker state, wired together (no I/O until started); every
    snapshot part is signed by `signer`."""
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        value_serializer="raw",
        key_serializer="raw",
        web_host="127.0.0.1",
        web_bind=settings.web_bind,
        web_port=settings.web_port,
        datadir=str(settings.data_dir),
        broker_session_timeout=6.0,
        broker_heartbeat_interval=0.5,
        topic_disable_leader=True,
        consumer_max_fetch_size=16 << 20,
        producer_max_request_size=2 << 20,
        stream_wait_empty=False,
    )
    # the transport builds its consumer from this attribute when the app starts
    app.transport.Consumer = _consumer_class(  # type: ignore[misc]
        settings.fetch_max_wait_ms)
    worker = StreamWorker(app, settings, signer)

    @app.agent(worker.events_topic, name="count-events")
    async def count_events(stream: Any) -> None:
        async for events in stream.take_events(TAKE_MESSAGES, within=TAKE_WITHIN_S):
            await worker.handle(events)

    async def _assigned(sender: Any, assigned: set[Any], **_: Any) -> None:
        await worker.on_assigned(assigned)

    app.on_partitions_assigned.connect(_assigned)  # type: ignore[arg-type]

    @app.timer(interval=min(0.25, settings.hop_s / 4))
    async def _tick() -> None:
        await worker.tick()

    @app.page("/metrics")
    async def _metrics(web: Any, request: Any) -> Any:
        return web.text(worker.counters.to_prometheus(),
                        content_type="text/plain; version=0.0.4")

    @app.task
    async def _declare() -> None:
        await worker.snapshots_topic.maybe_declare()
        await worker.deadletter_topic.maybe_declare()

    return app, worker
