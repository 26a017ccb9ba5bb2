"""A broker that loses its storage under running clients (the local broker's memory
storage after SIGKILL; a wiped or rebuilt cluster in production).

An idempotent producer the broker no longer knows is stuck without an error; the
`RenewingProducer` replaces it and sends what was unacknowledged again, in order. The
stream worker's part (offsets that start over) is in the chaos test and the processor's
unit tests.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from planner_svc.devstack.processes import start_broker
from streams.producer import RenewingProducer
from tests.faults import signals

pytestmark = pytest.mark.integration


def create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(20)


def values_of(bootstrap: str, topic: str, want: int, timeout_s: float = 20.0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            out.append(m.value())
    c.close()
    return out


def test_a_producer_the_broker_forgot_is_replaced_and_resends_in_order(tmp_path: Path):
    broker = start_broker(tmp_path)
    try:
        create(broker.bootstrap, "t")
        p = RenewingProducer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                              "acks": "all", "log_level": 0}, stall_s=1.0)
        delivered: list[bytes] = []
        for i in range(5):
            p.produce("t", value=b"before-%d" % i, on_delivery=lambda e, m: delivered.append(
                m.value()) if e is None else None)
        assert p.flush(10) == 0
        signals.kill(broker.process.pid)
        broker.process.stop()
        broker = start_broker(tmp_path, port=broker.port)  # same address, empty storage
        create(broker.bootstrap, "t")
        after = [b"after-%d" % i for i in range(50)]
        for v in after:
            p.produce("t", value=v, on_delivery=lambda e, m: delivered.append(
                m.value()) if e is None else None)
        assert p.flush(30) == 0
        assert p.renewals >= 1
        assert delivered[5:] == after  # each acknowledged once, in order
        assert values_of(broker.bootstrap, "t", len(after)) == after
    finally:
        broker.process.stop()
