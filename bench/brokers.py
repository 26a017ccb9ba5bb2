"""Start-up time and memory of the two local brokers (Apache Kafka, Tansu), as the devstack
starts them.

    .venv/bin/python bench/brokers.py [--starts 3] [--events 200000]

For each broker, `--starts` times: the seconds from `start_broker()` to a broker that
answers metadata (Kafka's include formatting its storage), then the seconds until a first
produce is acknowledged, then `--events` small records produced (idempotent, acks=all) and
read back (for at most 30 s), and the broker's resident set (VmRSS) idle after the start
and its peak (VmHWM) after the load. The machine is shared: compare the two brokers
within one run. The last line is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from planner_svc.devstack.processes import BROKER_KINDS, ManagedProcess, start_broker


def rss_mb(process: ManagedProcess) -> float:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def first_ack_s(bootstrap: str, topic: str) -> float:
    started = time.monotonic()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    p.produce(topic, value=b"first")
    if p.flush(30) != 0:
        raise RuntimeError("the first record was not acknowledged in 30 s")
    return time.monotonic() - started


def produce(bootstrap: str, topic: str, events: int) -> float:
    """`events` 100-byte records, idempotent, acks=all: acknowledged events/s."""
    started = time.monotonic()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    value = b"x" * 100
    for _ in range(events):
        p.produce(topic, value=value)
        p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("records were not acknowledged in 60 s")
    return events / (time.monotonic() - started)


def read_back(bootstrap: str, topic: str, events: int, limit_s: float = 30.0) -> float:
    """Read the topic from its start: records/s, over at most `limit_s`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    started = time.monotonic()
    seen = 0
    while seen < events and time.monotonic() - started < limit_s:
        seen += sum(1 for m in c.consume(10_000, 0.5) if not m.error())
    c.close()
    return seen / (time.monotonic() - started)


def measure(kind: str, workdir: Path, events: int) -> dict[str, float]:
    started = time.monotonic()
    broker = start_broker(workdir, kind=kind)
    try:
        AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30)
        start_s = time.monotonic() - started
        idle = rss_mb(broker.process)
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        ack_s = first_ack_s(broker.bootstrap, topic)
        produced = produce(broker.bootstrap, topic, events)
        read = read_back(broker.bootstrap, topic, events + 1)
        return {"start_s": start_s, "first_ack_s": ack_s, "idle_rss_mb": idle,
                "peak_rss_mb": broker.process.peak_rss_mb(), "produce_events_per_s": produced,
                "read_events_per_s": read}
    finally:
        broker.process.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--brokers", default=",".join(BROKER_KINDS))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-brokers-"))
    fig: dict[str, float] = {}
    try:
        for kind in args.brokers.split(","):
            runs = [measure(kind, work, args.events) for _ in range(args.starts)]
            for name in runs[0]:
                values = [r[name] for r in runs]
                fig[f"{name}_{kind}"] = round(statistics.median(values), 3)
                fig[f"{name}_{kind}_max"] = round(max(values), 3)
                print(f"{kind} {name}: " + " ".join(f"{v:.3f}" for v in values), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # The run's peak: the largest broker's, or this process's (the clients) if larger.
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fig["peak_rss_mb"] = round(max([own_mb, *(v for k, v in fig.items()
                                              if k.startswith("peak_rss_mb_"))]), 1)
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
