"""The fixtures start real servers that real clients can use."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration


def test_redis_answers(redis_server):
    r = redis.Redis.from_url(redis_server.url)
    assert r.ping()
    r.set("k", "v")
    assert r.get("k") == b"v"


def test_broker_round_trip(broker):
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(10):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(10) == 0
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    c.subscribe([topic])
    got = set()
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.add(m.value())
    c.close()
    assert got == {f"v{i}".encode() for i in range(10)}
