"""Waiting for asynchronous outcomes in tests, and stopping routers together."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


def eventually(cond: Callable[[], bool], timeout_s: float = 5.0, poll_s: float = 0.02) -> bool:
    """Whether `cond()` held within `timeout_s` (polled every `poll_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(poll_s)
    return cond()


def stop_routers(clients: Iterable[Any]) -> None:
    """Stop router clients: signal all first, so their waits end together."""
    clients = list(clients)
    for c in clients:
        c._stop.set()
    for c in clients:
        c.stop()
