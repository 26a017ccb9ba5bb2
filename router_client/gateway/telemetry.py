"""The event seam: what the gateway reports per request, and to whom.

`EventSink` is the shape of `streams.emitter.EventEmitter` (the Kafka emitter): the
gateway never imports it, the entry point passes one in. Every method must return at
once (the emitter buffers and never blocks).

Per request the gateway emits a request event at dispatch (with the destination's
in-flight count), then either a cache-hit (usage) event when the engine reported usage,
or an error event with what went wrong.
"""

from __future__ import annotations

from typing import Protocol


class EventSink(Protocol):
    def emit_request(self, routing_key: str, destination: str, *, prompt_tokens: int,
                     reusable_prefix_tokens: int = 0, inflight: int | None = None,
                     router_id: str = "", timestamp_ms: int | None = None) -> bool: ...

    def emit_cache_hit(self, routing_key: str, destination: str, *, prompt_tokens: int,
                       cached_tokens: int, output_tokens: int = 0,
                       queue_depth: int | None = None, ttft_ms: float = 0.0,
                       e2e_ms: float = 0.0, timestamp_ms: int | None = None) -> bool: ...

    def emit_error(self, routing_key: str, destination: str, *, kind: str,
                   status_code: int = 0, router_id: str = "",
                   timestamp_ms: int | None = None) -> bool: ...


class NoSink:
    """Emits nothing (a gateway without telemetry)."""

    def emit_request(self, *args: object, **kwargs: object) -> bool:
        return True

    def emit_cache_hit(self, *args: object, **kwargs: object) -> bool:
        return True

    def emit_error(self, *args: object, **kwargs: object) -> bool:
        return True
