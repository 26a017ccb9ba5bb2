"""Every `bench/<name>.py` starts as its documented command runs it (`python bench/x.py`),
with bench/ first on the import path: there `bench/streams.py` shadows the `streams`
package, so a core module that imports `streams` broke `bench/simulator.py` while every
test that loads the scripts as modules passed. `--help` parses no more than the imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_bench_script_starts_from_its_command_line(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
