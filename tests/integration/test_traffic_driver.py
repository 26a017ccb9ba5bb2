"""The arena's traffic driver against real emulated engines: conversations over several
router replicas, in turn or kept on one replica (`--client session`). Two engines stand in
for two replicas here, so where each turn went shows in the engines' caches."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from planner_svc.devstack.engines import start_engines
from planner_svc.devstack.traffic import Driver, Record
from planner_svc.simulator.sessions import SCENARIOS, population, sessions

pytestmark = pytest.mark.integration


def _drive(tmp_path: Path, session_affine: bool) -> list[Record]:
    workdir = tmp_path / ("affine" if session_affine else "in-turn")
    workdir.mkdir()
    fleet = start_engines(workdir, 2, extra=["--time-scale", "0", "--model", "arena-model"])
    try:
        pop = population(SCENARIOS["paper-like"].scaled(sessions_per_s=8.0), 1)
        plan = sessions(pop, 2.0)
        driver = Driver(list(fleet.urls.values()), pop, session_affine=session_affine)
        return asyncio.run(driver.run(plan, until_s=4.0))
    finally:
        fleet.process.stop()


def _later_turns_hit(records: list[Record]) -> float:
    later = [r for r in records if r.ok and r.turn > 0]
    assert later, "no conversation reached a second turn"
    return sum(r.cached_tokens for r in later) / sum(r.prompt_tokens for r in later)


def test_a_session_affine_client_keeps_each_conversation_on_one_replica(
        tmp_path: Path) -> None:
    affine = _drive(tmp_path, session_affine=True)
    in_turn = _drive(tmp_path, session_affine=False)
    assert all(r.ok for r in affine + in_turn), [r.error for r in affine + in_turn if not r.ok]
    # the same conversations either way (instant engines: every turn is answered)
    assert sorted((r.sid, r.turn) for r in affine) == sorted((r.sid, r.turn) for r in in_turn)
    # Kept on one engine, a conversation's later turns find their whole history cached
    # (measured: 95 %); sent in turn, each turn lands on the engine without the last
    # answer and finds only the history up to the turn before (85 %).
    assert _later_turns_hit(affine) > 0.9
    assert _later_turns_hit(in_turn) < _later_turns_hit(affine) - 0.05


def test_the_engines_report_each_requests_model_ttft_beside_what_the_client_saw(
        tmp_path: Path) -> None:
    """The split the arena reports (`engine_ttft_p99_s`): the engine model's TTFT of every
    request since the reset, on the clock the driver uses, never above the client's."""
    fleet = start_engines(tmp_path, 1, extra=["--time-scale", "1", "--model", "arena-model",
                                              "--faults"])
    try:
        pop = population(SCENARIOS["paper-like"].scaled(sessions_per_s=4.0), 2)
        driver = Driver(list(fleet.urls.values()), pop)
        records = asyncio.run(driver.run(sessions(pop, 2.0), until_s=4.0))
        ok = [r for r in records if r.ok]
        timings = fleet.timings(next(iter(fleet.urls)))
    finally:
        fleet.process.stop()
    # (a request cut off at `until_s` may have had its first token at the engine)
    assert ok and len(timings["ttft_s"]) >= len(ok) and timings["dropped"] == 0
    assert all(driver.started_at <= a <= driver.started_at + 4.0 for a in timings["arrived_s"])
    assert all(t > 0 for t in timings["ttft_s"]) and all(x >= 0 for x in timings["late_s"])
    assert sorted(timings["ttft_s"])[len(ok) // 2] <= sorted(r.ttft_s for r in ok)[len(ok) // 2]
