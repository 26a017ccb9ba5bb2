"""An InferencePool's pods as planner destinations, and the edit that gets the planner
there (orchestration.reconcile), on the API's own JSON shapes (adapters.discovery reads them)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.adapters.discovery import pool_destinations, pool_spec
from planner_svc.errors import InvalidRequest
from planner_svc.orchestration.destinations import edit_destinations
from planner_svc.orchestration.reconcile import reconcile
from router_client.plan import DestinationSpec

POOL = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "llm"},
        "spec": {"selector": {"matchLabels": {"app": "vllm", "tier": "a"}},
                 "targetPorts": [{"number": 8000}],
                 "endpointPickerRef": {"name": "cacheroute-epp", "port": {"number": 9002}}}}


def pod(name: str, ip: str | None = "10.1.0.5", *, ready: bool = True, phase: str = "Running",
        deleting: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {"app": "vllm", "tier": "a"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_the_spec_is_read_and_checked():
    spec = pool_spec(POOL)
    assert spec.port == 8000 and spec.label_selector == "app=vllm,tier=a"
    for broken, why in [
        ({"spec": {**POOL["spec"], "targetPorts": []}}, "one port"),
        ({"spec": {**POOL["spec"], "targetPorts": [{"number": 70000}]}}, "not a port"),
        ({"spec": {**POOL["spec"], "selector": {}}}, "matchLabels"),
        ({"spec": None}, "spec"),
    ]:
        with pytest.raises(InvalidRequest, match=why):
            pool_spec({**POOL, **broken})


def test_only_running_ready_labelled_pods_with_an_ip_are_destinations():
    spec = pool_spec(POOL)
    pods = [pod("a", "10.1.0.5"), pod("b", None), pod("c", ready=False),
            pod("d", phase="Pending"), pod("e", deleting=True),
            pod("f", labels={"app": "other"}), pod("g", "fd00::7")]
    assert pool_destinations(spec, pods) == [
        DestinationSpec("a", "http://10.1.0.5:8000"), DestinationSpec("g", "http://[fd00::7]:8000")]


def d(ident: str, ip: str = "10.0.0.1", draining: bool = False) -> DestinationSpec:
    return DestinationSpec(ident, f"http://{ip}:8000", 1.0, draining)


def test_new_pods_join_gone_pods_drain_then_leave():
    edit = reconcile([d("a"), d("b")], [d("a"), d("c")], drained_since={}, now=0.0)
    assert [x.id for x in edit.add] == ["c"] and edit.drain == ["b"] and edit.remove == []
    current = [d("a"), d("b", draining=True), d("c")]
    assert not reconcile(current, [d("a"), d("c")], drained_since={"b": 0.0}, now=30.0)
    edit = reconcile(current, [d("a"), d("c")], drained_since={"b": 0.0}, now=60.0)
    assert edit.remove == ["b"] and not edit.add and not edit.drain
    # a drained pod that comes back, and a pod at a new address, are added again
    edit = reconcile(current, [d("a"), d("b"), d("c", "10.0.0.9")],
                     drained_since={"b": 0.0}, now=10.0)
    assert [(x.id, x.address) for x in edit.add] == [("b", "http://10.0.0.1:8000"),
                                                     ("c", "http://10.0.0.9:8000")]
    assert not edit.remove and not edit.drain


def pods_st(min_size: int) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from("abcdefgh"), st.sampled_from(["1.1.1.1", "2.2.2.2"]),
                           min_size=min_size, max_size=8)


@settings(max_examples=200, deadline=None)
@given(start=pods_st(0), target=pods_st(1))  # pool-sync never edits toward an empty pool
def test_rounds_of_edits_reach_the_pool_and_every_edit_is_valid(start, target):
    """Applied through the planner's own edit function, a few rounds always converge on the
    pool's list, with nothing draining left over, and no edit is ever refused."""
    current = [d(i, ip) for i, ip in sorted(start.items())]
    desired = [d(i, ip) for i, ip in sorted(target.items())]
    since: dict[str, float] = {}
    for now in (0.0, 100.0, 200.0, 300.0):
        since = {x.id: since.get(x.id, now) for x in current if x.draining}
        edit = reconcile(current, desired, drained_since=since, now=now, remove_after_s=50.0)
        if edit:
            current = edit_destinations(current, edit.add, edit.drain, edit.remove)
    assert sorted((x.id, x.address) for x in current if not x.draining) == \
        sorted((x.id, x.address) for x in desired)
    assert not any(x.draining for x in current)


def test_an_id_removed_twice_in_one_edit_is_removed_once():
    # Found by the gRPC fuzzer: UpdateConfig(remove_destinations=[x, x]) was a KeyError (an
    # INTERNAL answer) instead of an edit.
    current = [DestinationSpec("a"), DestinationSpec("b")]
    assert [d.id for d in edit_destinations(current, [], [], ["b", "b"])] == ["a"]
