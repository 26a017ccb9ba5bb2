"""The planner's durable record in a compacted Kafka topic: Redis delivers, this remembers.

Records (key -> value), all small except the plans:
- `plan:<epoch>.<seq>` -> the SignedBlob bytes exactly as published to Redis;
- `current`            -> `<epoch>.<seq>` of the installed plan;
- `config`             -> JSON of the tunables and destinations after the last change;
- `decision:<id>`      -> JSON of one decision (older ones are tombstoned to bound the log);
- `loop`               -> JSON snapshot of the control loop (staleness, learned factors);
- `delivery:<e>.<s>`   -> JSON of what plan <e>.<s> predicted and what was measured since
                          (`cacheroute plan report`), retired with its plan.
Compaction keeps the newest value per key, so a restart reads O(retained) records.
`load()` reads the topic to its high watermark and returns what it found.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from router_client.plan import Version
from streams.producer import RenewingProducer

log = logging.getLogger("cacheroute.planner.history")
KEEP_DECISIONS = 1000
KEEP_PLANS = 50


@dataclass
class History:
    current: Version | None = None
    plans: dict[Version, bytes] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    loop: dict[str, Any] | None = None
    deliveries: dict[Version, dict[str, Any]] = field(default_factory=dict)


def ensure_topic(bootstrap: str, topic: str) -> None:
    """The compacted history topic, replicated as the cluster's `default.replication.factor`
    says (3 in production: with a factor of 1 the loss of the one broker holding it would
    lose every plan the planner recorded). A broker that cannot take the cluster's default
    (-1, KIP-464) gets one replica."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for replicas in (-1, 1):
        spec = NewTopic(topic, num_partitions=1, replication_factor=replicas,
                        config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([spec])[topic].result(15)
            return
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                return
            if replicas == 1 or ("REPLICATION_FACTOR" not in str(exc).upper() and \
                    "INVALID" not in str(exc).upper()):
                raise


class KafkaHistory:
    """Appends planner records; one partition so order is total."""

    def __init__(self, bootstrap: str, topic: str, **kafka_config: Any) -> None:
        self._bootstrap, self._topic, self._config = bootstrap, topic, kafka_config
        ensure_topic(bootstrap, topic)
        self._producer = RenewingProducer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.max.bytes": 256 * 1024 * 1024,
                **kafka_config,
            },
            stall_s=4.0,  # an install waits for this flush: replace a forgotten producer soon
        )
        self._plans: list[Version] = []

    def _put(self, key: str, value: bytes | None) -> None:
        for _ in range(50):
            try:
                self._producer.produce(self._topic, key=key.encode(), value=value)
                return
            except BufferError:  # a full queue, or a producer just replaced: let it drain
                self._producer.poll(0.05)
        raise KafkaException("planner history: the producer's queue stayed full")

    def record_install(self, version: Version, signed_blob: bytes) -> None:
        self._put(f"plan:{version}", signed_blob)
        self._put("current", str(version).encode())
        if version not in self._plans:  # recorded again after a failure: once in the list
            self._plans.append(version)
        while len(self._plans) > KEEP_PLANS:
            retired = self._plans.pop(0)
            self._put(f"plan:{retired}", None)
            self._put(f"delivery:{retired}", None)
        self.flush()  # an install is acknowledged only once it is durable

    def record_decision(self, decision: dict[str, Any]) -> None:
        self._put(f"decision:{decision['id']}", json.dumps(decision).encode())
        self._put(f"decision:{decision['id'] - KEEP_DECISIONS}", None)

    def record_config(self, config: dict[str, Any]) -> None:
        self._put("config", json.dumps(config).encode())

    def record_loop(self, snapshot: dict[str, Any]) -> None:
        self._put("loop", json.dumps(snapshot).encode())

    def record_delivery(self, version: Version, record: dict[str, Any]) -> None:
        self._put(f"delivery:{version}", json.dumps(record).encode())

    def flush(self, timeout_s: float = 10.0) -> None:
        if self._producer.flush(timeout_s) != 0:
            raise KafkaException("planner history not acknowledged by the broker")

    def load(self, timeout_s: float = 10.0) -> History:
        history = read_history(self._bootstrap, self._topic, timeout_s, **self._config)
        # Keep retiring the oldest plans across restarts, not only this process's own.
        self._plans = sorted(history.plans)
        return history

    def close(self) -> None:
        self._producer.flush(5)


def read_history(bootstrap: str, topic: str, timeout_s: float = 10.0, **config: Any) -> History:
    """Every record of the (single-partition) topic, read by fetching until end of partition.

    Not by the ListOffsets high watermark: some brokers (Tansu) answer it one short after
    batched writes, which would drop the newest install.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "cacheroute-planner-history",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        **config,
    })
    history = History()
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return history
            if error is None:
                _apply(history, (msg.key() or b"").decode(), msg.value())
        raise KafkaException(f"planner history: no end of {topic} within {timeout_s:.0f} s")
    finally:
        consumer.close()


def _apply(h: History, key: str, value: bytes | None) -> None:
    kind, _, name = key.partition(":")
    if kind == "plan":
        version = Version.parse(name)
        if value is None:
            h.plans.pop(version, None)
        else:
            h.plans[version] = value
    elif kind == "current" and value is not None:
        h.current = Version.parse(value.decode())
    elif kind == "config" and value is not None:
        h.config = json.loads(value)
    elif kind == "loop" and value is not None:
        h.loop = json.loads(value)
    elif kind == "delivery":
        version = Version.parse(name)
        if value is None:
            h.deliveries.pop(version, None)
        else:
            h.deliveries[version] = json.loads(value)
    elif kind == "decision":
        ident = int(name)
        h.decisions = [d for d in h.decisions if d.get("id") != ident]
        if value is not None:
            h.decisions.append(json.loads(value))
