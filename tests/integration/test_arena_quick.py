"""`bench/arena.py --quick` end to end (slow tier): CacheRoute's whole stack and the real
SGLang and vLLM routers in front of the same emulated engines, the same traffic, with the
results files and the last-line JSON the arena issue asks for."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner_svc.devstack.routers import RouterSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("cacheroute_hit_1r", "cacheroute_hit_4r", "best_peer_hit_1r", "best_peer_hit_4r",
        "capacity_ratio_vs_best_peer", "peer_versions", "peak_rss_mb")


def test_quick_arena_measures_every_router_on_the_same_traffic(tmp_path: Path) -> None:
    if not RouterSpec("sglang cache_aware", "sglang", "cache_aware").installed:
        pytest.skip("the peer routers are not installed: pip install -e '.[arena]'")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "arena.py"), "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(summary), summary
    assert summary["peer_versions"].get("sglang-router"), summary
    for name in ("cacheroute_hit_1r", "cacheroute_hit_4r", "best_peer_hit_1r"):
        assert 0.0 < summary[name] <= 1.0, summary
    rows = list(csv.DictReader((tmp_path / "arena-quick.csv").open()))
    assert {r["router"] for r in rows} >= {"cacheroute", "sglang cache_aware"}
    assert all(int(r["requests"]) > 0 and int(r["errors"]) == 0 for r in rows), rows
    # every router was offered the same conversations: the request counts differ only by
    # how fast each served them (closed loop), not by an order of magnitude
    counts = [int(r["requests"]) for r in rows]
    assert max(counts) < 2 * min(counts), rows
    md = (tmp_path / "arena-quick.md").read_text()
    assert "Did CacheRoute's plan deliver" in md, md
    assert (tmp_path / "arena-hit-quick.png").exists()


GRID_KEYS = ("cells", "cells_within_1pp_1r", "cells_ahead_4r", "cells_ahead_8r",
             "worst_cell_hit_delta_1r_pp", "worst_cell_p99_ratio_1r", "peer_versions",
             "peak_rss_mb")


def test_quick_grid_measures_one_cell_at_one_four_and_eight_gateways(tmp_path: Path) -> None:
    """`--grid --quick`: the grid's first cell, CacheRoute and smg at 1, 4 and 8 gateways
    and vllm-router at 1 (~4 minutes), its files and the JSON the issue asks for."""
    if not RouterSpec("smg cache_aware", "smg", "cache_aware").installed:
        pytest.skip("smg is not installed: python3 -m venv .venv-peers/smg && "
                    ".venv-peers/smg/bin/pip install smg")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "arena.py"), "--grid", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(GRID_KEYS) <= set(summary), summary
    assert summary["cells"] == 1 and summary["peer_versions"]["smg"] != "not installed"
    rows = list(csv.DictReader((tmp_path / "grid-live.csv").open()))
    assert {(r["router"], r["replicas"]) for r in rows} >= {
        ("cacheroute", "1"), ("cacheroute", "4"), ("cacheroute", "8"),
        ("smg cache_aware", "1"), ("smg cache_aware", "4"), ("smg cache_aware", "8")}
    assert all(int(r["requests"]) > 0 and int(r["errors"]) == 0 for r in rows), rows
    assert (tmp_path / "grid-live-heatmap.png").exists()
    assert "best peer" in (tmp_path / "grid-live.md").read_text()
