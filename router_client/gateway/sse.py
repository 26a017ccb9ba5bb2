"""Server-sent events as the gateway relays them (pure).

An OpenAI-compatible stream is a sequence of events, each `data: <json>` lines ended by
a blank line, closed by `data: [DONE]`. The gateway relays complete events as they
arrive (never more than one event is held back), and looks inside only what it must:
the usage chunk (to emit a usage event, and to drop it when the gateway asked for it
and the client did not), `[DONE]` (a stream without it was cut short), and an error
event from the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from router_client.gateway import jsonio

_EVENT_END = re.compile(rb"\r?\n\r?\n")
# One event held back while it arrives. Engines send events of a few hundred bytes; an
# upstream that never ends one is broken (or hostile) and would have the gateway hold
# and re-scan an ever-growing buffer.
MAX_EVENT_BYTES = 4 << 20


class EventTooLarge(ValueError):
    """An event grew past MAX_EVENT_BYTES without its end."""


class SseSplitter:
    """Feed bytes as they arrive; get back the complete events, each with its blank line.

    Each byte is scanned once: an incomplete event is kept as its parts (and the last three
    bytes, where an event's end may begin), not re-joined and re-scanned per chunk."""

    __slots__ = ("_parts", "_size", "_tail", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._parts:
            if _EVENT_END.search(self._tail + chunk) is None:  # still the same event
                self._keep(chunk)
                return []
            buf = b"".join(self._parts) + chunk
            self._parts, self._size, self._tail = [], 0, b""
        else:
            buf = chunk
        events: list[bytes] = []
        start = 0
        for m in _EVENT_END.finditer(buf):
            events.append(buf[start:m.end()])
            start = m.end()
        if start < len(buf):
            self._keep(buf[start:])
        return events

    def _keep(self, part: bytes) -> None:
        self._parts.append(part)
        self._size += len(part)
        self._tail = (self._tail + part)[-3:]
        if self._size > self.max_event_bytes:
            raise EventTooLarge(f"an event over {self.max_event_bytes} bytes without its end")

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet complete (what a stream ending now would lose)."""
        return b"".join(self._parts)


@dataclass(frozen=True, slots=True)
class EventInfo:
    done: bool = False
    usage: dict[str, Any] | None = None
    # The parsed payload, when it had to be parsed (usage or error present).
    payload: dict[str, Any] | None = None
    error: bool = False


_PLAIN = EventInfo()
_DONE = EventInfo(done=True)


def inspect(event: bytes) -> EventInfo:
    """What the gateway needs to know about one event; JSON is parsed only when the event
    mentions usage or an error."""
    data = b"".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
    if data == b"[DONE]":
        return _DONE
    if b'"usage"' not in data and b'"error"' not in data:
        return _PLAIN
    try:
        payload = jsonio.loads(data)
    except ValueError:
        return _PLAIN
    if not isinstance(payload, dict):
        return _PLAIN
    usage = payload.get("usage")
    return EventInfo(usage=usage if isinstance(usage, dict) else None, payload=payload,
                     error="error" in payload and "choices" not in payload)


def without_usage(info: EventInfo) -> bytes | None:
    """The event re-encoded without its usage, or None when it carried nothing else (the
    usage-only final chunk, whose `choices` is empty)."""
    assert info.payload is not None
    if not info.payload.get("choices"):
        return None
    rest = {k: v for k, v in info.payload.items() if k != "usage"}
    return b"data: " + json.dumps(rest, separators=(",", ":")).encode() + b"\n\n"


def error_event(message: str, code: int, kind: str = "upstream_error") -> bytes:
    """An OpenAI-style error event: the SDKs raise on it."""
    body = {"error": {"message": message, "type": kind, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
