"""The gateway's pure edge rules: which request targets are forwarded (and how), and the
ledger of what clients hold (router_client.gateway.paths, .client_limits)."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router_client.gateway.client_limits import ClientLedger
from router_client.gateway.paths import normal_target


@pytest.mark.parametrize(("target", "forwarded"), [
    ("/v1/chat/completions", "/v1/chat/completions"),
    ("/v1/models?x=../y", "/v1/models?x=../y"),  # the query is not a path
    ("//v1//models", "/v1/models"),
    ("/v1/files/a.b/..c/c..", "/v1/files/a.b/..c/c.."),  # dots inside names are names
    ("/v1/files/a%20b", "/v1/files/a%20b"),
    ("/v1/../metrics", None), ("/v1/../../etc/passwd", None), ("/v1/./models", None),
    ("/v1/models/..", None), ("/v1/%2e%2e/metrics", None), ("/v1/%2E./metrics", None),
    ("/v1/..%2Fmetrics", None), ("/v1/..\\metrics", None), ("/v1/%252e%252e/metrics", None),
    ("http://engine/v1/../metrics", None),
])
def test_targets(target: str, forwarded: str | None) -> None:
    assert normal_target(target) == forwarded


segments = st.lists(st.sampled_from(["v1", "models", ".", "..", "a.b", "", "%2e", "x%2fy"]),
                    min_size=1, max_size=6)


@given(segments, st.integers(min_value=0, max_value=2))
def test_nothing_forwarded_unescapes_to_a_dot_segment(parts: list[str], escapes: int) -> None:
    """Whatever a server behind the gateway unescapes (once or more), a forwarded path has
    no dot segment; and forwarding is stable (a forwarded target is forwarded unchanged)."""
    path = "/" + "/".join(parts)
    for _ in range(escapes):
        path = quote(path, safe="/")
    out = normal_target(path)
    if out is None:
        return
    seen = out
    for _ in range(4):
        assert not {".", ".."} & set(seen.replace("\\", "/").split("/"))
        seen = unquote(seen)
    assert normal_target(out) == out


def test_the_ledger_bounds_bodies_in_total_and_per_client() -> None:
    ledger = ClientLedger(body_limit=100, client_body_limit=60)
    assert ledger.take("a", 60) is None
    refused = ledger.take("a", 1)
    assert refused is not None and refused.status == 413
    assert ledger.take("b", 40) is None
    refused = ledger.take("c", 1)
    assert refused is not None and refused.status == 503
    assert (ledger.held, ledger.held_by("a"), ledger.held_by("c")) == (100, 60, 0)
    ledger.give("a", 1000)  # at most what it held
    assert (ledger.held, ledger.held_by("a")) == (40, 0)
    assert ledger.take("c", 60) is None


def test_per_client_limits_of_zero_are_off() -> None:
    ledger = ClientLedger(body_limit=10)
    assert ledger.take("a", 10) is None and all(ledger.connect("a") for _ in range(1000))


def test_the_ledger_counts_connections_per_client() -> None:
    ledger = ClientLedger(body_limit=1, client_connection_limit=2)
    assert ledger.connect("a") and ledger.connect("a") and not ledger.connect("a")
    assert ledger.connect("b")
    ledger.disconnect("a")
    assert ledger.connections_of("a") == 1 and ledger.connect("a")
    for _ in range(3):
        ledger.disconnect("b")  # more than it opened: never below zero
    assert ledger.connections_of("b") == 0


@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans(),
                          st.integers(min_value=0, max_value=50)), max_size=60))
def test_held_is_the_sum_of_what_each_client_holds(ops: list[tuple[str, bool, int]]) -> None:
    ledger = ClientLedger(body_limit=120, client_body_limit=70)
    for client, take, n in ops:
        if take:
            ledger.take(client, n)
        else:
            ledger.give(client, n)
        mine = [ledger.held_by(c) for c in "abc"]
        assert ledger.held == sum(mine) <= 120 and all(0 <= m <= 70 for m in mine)
