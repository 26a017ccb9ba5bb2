"""Every benchmark the docs cite runs to its figures: each `bench/*.py` that README.md or a
page of docs/ names, in its `--quick` form (its smallest documented form where it has none),
as its command line runs it, ends on one JSON object with its peak RSS.

A benchmark nothing runs breaks unnoticed (bench/fleet.py refused every window for weeks);
this is the slow tier's check that each still reaches its JSON line. Outputs that a script
writes by default into docs/results/ go to a temporary directory instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
OUT = "{out}"  # replaced by the test's temporary directory
# The form each benchmark runs in: `--quick` where it has one, else its smallest form.
FORMS: dict[str, tuple[str, ...]] = {
    "ablations.py": ("--policies", "flat,dualmap,affinity", "--loads", "40", "--seeds", "1",
                     "--requests", "3000", "--keys", "300", "--destinations", "4",
                     "--out", OUT, "--no-plots"),
    "arena.py": ("--quick", "--out", OUT),
    "arena_transient.py": ("--seeds", "1", "--scenarios", "paper-like", "--tail-slacks", "1"),
    "attacks.py": ("--attack-s", "1", "--baseline-s", "3", "--quiet-s", "1"),
    "brokers.py": ("--starts", "1", "--events", "20000"),
    "chaos.py": ("--minutes", "0.5", "--no-attacks"),
    "control_loop.py": ("--quick",),
    "epp.py": ("--quick",),
    "fleet.py": ("--quick",),
    "gateway.py": ("--quick",),
    "learning.py": ("--part", "sweep", "--seeds", "1", "--factors", "1", "--knobs", "q_cap",
                    "--out", OUT),
    "planning.py": ("--quick",),
    "pools.py": ("--quick",),
    "probe_sglang_p2c.py": ("--runs", "1", "--requests", "8"),
    "propagation.py": ("--quick",),
    "rehome_window.py": ("--requests", "30000"),
    "router.py": ("--quick",),
    "routers_live.py": ("--quick",),
    "sim_capacity_1r.py": ("--seeds", "1", "--scales", "6", "--measure-s", "30"),
    "sim_vs_arena.py": ("--arena-csv", "docs/results/arena/arena.csv"),
    "simulator.py": ("--quick",),
    "soak.py": ("--quick",),
    "streams.py": ("--quick",),
}
TIMEOUT_S = 1200


def cited_benchmarks() -> set[str]:
    """The `bench/NAME.py` scripts README.md and docs/*.md name."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {m for page in pages for m in re.findall(r"bench/(\w+\.py)", page.read_text())
            if (ROOT / "bench" / m).exists()}


def test_every_cited_benchmark_has_a_form_here() -> None:
    assert cited_benchmarks() <= set(FORMS), sorted(cited_benchmarks() - set(FORMS))


def last_json(stdout: str) -> dict[str, object]:
    """The benchmark's figures: its last line, one JSON object."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "no output"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict), lines[-1][:200]
    return figures


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("script", sorted(FORMS))
def test_the_benchmark_reaches_its_json_line(script: str, tmp_path: Path) -> None:
    argv = [a.replace(OUT, str(tmp_path)) for a in FORMS[script]]
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *argv],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    seconds = time.monotonic() - started
    print(f"{script} {' '.join(argv)}: exit {done.returncode} in {seconds:.0f} s")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    figures = last_json(done.stdout)
    assert isinstance(figures.get("peak_rss_mb"), (int, float)), sorted(figures)
    assert float(figures["peak_rss_mb"]) > 0  # type: ignore[arg-type]
