"""Connections to the engines: a keep-alive pool per destination, the timeouts, and what a
failure means for retrying.

`send` returns the upstream response once its status line and headers arrived, or raises
`UpstreamFailure`, which says how the destination fared (`Outcome`) and whether the
request may be sent elsewhere: only when nothing can have been generated — the connection
was refused or timed out, it broke before any response, or the engine answered 503
(overloaded or not ready). A first-byte timeout is *not* retried: the engine may be
generating, and sending the same request elsewhere would generate it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from router_client.gateway.http11 import UpstreamError, UpstreamPool, UpstreamResponse
from router_client.gateway.settings import GatewaySettings
from router_client.health import Outcome


@dataclass(frozen=True, slots=True)
class Passthrough:
    """A final upstream answer to hand to the client as it is (a 503's status and body)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class UpstreamFailure(Exception):
    def __init__(self, outcome: Outcome, *, retryable: bool, status: int, message: str,
                 passthrough: Passthrough | None = None, local: bool = False) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retryable = retryable
        self.status = status  # what the client gets if this is the last attempt
        self.passthrough = passthrough
        self.local = local  # the gateway's own resources ran out: not the destination's fault

    @property
    def kind(self) -> str:
        return self.outcome.value


class Upstreams:
    """One `UpstreamPool` per destination address (`http://host:port`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._pools: dict[str, tuple[UpstreamPool, bytes]] = {}

    def pool(self, address: str) -> tuple[UpstreamPool, bytes]:
        """The pool for `address` and its Host header line."""
        found = self._pools.get(address)
        if found is None:
            parts = urlsplit(address if "://" in address else f"http://{address}")
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True, status=502,
                                      message=f"unsupported destination address {address!r}")
            port = parts.port or 80
            pool = UpstreamPool(parts.hostname, port,
                                max_idle=self.settings.max_inflight_per_destination,
                                connect_timeout_s=self.settings.connect_timeout_s)
            found = self._pools[address] = (pool, f"Host: {parts.hostname}:{port}\r\n".encode())
        return found

    async def send(self, method: str, address: str, target: str,
                   headers: list[tuple[str, str]], body: bytes) -> UpstreamResponse:
        pool, host = self.pool(address)
        head = b"".join((
            f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), host,
            b"Content-Length: %d\r\n" % len(body),
            *(f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in headers), b"\r\n"))
        try:
            resp = await pool.request(head, body, self.settings.first_byte_timeout_s)
        except UpstreamError as exc:
            raise _classified(exc) from None
        if resp.status == 503:
            try:
                data = await resp.read()
            except UpstreamError:
                data = b""
            resp.release()
            raise UpstreamFailure(
                Outcome.HTTP_5XX, retryable=True, status=503, message="destination answered 503",
                passthrough=Passthrough(503, resp.headers, data))
        return resp

    def close(self) -> None:
        for pool, _host in self._pools.values():
            pool.close()


def _classified(exc: UpstreamError) -> UpstreamFailure:
    if exc.local:  # another destination would fail the same way: answer now, blame nobody
        return UpstreamFailure(Outcome.CONNECT_ERROR, retryable=False, status=503,
                               message=f"the gateway is out of resources: {exc}", local=True)
    if exc.connect:
        return UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True,
                               status=504 if exc.timeout else 502, message=str(exc))
    if exc.timeout:
        return UpstreamFailure(Outcome.TIMEOUT, retryable=False, status=504, message=str(exc))
    return UpstreamFailure(Outcome.RESET, retryable=True, status=502,
                           message=f"connection broke before a response: {exc}")
