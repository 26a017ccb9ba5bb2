"""A planner service in-process and the load around it, for the fault tests.

- `planner_service`: the real service (`build_service`, consume=False) on a
  Redis URL, its gRPC server on port 0, its timer running (republish + tick);
- `feed`: complete rate windows straight into the planner;
- `InstallLog`: every install the planner announces (its watch stream);
- `Replanner`: operator replans at a fixed pace (the publication load);
- `RoutingLoad`: threads that route through router clients without pause,
  sample decisions into histories and note any error or stall.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner_svc.server import PlannerService, build_service
from router_client import RouterClient, signing
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from tests.faults.history import RouterHistory
from tests.service.harness import feed, planner_settings

N_KEYS = 400


def planner_service(redis_url: str, data_dir: Path, **overrides: Any) -> PlannerService:
    """The shared in-process planner, with its timer running (republish + tick)."""
    options = {"interval_s": 2.0, "retain_versions": 200, **overrides}
    svc = build_service(planner_settings(redis_url, data_dir, **options), consume=False)
    svc.start()
    return svc


def public_key(svc: PlannerService) -> Any:
    path = Path(svc.settings.data_dir) / "planner-signing-key.pem"
    return signing.load_private_key(path).public_key()


class InstallLog:
    """Collects (version -> digest, publish time) from the planner's watch stream."""

    def __init__(self, svc: PlannerService) -> None:
        self.published: dict[Version, bytes] = {}
        self.published_at: dict[Version, float] = {}
        self._active = True
        self._thread = threading.Thread(target=self._run, args=(svc,), daemon=True)
        self._thread.start()
        time.sleep(0.1)  # subscribed before the caller installs anything

    def _run(self, svc: PlannerService) -> None:
        for kind, info in svc.planner.events.watch(lambda: self._active, poll_s=0.1):
            if kind == "installed":
                v = info["plan"].version
                self.published[v] = bytes(info["digest"])
                self.published_at.setdefault(v, time.time() * 1000)

    def close(self) -> None:
        self._active = False
        self._thread.join(2)

    @property
    def latest(self) -> Version:
        return max(self.published)


class Replanner:
    """Operator replans every `period_s` (forced, repacked); errors while Redis is
    down are counted, not raised."""

    def __init__(self, svc: PlannerService, period_s: float = 0.25) -> None:
        self.svc, self.period_s = svc, period_s
        self.ok = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Replanner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        seed = 2
        while not self._stop.wait(self.period_s):
            try:
                feed(self.svc, seed=seed)
                self.svc.planner.replan(fresh=False, force=True, dry_run=False)
                self.ok += 1
            except Exception:
                self.failed += 1
            seed += 1


def router(url: str, key: Any, rid: str, **options: Any) -> tuple[RouterClient, RouterHistory]:
    h = RouterHistory(rid)
    c = RouterClient(
        RedisPlanSource(url), router_id=rid, public_keys=[key], on_applied=h.on_applied, **options
    )
    return c.start(initial_wait_s=5), h


@dataclass
class RoutingLoad:
    """Routing threads, one per client; `errors` and `longest_gap_s` tell if it ever
    failed or stalled."""

    clients: list[RouterClient]
    histories: list[RouterHistory]
    errors: list[str] = field(default_factory=list)
    keys: list[str] | None = None  # default: the planner_service keys and some unadmitted
    longest_gap_s: float = 0.0
    calls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> RoutingLoad:
        for c, h in zip(self.clients, self.histories, strict=True):
            t = threading.Thread(target=self._run, args=(c, h), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _run(self, c: RouterClient, h: RouterHistory) -> None:
        n, last = 0, time.monotonic()
        keys = self.keys or [f"tenant-{i:08d}" for i in range(N_KEYS + 50)]
        while not self._stop.is_set():
            try:
                key = keys[n % len(keys)]
                if n % 50 == 0 and len(h.decisions) < 5000:
                    h.route(c, key)
                else:
                    c.route(key)
            except Exception as exc:  # routing must never fail
                self.errors.append(f"{c.router_id}: {exc!r}")
            now = time.monotonic()
            self.longest_gap_s = max(self.longest_gap_s, now - last)
            last, n = now, n + 1
            self.calls += 1
            if n % 20 == 0:
                time.sleep(0.001)
