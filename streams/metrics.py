"""Worker counters and their Prometheus text form (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass
class StreamCounters:
    """What a worker has seen since it started (or since a partition was recovered)."""

    events_by_type: Counter[str] = field(default_factory=Counter)
    dead_letters_by_reason: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    # Events that opened a run of sequences beside their producer's (streams.dedup): lost
    # events, or sequences forged under a real producer's id.
    sequence_runs_opened: int = 0
    dead_letter_send_failures: int = 0
    overflow_events: int = 0
    messages: int = 0
    snapshots_published: int = 0
    windows_closed: int = 0
    lag_by_partition: dict[int, int] = field(default_factory=dict)
    assigned_partitions: int = 0
    recovering_partitions: int = 0
    log_resets: int = 0
    # Times the consumer resumed past the state's next offset, and the messages replayed
    # to close those gaps (streams.app.StreamWorker._fill_gap).
    gaps_filled: int = 0
    gap_messages: int = 0
    # Wall-clock seconds of the first and the latest message that carried events
    # (throughput = events / (last - first) without trusting an outside observer).
    first_events_at_s: float = 0.0
    last_events_at_s: float = 0.0

    @property
    def dead_letters(self) -> int:
        return sum(self.dead_letters_by_reason.values())

    @property
    def lag(self) -> int:
        return sum(self.lag_by_partition.values())

    def to_prometheus(self, prefix: str = "cacheroute_streams") -> str:
        """Prometheus text exposition (prometheus_client: escaping and format are its)."""
        registry = CollectorRegistry()
        registry.register(_Collector(self, prefix))
        return generate_latest(registry).decode()


class _Collector(Collector):
    def __init__(self, c: StreamCounters, prefix: str) -> None:
        self.c, self.prefix = c, prefix

    def collect(self) -> Iterator[Metric]:
        c, p = self.c, self.prefix
        events = CounterMetricFamily(f"{p}_events", "Valid events counted, by type.",
                                     labels=["type"])
        for t, n in sorted(c.events_by_type.items()):
            events.add_metric([t], n)
        letters = CounterMetricFamily(f"{p}_dead_letters",
                                      "Rejected events and messages, by reason.",
                                      labels=["reason"])
        for r, n in sorted(c.dead_letters_by_reason.items()):
            letters.add_metric([r], n)
        lag = GaugeMetricFamily(f"{p}_consumer_lag_messages",
                                "Messages behind the log end, by partition.",
                                labels=["partition"])
        for part, n in sorted(c.lag_by_partition.items()):
            lag.add_metric([str(part)], n)
        yield events
        yield letters
        yield lag
        for name, text, value in (
            ("duplicates", "Events dropped as already counted.", c.duplicates),
            ("sequence_runs_opened", "Events whose sequence did not continue a run of their "
             "producer's (lost events, or forged under its id).", c.sequence_runs_opened),
            ("dead_letter_send_failures", "Dead letters that could not be published (logged).",
             c.dead_letter_send_failures),
            ("overflow_events", "Events of keys beyond the tracked-key cap.", c.overflow_events),
            ("messages", "Kafka messages processed.", c.messages),
            ("snapshots_published", "Snapshot parts published.", c.snapshots_published),
            ("log_resets", "Partition logs found shorter than what was read (topic lost or "
             "re-created): counting restarted from the new log.", c.log_resets),
            ("gaps_filled", "Times the consumer resumed past the counted offsets (the gap "
             "was replayed from the log).", c.gaps_filled),
            ("gap_messages", "Messages replayed to close consumer gaps.", c.gap_messages),
        ):
            yield CounterMetricFamily(f"{p}_{name}", text, value=value)
        for name, text, g in (
            ("assigned_partitions", "Source partitions owned.", c.assigned_partitions),
            ("recovering_partitions", "Partitions still replaying history.",
             c.recovering_partitions),
            ("first_events_at_seconds", "Wall time of the first counted message.",
             c.first_events_at_s),
            ("last_events_at_seconds", "Wall time of the latest counted message.",
             c.last_events_at_s),
        ):
            yield GaugeMetricFamily(f"{p}_{name}", text, value=g)
