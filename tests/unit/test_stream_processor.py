"""The per-partition pipeline (streams.processor), dedup and key slots, no servers."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cacheroute.v1 import events_pb2
from streams.categorical import Categorical
from streams.config import StreamConfig
from streams.dedup import Deduplicator
from streams.keyspace import SlotMap
from streams.processor import PartitionProcessor

NOW = 1_800_000_000_000
CFG = StreamConfig(window_ms=10_000, hop_ms=2_000, grace_ms=0)


def batch(*events: events_pb2.Event) -> bytes:
    return events_pb2.EventBatch(events=list(events)).SerializeToString()


def req(seq: int, key: str = "k", ts: int = NOW, producer: str = "p") -> events_pb2.Event:
    return events_pb2.Event(producer_id=producer, sequence=seq, timestamp_ms=ts,
                            request=events_pb2.RequestEvent(routing_key=key, destination="d",
                                                            prompt_tokens=5))


def total_requests(proc: PartitionProcessor) -> int:
    return int(proc.counters.events_by_type["request"])


def test_redelivered_messages_are_skipped_by_offset():
    proc = PartitionProcessor(0, CFG)
    proc.process([(0, batch(req(1))), (1, batch(req(2)))], NOW)
    proc.process([(0, batch(req(1))), (1, batch(req(2))), (2, batch(req(3)))], NOW)
    assert total_requests(proc) == 3
    assert proc.next_offset == 3


def test_duplicate_events_are_dropped_and_counted():
    proc = PartitionProcessor(0, CFG)
    proc.process([(0, batch(req(1), req(2), req(3)))], NOW)
    proc.process([(1, batch(req(2), req(3), req(4)))], NOW)  # a producer retry, re-batched
    assert total_requests(proc) == 4
    assert proc.counters.duplicates == 2
    assert proc.dedup.duplicates == 2


def test_bad_message_and_bad_event_become_dead_letters_good_ones_count():
    proc = PartitionProcessor(0, CFG)
    bad_event = events_pb2.Event(producer_id="p", sequence=9, timestamp_ms=NOW)  # no body
    out = proc.process([(0, b"\xff\xffgarbage"), (1, batch(req(1), bad_event, req(2)))], NOW)
    assert [(r.reason, r.offset) for r in out.rejected] == [("undecodable", 0),
                                                            ("unknown_type", 1)]
    assert out.rejected[1].raw == bad_event.SerializeToString()
    assert total_requests(proc) == 2
    assert proc.dead_letters == 2
    assert dict(proc.counters.dead_letters_by_reason) == {"undecodable": 1, "unknown_type": 1}


def test_idle_tick_closes_windows_only_when_caught_up():
    proc = PartitionProcessor(0, CFG)
    proc.process([(0, batch(req(1, ts=NOW)))], NOW)
    assert proc.tick(NOW + 20_000, caught_up=False) == []
    closed = proc.tick(NOW + 20_000, caught_up=True)
    assert closed and sum(int(w.requests.sum()) for w in closed[:1]) == 1


def test_windows_before_the_replayed_history_are_marked_incomplete():
    proc = PartitionProcessor(0, CFG)
    proc.complete_since_ms = NOW
    out = proc.process([(0, batch(req(1, ts=NOW + 1), req(2, ts=NOW + 30_000)))], NOW + 30_000)
    assert {proc.is_complete(w) for w in out.windows} == {False, True}


def test_dedup_tracks_producers_separately_and_is_bounded():
    d = Deduplicator(max_producers=2)
    keep = d.keep(Categorical.of(["a", "b", "a", "b"]), np.array([1, 1, 2, 1], dtype=np.uint64))
    assert keep.tolist() == [True, True, True, False]
    d.keep(Categorical.of(["c"]), np.array([1], dtype=np.uint64))  # evicts the least recent ("a")
    assert len(d) == 2 and d.forgotten == 1


@given(st.lists(st.integers(1, 50), max_size=60))
def test_dedup_keeps_exactly_the_first_time_each_sequence_is_seen(seqs):
    d = Deduplicator(max_runs=64)
    keep = d.keep(Categorical.of(["p"] * len(seqs)), np.array(seqs, dtype=np.uint64))
    assert keep.tolist() == [s not in seqs[:i] for i, s in enumerate(seqs)]


batches_of_sequences = st.lists(
    st.one_of(st.lists(st.integers(1, 40), max_size=12),  # anything
              st.builds(lambda lo, n: list(range(lo, lo + n)), st.integers(1, 40),
                        st.integers(1, 12))),  # a run in order (the one-step path)
    max_size=8)


@given(batches_of_sequences)
def test_dedup_across_batches_keeps_exactly_first_occurrences(batches):
    d = Deduplicator(max_runs=64)
    seen: set[int] = set()
    for seqs in batches:
        keep = d.keep(Categorical.of(["p"] * len(seqs)), np.array(seqs, dtype=np.uint64))
        for s, kept in zip(seqs, keep.tolist(), strict=True):
            assert kept == (s not in seen)
            seen.add(s)


@given(batches_of_sequences)
def test_dedup_never_drops_a_new_sequence_whatever_it_forgets(batches):
    d = Deduplicator(max_runs=2)
    seen: set[int] = set()
    for seqs in batches:
        keep = d.keep(Categorical.of(["p"] * len(seqs)), np.array(seqs, dtype=np.uint64))
        for s, kept in zip(seqs, keep.tolist(), strict=True):
            assert kept or s in seen
            seen.add(s)


def test_a_forward_jump_does_not_freeze_the_real_producer():
    d = Deduplicator()
    one = Categorical.of(["p"])
    assert d.keep(Categorical.of(["p"] * 3), np.array([1, 2, 3], dtype=np.uint64)).all()
    assert d.keep(one, np.array([9_000_003], dtype=np.uint64)).all()  # forged: its own run
    later = d.keep(Categorical.of(["p"] * 3), np.array([4, 5, 6], dtype=np.uint64))
    assert later.all() and d.runs_opened == 1 and d.duplicates == 0
    assert not d.keep(Categorical.of(["p"] * 2), np.array([5, 9_000_003], dtype=np.uint64)).any()
    assert d.duplicates == 2


def test_a_forged_run_shadows_only_the_sequences_it_covers():
    d = Deduplicator()
    d.keep(Categorical.of(["p"] * 2), np.array([1, 2], dtype=np.uint64))
    d.keep(Categorical.of(["p"] * 2), np.array([5, 6], dtype=np.uint64))  # forged just ahead
    keep = d.keep(Categorical.of(["p"] * 6), np.arange(3, 9, dtype=np.uint64))
    assert keep.tolist() == [True, True, False, False, True, True]


def test_a_batch_continuing_one_run_into_another_counts_only_what_is_new():
    d = Deduplicator()
    d.keep(Categorical.of(["p"] * 2), np.array([1, 2], dtype=np.uint64))
    d.keep(Categorical.of(["p"] * 2), np.array([4, 5], dtype=np.uint64))
    keep = d.keep(Categorical.of(["p"] * 3), np.array([3, 4, 5], dtype=np.uint64))
    assert keep.tolist() == [True, False, False]
    assert not d.keep(Categorical.of(["p"] * 2), np.array([4, 5], dtype=np.uint64)).any()


def test_a_gap_wider_than_allowed_opens_a_run_and_loses_nothing():
    d = Deduplicator(max_gap=4)
    assert d.keep(Categorical.of(["p"] * 3), np.array([1, 3, 7], dtype=np.uint64)).all()
    assert d.runs_opened == 0  # gaps within max_gap extend the run
    assert d.keep(Categorical.of(["p"] * 2), np.array([20, 21], dtype=np.uint64)).all()
    assert d.runs_opened == 1
    assert d.keep(Categorical.of(["p"] * 2), np.array([2, 5], dtype=np.uint64)).tolist() == [
        False, False]  # inside the run [1, 7]: bridged gaps count as seen


def test_mixed_producers_in_one_buffer_are_kept_in_their_own_order():
    d = Deduplicator()
    keep = d.keep(Categorical.of(["a", "b", "a", "b", "a"]),
                  np.array([1, 1, 2, 1, 1], dtype=np.uint64))
    assert keep.tolist() == [True, True, True, False, False] and d.duplicates == 2


def test_slot_map_caps_and_recycles():
    m = SlotMap(capacity=2)
    assert m.lookup(["a", "b", "c", "a"]).tolist() == [0, 1, -1, 0]
    m.release(np.array([0]))
    assert m.lookup(["c", "a"]).tolist() == [0, -1]
    assert m.names(np.array([0, 1])) == ["c", "b"]
    assert m.live().tolist() == [True, True] and len(m) == 2


def test_a_forged_sequence_jump_is_refused_and_does_not_poison_the_producer():
    d = Deduplicator(max_jump=1_000)
    assert d.keep(Categorical.of(["p"] * 3), np.array([1, 2, 3], dtype=np.uint64)).all()
    forged = d.keep(Categorical.of(["p"]), np.array([2**64 - 1], dtype=np.uint64))
    assert not forged.any() and d.last_jumps == [0] and d.jumps == 1 and d.duplicates == 0
    assert d.keep(Categorical.of(["p"] * 2), np.array([4, 5], dtype=np.uint64)).all()


def test_events_from_the_future_cannot_move_the_watermark_past_the_clock():
    proc = PartitionProcessor(0, CFG)
    future = proc.process([(0, batch(req(1, ts=NOW + 9_000)))], NOW)  # within max_future
    assert not future.rejected
    later = proc.process([(1, batch(req(2, ts=NOW + 100)))], NOW + 200)
    assert not [r for r in later.rejected if r.reason == "late"]
    too_far = proc.process([(2, batch(req(3, ts=NOW + 60_000)))], NOW + 300)
    assert [r.reason for r in too_far.rejected] == ["timestamp_future"]


def test_a_dead_letter_always_fits_the_topic():
    from streams.processor import MAX_DEAD_LETTER_RAW, Rejected, dead_letter

    huge = Rejected("undecodable", "x" * 5000, bytes(range(256)) * 40_000, 7)  # ~10 MB
    letter = dead_letter(huge, topic="t", partition=1, now_ms=5)
    assert len(letter.raw) == MAX_DEAD_LETTER_RAW
    assert "truncated from 10240000 bytes" in letter.detail and "sha256=" in letter.detail
    assert len(letter.SerializeToString()) < 2 << 20
    small = dead_letter(Rejected("late", "d", b"abc", 1), topic="t", partition=0, now_ms=5)
    assert small.raw == b"abc" and small.detail == "d"


def test_a_log_that_starts_over_is_counted_from_its_new_offsets():
    # The broker lost its storage (or the topic was re-created): offsets begin at 0 again.
    proc = PartitionProcessor(0, CFG)
    proc.process([(o, batch(req(o + 1))) for o in range(5)], NOW)
    assert not proc.log_reset(5, NOW)  # the log still ends where we are: nothing to do
    assert proc.log_reset(2, NOW + 1_000)  # shorter than what was read: a new log
    proc.process([(0, batch(req(6))), (1, batch(req(7)))], NOW + 1_000)
    assert total_requests(proc) == 7
    assert proc.counters.log_resets == 1
    # windows that began before the loss may lack what the old log held unread
    assert proc.complete_since_ms == NOW + 1_000
    # the producer's repeats in the new log are still dropped by sequence
    proc.process([(2, batch(req(7), req(8)))], NOW + 1_000)
    assert total_requests(proc) == 8


def test_a_partition_that_never_saw_an_event_publishes_empty_windows_once_its_log_is_known():
    """A silent partition must not hold back every complete window (the planner assembles
    one part per partition) until a key happens to hash onto it."""
    proc = PartitionProcessor(0, CFG)
    assert proc.tick(NOW, caught_up=True, log_known=False) == []  # may hold a backlog
    assert proc.tick(NOW, caught_up=False, log_known=True) == []
    first = proc.tick(NOW, caught_up=True, log_known=True)
    assert len(first) == 1 and first[0].window_end_ms % CFG.hop_ms == 0
    assert first[0].window_end_ms <= NOW - CFG.idle_ms - CFG.grace_ms
    assert first[0].keys == [] and proc.is_complete(first[0])
    later = proc.tick(NOW + 3 * CFG.hop_ms, caught_up=True, log_known=True)
    # (after a silence the clock jumps to the newest window due)
    assert [w.window_end_ms for w in later] == [first[0].window_end_ms + 3 * CFG.hop_ms]
    # events that arrive afterwards count in the next windows as usual
    out = proc.process([(0, batch(req(1, ts=NOW + 3 * CFG.hop_ms)))], NOW + 3 * CFG.hop_ms)
    assert not out.rejected
    closed = proc.tick(NOW + 20_000, caught_up=True)
    assert sum(int(w.requests.sum()) for w in closed[:1]) == 1


def test_dead_lettered_events_keep_their_producers_sequences_consecutive():
    proc = PartitionProcessor(0, CFG)
    no_body = events_pb2.Event(producer_id="p", sequence=2, timestamp_ms=NOW)
    out = proc.process([(0, batch(req(1), no_body, req(3)))], NOW)
    assert [r.reason for r in out.rejected] == ["unknown_type"]
    assert proc.dedup.runs_opened == 0  # 1, 2, 3 is one run although 2 was rejected
    proc.process([(1, batch(req(1), req(3), req(4)))], NOW)  # a retry, then the next one
    assert total_requests(proc) == 3 and proc.counters.duplicates == 2
