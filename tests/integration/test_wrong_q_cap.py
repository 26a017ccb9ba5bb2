"""A deliberately wrong q_cap on the live stack: `plan report` names it, and the real
Prometheus fires the project's alert on the planner's live metrics.

The demo stack (broker, Redis, stream worker, planner with a 2-s validated p99) learns the
demo fleet's traffic with the right q_cap, and its report says q_cap is consistent with the
latency measured. An operator then sets a q_cap twelve times too low (`UpdateConfig`): the next
plan expects every destination at 5x its capacity, the engines serve it in tens of
milliseconds, and the report calls q_cap understated. (The hit rate cannot show it: the plan
predicts its hit from rates measured under the same q_cap. Overstated q_caps, which need
engines that saturate, are tested at the service tier and by the arena's capacity sweep.)
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.cli.demo import run_demo
from planner_svc.devstack.fleet import FleetOptions
from planner_svc.devstack.processes import free_port
from planner_svc.devstack.stack import LocalStack, StackOptions, start_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~2.5 min

ROOT = Path(__file__).resolve().parents[2]
RIGHT_Q_CAP, WRONG_Q_CAP = 60.0, 5.0


@pytest.fixture()
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    s = start_stack(StackOptions(destinations=8, window_s=6.0, hop_s=1.0, interval_s=3.0,
                                 q_cap=RIGHT_Q_CAP, p99_ms_max=2000.0,
                                 workdir=str(tmp_path / "stack")))
    yield s
    s.stop()


@pytest.fixture()
def prometheus(stack: LocalStack, tmp_path: Path) -> Iterator[str]:
    """Debian's prometheus scraping the planner every second, with deploy/'s alert rules."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        "scrape_configs": [{"job_name": "planner", "static_configs": [
            {"targets": [f"127.0.0.1:{stack.metrics_port}"]}]}],
    }))
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).read()
                break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail((tmp_path / "prometheus.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def alert_states(url: str, name: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as reply:
        alerts = json.load(reply)["data"]["alerts"]
    return [a["state"] for a in alerts if a["labels"].get("alertname") == name]


def report(stub: Any) -> Any | None:
    try:
        return stub.GetPlanReport(planner_pb2.GetPlanReportRequest(), timeout=5)
    except grpc.RpcError:
        return None  # no plan yet, or a fallback table


def wait_for(what: str, timeout_s: float, probe: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(1.0)
    pytest.fail(f"timed out waiting for {what}")


def test_a_wrong_q_cap_is_reported_and_fires_the_alert(stack, prometheus):
    options = FleetOptions(keys=1500, total_rate=200.0, shift_at_s=0.0, seed=7)
    fleet = threading.Thread(target=run_demo, args=(stack, options, 130.0), daemon=True)
    fleet.start()
    channel = grpc.insecure_channel(stack.grpc_target)
    stub = planner_pb2_grpc.PlannerStub(channel)
    try:
        def measured(r: Any) -> bool:
            return r is not None and r.windows >= 3 and r.capacity_verdict != "unchecked"

        right = wait_for("a plan measured past its dip", 90, lambda: (r := report(stub))
                         and measured(r) and r)
        assert right.q_cap == RIGHT_Q_CAP and right.p99_target_ms == 2000.0
        assert right.capacity_verdict == "consistent", right.capacity_reason
        stub.UpdateConfig(planner_pb2.UpdateConfigRequest(
            q_cap=WRONG_Q_CAP, min_dwell_s=600), timeout=10)  # no replan: it persists
        stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=30)
        wrong_version = stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(),
                                               timeout=5).version

        def wrong_report() -> Any:
            return stub.GetPlanReport(planner_pb2.GetPlanReportRequest(version=wrong_version),
                                      timeout=5)

        wrong = wait_for("the wrong plan measured past its dip", 60,
                         lambda: (r := wrong_report()) and measured(r) and r)
        assert wrong.q_cap == WRONG_Q_CAP
        assert wrong.capacity_verdict == "q_cap_understated", wrong.capacity_reason
        assert min(wrong.predicted_utilisation) > 1.25  # the plan itself expected overload
        assert max(wrong.p99_ms) <= 1000.0
        states = wait_for("the alert's expression on the live series", 30, lambda: alert_states(
            prometheus, "CacheRouteQCapMiscalibrated"))
        assert set(states) <= {"pending", "firing"}, states  # pending: its `for: 5m` runs
        print(f"q_cap {RIGHT_Q_CAP:g}: plan {right.version.seq} {right.capacity_verdict} "
              f"({right.capacity_reason}); q_cap {WRONG_Q_CAP:g}: plan {wrong.version.seq} "
              f"{wrong.capacity_verdict} ({wrong.capacity_reason}); alert {states}")
    finally:
        channel.close()
        fleet.join(200)
