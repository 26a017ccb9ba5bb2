"""The in-process planner the service, CLI and metrics tests share: settings and rates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from planner_svc.server import PlannerService, build_service
from planner_svc.settings import PlannerSettings
from planner_svc.simulator.rates import paper_like_keys, paper_like_rates
from tests.service.windows import make_window

DESTS = tuple(f"d{i}" for i in range(6))
OPERATOR, READER = "op-secret", "read-secret"


def planner_settings(redis_url: str, data_dir: Path, **overrides: Any) -> PlannerSettings:
    """Six destinations, 8 warm slots each, ticks driven by the test unless overridden.

    The guard's floor on affinity's predicted gain is off unless a test sets it: caches of 8
    of these 1000-token prompts against 400 keys predict a 9 pp gain, under the default
    floor, while the windows claim what the test needs served (test_guard_gain_floor_*)."""
    base = PlannerSettings(
        redis_url=redis_url,
        grpc_port=0,
        data_dir=str(data_dir),
        destinations=DESTS,
        q_cap=20.0,
        warm_slots_per_destination=8,
        interval_s=3600.0,
        validated_affinity_gain_min=0.0,
    )
    return base.with_overrides(**overrides)


@contextmanager
def serving(redis_url: str, data_dir: Path, **overrides: Any) -> Iterator[PlannerService]:
    """A planner (no broker: windows are fed by the test) with its gRPC server started."""
    svc = build_service(planner_settings(redis_url, data_dir, **overrides), consume=False)
    svc.server.start()
    try:
        yield svc
    finally:
        svc.stop(0)


def feed(svc: PlannerService, seed: int = 1, end_ms: int | None = None) -> None:
    """Two windows one window length apart: the planner waits for a full window of rates."""
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=seed)
    end = end_ms or int(time.time() * 1000)
    for window_end in (end - 10_000, end):
        window = make_window(keys, rates, window_end_ms=window_end, destinations=list(DESTS))
        svc.planner.on_window(window)
