"""Which headers cross the gateway, and the request id and trace context it adds (pure).

Hop-by-hop headers (RFC 9110 §7.6.1, plus every name listed in `Connection`) belong to
one connection and are dropped in both directions; so are the framing headers the
gateway recomputes (`Content-Length`, `Host`) and `Accept-Encoding`/`Content-Encoding`
(the gateway reads usage from response bodies, so it asks engines for identity
encoding). Everything else — Authorization, custom headers, `retry-after`, rate-limit
headers — passes through unchanged.

Trace context (W3C `traceparent`): the gateway is a hop of its own, so it keeps the
trace id and the sampling flags and gives the upstream request a new parent (span) id;
a missing or malformed `traceparent` starts a new trace. `x-request-id` is kept when
the client sent a sane one, else made up, and returned to the client.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Iterable, Mapping

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
    # The gateway answers `Expect: 100-continue` itself and forwards the whole body: passed
    # on, the engine's interim 100 came back as if it were the final response.
    "expect",
})
RECOMPUTED = frozenset({"content-length", "host", "accept-encoding", "content-encoding"})
REQUEST_ID = "x-request-id"
TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_prefix = secrets.token_hex(16)
_counter = itertools.count(secrets.randbits(40))
_SANE_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


_DROP = HOP_BY_HOP | RECOMPUTED


def forwarded(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The end-to-end headers of a message, in order (repeated names kept)."""
    items = [(k, v, k.lower()) for k, v in headers]
    drop = _DROP
    for _k, value, low in items:
        if low == "connection":  # names it lists are hop-by-hop too
            drop = drop | {name.strip().lower() for name in value.split(",")}
    return [(k, v) for k, v, low in items if low not in drop]


def _hex(bits: int) -> str:
    # Ids need to be unique, not secret: a random per-process prefix and a counter, cheaper
    # than drawing random bits for every request.
    return f"{_prefix[: bits // 4 - 12]}{next(_counter) & 0xFFFFFFFFFFFF:012x}"


def request_id(headers: Mapping[str, str]) -> str:
    given = headers.get(REQUEST_ID, "")
    return given if _SANE_ID.match(given) else _hex(128)


def child_traceparent(given: str | None) -> str:
    """The traceparent for the upstream request (see the module doc)."""
    span = _hex(64)
    if given:
        m = _TRACEPARENT.match(given)
        if m and m.group(1) != "ff" and set(m.group(2)) != {"0"} and set(m.group(3)) != {"0"}:
            return f"00-{m.group(2)}-{span}-{m.group(4)}"
    return f"00-{_hex(128)}-{span}-01"
