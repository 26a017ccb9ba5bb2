"""Consume the engine-signals topic (streams/engines/watch.py) and hand each message to the
planner. Small and low-volume: one message per destination per second. Like the snapshot
consumer it assigns every partition directly at the end (only fresh signals matter) and
creates a missing topic. A message that does not decode, or is too large, is counted and
skipped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from google.protobuf.message import DecodeError

from cacheroute.v1 import signals_pb2

log = logging.getLogger("cacheroute.planner.signals")
MAX_SIGNALS_BYTES = 16 << 10


class EngineSignalsConsumer:
    def __init__(self, bootstrap: str, topic: str,
                 on_signals: Callable[[signals_pb2.EngineSignals], None]) -> None:
        self._bootstrap, self._topic, self._on_signals = bootstrap, topic, on_signals
        self.undecodable = 0
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-signals", daemon=True)
        self._consumer = Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": "cacheroute-planner-signals",  # never joined
                                   "enable.auto.commit": False, "fetch.wait.max.ms": 100})

    def start(self) -> None:
        if self._thread.is_alive():
            return
        meta = self._consumer.list_topics(self._topic, timeout=10)
        topic = meta.topics.get(self._topic)
        if topic is None or topic.error is not None or not topic.partitions:
            admin = AdminClient({"bootstrap.servers": self._bootstrap})
            for future in admin.create_topics([NewTopic(self._topic, 1, 1)]).values():
                try:
                    future.result(10)
                except Exception as exc:  # exists already, or the broker is not ready
                    log.info("creating %s: %s", self._topic, exc)
            raise KafkaException(f"engine-signals topic {self._topic!r} was missing (created)")
        self._consumer.assign([TopicPartition(self._topic, p, OFFSET_END)
                               for p in sorted(topic.partitions)])
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            raw = msg.value() or b""
            signals = signals_pb2.EngineSignals()
            try:
                if len(raw) > MAX_SIGNALS_BYTES:
                    raise ValueError(f"{len(raw)} bytes")
                signals.ParseFromString(raw)
            except (DecodeError, ValueError) as exc:
                self.undecodable += 1
                log.warning("skipping an engine-signals message: %s", exc)
                continue
            self.received += 1
            try:
                self._on_signals(signals)
            except Exception:
                log.exception("planner failed on engine signals of %r", signals.destination)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._consumer.close()
