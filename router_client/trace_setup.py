"""Tracing for an entry point (the gateway, the endpoint picker), imported only when an OTLP
endpoint is configured: off, OpenTelemetry is never imported (router_client.tracing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router_client.tracing import Tracing


def start_tracing(endpoint: str, *, service: str, router_id: str) -> Tracing | None:
    """Spans exported to `endpoint` over OTLP, or None when it is "" (tracing off)."""
    if not endpoint:
        return None
    try:
        from router_client.tracing import Tracing
    except ImportError as exc:
        raise RuntimeError("tracing (--otlp-endpoint) needs OpenTelemetry: pip install "
                           f"'cacheroute[tracing]' ({exc})") from None
    return Tracing(endpoint, service=service, router_id=router_id)
