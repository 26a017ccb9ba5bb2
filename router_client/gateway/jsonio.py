"""JSON in the gateway's hot path: orjson where installed (the `gateway` extra brings it;
~3x faster on request and response bodies), the standard library otherwise."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    orjson = None  # type: ignore[assignment]

JSONDecodeError: tuple[type[Exception], ...] = (ValueError,)
# What `dumps` raises on what `loads` accepted: orjson reads 1,024 levels of nesting but
# writes 255 (TypeError); the standard library runs out of recursion.
JSONEncodeError: tuple[type[Exception], ...] = (TypeError, ValueError, RecursionError)


def loads(data: bytes) -> Any:
    if orjson is not None:
        return orjson.loads(data)  # orjson.JSONDecodeError is a ValueError
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()
