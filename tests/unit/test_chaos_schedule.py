"""The chaos run's fault schedule (bench/chaos.py): every kind once per cycle, the broker
kill early (short runs see it) and never so late that the final counted window covers it."""

from __future__ import annotations

from pathlib import Path

from tests.bench_module import load_bench


def test_every_kind_once_per_cycle_and_the_broker_kill_early(tmp_path: Path) -> None:
    chaos = load_bench("chaos")
    for seed in range(20):
        c = chaos.Chaos(tmp_path, seed)
        picks = [c.next_chaos_fault(600.0) for _ in range(len(chaos.FAULTS))]
        assert sorted(picks) == sorted(chaos.FAULTS)
        assert picks.index("broker_kill") <= 3


def test_no_broker_kill_near_the_end(tmp_path: Path) -> None:
    chaos = load_bench("chaos")
    for seed in range(20):
        c = chaos.Chaos(tmp_path, seed)
        assert "broker_kill" not in [c.next_chaos_fault(30.0) for _ in range(40)]
