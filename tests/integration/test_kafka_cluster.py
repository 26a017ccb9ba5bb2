"""Production's shape on loopback: three KRaft brokers, replication factor 3,
`min.insync.replicas` 2, idempotent `acks=all` producers. One broker is SIGKILLed while the
producers send at full speed and the stream worker counts; every acknowledged event is
counted exactly once in the window, and the killed broker rejoins the ISR once restarted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from test_stream_support import SnapshotLog, Topics, start_worker

from planner_svc.devstack.kafka import KafkaCluster, restart_kafka, start_kafka_cluster
from planner_svc.devstack.stack import stream_metrics, worker_web_port
from streams.assembly import CompleteWindow
from streams.emitter import EventEmitter
from tests.faults import signals

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
EVENTS_PER_PRODUCER = 300_000
PRODUCERS = 2


def replicated_topics(cluster: KafkaCluster, tag: str) -> Topics:
    t = Topics(f"ev-{tag}", f"snap-{tag}", f"dl-{tag}", f"streams-{tag}")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = [NewTopic(t.events, num_partitions=PARTITIONS, replication_factor=3),
           NewTopic(t.snapshots, num_partitions=1, replication_factor=3),
           NewTopic(t.deadletter, num_partitions=1, replication_factor=3)]
    for f in admin.create_topics(new).values():
        f.result(30)
    return t


def isr_sizes(cluster: KafkaCluster, topic: str) -> list[int]:
    meta = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    return [len(p.isrs) for p in meta.topics[topic].partitions.values()]


def leader_of(cluster: KafkaCluster, topic: str, partition: int) -> int:
    meta = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    return int(meta.topics[topic].partitions[partition].leader)


def produce(bootstrap: str, topic: str, name: str, sent: list[float]) -> None:
    with EventEmitter(bootstrap, topic, producer_id=name) as em:
        for i in range(EVENTS_PER_PRODUCER):
            em.emit_request(f"k-{i % 5000}", f"d{i % 8}", prompt_tokens=10)
        assert em.flush(120) == 0
        assert em.dropped == 0
    sent.append(time.monotonic())


def test_a_broker_killed_under_load_loses_and_doubles_nothing(tmp_path: Path) -> None:
    cluster = start_kafka_cluster(tmp_path)
    worker = None
    try:
        topics = replicated_topics(cluster, "kill")
        worker = start_worker(cluster.bootstrap, topics, tmp_path, "--window-s", "600",
                              "--hop-s", "2")
        port = worker_web_port(worker)
        deadline = time.monotonic() + 60
        while stream_metrics(port).get("assigned_partitions", 0) < PARTITIONS:
            assert time.monotonic() < deadline, worker.log_tail(30)
            time.sleep(0.2)
        snaps = SnapshotLog(cluster.bootstrap, topics.snapshots)
        finished: list[float] = []
        started = time.monotonic()
        threads = [threading.Thread(target=produce, args=(cluster.bootstrap, topics.events,
                                                          f"p{i}", finished))
                   for i in range(PRODUCERS)]
        for t in threads:
            t.start()
        # the leader of an events partition: its clients must move to a new leader
        victim = next(n for n in cluster.nodes
                      if n.node_id == leader_of(cluster, topics.events, 0))
        time.sleep(1.5)  # under load
        signals.kill(victim.process.pid)
        killed_at = time.monotonic()
        for t in threads:
            t.join(180)
        assert len(finished) == PRODUCERS, "a producer did not get every event acknowledged"
        total = PRODUCERS * EVENTS_PER_PRODUCER
        rate = total / (max(finished) - started)
        print(f"produced {total} events at {rate:,.0f}/s, broker {victim.node_id} killed "
              f"{killed_at - started:.1f} s in")

        def exact(w: CompleteWindow) -> bool:
            return not w.recovering and int(w.requests.sum()) == total

        found = snaps.wait_for(exact, timeout_s=120)
        counted_after = time.monotonic() - max(finished)
        seen = [(int(w.requests.sum()), w.recovering) for w in snaps.complete_windows()[-3:]]
        assert found is not None, (seen, worker.log_tail(30))
        # never more than the truth in any complete window (no double count)
        assert all(int(w.requests.sum()) <= total for w in snaps.complete_windows()), seen
        print(f"every event counted {counted_after:.1f} s after the last acknowledgement")

        victim.process.stop()
        restart_kafka(victim)
        deadline = time.monotonic() + 60
        while isr_sizes(cluster, topics.events) != [3] * PARTITIONS:
            assert time.monotonic() < deadline, isr_sizes(cluster, topics.events)
            time.sleep(0.5)
    finally:
        if worker is not None:
            worker.stop()
        cluster.stop()
