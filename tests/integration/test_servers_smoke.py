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


def test_the_stack_starts_again_when_its_ports_are_taken_before_its_servers_bind(
        tmp_path, monkeypatch):
    """`free_port()` finds a port; the server binds it seconds later. Here something else
    holds it in between (as an outgoing connection's ephemeral port did once in CI): the
    worker and the planner exit on the bind and start again on new ports."""
    import socket

    from planner_svc.devstack import stack as stack_mod

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    handed = iter([port, port])  # the worker's web port, then the planner's gRPC port
    real = stack_mod.free_port
    monkeypatch.setattr(stack_mod, "free_port", lambda: next(handed, None) or real())
    options = stack_mod.StackOptions(destinations=2, event_partitions=1, workers=1,
                                     workdir=str(tmp_path))
    s = stack_mod.start_stack(options)
    try:
        assert s.planner is not None and s.planner.alive()
        assert s.grpc_port != port
        assert all(w.alive() for w in s.workers)
        assert stack_mod.worker_web_port(s.workers[0]) != port
    finally:
        s.stop()
        taken.close()
