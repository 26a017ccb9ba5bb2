"""The emitter never blocks its caller: with no broker reachable, emits return at
once and what does not fit the bounded buffer is dropped and counted."""

from __future__ import annotations

import pytest

from planner_svc.devstack.processes import free_port
from streams.emitter import EventEmitter


def test_emit_never_blocks_and_counts_drops_without_a_broker():
    em = EventEmitter(f"127.0.0.1:{free_port()}", "t", producer_id="unit",
                      buffer_max_events=100, linger_ms=10,
                      socket_connection_setup_timeout_ms=1000, log_level=0)
    try:
        accepted = [em.emit_request(f"k{i}", "d", prompt_tokens=1) for i in range(150)]
        accepted += [em.emit_cache_hit("k", "d", prompt_tokens=2, cached_tokens=1)
                     for _ in range(50)]
        assert accepted.count(True) == 100
        assert em.dropped == 100
        assert em.buffered == 100  # no metadata: nothing could be partitioned yet
    finally:
        em.close(timeout_s=0.5)
    assert not em.emit_request("k", "d", prompt_tokens=1)  # closed: dropped, no error


def test_producer_id_is_required():
    with pytest.raises(ValueError):
        EventEmitter("127.0.0.1:1", producer_id="")
