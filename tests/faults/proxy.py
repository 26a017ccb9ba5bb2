"""A small TCP fault proxy on loopback, between a client and one upstream server.

    proxy = FaultProxy(redis_port).start()
    client = RedisPlanSource(proxy.redis_url)
    proxy.blackhole = True     # half-open: connections stay up, nothing moves
    proxy.reset_all()          # every connection gets a TCP RST
    proxy.drop_messages = 0.3  # pub/sub message frames dropped / duplicated / delayed

Faults are attributes read on every chunk, so a test flips them at any time.
Each connection is two pump threads. While blackholed a pump stops reading, so
bytes wait in the kernel buffers, as on a path whose packets are lost and
retransmitted; when the blackhole ends they flow again (if the peer still
listens). Pub/sub faults act on whole RESP frames (`tests.faults.resp`) from the
server to the client, so the stream stays well formed.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from tests.faults.resp import is_pubsub_message, split_frames

_POLL_S = 0.05


@dataclass
class ProxyStats:
    connections: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    resets: int = 0
    corrupted: int = 0


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self, rst: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()


class FaultProxy:
    """See the module docstring. `seed` makes the message faults reproducible."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1", seed: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self.latency_s = 0.0
        self.blackhole = False
        self.refuse = False  # accept, then RST at once
        self.drop_messages = 0.0
        self.duplicate_messages = 0.0
        self.delay_messages = 0.0  # share of message frames held back by delay_s
        self.delay_s = 0.0
        # Flip one byte in the middle of the next client->server chunk of at least
        # this many bytes (0 = off): a corrupt publication, in flight.
        self.corrupt_next_upstream = 0
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_POLL_S)
        self.port: int = self._listener.getsockname()[1]

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self.reset_all()
        for t in self._threads:
            t.join(2)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset_all(self) -> None:
        """Send a TCP RST on every open connection (both sides)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for p in pairs:
            p.close(rst=True)
            self.stats.resets += 1

    def open_connections(self) -> int:
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed.is_set()]
            return len(self._pairs)

    # --- plumbing -------------------------------------------------------------------

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=target, args=args, daemon=True, name="fault-proxy")
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        if self.refuse:
            _Pair(client, socket.socket()).close(rst=True)
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            _Pair(client, socket.socket()).close(rst=True)
            return
        pair = _Pair(client, upstream)
        for s in (client, upstream):
            s.settimeout(_POLL_S)
        with self._lock:
            self._pairs.append(pair)
        self.stats.connections += 1
        self._spawn(self._pump, pair, client, upstream, False)
        self._spawn(self._pump, pair, upstream, client, True)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        pending = bytearray()
        while not (pair.closed.is_set() or self._stop.is_set()):
            if self.blackhole:
                time.sleep(_POLL_S)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            while self.blackhole and not (pair.closed.is_set() or self._stop.is_set()):
                time.sleep(_POLL_S)  # read just as the path went dark: hold it, like the wire
            if self.latency_s:
                time.sleep(self.latency_s)
            if not downstream and 0 < self.corrupt_next_upstream <= len(data):
                data = self._corrupt(data)
            try:
                self._forward(data, dst, pending if downstream else None)
            except OSError:
                break
        pair.close()

    def _forward(self, data: bytes, dst: socket.socket, pending: bytearray | None) -> None:
        if pending is None or not self._message_faults():
            if pending:  # faults were just switched off: flush what was held for framing
                data, pending[:] = bytes(pending) + data, b""
            dst.sendall(data)
            return
        pending += data
        for frame in split_frames(pending):
            for _ in range(self._copies(frame)):
                dst.sendall(frame)

    def _corrupt(self, data: bytes) -> bytes:
        self.corrupt_next_upstream = 0
        self.stats.corrupted += 1
        mid = len(data) // 2
        return data[:mid] + bytes([data[mid] ^ 0x5A]) + data[mid + 1 :]

    def _message_faults(self) -> bool:
        return bool(self.drop_messages or self.duplicate_messages or self.delay_messages)

    def _copies(self, frame: bytes) -> int:
        """How many times to deliver `frame` (0 = dropped); may sleep (delayed)."""
        if not is_pubsub_message(frame):
            return 1
        r = self._rng.random()
        if r < self.drop_messages:
            self.stats.dropped += 1
            return 0
        if self._rng.random() < self.delay_messages:
            self.stats.delayed += 1
            time.sleep(self.delay_s)
        if self._rng.random() < self.duplicate_messages:
            self.stats.duplicated += 1
            return 2
        return 1
