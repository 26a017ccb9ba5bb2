"""The fault harness itself: the RESP framer, the history checker (it must catch
every kind of violation it claims to), and the fault proxy on a plain echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from router_client.plan import Version
from tests.faults.history import (
    AppliedRecord,
    DecisionSample,
    RouterHistory,
    check_history,
    percentile,
    propagation_delays_ms,
)
from tests.faults.proxy import FaultProxy
from tests.faults.resp import frame_end, is_pubsub_message, split_frames

V1, V2, V3 = Version(1, 1), Version(1, 2), Version(1, 3)
PUBLISHED = {V1: b"a" * 32, V2: b"b" * 32, V3: b"c" * 32}
MESSAGE = b"*3\r\n$7\r\nmessage\r\n$4\r\nchan\r\n$3\r\nabc\r\n"


def test_resp_frames_split_only_when_complete():
    stream = bytearray(b"+OK\r\n" + MESSAGE + b":12\r\n$-1\r\n*2\r\n$1\r\na\r\n$3\r\nbc")
    frames = split_frames(stream)
    assert frames == [b"+OK\r\n", MESSAGE, b":12\r\n", b"$-1\r\n"]
    assert bytes(stream) == b"*2\r\n$1\r\na\r\n$3\r\nbc"  # the incomplete tail stays
    stream += b"d\r\n"
    assert split_frames(stream) == [b"*2\r\n$1\r\na\r\n$3\r\nbcd\r\n"]
    assert frame_end(b"%1\r\n+a\r\n+b\r\n") == 12
    assert is_pubsub_message(MESSAGE) and not is_pubsub_message(b"*1\r\n$4\r\npong\r\n")


def _history(*applied: tuple[Version, bytes], decisions=()) -> RouterHistory:  # type: ignore[no-untyped-def]
    h = RouterHistory("r")
    h.applied = [AppliedRecord(v, d, float(i)) for i, (v, d) in enumerate(applied)]
    h.decisions = list(decisions)
    return h


def allowed(v: Version, key: str, planned: bool) -> set[str]:
    return {f"v{v.seq}-a"} if planned else {f"v{v.seq}-a", f"v{v.seq}-b"}


def test_a_valid_history_passes_and_round_trips():
    h = _history((V1, PUBLISHED[V1]), (V3, PUBLISHED[V3]),
                 decisions=[DecisionSample("k", "v1-a", V1, V3, True)])  # fmt: skip
    assert check_history(h, published=PUBLISHED, final=V3, allowed=allowed) == []
    again = RouterHistory.from_dict(h.to_dict())
    assert again == h


def test_the_checker_catches_every_violation():
    cases = {
        "not strictly increasing": _history((V2, PUBLISHED[V2]), (V1, PUBLISHED[V1])),
        "applied twice": _history((V2, PUBLISHED[V2]), (V2, PUBLISHED[V2])),
        "never published": _history((Version(1, 9), b"z" * 32)),
        "wrong digest": _history((V1, b"x" * 32)),
        "not the final": _history((V1, PUBLISHED[V1])),
        "mixed decision": _history(
            (V1, PUBLISHED[V1]), (V2, PUBLISHED[V2]), (V3, PUBLISHED[V3]),
            decisions=[DecisionSample("k", "v2-a", V1, V3, True)],
        ),
        "unplanned answer in planned mode": _history(
            (V3, PUBLISHED[V3]), decisions=[DecisionSample("k", "v3-b", V3, V3, True)]
        ),
    }  # fmt: skip
    for name, h in cases.items():
        assert check_history(h, published=PUBLISHED, final=V3, allowed=allowed), name


def test_propagation_delay_counts_the_first_version_at_or_after():
    h = _history((V1, b""), (V3, b""))
    h.applied = [AppliedRecord(V1, b"", 100.0), AppliedRecord(V3, b"", 350.0)]
    delays = propagation_delays_ms(h, {V1: 90.0, V2: 200.0, V3: 300.0})
    assert delays == [10.0, 150.0, 50.0]
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([5.0], 99) == 5.0


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):  # the proxy resets it at the end
        while data := conn.recv(65536):
            conn.sendall(data)


def test_proxy_passes_blackholes_and_resets():
    srv, _t = _echo_server()
    with FaultProxy(srv.getsockname()[1]) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        c.sendall(b"hello")
        assert c.recv(100) == b"hello"
        proxy.blackhole = True
        c.sendall(b"lost?")
        c.settimeout(0.3)
        try:
            got = c.recv(100)
        except TimeoutError:
            got = None
        assert got is None  # half-open: nothing comes back, nothing fails
        proxy.blackhole = False
        c.settimeout(2)
        assert c.recv(100) == b"lost?"  # delivered once the path heals
        proxy.reset_all()
        time.sleep(0.1)
        try:
            reset = c.recv(100) == b""
        except ConnectionResetError:
            reset = True
        assert reset
        c.close()
    srv.close()
