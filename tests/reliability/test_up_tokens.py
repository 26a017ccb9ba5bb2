"""`cacheroute up` with gRPC tokens set (issue 55, defect 9)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_demo_cli import start_up

pytestmark = pytest.mark.integration


def test_up_starts_with_a_reader_token(tmp_path: Path) -> None:
    """Its readiness probe sent no token, so with one set `up` never started ("the planner
    did not answer in 30 s"; issue 55, defect 9)."""
    proc, lines = start_up(tmp_path, "--reader-token", "r-secret", "--operator-token", "o")
    try:
        assert any("planner gRPC" in ln for ln in lines), "".join(lines)
        assert not any("Traceback" in ln for ln in lines)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
