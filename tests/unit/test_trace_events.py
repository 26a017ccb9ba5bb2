"""Recorded traffic from the events topic: requests joined with their usage events, and a
prompt size of 0 read as unknown, never as an empty prompt."""

from __future__ import annotations

import pytest

from cacheroute.v1 import events_pb2
from planner_svc.simulator.trace import TraceError, rows_from_event_batches, workload_from_rows


def _batch(*events: tuple) -> bytes:
    batch = events_pb2.EventBatch()
    for producer, seq, ms, kind, key, dest, fields in events:
        ev = batch.events.add(producer_id=producer, sequence=seq, timestamp_ms=ms)
        body = ev.request if kind == "request" else ev.cache_hit
        body.routing_key, body.destination = key, dest
        for name, value in fields.items():
            setattr(body, name, value)
    return batch.SerializeToString()


def test_a_request_takes_its_prompt_and_output_from_its_usage_event():
    rows = rows_from_event_batches([
        _batch(("g1", 1, 1_000, "request", "app", "e0", {"reusable_prefix_tokens": 800}),
               ("g1", 2, 1_100, "request", "app", "e0", {}),
               ("g1", 3, 1_900, "cache_hit", "app", "e0",
                {"prompt_tokens": 1_200, "cached_tokens": 800, "output_tokens": 40,
                 "e2e_ms": 900}),
               ("g1", 4, 2_500, "cache_hit", "app", "e0",
                {"prompt_tokens": 1_500, "output_tokens": 20, "e2e_ms": 1_400}))])
    assert [(r["timestamp_ms"], r["prompt_tokens"], r["output_tokens"]) for r in rows] == [
        (1_000, 1_200, 40), (1_100, 1_500, 20)]
    w = workload_from_rows(rows)
    assert w.prompt.tolist() == [1_200, 1_500] and w.output.tolist() == [40, 20]
    assert w.prefix.tolist() == [800, 1_200]  # unknown prefix: the key's previous prompt


def test_unknown_prompts_take_their_keys_median_and_repeats_count_once():
    request = ("g1", 1, 1_000, "request", "app", "e0", {})
    rows = rows_from_event_batches([
        _batch(request, request,  # a producer retry: the same (producer, sequence)
               ("g1", 2, 1_050, "request", "app", "e1", {}),  # never answered
               ("g1", 3, 1_060, "request", "other", "e1", {}),  # neither, nor its key
               ("g1", 4, 1_500, "cache_hit", "app", "e0", {"prompt_tokens": 700,
                                                            "e2e_ms": 500}),
               # its request fell before the export began: a row at its start
               ("g2", 1, 3_000, "cache_hit", "late", "e0", {"prompt_tokens": 300,
                                                            "e2e_ms": 1_000}))])
    by_key = {(r["key"], r["timestamp_ms"]): r for r in rows}
    assert len(rows) == 4
    assert by_key[("app", 1_000)]["prompt_tokens"] == 700
    assert not by_key[("app", 1_000)]["prompt_imputed"]
    assert by_key[("app", 1_050)]["prompt_tokens"] == 700  # its key's median
    assert by_key[("app", 1_050)]["prompt_imputed"]
    assert by_key[("other", 1_060)]["prompt_tokens"] == 500  # the median of all known
    assert by_key[("late", 2_000.0)]["prompt_tokens"] == 300


def test_an_export_without_any_prompt_size_is_refused():
    with pytest.raises(TraceError, match="no event carries a prompt size"):
        rows_from_event_batches([_batch(("g1", 1, 1_000, "request", "app", "e0", {}))])
