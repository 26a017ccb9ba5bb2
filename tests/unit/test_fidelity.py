"""The fidelity gate: a recorded trace must be reproduced by the engine model (served hit
rate and end-to-end p99) before replay and diagnose answer for it."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from planner_svc.cli.replay_cmd import main as replay_main
from planner_svc.simulator.experiment import ENGINES
from planner_svc.simulator.fidelity import check_fidelity
from planner_svc.simulator.policies import flat_lb
from planner_svc.simulator.replica import ReplicaModel
from planner_svc.simulator.simulator import ClusterSpec, simulate
from planner_svc.simulator.workload import ScenarioSpec, Workload, paper_like

# the 70B-class preset (`--engine 70b`) with a 200k-token cache (`--cache-tokens 200000`)
ENGINE = dataclasses.replace(ENGINES["70b"], kv_capacity_tokens=200_000)


def recorded(engine: ReplicaModel = ENGINE, n: int = 6_000) -> Workload:
    """A paper-like stream served by Flat-LB on `engine`, recorded as a gateway would:
    where each request went, what it met in cache, how long it took."""
    w = paper_like(ScenarioSpec(5.0, n, 3, n_keys=300, interval_s=20.0))  # 20 % hit
    run = simulate(w, flat_lb, ClusterSpec(n_destinations=4, model=engine), seed=3)
    return dataclasses.replace(
        w, recorded_dest=run.dest.astype(np.int32),
        recorded_destinations=[f"e{i}" for i in range(4)],
        measured_cached=run.cached, measured_e2e_s=run.latency)


def test_the_model_that_served_the_trace_passes():
    f = check_fidelity(recorded(), ENGINE)
    assert f.checked and f.passed, f.lines()
    assert abs(f.simulated_hit - f.measured_hit) < 1e-9
    assert f.simulated_p99_s == f.measured_p99_s


def test_a_model_with_another_cache_or_speed_is_refused_with_the_figures():
    trace = recorded()
    small_cache = check_fidelity(trace, dataclasses.replace(ENGINE, kv_capacity_tokens=20_000))
    assert small_cache.checked and not small_cache.passed
    assert "hit rate" in small_cache.why and small_cache.simulated_hit < small_cache.measured_hit
    slow = check_fidelity(trace, dataclasses.replace(ENGINE, prefill_s_per_token=6e-4,
                                                     decode_s_per_step=0.05))
    assert slow.checked and not slow.passed and "p99" in slow.why
    assert any("FAILED" in line for line in slow.lines())


def test_a_trace_without_outcomes_is_not_checked():
    w = paper_like(ScenarioSpec(5.0, 2_000, 3, n_keys=300, interval_s=20.0))
    f = check_fidelity(w, ENGINE)
    assert not f.checked and "no destinations" in f.why
    partial = dataclasses.replace(recorded(n=2_000), recorded_dest=np.full(2_000, -1, np.int32))
    assert not check_fidelity(partial, ENGINE).checked


def _csv(w: Workload, path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["timestamp", "key", "prompt_tokens", "prefix_tokens", "output_tokens",
                      "destination", "cached_tokens", "e2e_ms"])
        assert w.recorded_dest is not None and w.measured_cached is not None
        assert w.measured_e2e_s is not None
        for i in range(len(w)):
            out.writerow([f"{w.t[i]:.6f}", w.keys[w.key[i]], w.prompt[i], w.prefix[i],
                          w.output[i], w.recorded_destinations[w.recorded_dest[i]],
                          w.measured_cached[i], f"{w.measured_e2e_s[i] * 1000:.3f}"])


def test_diagnose_refuses_a_trace_its_model_cannot_reproduce(tmp_path, capsys):
    path = tmp_path / "recorded.csv"
    _csv(recorded(), path)
    common = ["diagnose", "--trace", str(path), "--destinations", "4", "--engine", "70b"]
    assert replay_main([*common, "--cache-tokens", "20000"]) == 3  # a tenth of the engines'
    err = capsys.readouterr().err
    assert "refusing to answer" in err and "FAILED" in err and "hit rate" in err
    assert replay_main([*common, "--cache-tokens", "20000", "--no-fidelity-gate"]) == 0
    assert "affinity" in capsys.readouterr().out
    # the engines' own model: the gate passes and says so before the verdict
    assert replay_main([*common, "--cache-tokens", "200000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fidelity gate passed") and "affinity" in out
