"""Event validation: every rejected event gets one named reason (pure).

Reasons, in order of precedence (the first that applies is reported):

    unknown_type           the event body is none of request, cache hit, error
    missing_field          producer_id, sequence, timestamp, routing key or
                           destination unset; a cache hit without prompt tokens
    invalid_key            routing key, destination or producer id too long, or holds NUL
    absurd_tokens          a token count above `max_tokens` (negative numbers
                           written into the uint32 fields wrap to ~4e9 and land here)
    cached_exceeds_prompt  cached_tokens > prompt_tokens
    invalid_latency        ttft or e2e negative or not finite
    timestamp_future       event time more than `max_future_ms` ahead of now
    timestamp_past         event time more than `max_past_ms` behind now

Three more reasons are assigned elsewhere: `undecodable` (the message is not an
EventBatch: decoding), `late` (older than every window still open: windows) and
`sequence_jump` (a producer's sequence leaping implausibly far: dedup).
"""

from __future__ import annotations

import numpy as np

from streams.categorical import Categorical
from streams.config import StreamConfig
from streams.decoding import KIND_CACHE_HIT, KIND_UNKNOWN, EventColumns

OK = 0
REASONS = (
    "ok",
    "undecodable",
    "unknown_type",
    "missing_field",
    "invalid_key",
    "absurd_tokens",
    "cached_exceeds_prompt",
    "invalid_latency",
    "timestamp_future",
    "timestamp_past",
    "late",
    "sequence_jump",
)
CODE = {name: i for i, name in enumerate(REASONS)}


def validate(cols: EventColumns, now_ms: int, config: StreamConfig) -> np.ndarray:
    """Reason code per event (int8, 0 = valid). `now_ms` is the wall clock."""
    reason = np.zeros(len(cols), dtype=np.int8)
    if not len(cols):
        return reason
    key_len = cols.key.per_row(cols.key.name_lengths())
    dest_len = cols.destination.per_row(cols.destination.name_lengths())
    # Assign from the lowest precedence up, so higher ones overwrite.
    checks = (
        ("timestamp_past", cols.timestamp_ms < now_ms - config.max_past_ms),
        ("timestamp_future", cols.timestamp_ms > now_ms + config.max_future_ms),
        ("invalid_latency", _bad_latency(cols)),
        ("cached_exceeds_prompt", cols.cached_tokens > cols.prompt_tokens),
        ("absurd_tokens", _absurd_tokens(cols, config.max_tokens)),
        ("invalid_key", _bad_names(cols, config.max_key_bytes)),
        ("missing_field", _missing(cols, key_len, dest_len)),
        ("unknown_type", cols.kind == KIND_UNKNOWN),
    )
    for name, mask in checks:
        reason[mask] = CODE[name]
    return reason


def _bad_latency(cols: EventColumns) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(cols.ttft_ms) | ~np.isfinite(cols.e2e_ms) | (cols.ttft_ms < 0) | (
            cols.e2e_ms < 0
        )


def _absurd_tokens(cols: EventColumns, max_tokens: int) -> np.ndarray:
    return (
        (cols.prompt_tokens > max_tokens)
        | (cols.cached_tokens > max_tokens)
        | (cols.prefix_tokens > max_tokens)
    )


def _missing(cols: EventColumns, key_len: np.ndarray, dest_len: np.ndarray) -> np.ndarray:
    no_producer = cols.producer.per_row(cols.producer.name_lengths()) == 0
    no_key = key_len == 0
    no_dest = dest_len == 0
    hit_without_prompt = (cols.kind == KIND_CACHE_HIT) & (cols.prompt_tokens == 0)
    known = cols.kind != KIND_UNKNOWN
    return (
        no_producer
        | (cols.sequence == 0)
        | (cols.timestamp_ms <= 0)
        | (known & (no_key | no_dest | hit_without_prompt))
    )


def identified(cols: EventColumns, config: StreamConfig) -> np.ndarray:
    """Per row: the event names its producer and sequence as every valid event must (both
    set, the id within `max_key_bytes` and without NUL), whatever else is wrong with it."""
    named = cols.producer.per_row(cols.producer.name_lengths()) > 0
    return named & (cols.sequence != 0) & ~_bad_strings(cols.producer, config.max_key_bytes)


def _bad_names(cols: EventColumns, max_bytes: int) -> np.ndarray:
    # The producer id too: a megabyte of id per event would grow the dedup state for good.
    return (_bad_strings(cols.key, max_bytes) | _bad_strings(cols.destination, max_bytes)
            | _bad_strings(cols.producer, max_bytes))


def _bad_strings(values: Categorical, max_bytes: int) -> np.ndarray:
    """Per row: the string is over `max_bytes` in UTF-8, or holds a NUL (judged once
    per distinct string)."""
    names = values.names
    lengths = values.name_lengths()
    bad = np.zeros(len(names), dtype=bool)
    # A UTF-8 character takes at most 4 bytes: only long strings need encoding.
    for i in np.flatnonzero(lengths * 4 > max_bytes).tolist():
        bad[i] = len(names[i].encode("utf-8")) > max_bytes
    if "\0" in "".join(names):  # one C-level scan for the rare NUL
        bad |= np.fromiter(("\0" in v for v in names), dtype=bool, count=len(names))
    return values.per_row(bad)
