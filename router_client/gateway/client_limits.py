"""What the gateway's clients hold at once: request-body bytes, in total and per client
address, and connections per client address (pure; one ledger per server, driven by
`http11` on its single event loop, so plain counters suffice).

A body counts from its first byte until its request is answered (the proxy forwards it
whole, so it is held that long). Past the total a request is refused 503 (the gateway is
full: retry); past one client's share, 413 (that client holds too much at once). Without
them, bodies held one byte short of their end would be bounded only by the connection count
times the body cap.
A client is its IP address: behind a proxy that hides the addresses every request is one
client, so the per-client limits are 0 (off) there.
"""

from __future__ import annotations

from dataclasses import dataclass

# The defaults (GatewaySettings and http11.ServerLimits take them from here).
BUFFERED_BODY_BYTES = 512 << 20
CLIENT_BUFFERED_BODY_BYTES = 128 << 20
HEADER_TIMEOUT_S = 10.0


def connections_per_client(max_connections: int) -> int:
    """The gateway's default share of its connections for one client address: a quarter,
    and at least 1,024 (below that, one load generator or proxy would be refused while the
    header timeout already closes idle sockets)."""
    return max(1024, max_connections // 4)


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int  # 503: the gateway's total; 413: this client's share
    message: str


class ClientLedger:
    __slots__ = ("_bodies_of", "_connections_of", "body_limit", "client_body_limit",
                 "client_connection_limit", "held", "released")

    def __init__(self, *, body_limit: int, client_body_limit: int = 0,
                 client_connection_limit: int = 0) -> None:
        """`client_*` 0: no per-client limit."""
        if body_limit < 1 or client_body_limit < 0 or client_connection_limit < 0:
            raise ValueError("body_limit must be >= 1, the per-client limits >= 0 (0 = off)")
        self.body_limit = body_limit
        self.client_body_limit = client_body_limit
        self.client_connection_limit = client_connection_limit
        self.held = 0  # body bytes held by every client
        self.released = 0  # body bytes given back, ever
        self._bodies_of: dict[str, int] = {}
        self._connections_of: dict[str, int] = {}

    # --- connections ----------------------------------------------------------------------

    def connect(self, client: str) -> bool:
        """Count a new connection of `client`; False (not counted) past its limit."""
        n = self._connections_of.get(client, 0)
        if self.client_connection_limit and n >= self.client_connection_limit:
            return False
        self._connections_of[client] = n + 1
        return True

    def disconnect(self, client: str) -> None:
        n = self._connections_of.get(client, 0) - 1
        if n > 0:
            self._connections_of[client] = n
        else:
            self._connections_of.pop(client, None)

    def connections_of(self, client: str) -> int:
        return self._connections_of.get(client, 0)

    # --- body bytes -----------------------------------------------------------------------

    def check(self, client: str, n: int) -> Refusal | None:
        """Why `client` may not hold `n` more body bytes now (None: it may)."""
        if self.held + n > self.body_limit:
            return Refusal(503, f"the gateway holds its limit of request bodies "
                                f"({self.body_limit} bytes) at once; retry")
        mine = self._bodies_of.get(client, 0)
        if self.client_body_limit and mine + n > self.client_body_limit:
            return Refusal(413, f"this client's request bodies would exceed the "
                                f"{self.client_body_limit} bytes one client may hold at once")
        return None

    def take(self, client: str, n: int) -> Refusal | None:
        """Hold `n` more bytes for `client`, or say why not (then nothing is held)."""
        bodies = self._bodies_of
        mine = bodies.get(client, 0) + n
        held = self.held + n
        # Once per piece of every body: the common case is one test each, no call.
        if held > self.body_limit or (self.client_body_limit and mine > self.client_body_limit):
            return self.check(client, n)
        self.held = held
        bodies[client] = mine
        return None

    def give(self, client: str, n: int) -> None:
        """`client` no longer holds `n` bytes (at most what it held)."""
        mine = self._bodies_of.get(client, 0)
        n = min(n, mine)
        self.held -= n
        self.released += n
        if mine - n > 0:
            self._bodies_of[client] = mine - n
        else:
            self._bodies_of.pop(client, None)

    def held_by(self, client: str) -> int:
        return self._bodies_of.get(client, 0)
