"""Snapshot split (streams.snapshots) and reassembly (streams.assembly), no servers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cacheroute.v1 import snapshot_pb2
from streams.assembly import DestinationStats, WindowAssembler, merge_parts
from streams.columns import decode_keys, encode_keys
from streams.errors import SnapshotError
from streams.snapshots import SnapshotContext, build_snapshots
from streams.windows import WindowResult


def window(keys: list[str], end: int = 10_000, dests=()) -> WindowResult:
    n = len(keys)
    r = np.arange(n, dtype=np.float64)
    return WindowResult(
        window_start_ms=end - 6000, window_end_ms=end, keys=keys, rate_per_s=r,
        ewma_rate_per_s=r / 2, prompt_tokens=r * 10, cached_tokens=r * 5,
        reuse_fraction=np.full(n, 0.5), interarrival_cv=np.full(n, math.nan),
        reusable_prefix_tokens=np.zeros(n), requests=np.arange(n, dtype=np.uint64),
        destinations=list(dests), overflow_keys=3, overflow_rate_per_s=1.5, active_keys=n + 3,
    )


def ctx(partition: int, count: int, recovering: bool = False) -> SnapshotContext:
    return SnapshotContext(source_partition=partition, partition_count=count, worker_id="w",
                           recovering=recovering, published_at_ms=123, dead_letters=2,
                           duplicates_dropped=1)


def roundtrip(parts):
    return [snapshot_pb2.RateSnapshot.FromString(p.SerializeToString()) for p in parts]


def test_keys_blob_roundtrip():
    keys = ["a", "tenant/é", "x" * 300]
    assert decode_keys(encode_keys(keys)) == keys
    assert decode_keys(encode_keys([])) == []


def test_large_window_splits_under_the_size_limit_and_reassembles():
    keys = [f"key-{i:06d}" for i in range(20_000)]
    parts = roundtrip(build_snapshots(window(keys), ctx(0, 1), part_bytes=100_000))
    assert len(parts) > 5
    assert all(len(p.SerializeToString()) <= 100_000 for p in parts)
    assert {p.part_count for p in parts} == {len(parts)}
    asm = WindowAssembler()
    results = [asm.add(p) for p in reversed(parts)]  # any order
    assert results[:-1] == [None] * (len(parts) - 1)
    w = results[-1]
    assert w is not None and w.keys == keys
    assert np.array_equal(w.requests, np.arange(20_000, dtype=np.uint64))
    assert w.overflow_keys == 3 and w.dead_letters == 2  # from part 0 only, not per part


def test_window_completes_only_with_every_partition():
    d = DestinationStats("d1", 2.0, 100.0, 50.0, 3.0, 80.0)
    asm = WindowAssembler()
    p0 = roundtrip(build_snapshots(window(["a"], dests=[d]), ctx(0, 2)))
    p1 = roundtrip(build_snapshots(window(["b"], dests=[d]), ctx(1, 2, recovering=True)))
    assert asm.add(p0[0]) is None
    w = asm.add(p1[0])
    assert w is not None
    assert w.keys == ["a", "b"] and w.recovering
    dest = w.destinations["d1"]
    assert (dest.arrival_rate_per_s, dest.prompt_tokens, dest.hit_rate) == (4.0, 200.0, 0.5)
    assert w.active_keys == 8 and w.overflow_rate_per_s == 3.0


def test_republished_part_replaces_and_old_windows_are_ignored():
    asm = WindowAssembler()
    first = roundtrip(build_snapshots(window(["a"], end=10_000), ctx(0, 2)))[0]
    again = roundtrip(build_snapshots(window(["a", "a2"], end=10_000), ctx(0, 2)))[0]
    other = roundtrip(build_snapshots(window(["b"], end=10_000), ctx(1, 2)))[0]
    asm.add(first)
    asm.add(again)
    w = asm.add(other)
    assert w is not None and w.keys == ["a", "a2", "b"]
    assert asm.add(other) is None  # a window completes once
    older = roundtrip(build_snapshots(window(["z"], end=8_000), ctx(0, 2)))[0]
    assert asm.add(older) is None
    assert asm.pending_windows() == []


def test_pending_windows_are_bounded():
    asm = WindowAssembler(max_pending=3)
    for end in range(10):
        asm.add(roundtrip(build_snapshots(window(["a"], end=10_000 + end * 2000), ctx(0, 2)))[0])
    assert len(asm.pending_windows()) == 3
    assert asm.dropped_windows == 7


def test_inconsistent_parts_are_refused():
    asm = WindowAssembler()
    bad = roundtrip(build_snapshots(window(["a"]), ctx(0, 2)))[0]
    bad.source_partition = 5
    with pytest.raises(SnapshotError):
        asm.add(bad)
    ok = roundtrip(build_snapshots(window(["a"]), ctx(0, 2)))[0]
    asm.add(ok)
    ok.partition_count = 3
    with pytest.raises(SnapshotError):
        asm.add(ok)


def test_merge_of_empty_window_has_empty_arrays():
    w = merge_parts(roundtrip(build_snapshots(window([]), ctx(0, 1))))
    assert w.keys == [] and w.rate_per_s.size == 0 and w.hit_rate.size == 0


def part(end: int, partition: int, count: int) -> snapshot_pb2.RateSnapshot:
    parts = build_snapshots(window(["a", "b"], end=end), ctx(partition, count))
    assert len(parts) == 1
    return roundtrip(parts)[0]


def test_forged_or_implausible_snapshots_are_refused():
    from streams.assembly import SnapshotLimits

    limits = SnapshotLimits(window_ms=6000, hop_ms=2000, partitions=2)
    now = 1_800_000_000_000
    asm = WindowAssembler(limits=limits)
    for forged in (
        part(2**62, 0, 2),  # from the far future
        part(now - 4 * 3_600_000, 0, 2),  # hours old
        part(now + 1000, 0, 2),  # off the hop grid
        part(now, 0, 1),  # not the events topic's partition count
    ):
        with pytest.raises(SnapshotError):
            asm.add(forged, now)
    hot = part(now, 0, 2)
    hot.keys.rate_per_s[0] = 5e9
    with pytest.raises(SnapshotError):
        asm.add(hot, now)
    assert asm.add(part(now, 0, 2), now) is None
    assert asm.add(part(now, 1, 2), now) is not None  # the real window still completes


def test_last_destinations_survive_the_split_and_merge_across_partitions():
    keys = [f"key-{i:05d}" for i in range(3000)]
    w0 = window(keys[:2000])
    w0 = dataclasses.replace(w0, last_destination=np.array([i % 3 - 1 for i in range(2000)],
                                                           np.int32),
                             last_destination_names=["d-a", "d-b"])
    w1 = dataclasses.replace(window(keys[2000:]), last_destination=np.full(1000, 0, np.int32),
                             last_destination_names=["d-b"])
    parts = roundtrip(build_snapshots(w0, ctx(0, 2), part_bytes=20_000)
                      + build_snapshots(w1, ctx(1, 2)))
    assert len(parts) > 3
    asm = WindowAssembler()
    merged = [asm.add(p) for p in parts][-1]
    assert merged is not None
    got = [merged.last_destination_names[i] if i >= 0 else None
           for i in merged.last_destination.tolist()]
    assert got == [[None, "d-a", "d-b"][i % 3] for i in range(2000)] + ["d-b"] * 1000
    # A worker that does not report them: its keys unknown, the others' kept.
    old = roundtrip(build_snapshots(window(keys[2000:]), ctx(1, 2)))
    merged = merge_parts(roundtrip(build_snapshots(w0, ctx(0, 2))) + old)
    assert (merged.last_destination[2000:] == -1).all()
    assert len(merge_parts(roundtrip(build_snapshots(window(keys), ctx(0, 1)))
                           ).last_destination) == 0  # nobody reported: empty


@pytest.mark.parametrize("last, names, words", [
    ([0, 0], ["d"], "last destinations for"),        # fewer entries than keys
    ([0, 0, 1], ["d"], "outside"),                   # an index past the names
    ([0, -2, 0], ["d"], "outside"),
    ([0, 0, 0], [""], "names"),
    ([0, 0, 0], ["x" * 2000], "names"),
])
def test_bad_last_destination_columns_are_refused(last, names, words):
    snap = build_snapshots(window(["a", "b", "c"]), ctx(0, 1))[0]
    snap.keys.last_destination.extend(last)
    snap.keys.last_destination_names.extend(names)
    with pytest.raises(SnapshotError, match=words):
        WindowAssembler().add(snap)
