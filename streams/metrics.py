"""Worker counters and their Prometheus text form (pure)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StreamCounters:
    """What a worker has seen since it started (or since a partition was recovered)."""

    events_by_type: Counter[str] = field(default_factory=Counter)
    dead_letters_by_reason: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    dead_letter_send_failures: int = 0
    overflow_events: int = 0
    messages: int = 0
    snapshots_published: int = 0
    windows_closed: int = 0
    lag_by_partition: dict[int, int] = field(default_factory=dict)
    assigned_partitions: int = 0
    recovering_partitions: int = 0
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
        """Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {prefix}_{name} {help_}")
            lines.append(f"# TYPE {prefix}_{name} {kind}")
            lines.extend(f"{prefix}_{name}{labels} {value:.17g}" for labels, value in samples)

        metric("events_total", "counter", "Valid events counted, by type.",
               [(f'{{type="{t}"}}', n) for t, n in sorted(self.events_by_type.items())])
        metric("dead_letters_total", "counter", "Rejected events and messages, by reason.",
               [(f'{{reason="{r}"}}', n) for r, n in sorted(self.dead_letters_by_reason.items())])
        metric("duplicates_total", "counter", "Events dropped as already counted.",
               [("", self.duplicates)])
        metric("dead_letter_send_failures_total", "counter",
               "Dead letters that could not be published (logged).",
               [("", self.dead_letter_send_failures)])
        metric("overflow_events_total", "counter", "Events of keys beyond the tracked-key cap.",
               [("", self.overflow_events)])
        metric("messages_total", "counter", "Kafka messages processed.", [("", self.messages)])
        metric("snapshots_published_total", "counter", "Snapshot parts published.",
               [("", self.snapshots_published)])
        metric("consumer_lag_messages", "gauge", "Messages behind the log end, by partition.",
               [(f'{{partition="{p}"}}', n) for p, n in sorted(self.lag_by_partition.items())])
        metric("assigned_partitions", "gauge", "Source partitions owned.",
               [("", self.assigned_partitions)])
        metric("recovering_partitions", "gauge", "Partitions still replaying history.",
               [("", self.recovering_partitions)])
        metric("first_events_at_seconds", "gauge", "Wall time of the first counted message.",
               [("", self.first_events_at_s)])
        metric("last_events_at_seconds", "gauge", "Wall time of the latest counted message.",
               [("", self.last_events_at_s)])
        return "\n".join(lines) + "\n"
