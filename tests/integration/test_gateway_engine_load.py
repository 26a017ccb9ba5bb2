"""A gateway that reads the engines' own load (`--engine-load-period-s`): an engine queueing
work that did not come through this gateway (another replica's, a batch job's) is avoided,
and when it drains, or its /metrics stops answering, the gateway counts only its own."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from planner_svc.devstack.engines import EngineFleet, start_engines
from router_client.gateway import GatewaySettings
from router_client.plan import DestinationSpec
from tests.gateway_harness import GatewayThread, fault
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture()
def fleet(tmp_path) -> Iterator[EngineFleet]:  # type: ignore[no-untyped-def]
    # One request in an engine's batch at a time, each taking a while: a few direct
    # requests queue at e0 the way another gateway's traffic would.
    f = start_engines(tmp_path, 2, extra=["--time-scale", "6", "--batch-limit", "1",
                                          "--faults"])
    yield f
    f.stop()


def ask(url: str, text: str, timeout_s: float = 60.0) -> str:
    body = json.dumps({"model": "m", "max_tokens": 2,
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.headers.get("x-cacheroute-destination") or resp.headers.get(
            "x-emulated-engine") or ""


def test_an_engine_busy_with_other_traffic_is_avoided_until_it_drains(fleet):
    e0 = fleet.urls["e0"]
    others = [threading.Thread(target=ask, args=(e0, f"a long report on topic {i} " * 30))
              for i in range(8)]
    g = GatewayThread([DestinationSpec(i, u) for i, u in fleet.urls.items()],
                      settings=GatewaySettings(port=0, router_id="gw-load",
                                               engine_load_period_s=0.1)).start()
    try:
        poller = g.gateway.engine_load  # type: ignore[union-attr]
        assert poller is not None
        for t in others:
            t.start()
        assert eventually(lambda: poller.latest.get("e0", 0) >= 3, 10)
        # No plan: every request is a P2C choice between e0 and e1; e0's queue decides.
        # Only picks made while e0 still reported a queue before and after count (on a
        # loaded machine its queue can drain before the last pick).
        picks = []
        for i in range(6):
            before = poller.latest.get("e0", 0)
            pick = ask(g.url, f"question {i}")
            if before >= 3 and poller.latest.get("e0", 0) >= 3:
                picks.append(pick)
        assert len(picks) >= 3 and set(picks) == {"e1"}, picks
        for t in others:
            t.join(60)
        assert eventually(lambda: poller.latest.get("e0") == 0, 10)
        core = g.client.core  # type: ignore[union-attr]
        assert core.load == core.inflight  # drained: the engines add nothing
        # An engine whose /metrics does not answer is left out of the round: own counts.
        fault(fleet, "e1", "down")
        assert eventually(lambda: "e1" not in poller.latest and "e1" in poller.failures, 10)
    finally:
        g.stop()
        fault(fleet, "e1", "up")
