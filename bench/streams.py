"""Telemetry stream throughput and delay, through the real broker on loopback.

    .venv/bin/python bench/streams.py [--quick]

1. ceiling: a bare loop that only decodes the same EventBatch messages and
   counts keys, and the pure pipeline (`PartitionProcessor`, everything on)
   without Kafka, both in this process on the same batches;
2. drain: one worker process (`python -m streams worker`) started against a
   pre-produced backlog (128k distinct keys, requests + cache hits, dedup,
   validation, windows, hit rates, reuse statistic): events/s from its first
   counted event until the backlog is counted;
3. live: events produced at a fixed rate (default 100,000/s) while the worker
   runs: lag over time (must not grow) and the delay from the start of a hop
   to the complete window that contains it appearing on the snapshots topic
   (target: hop + 2 s); then the worker is SIGKILLed and its recovery timed.

Phases 2 and 3 run on each broker of `--brokers` in turn (Apache Kafka, then Tansu, by
default), with their figures suffixed `_kafka` / `_tansu`. The machine is shared and
noisy: compare figures with the ceiling measured in the same run. The last line is one
JSON object of figures.
"""

# ruff: noqa: E402 - bench/ must leave sys.path before `streams` is imported
from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the package it measures: keep bench/ off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import gc
import json
import resource
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cacheroute.v1 import events_pb2, snapshot_pb2
from planner_svc.devstack.processes import BROKER_KINDS, ManagedProcess, free_port, start_broker
from planner_svc.devstack.stack import stream_metrics as metrics
from streams.config import StreamConfig
from streams.partitioning import partition_for_key
from streams.processor import PartitionProcessor
from streams.windows import PartitionWindows

PARTITIONS = 4
KEYS = 128_000
BATCH = 500
WINDOW_S, HOP_S = 10, 2


def build_batches(
    n_events: int, rng: np.random.Generator, t0_ms: int, rate_per_s: float
) -> list[tuple[int, events_pb2.EventBatch]]:
    """(partition, batch) with every key's events in its partition; event times
    spread as if produced at `rate_per_s` from `t0_ms`."""
    keys = [f"tenant-{i:06d}/app-{i % 97}" for i in range(KEYS)]
    part_of = np.array([partition_for_key(k, PARTITIONS) for k in keys])
    # Zipf-like popularity, every key present
    draws = np.concatenate([np.arange(KEYS), (rng.pareto(1.2, n_events) * 50).astype(int) % KEYS])
    draws = draws[:n_events]
    rng.shuffle(draws)
    out: list[tuple[int, events_pb2.EventBatch]] = []
    pending: dict[int, events_pb2.EventBatch] = {
        p: events_pb2.EventBatch() for p in range(PARTITIONS)
    }
    for i, k in enumerate(draws.tolist()):
        p = int(part_of[k])
        b = pending[p]
        e = b.events.add(
            producer_id="bench", sequence=i + 1, timestamp_ms=t0_ms + int(i * 1000 / rate_per_s)
        )
        dest = f"dest-{(k * 7 + i % 3) % 30}"
        if i % 2:
            r = e.request
            r.routing_key, r.destination, r.prompt_tokens = keys[k], dest, 1500
            r.reusable_prefix_tokens, r.inflight = 1024, i % 9
        else:
            c = e.cache_hit
            c.routing_key, c.destination, c.prompt_tokens = keys[k], dest, 1500
            c.cached_tokens, c.queue_depth, c.e2e_ms = 1000, i % 7, 900.0
        if len(b.events) >= BATCH:
            out.append((p, b))
            pending[p] = events_pb2.EventBatch()
    out.extend((p, b) for p, b in pending.items() if len(b.events))
    return out


def bare_decode_count(values: list[bytes]) -> float:
    """The ceiling: decode and count keys, nothing else."""
    counts: Counter[str] = Counter()
    n = 0
    t = time.perf_counter()
    for v in values:
        for e in events_pb2.EventBatch.FromString(v).events:
            body = e.request if e.HasField("request") else e.cache_hit
            counts[body.routing_key] += 1
            n += 1
    return n / (time.perf_counter() - t)


@contextmanager
def time_spent_in(cls: type, names: tuple[str, ...]) -> Iterator[dict[str, float]]:
    """Seconds spent in each of `cls`'s methods `names` while the block runs (the
    methods are wrapped on the class and restored after): the share of the pipeline
    that closing windows, and naming each key's last destination in them, cost."""
    spent = dict.fromkeys(names, 0.0)
    originals = {name: getattr(cls, name) for name in names}

    def wrapped(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
        return timed

    for name, method in originals.items():
        setattr(cls, name, wrapped(name, method))
    try:
        yield spent
    finally:
        for name, method in originals.items():
            setattr(cls, name, method)


def pipeline_in_process(batches: list[tuple[int, bytes]],
                        now_ms: int) -> tuple[float, float, dict[str, float]]:
    """Events/s through the pure pipeline, its seconds, and the seconds of them spent
    closing windows (`_close_one`) and naming last destinations (`_last_destinations`)."""
    cfg = StreamConfig(window_ms=WINDOW_S * 1000, hop_ms=HOP_S * 1000)
    procs = {p: PartitionProcessor(p, cfg) for p in range(PARTITIONS)}
    n = 0
    with time_spent_in(PartitionWindows, ("_close_one", "_last_destinations")) as spent:
        t = time.perf_counter()
        for start in range(0, len(batches), 32):
            by_p: dict[int, list[tuple[int, bytes]]] = {}
            for off, (p, v) in enumerate(batches[start : start + 32], start):
                by_p.setdefault(p, []).append((off, v))
            for p, msgs in by_p.items():
                procs[p].process(msgs, now_ms)
        elapsed = time.perf_counter() - t
    for proc in procs.values():
        n += sum(proc.counters.events_by_type.values())
    return n / elapsed, elapsed, spent


def create_topics(bootstrap: str, tag: str) -> tuple[str, str]:
    events, snaps = f"bench-ev-{tag}", f"bench-snap-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(events, PARTITIONS, 1), NewTopic(snaps, 1, 1)]).values():
        f.result(10)
    return events, snaps


def produce(producer: Producer, topic: str, batches: list[tuple[int, bytes]],
            message_ts_ms: int = 0) -> None:
    for p, v in batches:
        while True:
            try:
                producer.produce(topic, value=v, partition=p, timestamp=message_ts_ms)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def broker_read(bootstrap: str, topic: str, total_messages: int) -> float:
    """Events/s of a bare aiokafka read of the topic (Faust's client): the broker +
    client ceiling, with no processing."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as TP

    async def run() -> float:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             max_partition_fetch_bytes=8 << 20)
        await c.start()
        tps = [TP(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        n = events = 0
        t = time.perf_counter()
        while n < total_messages:
            for records in (await c.getmany(timeout_ms=1000, max_records=512)).values():
                n += len(records)
                events += sum(len(r.value) for r in records)
        dt = time.perf_counter() - t
        await c.stop()
        return dt

    dt = asyncio.run(run())
    return total_messages * BATCH / dt


def wait_ready(port: int, timeout_s: float) -> float:
    """Seconds until the worker owns every partition and has recovered them."""
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        m = metrics(port)
        if m.get("assigned_partitions") == PARTITIONS and m.get("recovering_partitions") == 0:
            return time.monotonic() - t
        time.sleep(0.1)
    raise SystemExit(f"worker not ready in {timeout_s} s")


def drain(port: int, total: int, timeout_s: float) -> tuple[float, float]:
    """(events/s, seconds) by the worker's own clock: from the start of its first
    counted message to the end of the one that completed `total`."""
    deadline = time.monotonic() + timeout_s
    m: dict[str, float] = {}
    while time.monotonic() < deadline:
        m = metrics(port)
        if m.get("events_total", 0.0) >= total:
            dt = m["last_events_at_seconds"] - m["first_events_at_seconds"]
            return m["events_total"] / dt, dt
        time.sleep(0.2)
    raise SystemExit(f"worker counted {m.get('events_total')} of {total} in {timeout_s} s")


def recover(worker: ManagedProcess, port: int) -> tuple[float, float]:
    """SIGKILL the worker, start it again: (events replayed, seconds from the new
    process's assignment until every partition is rebuilt)."""
    worker.signal(signal.SIGKILL)
    assert worker.proc is not None
    worker.proc.wait(30)
    worker.start()
    deadline = time.monotonic() + 300
    assigned_at = None
    while time.monotonic() < deadline:
        m = metrics(port)
        if m.get("assigned_partitions") == PARTITIONS:
            assigned_at = assigned_at or time.monotonic()
            if m.get("recovering_partitions") == 0:
                return m.get("events_total", 0.0), time.monotonic() - assigned_at
        time.sleep(0.05)
    raise SystemExit("worker did not recover in 300 s")


class LiveProducer:
    """Sends pre-serialized batches on schedule. All batches of the live phase are
    stamped and serialized before it starts (event times = their planned send
    times), so the bench process spends almost no CPU while the worker is measured."""

    def __init__(self, producer: Producer, topic: str,
                 templates: list[tuple[int, events_pb2.EventBatch]], seq0: int,
                 rate: float, seconds: float, build_rate: float) -> None:
        self.p, self.topic = producer, topic
        n_batches = int(rate * seconds / BATCH) + 1
        self.interval_s = BATCH / rate
        # start far enough ahead that building the batches finishes first
        self.start_s = time.time() + 1.5 * n_batches * BATCH / build_rate + 2.0
        seq = seq0
        self.batches: list[tuple[int, bytes]] = []
        for j in range(n_batches):
            part, b = templates[j % len(templates)]
            ts = int((self.start_s + j * self.interval_s) * 1000)
            for e in b.events:
                seq += 1
                e.sequence = seq
                e.timestamp_ms = ts
            self.batches.append((part, b.SerializeToString()))
        self.sent = 0
        self.late_start_s = max(0.0, time.time() - self.start_s)

    def send_due(self) -> None:
        """Send every batch whose planned time has come."""
        due = min(len(self.batches), int((time.time() - self.start_s) / self.interval_s) + 1)
        while self.sent // BATCH < due:
            part, value = self.batches[self.sent // BATCH]
            try:
                self.p.produce(self.topic, value=value, partition=part)
            except BufferError:
                self.p.poll(0.01)
                continue
            self.sent += BATCH
        self.p.poll(0)


def live(producer: LiveProducer, port: int, snaps: Consumer, rate: float, seconds: float):
    """Produce at `rate` for `seconds`; sample lag and window delays."""
    lag_samples: list[tuple[float, float]] = []
    delays: list[float] = []
    parts: dict[int, set[int]] = {}
    while time.time() < producer.start_s:
        time.sleep(0.01)
    t0 = time.monotonic()
    next_sample = t0
    while time.monotonic() - t0 < seconds:
        producer.send_due()
        now = time.monotonic()
        if now >= next_sample:
            lag_samples.append((now - t0, metrics(port).get("consumer_lag_messages", 0.0)))
            next_sample = now + 0.5
        _collect_delays(snaps, parts, delays, t0_wall=time.time() - (now - t0))
        time.sleep(0.002)
    return lag_samples, delays


def _collect_delays(
    snaps: Consumer, parts: dict[int, set[int]], delays: list[float], t0_wall: float
) -> None:
    for m in snaps.consume(200, 0):
        if m.error():
            continue
        s = snapshot_pb2.RateSnapshot.FromString(m.value())
        got = parts.setdefault(s.window_end_ms, set())
        got.add(s.source_partition * 1000 + s.part_index)
        total = s.partition_count * s.part_count  # parts per partition are equal here
        hop_start = (s.window_end_ms - HOP_S * 1000) / 1000
        if len(got) == total and hop_start > t0_wall + 1:
            delays.append(time.time() - hop_start)
            got.add(-1)  # count each window once


def on_broker(kind: str, work: Path, originals: list[tuple[int, bytes]], built_ms: int,
              backlog: int, bare: float, args: argparse.Namespace, live_s: float,
              build_rate: float) -> dict[str, Any]:
    """The drain, live and recovery phases on one broker of `kind`, on its own copy of the
    backlog (`originals`, stamped at `built_ms`): the phases restamp and renumber events."""
    built = [(p, events_pb2.EventBatch.FromString(v)) for p, v in originals]
    work.mkdir(parents=True)
    broker = start_broker(work, kind=kind)
    worker = None
    try:
        tag = uuid.uuid4().hex[:6]
        events_topic, snaps_topic = create_topics(broker.bootstrap, tag)
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "linger.ms": 5,
                "queue.buffering.max.messages": 200_000,
                "queue.buffering.max.kbytes": 1 << 21,
            }
        )
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "streams",
            "worker",
            "--bootstrap",
            broker.bootstrap,
            "--web-port",
            str(port),
            "--events-topic",
            events_topic,
            "--snapshots-topic",
            snaps_topic,
            "--deadletter-topic",
            f"bench-dl-{tag}",
            "--app-id",
            f"bench-{tag}",
            "--data-dir",
            str(work / "faust"),
            "--window-s",
            str(WINDOW_S),
            "--hop-s",
            str(HOP_S),
        ]
        worker = ManagedProcess("streams", argv, work / "worker.log")
        started = time.monotonic()
        worker.start()
        ready_s = wait_ready(port, 120)
        # The backlog lands at once (librdkafka sends it in well under the drain
        # time); the worker's own clock times the drain. (Producing it before the
        # worker starts would drain it through the recovery replay instead: Tansu
        # answers offsets-for-times with the log start.)
        # Events stamped when the backlog was built are, by now, older than a window: the
        # worker's idle partitions advanced their clocks to the wall clock while it started
        # (streams.windows.advance_idle), so they would be dead-lettered as late (a 600k
        # backlog lost 401,700). A backlog is a burst that just arrived: stamp it now.
        shift_ms = int(time.time() * 1000) - built_ms
        for _, batch in built:
            for event in batch.events:
                event.timestamp_ms += shift_ms
        values = [(p, b.SerializeToString()) for p, b in built]
        t = time.perf_counter()
        produce(producer, events_topic, values)
        produce_s = time.perf_counter() - t
        drain_rate, drain_s = drain(port, backlog, timeout_s=600)
        start_to_drained_s = time.monotonic() - started
        print(f"{kind}: drain: {drain_rate:,.0f} ev/s ({drain_s:.1f} s)", flush=True)
        read_rate = broker_read(broker.bootstrap, events_topic, len(values))
        print(f"{kind}: bare aiokafka read of the backlog: {read_rate:,.0f} ev/s", flush=True)

        snaps = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"b-{tag}",
                "auto.offset.reset": "latest",
                # what the planner's SnapshotConsumer uses (adapters/snapshot_consumer.py)
                "fetch.wait.max.ms": 100,
            }
        )
        snaps.assign([TopicPartition(snaps_topic, 0, -1)])  # from the end
        lp = LiveProducer(producer, events_topic, built[:400], backlog + 10, args.live_rate,
                          live_s, build_rate)
        lag, delays = live(lp, port, snaps, args.live_rate, live_s)
        produced_rate = lp.sent / live_s
        snaps.close()
        counted = metrics(port)
        worker_rss = worker.peak_rss_mb() or float("nan")
        broker_rss = broker.process.peak_rss_mb() or float("nan")
        recovered_events, recovery_s = recover(worker, port)
        print(f"{kind}: recovery after SIGKILL: {recovered_events:,.0f} events in "
              f"{recovery_s:.1f} s", flush=True)
    finally:
        if worker is not None:
            worker.stop()
        broker.process.stop()

    tail = [(t, v) for t, v in lag if t >= live_s / 2]
    slope = (
        float(np.polyfit([t for t, _ in tail], [v for _, v in tail], 1)[0])
        if len(tail) > 2
        else float("nan")
    )
    fig: dict[str, Any] = {
        "events_per_s": round(drain_rate),
        "drain_over_bare": round(drain_rate / bare, 3),
        "broker_read_events_per_s": round(read_rate),
        "produce_backlog_s": round(produce_s, 2),
        "worker_ready_s": round(ready_s, 1),
        "worker_start_to_drained_s": round(start_to_drained_s, 1),
        "recovery_events": recovered_events,
        "recovery_s": round(recovery_s, 2),
        "recovery_events_per_s": round(recovered_events / recovery_s) if recovery_s else None,
        "drain_s": round(drain_s, 2),
        "live_produced_events_per_s": round(produced_rate),
        "live_start_late_s": round(lp.late_start_s, 2),
        "live_lag_max_messages": max((v for _, v in lag), default=float("nan")),
        "live_lag_last_messages": lag[-1][1] if lag else float("nan"),
        "live_lag_slope_messages_per_s": round(slope, 2),
        "delay_p50_s": round(float(np.median(delays)), 3) if delays else None,
        "delay_p99_s": round(float(np.percentile(delays, 99)), 3) if delays else None,
        "delay_max_s": round(max(delays), 3) if delays else None,
        "windows_observed": len(delays),
        "worker_peak_rss_mb": round(worker_rss, 1),
        "dead_letters": counted.get("dead_letters_total", 0.0),
        "broker_peak_rss_mb": round(broker_rss, 1),
    }
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller backlog, shorter live phase")
    ap.add_argument("--backlog", type=int, default=None)
    ap.add_argument("--live-rate", type=float, default=100_000)
    ap.add_argument("--live-s", type=float, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (worker log)")
    ap.add_argument("--brokers", default=",".join(BROKER_KINDS),
                    help="the brokers to run on, in order (figures are suffixed _KIND)")
    args = ap.parse_args()
    backlog = args.backlog or (600_000 if args.quick else 3_000_000)
    live_s = args.live_s or (10.0 if args.quick else 30.0)
    rng = np.random.default_rng(1)
    now = int(time.time() * 1000)
    # the same collector settings as the worker (streams/__main__.py), for a fair ceiling
    gc.set_threshold(100_000, 50, 100)

    print(f"building {backlog:,} events over {KEYS:,} keys ...", flush=True)
    t = time.perf_counter()
    built = build_batches(backlog, rng, now - int(backlog / 300.0), 300_000)
    build_rate = backlog / (time.perf_counter() - t)
    values = [(p, b.SerializeToString()) for p, b in built]
    gc.collect()
    gc.freeze()
    bare = bare_decode_count([v for _, v in values])
    inproc, inproc_s, spent = pipeline_in_process(values, int(time.time() * 1000))
    print(
        f"bare decode+count: {bare:,.0f} ev/s   pipeline in-process: {inproc:,.0f} ev/s", flush=True
    )
    print(f"  of its {inproc_s:.2f} s: closing windows {spent['_close_one']:.3f} s, of which "
          f"naming last destinations {spent['_last_destinations']:.3f} s", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    fig: dict[str, Any] = {
        "bare_decode_events_per_s": round(bare),
        "pipeline_in_process_events_per_s": round(inproc),
        "pipeline_window_close_s": round(spent["_close_one"], 3),
        "pipeline_last_destinations_s": round(spent["_last_destinations"], 3),
        "pipeline_in_process_s": round(inproc_s, 2),
        "backlog_events": backlog,
        "distinct_keys": KEYS,
        "delay_target_s": HOP_S + 2,
        "hop_s": HOP_S,
        "window_s": WINDOW_S,
    }
    try:
        for kind in args.brokers.split(","):
            one = on_broker(kind, work / kind, values, now, backlog, bare, args, live_s,
                            build_rate)
            fig.update({f"{name}_{kind}": value for name, value in one.items()})
    finally:
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    fig["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print()
    print(f"{'figure':40s} value")
    for k, v in fig.items():
        print(f"{k:40s} {v}")
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
