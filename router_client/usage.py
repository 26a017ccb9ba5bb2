"""Turn what engines already return into cache-hit events (pure).

- vLLM (OpenAI-compatible server): the response's `usage` object,
  `{"prompt_tokens": 1200, "completion_tokens": 80,
    "prompt_tokens_details": {"cached_tokens": 1024}}`
  (`prompt_tokens_details` is null unless the server runs with
  `--enable-prompt-tokens-details`; then nothing is known to be cached).
- SGLang: the native response's `meta_info`,
  `{"prompt_tokens": 1200, "completion_tokens": 80, "cached_tokens": 1024,
    "e2e_latency": 1.93}` (seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class CacheHitCounts:
    """Token counts of one served request, as a cache-hit event carries them."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int = 0
    e2e_ms: float = 0.0


class CacheHitSink(Protocol):
    def emit_cache_hit(self, routing_key: str, destination: str, *, prompt_tokens: int,
                       cached_tokens: int, output_tokens: int = 0,
                       queue_depth: int | None = None, ttft_ms: float = 0.0,
                       e2e_ms: float = 0.0, timestamp_ms: int | None = None) -> bool: ...


def _int(value: Any) -> int:
    return max(0, int(value or 0))


def from_openai_usage(usage: Mapping[str, Any]) -> CacheHitCounts:
    """vLLM's OpenAI-compatible `usage` -> counts (cached clamped to prompt)."""
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details") or {}
    cached = min(_int(details.get("cached_tokens")), prompt)
    return CacheHitCounts(prompt, cached, _int(usage.get("completion_tokens")))


def from_sglang_meta(meta_info: Mapping[str, Any]) -> CacheHitCounts:
    """SGLang's `meta_info` -> counts; `e2e_latency` (s) becomes e2e_ms."""
    prompt = _int(meta_info.get("prompt_tokens"))
    cached = min(_int(meta_info.get("cached_tokens")), prompt)
    e2e_s = float(meta_info.get("e2e_latency") or 0.0)
    return CacheHitCounts(prompt, cached, _int(meta_info.get("completion_tokens")),
                          max(0.0, e2e_s * 1000.0))


def emit_counts(sink: CacheHitSink, routing_key: str, destination: str, counts: CacheHitCounts,
                *, queue_depth: int | None = None, ttft_ms: float = 0.0,
                e2e_ms: float | None = None, timestamp_ms: int | None = None) -> bool:
    """Emit one cache-hit event from `counts` through an `EventEmitter` (or any sink)."""
    return sink.emit_cache_hit(
        routing_key, destination, prompt_tokens=counts.prompt_tokens,
        cached_tokens=counts.cached_tokens, output_tokens=counts.output_tokens,
        queue_depth=queue_depth, ttft_ms=ttft_ms,
        e2e_ms=counts.e2e_ms if e2e_ms is None else e2e_ms, timestamp_ms=timestamp_ms,
    )
