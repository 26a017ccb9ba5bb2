"""The planner's /metrics endpoint after a short real run: timer ticking, Redis real.

The planner runs with its own control timer (1 s interval) while the test feeds drifting
windows, installs by hand and drills a fallback; then the endpoint is scraped over HTTP
and parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner_svc.api.metrics import planner_registry, start_metrics_server
from planner_svc.control.guard import Mode
from planner_svc.server import PlannerService, build_service
from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates
from tests.service.harness import DESTS, planner_settings
from tests.service.windows import make_window

pytestmark = pytest.mark.integration


@pytest.fixture()
def running(redis_server, tmp_path: Path) -> Iterator[PlannerService]:
    settings = planner_settings(redis_server.url, tmp_path, interval_s=1.0)
    svc = build_service(settings, consume=False)
    svc.start()
    yield svc
    svc.stop(0)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] for every sample of the exposition."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples


def one(samples: dict, name: str, **labels: str) -> float:
    matches = [v for lab, v in samples[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return matches[0]


def run_briefly(svc: PlannerService, seconds: float, *, first: bool = True) -> None:
    """Feed a drifting window every 0.25 s (stream windows, as the consumer would).

    `first`: start with a window one window length back (the first plan needs a full one).
    """
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=3)
    rng = np.random.default_rng(5)
    deadline = time.monotonic() + seconds
    earlier = [10_000] if first else []
    while time.monotonic() < deadline:
        end = int(time.time() * 1000) - (earlier.pop() if earlier else 0)
        window = make_window(keys, rates, window_end_ms=end, destinations=list(DESTS), hit_rate=0.6)
        latencies = {
            d: dataclasses.replace(s, p99_e2e_ms=800.0) for d, s in window.destinations.items()
        }
        window = dataclasses.replace(window, destinations=latencies)
        svc.planner.on_window(window)
        rates = lognormal_walk(rates, 0.05, rng)
        time.sleep(0.25)


def test_scrape_after_a_short_run_has_sane_values(running):
    endpoint = start_metrics_server(0, planner_registry(running.planner))
    try:
        run_briefly(running, 2.5)
        assert running.planner.installed is not None  # the timer installed the first plan
        running.planner.replan(fresh=False, force=True, dry_run=False)
        running.planner.set_mode(Mode.FALLBACK, "drill")
        first = scrape(endpoint.port)
        running.planner.set_mode(Mode.PLANNED, "drill over")
        run_briefly(running, 1.2, first=False)
        second = scrape(endpoint.port)
    finally:
        endpoint.close()

    plan = running.planner.installed.plan
    assert one(second, "cacheroute_planner_plan_seq") == plan.version.seq >= 3
    assert one(second, "cacheroute_planner_plan_info", version=str(plan.version)) == 1
    assert 0 <= one(second, "cacheroute_planner_plan_age_seconds") < 30
    assert 0 <= one(second, "cacheroute_planner_plan_build_seconds") < 10
    assert one(second, "cacheroute_planner_plan_admitted_keys") == len(plan.table) == 48
    assert 0 < one(second, "cacheroute_planner_plan_admitted_rate_ratio") <= 1

    assert one(first, "cacheroute_planner_mode", mode="fallback") == 1
    assert one(second, "cacheroute_planner_mode", mode="planned") == 1
    assert one(second, "cacheroute_planner_mode", mode="fallback") == 0
    installs = one(second, "cacheroute_planner_decisions_total", action="install")
    assert installs >= 2  # first plan, operator replan
    assert one(second, "cacheroute_planner_decisions_total", action="fallback") == 1
    assert one(second, "cacheroute_planner_decisions_total", action="resume") == 1
    for action in ("install", "keep", "skip", "fallback", "resume"):  # counters never go down
        before = one(first, "cacheroute_planner_decisions_total", action=action)
        assert one(second, "cacheroute_planner_decisions_total", action=action) >= before

    assert one(second, "cacheroute_planner_drift_total_variation") >= 0
    assert one(second, "cacheroute_planner_rewarm_cost_prefill_tokens") >= 0
    assert one(second, "cacheroute_planner_staleness_accumulated_prefill_tokens") >= 0
    assert (
        one(
            second,
            "cacheroute_planner_staleness_rate_prefill_tokens_per_second",
            estimate="modelled",
        )
        >= 0
    )
    assert 0 <= one(second, "cacheroute_planner_last_install_moved_traffic_ratio") <= 1

    load = "cacheroute_planner_destination_{}_load_requests_per_second"
    expected = [v for _, v in second[load.format("expected")]]
    measured = [v for _, v in second[load.format("measured")]]
    assert len(expected) == len(measured) == 6
    traffic = one(second, "cacheroute_planner_traffic_requests_per_second")
    assert sum(expected) == pytest.approx(traffic, rel=0.01)
    assert sum(measured) == pytest.approx(traffic, rel=0.01)
    assert 1 <= one(second, "cacheroute_planner_expected_imbalance_ratio") < 2
    assert one(second, "cacheroute_planner_hit_ratio", traffic="all") == pytest.approx(0.6)

    assert 0 <= one(second, "cacheroute_planner_rates_age_seconds") < 5
    assert one(second, "cacheroute_planner_rates_recovering") == 0
    window_end = one(second, "cacheroute_planner_rates_window_end_timestamp_seconds")
    assert abs(window_end - time.time()) < 10
    assert one(second, "cacheroute_planner_interval_seconds") == 1.0
    assert one(second, "cacheroute_planner_q_cap_requests_per_second") == 20.0
    assert one(second, "cacheroute_planner_p99_e2e_seconds") == pytest.approx(0.8)

    # Every planner metric the dashboard and the alerts query is exported.
    for name in planner_names_queried():
        assert name in second or f"{name}_total" in second, name


def planner_names_queried() -> set[str]:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    text = (deploy / "grafana" / "dashboards" / "cacheroute.json").read_text()
    text += (deploy / "prometheus" / "alerts.yml").read_text()
    names = set(re.findall(r"\bcacheroute_planner_\w+", text))
    assert len(names) > 20
    return names


def test_metric_names_follow_conventions(running):
    run_briefly(running, 1.5)
    endpoint = start_metrics_server(0, planner_registry(running.planner))
    try:
        samples = scrape(endpoint.port)
    finally:
        endpoint.close()
    assert samples and all(name.startswith("cacheroute_planner_") for name in samples)
    for name in samples:
        assert not name.endswith(("_ms", "_milliseconds", "_percent")), name
    counters = [n for n in samples if n.endswith("_total")]
    assert counters == ["cacheroute_planner_decisions_total"]
