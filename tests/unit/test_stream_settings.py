"""Settings parsing, Prometheus text, engine usage helpers, partitioning (no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router_client.usage import CacheHitCounts, emit_counts, from_openai_usage, from_sglang_meta
from streams.errors import ConfigError
from streams.metrics import StreamCounters
from streams.partitioning import partition_for_key
from streams.settings import Settings, parse_settings


def test_cli_beats_env_beats_default():
    env = {"CACHEROUTE_WINDOW_S": "30", "CACHEROUTE_HOP_S": "5", "CACHEROUTE_BOOTSTRAP": "h:1"}
    s = parse_settings(["--window-s", "10", "--hop-s", "2", "--data-dir", "/tmp/x"], env)
    assert (s.window_s, s.hop_s, s.bootstrap, s.data_dir) == (10.0, 2.0, "h:1", Path("/tmp/x"))
    assert s.events_topic == Settings().events_topic
    cfg = s.stream_config()
    assert (cfg.window_ms, cfg.hop_ms, cfg.buckets_per_window) == (10_000, 2_000, 5)


def test_bad_window_geometry_is_refused_at_the_entry_point():
    with pytest.raises(ConfigError, match="multiple of hop"):
        parse_settings(["--window-s", "10", "--hop-s", "3"], {})


def test_fetch_wait_is_configurable_and_bounded():
    assert Settings().fetch_max_wait_ms == 100  # not Faust's fixed 1,500 ms
    assert parse_settings([], {"CACHEROUTE_FETCH_MAX_WAIT_MS": "250"}).fetch_max_wait_ms == 250
    with pytest.raises(ConfigError, match="fetch_max_wait_ms"):
        parse_settings(["--fetch-max-wait-ms", "0"], {})


def test_prometheus_text():
    c = StreamCounters()
    c.events_by_type["request"] += 5
    c.dead_letters_by_reason["late"] += 2
    c.lag_by_partition[1] = 7
    text = c.to_prometheus()
    assert 'cacheroute_streams_events_total{type="request"} 5.0\n' in text
    assert 'cacheroute_streams_dead_letters_total{reason="late"} 2.0\n' in text
    assert 'cacheroute_streams_consumer_lag_messages{partition="1"} 7.0\n' in text
    assert "# TYPE cacheroute_streams_duplicates_total counter" in text
    assert c.dead_letters == 2 and c.lag == 7


def test_vllm_usage():
    usage = {"prompt_tokens": 1200, "completion_tokens": 80,
             "prompt_tokens_details": {"cached_tokens": 1024}}
    assert from_openai_usage(usage) == CacheHitCounts(1200, 1024, 80)
    assert from_openai_usage({"prompt_tokens": 10, "prompt_tokens_details": None}) == \
        CacheHitCounts(10, 0, 0)
    # a server bug reporting more cached than prompt must not produce a bad event
    bad = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}
    assert from_openai_usage(bad).cached_tokens == 10


def test_sglang_meta_info():
    meta = {"prompt_tokens": 900, "completion_tokens": 12, "cached_tokens": 512,
            "e2e_latency": 1.5}
    assert from_sglang_meta(meta) == CacheHitCounts(900, 512, 12, 1500.0)


def test_emit_counts_calls_the_sink():
    calls = []

    class Sink:
        def emit_cache_hit(self, routing_key, destination, **kw):
            calls.append((routing_key, destination, kw))
            return True

    assert emit_counts(Sink(), "k", "d", CacheHitCounts(10, 4, 2, 30.0), queue_depth=3)
    assert calls == [("k", "d", dict(prompt_tokens=10, cached_tokens=4, output_tokens=2,
                                     queue_depth=3, ttft_ms=0.0, e2e_ms=30.0,
                                     timestamp_ms=None))]


def test_partitioning_is_stable_and_in_range():
    assert partition_for_key("tenant-a", 8) == partition_for_key("tenant-a", 8)
    assert {partition_for_key(f"k{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    assert partition_for_key("abc", 1) == 0


def test_snapshot_key_and_dedup_bounds_come_from_settings():
    s = parse_settings(["--data-dir", "/tmp/w1", "--max-sequence-gap", "4"],
                       {"CACHEROUTE_MAX_SEQUENCE_JUMP": "1000"})
    assert s.resolved_signing_key_path == Path("/tmp/w1/snapshot-signing-key.pem")
    cfg = s.stream_config()
    assert (cfg.max_sequence_gap, cfg.max_sequence_jump) == (4, 1000)
    given = parse_settings([], {"CACHEROUTE_SIGNING_KEY_PATH": "/keys/w.pem"})
    assert given.resolved_signing_key_path == Path("/keys/w.pem")
    with pytest.raises(ConfigError, match="max_sequence_gap"):
        parse_settings(["--max-sequence-gap", "0"], {})
