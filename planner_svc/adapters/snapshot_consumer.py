"""Consume the stream's rate snapshots from Kafka and hand complete windows to the planner.

The only module of the planner that talks to Kafka. It assigns every partition of the
snapshots topic directly (no consumer group: a planner wants every window, and a group
join would delay start-up by seconds) starting at the end, since only fresh rates matter.

Anyone who may produce to the topic could write a part, so the planner's consumer is given
the stream workers' public keys and refuses every part they did not sign
(`streams.snapshot_signing`); only with no key paths at all (None: tools reading a topic
they trust) are parts taken unverified.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from google.protobuf.message import DecodeError

from cacheroute.v1 import snapshot_pb2
from streams.assembly import CompleteWindow, SnapshotLimits, WindowAssembler
from streams.errors import SnapshotError
from streams.snapshot_signing import SnapshotVerifier, load_public_keys

log = logging.getLogger("cacheroute.planner.snapshots")


class SnapshotConsumer:
    """Background thread: snapshots topic -> WindowAssembler -> `on_window`."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        on_window: Callable[[CompleteWindow], None],
        *,
        limits: SnapshotLimits | None = None,
        events_topic: str = "",
        worker_key_paths: Sequence[str] | None = None,
        **kafka_config: Any,
    ) -> None:
        self._topic = topic
        self._bootstrap = bootstrap
        self._events_topic = events_topic
        self._on_window = on_window
        self._limits = limits or SnapshotLimits()
        self._assembler = WindowAssembler(limits=self._limits)
        self._verifier = (None if worker_key_paths is None
                          else SnapshotVerifier(load_public_keys(worker_key_paths)))
        if self._verifier is not None and not self._verifier.keys:
            log.error("no stream worker keys configured (snapshot_keys): every snapshot "
                      "will be refused")
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshots", daemon=True)
        self.undecodable = 0
        self.windows = 0
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "cacheroute-planner",  # required by the client; we never join it
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "message.max.bytes": 64 * 1024 * 1024,
                "fetch.max.bytes": 128 * 1024 * 1024,
                **kafka_config,
            }
        )

    def start(self, from_beginning: bool = False) -> None:
        if self._thread.is_alive():
            return
        partitions = self._partitions()
        if self._events_topic and not self._limits.partitions:
            # A real window has a part per partition of the events topic: learn how many.
            meta = self._consumer.list_topics(self._events_topic, timeout=10)
            events = meta.topics.get(self._events_topic)
            if events is not None and events.error is None and events.partitions:
                self._limits = dataclasses.replace(self._limits,
                                                   partitions=len(events.partitions))
                self._assembler.limits = self._limits
        offset = 0 if from_beginning else OFFSET_END
        self._consumer.assign([TopicPartition(self._topic, p, offset) for p in partitions])
        self._thread.start()

    def _partitions(self) -> list[int]:
        meta = self._consumer.list_topics(self._topic, timeout=10)
        topic = meta.topics.get(self._topic)
        if topic is None or topic.error is not None or not topic.partitions:
            self._create_topic()  # a broker that lost its (in-memory) topics
            raise KafkaException(f"snapshots topic {self._topic!r} is missing (creating it)")
        return sorted(topic.partitions)

    def _create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self._bootstrap})
        for future in admin.create_topics([NewTopic(self._topic, 1, 1)]).values():
            try:
                future.result(10)
            except Exception as exc:  # exists already, or the broker is not ready: retried
                log.info("creating %s: %s", self._topic, exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                log.warning("snapshot consumer: %s", msg.error())
                continue
            self._handle(msg.value() or b"")

    def _handle(self, raw: bytes) -> None:
        try:
            snap = (snapshot_pb2.RateSnapshot.FromString(raw) if self._verifier is None
                    else self._verifier.verify(raw))
            window = self._assembler.add(snap, int(time.time() * 1000))
        except SnapshotError as exc:
            self.refused += 1
            log.warning("refusing a snapshot: %s", exc)
            return
        except (DecodeError, ValueError) as exc:
            self.undecodable += 1
            log.warning("skipping a snapshot that does not decode: %s", exc)
            return
        if window is not None:
            self.windows += 1
            try:
                self._on_window(window)
            except Exception:
                log.exception("planner failed on window %s", window.window_end_ms)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._consumer.close()
