"""One source partition's pipeline: decode -> validate -> dedup -> windows (pure).

The Faust agent hands each partition's messages to its `PartitionProcessor` in
offset order and publishes what comes back: dead letters (`Rejected`) and closed
windows. The processor remembers the next offset it expects, so a message that
is delivered again after a restart is skipped instead of counted twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cacheroute.v1 import events_pb2
from streams.config import StreamConfig
from streams.decoding import (
    KIND_CACHE_HIT,
    KIND_ERROR,
    KIND_REQUEST,
    EventColumns,
    columns_of,
    decode_batch,
    take,
)
from streams.dedup import Deduplicator
from streams.metrics import StreamCounters
from streams.validation import CODE, OK, REASONS, identified, validate
from streams.windows import PartitionWindows, WindowResult
from streams.wire import fast_columns


@dataclass(frozen=True, slots=True)
class Rejected:
    """A dead letter: what was rejected (raw bytes), where it came from, and why."""

    reason: str
    detail: str
    raw: bytes
    offset: int


MAX_DEAD_LETTER_RAW = 256 << 10  # far below the producer's 2 MB message limit
MAX_DETAIL_CHARS = 1024


def dead_letter(r: Rejected, *, topic: str, partition: int,
                now_ms: int) -> events_pb2.DeadLetter:
    """The dead-letter message of `r`, always small enough to produce: a raw part beyond
    `MAX_DEAD_LETTER_RAW` is cut, and the detail says its full size and SHA-256 (so the
    original can still be found and compared)."""
    raw, detail = r.raw, r.detail[:MAX_DETAIL_CHARS]
    if len(raw) > MAX_DEAD_LETTER_RAW:
        digest = hashlib.sha256(raw).hexdigest()
        detail = (f"{detail} [raw truncated from {len(raw)} bytes to {MAX_DEAD_LETTER_RAW}; "
                  f"sha256={digest}]")
        raw = raw[:MAX_DEAD_LETTER_RAW]
    return events_pb2.DeadLetter(reason=r.reason, detail=detail, raw=raw, source_topic=topic,
                                 source_partition=partition, source_offset=r.offset,
                                 rejected_at_ms=now_ms)


@dataclass
class Outcome:
    rejected: list[Rejected] = field(default_factory=list)
    windows: list[WindowResult] = field(default_factory=list)


class PartitionProcessor:
    """All state of one source partition; see module docstring."""

    def __init__(self, partition: int, config: StreamConfig,
                 counters: StreamCounters | None = None) -> None:
        self.partition = partition
        self.config = config
        self.windows = PartitionWindows(config)
        self.dedup = Deduplicator(config.max_producers, max_jump=config.max_sequence_jump,
                                  max_gap=config.max_sequence_gap)
        self.counters = counters if counters is not None else StreamCounters()
        self.next_offset = 0
        self.last_event_wall_ms: int | None = None
        self.dead_letters = 0
        # Windows starting before this event time may lack events that the state
        # never saw (a recovery replayed history only from here); None = complete.
        self.complete_since_ms: int | None = None

    def process(self, messages: Sequence[tuple[int, bytes]], now_ms: int) -> Outcome:
        """Count the (offset, value) messages; returns dead letters and closed windows."""
        out = Outcome()
        # Offsets below next_offset are already in state (delivered again after a restart).
        fresh = [(o, raw) for o, raw in messages if o >= self.next_offset]
        if not fresh:
            return out
        self.next_offset = fresh[-1][0] + 1
        self.counters.messages += len(fresh)
        cols = fast_columns(fresh)
        if cols is None:  # garbage or unusual encodings: the reference decoder
            cols = self._reference_columns(fresh, out)
        if cols is not None and len(cols):
            self.last_event_wall_ms = now_ms
            self._count(cols, now_ms, out)
        self._tally(out.rejected)
        return out

    def _reference_columns(self, messages: list[tuple[int, bytes]],
                           out: Outcome) -> EventColumns | None:
        events: list = []
        offsets: list[int] = []
        for offset, raw in messages:
            batch = decode_batch(raw)
            if batch is None:
                out.rejected.append(Rejected("undecodable", "not an EventBatch", raw, offset))
                continue
            events.extend(batch)
            offsets.extend([offset] * len(batch))
        return columns_of(events, offsets) if events else None

    def log_reset(self, log_end: int, now_ms: int) -> bool:
        """Whether the partition's log now ends below what this state has read, and if
        so start over on the new log. A Kafka log never shrinks: a shorter one was
        deleted and created again, or the broker lost its storage. Its offsets begin
        at 0 again; without this every new message would look already counted (below
        `next_offset`) and the windows would stay empty while claiming to be complete.
        Events the old log held but this state had not read are gone with it, so
        windows that began before now are marked recovering. Repeats that the new
        log may carry (producer retries) are still dropped by producer sequence."""
        if log_end >= self.next_offset:
            return False
        self.next_offset = 0
        self.complete_since_ms = max(self.complete_since_ms or 0, now_ms)
        self.counters.log_resets += 1
        return True

    def is_complete(self, window: WindowResult) -> bool:
        """Whether `window` holds every event of its range (False: recovering)."""
        return self.complete_since_ms is None or window.window_start_ms >= self.complete_since_ms

    def tick(self, now_ms: int, caught_up: bool = True,
             log_known: bool = True) -> list[WindowResult]:
        """Close windows of an idle partition by the wall clock. Only a partition
        that has read its whole log is idle: a backlog is not silence. One that never saw
        an event starts its window clock only once its log's end is known (`log_known`):
        before the first fetch, an empty-looking partition may hold a backlog."""
        if not caught_up:
            return []
        if self.windows.next_end_ms is None and not log_known:
            return []
        idle_since = self.last_event_wall_ms
        if idle_since is not None and now_ms - idle_since < self.config.idle_ms:
            return []
        return self.windows.advance_idle(now_ms)

    def _count(self, cols: EventColumns, now_ms: int, out: Outcome) -> None:
        reasons = validate(cols, now_ms, self.config)
        bad = np.flatnonzero(reasons != OK)
        out.rejected.extend(_rejects(cols, bad, reasons[bad]))
        good = self._new_events(cols, reasons == OK, out)
        # An event a little ahead of this worker's clock (within max_future) counts as now:
        # event time must not move the windows' watermark past the wall clock, or a few
        # events stamped in the future would make every real event "late".
        if good.timestamp_ms.size and int(good.timestamp_ms.max()) > now_ms:
            good = dataclasses.replace(good, timestamp_ms=np.minimum(good.timestamp_ms, now_ms))
        late, closed = self.windows.ingest(good)
        late_idx = np.flatnonzero(late)
        out.rejected.extend(_rejects(good, late_idx, np.full(late_idx.size, CODE["late"])))
        counted = good.kind[~late]
        by_type = self.counters.events_by_type
        by_type["request"] += int(np.count_nonzero(counted == KIND_REQUEST))
        by_type["cache_hit"] += int(np.count_nonzero(counted == KIND_CACHE_HIT))
        by_type["error"] += int(np.count_nonzero(counted == KIND_ERROR))
        self.counters.overflow_events = self.windows.overflow_events
        self.counters.windows_closed += len(closed)
        out.windows.extend(closed)

    def _new_events(self, cols: EventColumns, valid: np.ndarray, out: Outcome) -> EventColumns:
        """The valid events not counted before. Every event that names its producer and
        sequence passes through dedup, rejected or not, so a producer's sequences stay
        consecutive there where some of its events were dead-lettered (a gap would open a
        run of its own, and too many runs forget the older ones)."""
        named = identified(cols, self.config)
        rows = None if bool(named.all()) else np.flatnonzero(named)
        seen = cols if rows is None else take(cols, rows)
        ok = valid if rows is None else valid[rows]
        opened = self.dedup.runs_opened
        keep = self.dedup.keep(seen.producer, seen.sequence)
        self.counters.sequence_runs_opened += self.dedup.runs_opened - opened
        jumped = np.asarray(self.dedup.last_jumps, dtype=np.int64)
        jumped = jumped[ok[jumped]]  # an invalid event has its dead letter already
        if jumped.size:  # forged or corrupt sequences: dead letters, not silent repeats
            out.rejected.extend(_rejects(seen, jumped, np.full(jumped.size, CODE["sequence_jump"])))
        new = keep & ok
        self.counters.duplicates += int(np.count_nonzero(ok & ~keep)) - int(jumped.size)
        return seen if bool(new.all()) else take(seen, np.flatnonzero(new))

    def _tally(self, rejected: list[Rejected]) -> None:
        for r in rejected:
            self.counters.dead_letters_by_reason[r.reason] += 1
        self.dead_letters += len(rejected)


def _rejects(cols: EventColumns, idx: np.ndarray, codes: np.ndarray) -> list[Rejected]:
    out = []
    for i, code in zip(idx.tolist(), codes.tolist(), strict=True):
        detail = (f"producer={cols.producer[i]!r} seq={int(cols.sequence[i])} "
                  f"ts={int(cols.timestamp_ms[i])} key={cols.key[i][:64]!r}")
        out.append(Rejected(REASONS[code], detail, cols.event_bytes(i),
                            int(cols.offset[i])))
    return out
