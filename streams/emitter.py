"""Event emitter for engines, engine sidecars and edge routers (confluent-kafka).

    emitter = EventEmitter("127.0.0.1:9092", producer_id="router-7")
    emitter.emit_request("tenant-a", "dest-3", prompt_tokens=1200)
    emitter.emit_cache_hit("tenant-a", "dest-3", prompt_tokens=1200, cached_tokens=1024)
    emitter.close()

`emit_*` never blocks and never raises on a full buffer: the event is dropped
and counted in `.dropped`. A background thread groups buffered events by the
partition of their routing key (`streams.partitioning`), packs up to
`batch_max_events` of them into one `EventBatch` message per partition, and
produces it with an idempotent producer (acks=all). Each event carries this
emitter's producer id and a sequence number counted per partition: partition p's events
are numbered p * 2^40 + 1, + 2, + 3, ..., with a gap only where a message that was handed to
the producer failed delivery. That is the contract `streams.dedup` relies on (consecutive
within a partition, so it can tell the producer's next events from any sequence forged
under its id), and (producer, sequence) stays unique across partitions for anything that
recounts the topic.

The producer id on the wire is the given `producer_id` plus a random incarnation
suffix (`gateway` -> `gateway.3fa2b1c0`): sequences start at 1 in every process, so
two emitters sharing one id (gateway replicas with one config, a restarted process)
would otherwise share a sequence space, and the stream would drop the newer one's
events as repeats until its sequence passed the old high-water mark.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cacheroute.v1 import events_pb2
from streams.partitioning import partition_for_key
from streams.producer import RenewingProducer

log = logging.getLogger(__name__)
_REQUEST, _CACHE_HIT, _ERROR = 1, 2, 3
PARTITION_SHIFT = 40  # sequences of partition p start above p << 40 (see the docstring)


def _property(name: str) -> str:
    """`linger_ms` -> `linger.ms`; librdkafka's own underscore names stay as they are."""
    return name if name in {"log_level"} else name.replace("_", ".")


def default_producer_id(prefix: str = "emitter") -> str:
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class EventEmitter:
    """Batches events into `EventBatch` messages keyed by routing key; never blocks.

    `**kafka_config` are librdkafka producer settings with underscores for dots
    (`compression_type="lz4"` -> `compression.type`); they override the defaults
    (idempotent, acks=all, linger 5 ms inside librdkafka).
    """

    def __init__(self, bootstrap: str, topic: str = "cacheroute.events", *, producer_id: str,
                 batch_max_events: int = 500, linger_ms: int = 50,
                 buffer_max_events: int = 100_000, **kafka_config: Any) -> None:
        if not producer_id:
            raise ValueError("producer_id must be non-empty")
        self.topic = topic
        self.producer_id = f"{producer_id}.{secrets.token_hex(4)}"  # see the module docstring
        self.batch_max_events = batch_max_events
        self.linger_s = linger_ms / 1000.0
        self.buffer_max_events = buffer_max_events
        config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "message.max.bytes": 4 << 20}
        config.update({_property(k): v for k, v in kafka_config.items()})
        self._producer = RenewingProducer(config)
        self._lock = threading.Lock()
        self._pending: list[tuple] = []
        # partition -> the last sequence produced there (only the background thread, or
        # close() after it stopped, touches it)
        self._sequences: dict[int, int] = {}
        self._partitions = 0
        self.dropped = 0
        self.sent = 0
        self.delivery_errors = 0
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"emitter-{producer_id}",
                                        daemon=True)
        self._thread.start()

    # -- the caller's side: append under a lock, nothing else --------------------

    def emit_request(self, routing_key: str, destination: str, *, prompt_tokens: int,
                     reusable_prefix_tokens: int = 0, inflight: int | None = None,
                     router_id: str = "", timestamp_ms: int | None = None) -> bool:
        """Buffer a router dispatch; False when the buffer was full (counted in .dropped)."""
        return self._append((_REQUEST, routing_key, destination, timestamp_ms, prompt_tokens,
                             reusable_prefix_tokens, inflight, router_id))

    def emit_cache_hit(self, routing_key: str, destination: str, *, prompt_tokens: int,
                       cached_tokens: int, output_tokens: int = 0, queue_depth: int | None = None,
                       ttft_ms: float = 0.0, e2e_ms: float = 0.0,
                       timestamp_ms: int | None = None) -> bool:
        """Buffer an engine's cache-hit report; False when dropped."""
        return self._append((_CACHE_HIT, routing_key, destination, timestamp_ms, prompt_tokens,
                             cached_tokens, output_tokens, queue_depth, ttft_ms, e2e_ms))

    def emit_error(self, routing_key: str, destination: str, *, kind: str,
                   status_code: int = 0, router_id: str = "",
                   timestamp_ms: int | None = None) -> bool:
        """Buffer a router's failed attempt at a destination; False when dropped."""
        return self._append((_ERROR, routing_key, destination, timestamp_ms, status_code, kind,
                             router_id))

    def _append(self, row: tuple) -> bool:
        ts = row[3] if row[3] is not None else int(time.time() * 1000)
        with self._lock:
            if self._closed or len(self._pending) >= self.buffer_max_events:
                self.dropped += 1
                return False
            self._pending.append((ts, *row[:3], *row[4:]))
            full = len(self._pending) >= self.batch_max_events
        if full:
            self._wake.set()
        return True

    @property
    def buffered(self) -> int:
        return len(self._pending)

    # -- the background thread -----------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.linger_s)
            self._wake.clear()
            self._send_pending()
            self._producer.poll(0)

    def _send_pending(self, metadata_timeout_s: float = 5.0) -> None:
        if not self._pending or not self._ensure_partitions(metadata_timeout_s):
            return
        with self._lock:
            rows, self._pending = self._pending, []
        by_partition: dict[int, list[tuple]] = {}
        n = self._partitions
        for row in rows:
            by_partition.setdefault(partition_for_key(row[2], n), []).append(row)
        for p, prow in by_partition.items():
            for i in range(0, len(prow), self.batch_max_events):
                self._produce(p, prow[i : i + self.batch_max_events])

    def _ensure_partitions(self, timeout_s: float) -> bool:
        if self._partitions:
            return True
        try:
            meta = self._producer.list_topics(self.topic, timeout=timeout_s)
            topic = meta.topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                self._partitions = len(topic.partitions)
        except KafkaException as exc:
            log.warning("emitter: no metadata for %s yet: %s", self.topic, exc)
        return bool(self._partitions)

    def _produce(self, partition: int, rows: list[tuple]) -> None:
        # Sequences are taken only once the message is queued: rows dropped here leave no gap.
        first = self._sequences.get(partition, partition << PARTITION_SHIFT) + 1
        value = self._batch(rows, first).SerializeToString()
        for _ in range(50):
            try:
                self._producer.produce(self.topic, value=value, key=rows[0][2].encode(),
                                       partition=partition, on_delivery=self._delivered)
                self._sequences[partition] = first + len(rows) - 1
                self.sent += len(rows)
                return
            except BufferError:
                self._producer.poll(0.05)  # librdkafka's queue is full: let it drain
        with self._lock:
            self.dropped += len(rows)

    def _batch(self, rows: list[tuple], first_sequence: int) -> events_pb2.EventBatch:
        """Rows are (timestamp_ms, kind, routing key, destination, *the kind's fields)."""
        batch = events_pb2.EventBatch()
        add = batch.events.add
        pid = self.producer_id
        for sequence, row in enumerate(rows, first_sequence):
            e = add(producer_id=pid, sequence=sequence, timestamp_ms=row[0])
            if row[1] == _REQUEST:
                r = e.request
                r.routing_key, r.destination, r.prompt_tokens = row[2], row[3], row[4]
                r.reusable_prefix_tokens, r.router_id = row[5], row[7]
                if row[6] is not None:
                    r.inflight = row[6]
            elif row[1] == _ERROR:
                x = e.error
                x.routing_key, x.destination, x.status_code = row[2], row[3], row[4]
                x.kind, x.router_id = row[5], row[6]
            else:
                c = e.cache_hit
                c.routing_key, c.destination, c.prompt_tokens = row[2], row[3], row[4]
                c.cached_tokens, c.output_tokens = row[5], row[6]
                c.ttft_ms, c.e2e_ms = row[8], row[9]
                if row[7] is not None:
                    c.queue_depth = row[7]
        return batch

    def _delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.delivery_errors += 1
            log.warning("emitter: delivery failed: %s", err)

    # -- lifecycle -------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> int:
        """Send everything buffered and wait for delivery; returns messages still queued."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.01)
        return int(self._producer.flush(max(0.0, deadline - time.monotonic())))

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush and stop the background thread; later emits are dropped."""
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._send_pending(metadata_timeout_s=min(timeout_s, 5.0))
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.warning("emitter: %d messages undelivered at close", remaining)

    def __enter__(self) -> EventEmitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
