"""Discovery sources' answers become destinations (planner_svc.adapters.discovery): files,
DNS records and EndpointSlices, and bad answers are refused whole, naming the entry."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner_svc.adapters.discovery import (
    MAX_DESTINATIONS,
    destinations_from_a,
    destinations_from_endpoint_slices,
    destinations_from_file,
    destinations_from_srv,
)
from planner_svc.errors import InvalidRequest
from router_client.plan import DestinationSpec


def test_a_file_of_lines_or_json_names_the_destinations():
    lines = """
    # engines in rack 3
    e0 http://10.0.3.1:8000
    e1 http://10.0.3.2:8000 2   # the big one
    """
    assert destinations_from_file(lines) == [
        DestinationSpec("e0", "http://10.0.3.1:8000"),
        DestinationSpec("e1", "http://10.0.3.2:8000", 2.0)]
    as_json = json.dumps({"destinations": [{"id": "e1", "address": "http://10.0.3.2:8000",
                                            "weight": 2}, {"id": "e0",
                                                           "address": "http://10.0.3.1:8000"}]})
    assert destinations_from_file(as_json) == destinations_from_file(lines)
    assert destinations_from_file("# nothing yet\n") == []


@pytest.mark.parametrize("text,says", [
    ("e0 http://a:1\ne0 http://b:1\n", "ids repeat: e0"),
    ("e0 10.0.0.1:8000\n", "must be an http(s) URL"),
    ("e0 http://a:1 0\n", "weight '0' must be > 0"),
    ("e0 http://a:1 nan\n", "must be > 0"),
    ("e0 http://a:1 heavy\n", "is not a number"),
    ("e0\n", "f:1: expected 'id address [weight]'"),
    ("[{\"id\": \"e0\"}]", "address None"),
    ("{\"destinations\": 3}", "expected a list"),
    ("[1, 2", "not valid JSON"),
])
def test_a_bad_file_is_refused_whole_naming_the_entry(text, says):
    with pytest.raises(InvalidRequest, match=re.escape(says)):
        destinations_from_file(text, "f")


def test_too_many_destinations_are_refused_not_truncated():
    text = "".join(f"e{i} http://h:{i % 60000 + 1}\n" for i in range(MAX_DESTINATIONS + 1))
    with pytest.raises(InvalidRequest, match="at most"):
        destinations_from_file(text)


def test_a_records_are_one_destination_per_address_on_the_port():
    got = destinations_from_a(["10.0.0.2", "10.0.0.1", "fd00::1", "10.0.0.1"], 8000, "n")
    assert got == [DestinationSpec("10.0.0.1:8000", "http://10.0.0.1:8000"),
                   DestinationSpec("10.0.0.2:8000", "http://10.0.0.2:8000"),
                   DestinationSpec("fd00::1:8000", "http://[fd00::1]:8000")]
    with pytest.raises(InvalidRequest, match="not a port"):
        destinations_from_a(["10.0.0.1"], 0, "n")


def test_srv_records_use_the_best_priority_and_their_weights():
    got = destinations_from_srv([(10, 60, 8000, "e0.llm."), (10, 20, 8001, "e1.llm."),
                                 (20, 100, 8000, "backup.llm."), (10, 0, 0, "bad.")], "n")
    assert got == [DestinationSpec("e0.llm:8000", "http://e0.llm:8000", 1.5),
                   DestinationSpec("e1.llm:8001", "http://e1.llm:8001", 0.5)]
    assert [d.capacity_weight for d in destinations_from_srv(
        [(0, 0, 1, "a."), (0, 0, 1, "b.")], "n")] == [1.0, 1.0]
    assert destinations_from_srv([], "n") == []


def endpoint(ip: str, pod: str | None = None, **conditions: bool) -> dict:
    ep: dict = {"addresses": [ip], "conditions": conditions}
    if pod:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "llm"}
    return ep


def test_endpoint_slices_give_the_ready_endpoints_on_the_named_port():
    slices = [
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
         "metadata": {"name": "vllm-abc", "labels": {"kubernetes.io/service-name": "vllm"}},
         "ports": [{"name": "http", "port": 8000, "protocol": "TCP"},
                   {"name": "metrics", "port": 9000, "protocol": "TCP"}],
         "endpoints": [endpoint("10.1.0.5", "vllm-0", ready=True),
                       endpoint("10.1.0.6", "vllm-1", ready=False),
                       endpoint("10.1.0.7", "vllm-2", ready=True, terminating=True),
                       endpoint("10.1.0.8")]},  # no conditions: ready; no pod: by address
        {"addressType": "IPv6", "ports": [{"name": "http", "port": 8000}],
         "endpoints": [endpoint("fd00::5", "vllm-0", ready=True)]},  # same pod, other family
    ]
    got = destinations_from_endpoint_slices(slices, "http", "svc")
    assert [(d.id, d.address) for d in got] == [("10.1.0.8:8000", "http://10.1.0.8:8000"),
                                                 ("vllm-0", "http://[fd00::5]:8000")]
    # Two ports and none named: ambiguous, so the slice is not read.
    assert destinations_from_endpoint_slices(slices[:1], "", "svc") == []


@given(st.lists(st.tuples(st.text("abcdefgh", min_size=1, max_size=8),
                          st.integers(1, 65535), st.floats(0.01, 100)), max_size=30))
def test_any_file_of_valid_entries_round_trips(entries):
    unique = {ident: (port, w) for ident, port, w in entries}
    text = "".join(f"{i} http://h:{p} {w!r}\n" for i, (p, w) in unique.items())
    got = destinations_from_file(text)
    assert {d.id: (int(d.address.rsplit(":", 1)[1]), d.capacity_weight) for d in got} == unique
