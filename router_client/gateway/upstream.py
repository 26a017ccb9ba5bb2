"""Connections to the engines: keep-alive pools, the timeouts, and what a failure means.

One aiohttp session holds a keep-alive pool per destination (at most
`max_inflight_per_destination` connections each). `send` returns the upstream response
once its status line and headers arrived, or raises `UpstreamFailure`, which says how
the destination fared (`Outcome`) and whether the request may be sent elsewhere: only
when nothing can have been generated — the connection was refused or timed out, it
broke before any response, or the engine answered 503 (overloaded or not ready). A
first-byte timeout is *not* retried: the engine may be generating, and sending the same
request elsewhere would generate it twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

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
                 passthrough: Passthrough | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retryable = retryable
        self.status = status  # what the client gets if this is the last attempt
        self.passthrough = passthrough

    @property
    def kind(self) -> str:
        return self.outcome.value


class Upstreams:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        s = self.settings
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=s.max_inflight_per_destination, keepalive_timeout=30.0,
            ttl_dns_cache=10)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout_s),
            auto_decompress=False,  # requests say identity; see headers.RECOMPUTED
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstreams.open() first"
        return self._session

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes) -> aiohttp.ClientResponse:
        try:
            async with asyncio.timeout(self.settings.first_byte_timeout_s):
                resp = await self.session.request(method, url, headers=headers, data=body,
                                                  allow_redirects=False)
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True, status=504,
                                  message=f"connect timeout: {exc}") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True, status=502,
                                  message=f"cannot connect: {exc}") from exc
        except TimeoutError as exc:
            raise UpstreamFailure(Outcome.TIMEOUT, retryable=False, status=504,
                                  message="no response within the first-byte timeout") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise UpstreamFailure(Outcome.RESET, retryable=True, status=502,
                                  message=f"connection broke before a response: {exc!r}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(Outcome.RESET, retryable=False, status=502,
                                  message=f"upstream error: {exc!r}") from exc
        if resp.status == 503:
            body = await self._drain(resp)
            raise UpstreamFailure(
                Outcome.HTTP_5XX, retryable=True, status=503, message="destination answered 503",
                passthrough=Passthrough(503, list(resp.headers.items()), body))
        return resp

    async def _drain(self, resp: aiohttp.ClientResponse) -> bytes:
        try:
            async with asyncio.timeout(self.settings.idle_timeout_s):
                return await resp.read()
        except (TimeoutError, aiohttp.ClientError):
            return b""
        finally:
            resp.release()
