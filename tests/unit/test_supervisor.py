"""The stack's Supervisor (what `cacheroute up` runs): restarts exactly what died, with a
backoff that doubles per restart and resets once a component stays up. Pure logic over
stand-in processes; the chaos test runs it against the real stack."""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from planner_svc.devstack.processes import ManagedProcess
from planner_svc.devstack.stack import LocalStack, StackOptions, Supervisor


@dataclass
class StandIn:
    """The part of ManagedProcess the Supervisor uses."""

    up: bool = True
    starts: int = 0

    def alive(self) -> bool:
        return self.up

    def start(self) -> None:
        self.starts += 1
        self.up = True


def stack_of(n_workers: int) -> tuple[LocalStack, list[StandIn], StandIn]:
    workers = [StandIn() for _ in range(n_workers)]
    planner = StandIn()
    stack = LocalStack(StackOptions(), Path("/nonexistent"), workers=workers,  # type: ignore[arg-type]
                       planner=planner)  # type: ignore[arg-type]
    return stack, workers, planner


def test_only_the_dead_component_is_restarted():
    stack, workers, planner = stack_of(2)
    sup = Supervisor(stack)
    assert sup.check(now=0.0) == []
    workers[1].up = False
    assert sup.check(now=1.0) == ["worker-1"]
    assert (workers[0].starts, workers[1].starts, planner.starts) == (0, 1, 0)
    planner.up = False
    assert sup.check(now=2.0) == ["planner"]
    assert sup.restarts == {"worker-1": 1, "planner": 1}


def test_backoff_doubles_per_restart_up_to_the_cap_and_resets_after_a_minute_up():
    stack, _workers, planner = stack_of(0)
    sup = Supervisor(stack, max_backoff_s=3.0)
    t = 0.0
    restarted_at = []
    while t < 20.0:  # the planner dies as soon as it is started
        planner.up = False
        if sup.check(now=t):
            restarted_at.append(t)
        t = round(t + 0.1, 1)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(restarted_at)]
    assert gaps[:3] == [0.5, 1.0, 2.0]  # 0.5 s doubling
    assert set(gaps[3:]) == {3.0}  # capped
    # up for more than a minute: the next death is restarted at once, backoff from 0.5 s
    planner.up = True
    assert sup.check(now=t + 61.0) == []
    assert sup.restarts["planner"] == 0
    planner.up = False
    assert sup.check(now=t + 64.1) == ["planner"]


def test_a_managed_process_reports_the_cpu_it_used(tmp_path):
    burn = ("import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)")
    p = ManagedProcess("burn", [sys.executable, "-c", burn], tmp_path / "burn.log")
    p.start()
    try:
        deadline = time.monotonic() + 20
        while p.cpu_seconds() < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.3 <= p.cpu_seconds() < 5.0
    finally:
        p.stop()
    assert p.cpu_seconds() == 0.0  # gone: nothing to read
