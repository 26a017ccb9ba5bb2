"""Fixtures that start the real servers on loopback ephemeral ports.

Integration tests use these; pure unit tests need none of them. The servers are
started exactly as `cacheroute up` starts them (planner_svc.devstack.processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_svc.devstack.processes import Broker, RedisServer, start_broker, start_redis


@pytest.fixture(scope="session")
def server_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def broker(server_workdir: Path) -> Iterator[Broker]:
    """One Tansu broker for the session (memory storage); use unique topic names."""
    b = start_broker(server_workdir)
    yield b
    b.process.stop()


@pytest.fixture()
def redis_server(server_workdir: Path) -> Iterator[RedisServer]:
    """A fresh redis-server per test, so tests can kill and restart it freely."""
    r = start_redis(server_workdir)
    yield r
    r.process.stop()
