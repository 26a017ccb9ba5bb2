"""Fan-out of planner events to watchers, and the request-id cache of retried mutations."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator
from typing import Any


class Broadcast:
    """Each watcher has its own bounded queue; a slow one misses events, never stalls us."""

    def __init__(self, queue_size: int = 1000) -> None:
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[tuple[str, Any]]] = []
        self._size = queue_size
        self._closed = threading.Event()

    def close(self) -> None:
        """End every watch (their streams finish within `poll_s`): the source is gone."""
        self._closed.set()

    @property
    def watchers(self) -> int:
        """How many watchers are subscribed now."""
        with self._lock:
            return len(self._queues)

    def publish(self, kind: str, payload: Any) -> None:
        with self._lock:
            queues = list(self._queues)
        for q in queues:
            with contextlib.suppress(queue.Full):
                q.put_nowait((kind, payload))

    def watch(
        self, active: Callable[[], bool] = lambda: True, poll_s: float = 0.5
    ) -> Generator[tuple[str, Any], None, None]:
        """Yield (kind, payload) while `active()`; polling it every `poll_s` lets a departed
        watcher free its thread promptly."""
        q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=self._size)
        with self._lock:
            self._queues.append(q)
        try:
            while active() and not self._closed.is_set():
                try:
                    yield q.get(timeout=poll_s)
                except queue.Empty:
                    continue
        finally:
            with self._lock:
                self._queues.remove(q)


class RequestCache:
    """(kind, request id) -> result of the first call, bounded (the oldest are forgotten).

    Keyed by the kind of call too: the same request id sent to two different mutations
    is two requests (a Replan's result is no answer to a Rollback)."""

    def __init__(self, limit: int = 1000) -> None:
        self._results: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._limit = limit

    def get(self, kind: str, request_id: str) -> Any:
        return self._results.get((kind, request_id)) if request_id else None

    def remember(self, kind: str, request_id: str, result: Any) -> Any:
        if request_id:
            self._results[(kind, request_id)] = result
            while len(self._results) > self._limit:
                self._results.popitem(last=False)
        return result
