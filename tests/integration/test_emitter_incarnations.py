"""Two emitters given one producer id (gateway replicas sharing a config, or a gateway
restarted) are counted in full: each has its own incarnation on the wire, so the second
one's sequences (which start at 1 again) are not taken for repeats of the first's.
Before the incarnation suffix the second emitter's 300 events were all dropped."""

from __future__ import annotations

import pytest
from test_stream_support import SnapshotLog, make_topics, start_worker

from streams.assembly import CompleteWindow
from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration


def test_a_restarted_emitter_with_the_same_id_is_counted(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=2)
    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "600",
                          "--hop-s", "2")
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    try:
        for _incarnation in range(2):  # the same id twice, one after the other
            with EventEmitter(broker.bootstrap, topics.events, producer_id="gateway") as em:
                for i in range(300):
                    em.emit_request(f"k-{i % 20}", "d0", prompt_tokens=10)

        def all_counted(w: CompleteWindow) -> bool:
            return not w.recovering and int(w.requests.sum()) == 600

        found = snaps.wait_for(all_counted, timeout_s=60)
        seen = [(int(w.requests.sum()), w.recovering) for w in snaps.complete_windows()[-3:]]
        assert found is not None, seen
    finally:
        snaps.close()
        worker.stop()
