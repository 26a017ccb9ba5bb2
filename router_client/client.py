"""The thread-based router client: a daemon thread follows the plan; `route` never waits.

    client = RouterClient(RedisPlanSource(url), router_id="edge-1", public_keys=keys,
                          cache_path="/var/lib/edge/plan.bin")
    client.start()
    with client.request(key) as destination:
        forward(destination)

The follower thread: subscribe, read the pointer, fetch and verify what is
newer, swap; then wait for a hint or the re-check period (1 s). When the source
is unreachable it keeps the last good plan, retries after a jittered backoff
capped at 250 ms, and past `max_plan_age_s` without confirmation routes
everything by power-of-two-choices.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from router_client.client_base import BaseRouterClient, log
from router_client.follow import MAX_DELTA_CHAIN, Ask, Backoff, Want, sync_round
from router_client.layout import Pointer
from router_client.plan import Version
from router_client.probe import http_probe
from router_client.source import PlanSource, SourceUnavailable

MAX_PROBE_THREADS = 16

WAIT_SLICE_S = 0.25


class RouterClient(BaseRouterClient):
    """Routes with the newest verified plan from `source`; see the module docstring."""

    def __init__(
        self,
        source: PlanSource,
        *,
        router_id: str,
        prober: Callable[[str, str, float], bool] = http_probe,
        **options: Any,
    ) -> None:
        super().__init__(router_id=router_id, **options)
        self.source = source
        self._stop = threading.Event()
        self._applied = threading.Condition()
        self._thread: threading.Thread | None = None
        self._probe_thread: threading.Thread | None = None
        self._prober = prober
        self._backoff = Backoff()

    def start(self, initial_wait_s: float = 0.0) -> RouterClient:
        """Serve the saved plan (if any) at once, follow the source in a thread.

        With `initial_wait_s`, wait up to that long for a first plan from the source.
        """
        self.restore_from_disk()
        self._thread = threading.Thread(
            target=self._follow, name=f"router-client-{self.router_id}", daemon=True
        )
        self._thread.start()
        if self.probe is not None:
            self._probe_thread = threading.Thread(
                target=self._probe_loop, name=f"router-probe-{self.router_id}", daemon=True)
            self._probe_thread.start()
        if initial_wait_s > 0:
            self.wait_for_version(Version(0, 1), initial_wait_s)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for thread in (self._thread, self._probe_thread):
            if thread is not None:
                thread.join(timeout_s)
        self.source.close()

    def __enter__(self) -> RouterClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for_version(self, version: Version, timeout_s: float) -> bool:
        """Block until a version >= `version` is applied; False on timeout."""
        with self._applied:
            return self._applied.wait_for(lambda: self.version >= version, timeout_s)

    def _after_install(self) -> None:
        with self._applied:
            self._applied.notify_all()

    def _reconnects(self) -> int:
        return self.source.reconnects

    # --- the follower thread -----------------------------------------------------------

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
                self._housekeeping()
                self._backoff.reset()
                self._wait_for_change()
            except SourceUnavailable:
                self.unavailable_rounds += 1
                self.check_age()
                self._stop.wait(self._backoff.next_delay())
            except Exception:  # a bug must not stop plan following; routing goes on
                log.exception("router %s: plan-following round failed", self.router_id)
                self.failed_rounds += 1
                self.check_age()
                self._stop.wait(self._backoff.next_delay())

    def _wait_for_change(self) -> None:
        # In short slices, so that stop() never waits a whole re-check period.
        deadline = time.monotonic() + self.recheck_s
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            hint = self.source.wait_for_change(min(remaining, WAIT_SLICE_S))
            # After the first slice: off the fleet's apply burst.
            self._off_burst_work()
            self._health_tick()
            now = time.monotonic()
            if self._status_due(now):
                self._note_peers(self.source.report(self._status(now)))
            if hint is not None:
                self.follower.note_hint(hint)
                return

    def _round(self) -> None:
        self._start_round()
        rnd = sync_round(self.follower)
        try:
            want = next(rnd)
            while True:
                want = rnd.send(self._remember_fetched(want, self._ask(want)))
        except StopIteration as done:
            self._finish_round(done.value)

    def _ask(self, want: Want) -> Pointer | bytes | list[bytes] | None:
        if want.ask is Ask.CURRENT:
            return self.source.current()
        assert want.version is not None
        if want.ask is Ask.DELTAS:
            assert want.after is not None
            return self.source.fetch_deltas(want.after, want.version, MAX_DELTA_CHAIN)
        return self.source.fetch_plan(want.version)

    def _housekeeping(self) -> None:
        # Save first: the calls below fail when the source just went away, and the disk
        # copy must not lag the applied plan for the whole outage.
        self._save_chain()
        if self._chain_too_long():
            self._restart_chain(self.source.fetch_plan(self.version))
            self._save_chain()

    # --- active probes ------------------------------------------------------------------

    def _probe_loop(self) -> None:
        assert self.probe is not None
        settings = self.probe
        with ThreadPoolExecutor(MAX_PROBE_THREADS, thread_name_prefix="probe") as pool:
            while not self._stop.wait(settings.period_s):
                targets = self.probe_targets()
                verdicts = pool.map(
                    lambda t: self._prober(t[1], settings.path, settings.timeout_s), targets)
                for (dest, _address), ok in zip(targets, verdicts, strict=True):
                    self.report_probe(dest, ok)
