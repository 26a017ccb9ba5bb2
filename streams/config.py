"""What the stream computes and what it accepts: one frozen config (pure).

Built once at the entry point (from `streams.settings.Settings`) and passed to
the partition processors; nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from cacheroute.keyblob import MAX_KEY_BYTES
from streams.dedup import DEFAULT_MAX_GAP, DEFAULT_MAX_JUMP
from streams.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamConfig:
    """Window geometry, statistics and validation limits. Times in milliseconds."""

    window_ms: int = 60_000
    hop_ms: int = 10_000
    # Events up to `grace_ms` behind the newest event time still make the window
    # they belong to before it is published. Later events still count in every
    # later window that covers their hop.
    grace_ms: int = 500
    # A partition without events for this long advances its event clock with the
    # wall clock, so idle partitions still publish each hop.
    idle_ms: int = 1_000
    ewma_alpha: float = 0.3
    # Reuse statistic: a request "reuses" when its key was seen on the same
    # destination at most this long before.
    eviction_ms: int = 60_000
    max_tracked_keys: int = 262_144
    max_destinations: int = 4_096
    max_key_bytes: int = MAX_KEY_BYTES
    max_tokens: int = 10_000_000
    max_future_ms: int = 10_000
    max_past_ms: int = 6 * 3_600_000
    max_producers: int = 100_000
    # Dedup (streams.dedup): an event at most this far above the end of one of its
    # producer's runs of sequences extends that run; a farther one opens a run of its own and
    # never moves the producer's mark. 1 because producers number each partition 1, 2, 3...
    # (the emitter does); a larger gap lets one forged event shadow that many real ones.
    max_sequence_gap: int = DEFAULT_MAX_GAP
    # A sequence this far above every run of its producer is a dead letter (sequence_jump).
    max_sequence_jump: int = DEFAULT_MAX_JUMP
    # Keys whose EWMA rate decayed below this and have no traffic are not published.
    min_published_rate_per_s: float = 1e-3
    snapshot_part_bytes: int = 900_000

    def __post_init__(self) -> None:
        _require(self.hop_ms > 0, "hop_ms must be > 0")
        _require(
            self.window_ms >= self.hop_ms and self.window_ms % self.hop_ms == 0,
            "window_ms must be a positive multiple of hop_ms",
        )
        _require(self.grace_ms >= 0 and self.idle_ms >= 0, "grace_ms, idle_ms must be >= 0")
        _require(0.0 < self.ewma_alpha <= 1.0, "ewma_alpha must be in (0, 1]")
        _require(self.eviction_ms > 0, "eviction_ms must be > 0")
        _require(self.max_tracked_keys > 0 and self.max_destinations > 0, "caps must be > 0")
        _require(self.snapshot_part_bytes >= 4096, "snapshot_part_bytes must be >= 4096")
        _require(1 <= self.max_sequence_gap <= self.max_sequence_jump,
                 "max_sequence_gap must be in [1, max_sequence_jump]")

    @property
    def buckets_per_window(self) -> int:
        """N: hops per window; a window is the sum of its N hop buckets."""
        return self.window_ms // self.hop_ms

    @property
    def ring_slots(self) -> int:
        """Bucket slots held: the next window's N buckets plus those still in grace."""
        return self.buckets_per_window + -(-self.grace_ms // self.hop_ms) + 1


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
