"""Issue 55's attack run (CI tier): `bench/attacks.py`, which `bench/chaos.py` runs after
its chaos. One credential at a time against real servers on loopback (a redis-server with
the shipped ACL, the planner's gRPC service, the gateway and the endpoint picker on their
own router logins), while honest clients use the gateway.

Under each attack of items 1-3, 8 and 10-13: the attack is refused or bounded as its
defect test says (tests/reliability/test_redis_credentials.py, test_grpc_streams.py,
test_edge_bounds.py), the planner publishes (operator replans every second) and answers
GetStatus and health, and honest clients keep at least THROUGHPUT_FLOOR of the run's own
unattacked throughput (a ratio within the run, not a wall-clock figure). Items 4, 5 and
14-16 get one pass each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.bench_module import load_bench

pytestmark = pytest.mark.integration

# The bar, kept: with requests of about 0.3 s at the engines (the run's default)
# the lowest ratio of a run was 0.971, 0.988 and 0.991 on 2 shared cores at load 7-9, its
# unattacked windows within 3 % of each other (docs/security.md, "The attack run").
THROUGHPUT_FLOOR = 0.9
# At load 20 on the same 2 cores the unattacked windows of one run differed by 35 % (in
# another by 2.9x): a 10 % bound cannot be measured then, and the ratio is reported, not
# asserted.
MEASURABLE_SPREAD = 1.15


@pytest.fixture(scope="module")
def fig() -> dict[str, Any]:
    out: dict[str, Any] = load_bench("attacks").run_attacks()
    print(json.dumps(out, default=str))
    return out


@pytest.mark.timeout(240)
def test_every_attack_is_refused_or_bounded(fig: dict[str, Any]) -> None:
    assert fig["attacks"] == 13
    assert fig["attacks_not_held"] == [], {
        k: v for k, v in fig["by_attack"].items() if not v["held"]}
    by = fig["by_attack"]
    assert by["8_unread_plan_streams"]["refused"] >= 20
    assert by["10_repeated_headers"]["honest_routed_after"] == "20/20"
    assert by["11_endless_streams"]["outcomes"].get("deadline", 0) > 0
    assert by["12_body_flood"]["refused_413"] > 0
    assert by["13_idle_connections"]["refused_503"] > 0
    assert fig["components_alive"]


@pytest.mark.timeout(240)
def test_the_planner_publishes_and_answers_under_every_attack(fig: dict[str, Any]) -> None:
    assert fig["planner_published_during_every_attack"], {
        k: v["versions_published"] for k, v in fig["by_attack"].items()}
    assert fig["replan_errors"] == 0
    assert fig["unary_rpcs_answered_during_every_attack"]
    assert fig["health_serving_during_every_attack"]


@pytest.mark.timeout(240)
def test_honest_clients_keep_their_throughput_under_every_attack(fig: dict[str, Any]) -> None:
    ratios = fig["throughput_ratio_by_attack"]
    assert len(ratios) == 8
    assert all(v["honest_errors"] == 0 for v in fig["by_attack"].values())
    assert fig["unattacked_spread"] is not None, "an unattacked window served nobody"
    if fig["unattacked_spread"] > MEASURABLE_SPREAD:
        pytest.skip(f"the machine's load moved the unattacked throughput by "
                    f"{fig['unattacked_spread']:.2f}x within the run; ratios {ratios}")
    assert fig["attack_honest_throughput_ratio_min"] >= THROUGHPUT_FLOOR, ratios
