"""The stream path on the lighter embedded broker (Tansu, `CACHEROUTE_BROKER=tansu`): the
rest of the tier runs on Apache Kafka, this keeps events -> worker -> complete window
working on Tansu too."""

from __future__ import annotations

import pytest
from test_stream_support import SnapshotLog, make_topics, start_worker

from streams.assembly import CompleteWindow
from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration


def test_events_become_a_complete_window_on_tansu(tansu_broker, tmp_path):
    topics = make_topics(tansu_broker.bootstrap, partitions=2)
    worker = start_worker(tansu_broker.bootstrap, topics, tmp_path, "--window-s", "600",
                          "--hop-s", "2")
    snaps = SnapshotLog(tansu_broker.bootstrap, topics.snapshots)
    try:
        with EventEmitter(tansu_broker.bootstrap, topics.events, producer_id="smoke") as em:
            for i in range(500):
                em.emit_request(f"k-{i % 25}", f"d{i % 3}", prompt_tokens=10)

        def all_counted(w: CompleteWindow) -> bool:
            return not w.recovering and int(w.requests.sum()) == 500

        found = snaps.wait_for(all_counted, timeout_s=60)
        seen = [(int(w.requests.sum()), w.recovering) for w in snaps.complete_windows()[-3:]]
        assert found is not None, (seen, worker.log_tail(30))
        assert sorted(found.keys) == sorted(f"k-{i}" for i in range(25))
    finally:
        worker.stop()
