"""Active health probes over HTTP (the standard library's client; no dependency).

`http_probe` answers one question: does GET `address + path` return 2xx within the
timeout? Both router clients call it (the asyncio one in a worker thread); a host
process with its own HTTP client can pass any callable of the same shape instead.
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def http_probe(address: str, path: str, timeout_s: float) -> bool:
    """True when `GET address+path` answers 2xx within `timeout_s` seconds."""
    parts = urlsplit(address if "://" in address else f"http://{address}")
    if not parts.hostname:
        return False
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("GET", (parts.path.rstrip("/") + path) or "/")
        status = conn.getresponse().status
        return 200 <= status < 300
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
