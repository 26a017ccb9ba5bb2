"""Fixtures that start the real servers on loopback ephemeral ports.

Integration tests use these; pure unit tests need none of them. The servers are
started exactly as `cacheroute up` starts them (planner_svc.devstack.processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_svc.devstack.processes import (
    Broker,
    RedisServer,
    broker_kind,
    start_broker,
    start_redis,
)

# The CI tier runs on parallel workers (pytest-xdist, one test file per unit of work; see
# deploy/local/run.sh). Files are handed out in collection order, so the longest go first:
# started last, the 3-minute chaos test alone would set the run's length.
LONGEST_FIRST = (
    "tests/reliability/test_chaos.py",
    "tests/integration/test_demo_cli.py",
    "tests/integration/test_scaleout_streams.py",
    "tests/integration/test_scaleout_routers.py",
    "tests/integration/test_stream_crash.py",
    "tests/reliability/test_redis_kill.py",
    "tests/reliability/test_planner_kill.py",
    "tests/reliability/test_fanout.py",
    "tests/reliability/test_half_open.py",
    "tests/reliability/test_hardening.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=order)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def server_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def broker(server_workdir: Path) -> Iterator[Broker]:
    """One broker for the session (per xdist worker): Apache Kafka unless
    $CACHEROUTE_BROKER says otherwise (planner_svc.devstack.processes.broker_kind); use
    unique topic names."""
    # No fallback: a test tier that quietly ran on Tansu would say nothing about Kafka.
    b = start_broker(server_workdir, kind=broker_kind(fallback=False))
    yield b
    b.process.stop()


@pytest.fixture(scope="session")
def tansu_broker(server_workdir: Path) -> Iterator[Broker]:
    """The lighter embedded broker (Tansu, memory storage), for the smoke test that keeps
    the stream path working on it too."""
    b = start_broker(server_workdir, kind="tansu")
    yield b
    b.process.stop()


@pytest.fixture()
def redis_server(server_workdir: Path) -> Iterator[RedisServer]:
    """A fresh redis-server per test, so tests can kill and restart it freely."""
    r = start_redis(server_workdir)
    yield r
    r.process.stop()
