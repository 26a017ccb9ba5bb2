"""Which broker the local stack starts: Apache Kafka where it is installed, the embedded
Tansu where it is not (a pip install of the stack extra), never a silent fallback in the
tests, and whatever CACHEROUTE_BROKER names."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner_svc.devstack.processes import ServerStartError, broker_kind


def test_without_kafkas_jars_up_falls_back_to_the_embedded_broker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CACHEROUTE_BROKER", raising=False)
    monkeypatch.setenv("CACHEROUTE_KAFKA_LIB", str(tmp_path))  # no jars there
    assert broker_kind() == "tansu"
    assert broker_kind(fallback=False) == "kafka"  # the tests' fixture: no fallback
    monkeypatch.setenv("CACHEROUTE_BROKER", "kafka")
    assert broker_kind() == "kafka"  # asked for by name: no fallback either


def test_a_named_broker_is_taken_and_a_bad_name_is_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEROUTE_BROKER", "tansu")
    assert broker_kind() == "tansu"
    monkeypatch.setenv("CACHEROUTE_BROKER", "rabbit")
    with pytest.raises(ServerStartError, match="use one of kafka, tansu"):
        broker_kind()
