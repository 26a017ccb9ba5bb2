"""No control sequence from data reaches an operator's terminal (issue 55, defect 16).

A model, router id or rejection reason carrying ESC, OSC or BEL was printed raw by the
CLI. Every command's output now passes through planner_svc.cli.terminal."""

from __future__ import annotations

import io
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheroute.v1 import plan_pb2 as pb
from planner_svc.cli.terminal import TerminalSafe, escape_controls
from router_client.redis_source import RedisPlanSource
from tests.integration.test_cli_ops import cli, cli_json, service  # noqa: F401 (fixture)
from tests.service.harness import READER

HOSTILE = "\x1b]0;owned\x07\x1b]52;c;b3duZWQ=\x07\x1b[2J\x1b[1A\x9b31m\x00\x7f"


def _controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f}


@given(st.text())
def test_escaped_text_has_no_control_characters(text: str) -> None:
    out = escape_controls(text)
    assert not _controls(out)
    assert out.replace("\\x", "") .count("\n") == text.count("\n")


def test_colour_survives_on_a_terminal_and_nothing_else_does() -> None:
    out = escape_controls("\x1b[1mbold\x1b[0m" + HOSTILE, keep_sgr=True)
    assert out.startswith("\x1b[1mbold\x1b[0m")
    assert _controls(out[len("\x1b[1mbold\x1b[0m"):]) == set()
    assert "\\x1b]0;owned\\x07" in out and "\\x9b" in out


def test_a_stream_that_is_not_a_terminal_gets_no_escape_at_all() -> None:
    raw = io.StringIO()
    TerminalSafe(raw).write("\x1b[31mred\x1b[0m\n")
    assert raw.getvalue() == "\\x1b[31mred\\x1b[0m\n"


@pytest.mark.integration
def test_a_hostile_rejection_reason_is_printed_escaped(service, redis_server) -> None:  # noqa: F811
    """A router's status (its own Redis key, so any router credential) with control
    sequences in its rejection reason and mode, shown by `cacheroute routers`."""
    source = RedisPlanSource(redis_server.url)
    try:
        source.report(pb.RouterStatus(
            router_id="edge-1", reported_at_ms=int(time.time() * 1000), mode="planned",
            last_rejection=HOSTILE, last_rejected=pb.PlanVersion(epoch=1, seq=1)))
        listed = cli_json(service, "routers", token=READER)["routers"]
        assert [r["router_id"] for r in listed] == ["edge-1"]
        rc, out, err = cli(service, "routers", token=READER)
        assert rc == 0, err
        assert "edge-1" in out and "\\x1b]0;owned\\x07" in out
        assert not _controls(out + err)
    finally:
        source.close()
