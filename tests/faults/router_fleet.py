"""Router clients in their own processes, each recording a `RouterHistory`.

    fleet = RouterFleet(redis_url, public_pem, processes=5, per_process=10).start()
    fleet.wait_ready(Version(1, 1), timeout_s=30)
    ...publish...
    histories = fleet.stop()

Each process runs `per_process` `RouterClient`s on real `RedisPlanSource`s (one
follower thread each, as in production) and one thread that keeps routing
through every client and samples the decisions. Processes are spawned (not
forked) so no lock of the test process leaks into them.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from typing import Any

from tests.faults.history import RouterHistory

SAMPLES_PER_ROUTER = 3000


def _serve(
    url: str, public_pem: bytes, ids: list[str], n_keys: int, options: dict[str, Any],
    ready: Any, stop: Any, out: Any,
) -> None:  # fmt: skip
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from router_client import RouterClient
    from router_client.redis_source import RedisPlanSource

    key = load_pem_public_key(public_pem)
    histories = {rid: RouterHistory(rid) for rid in ids}
    clients = [
        RouterClient(
            RedisPlanSource(url), router_id=rid, public_keys=[key],
            on_applied=histories[rid].on_applied, **options,
        ).start(initial_wait_s=10)
        for rid in ids
    ]  # fmt: skip
    sampler = threading.Thread(target=_sample, args=(clients, histories, n_keys, stop))
    sampler.start()
    ready.put([(c.router_id, str(c.version)) for c in clients])
    stop.wait()
    sampler.join()
    for c in clients:
        c._stop.set()
    for c in clients:
        c.stop()
    out.put([h.to_dict() for h in histories.values()])


def _sample(clients: list[Any], histories: dict[str, RouterHistory], n_keys: int, stop: Any):  # type: ignore[no-untyped-def]
    n = 0
    while not stop.is_set():
        for c in clients:
            h = histories[c.router_id]
            if c.table is not None and len(h.decisions) < SAMPLES_PER_ROUTER:
                h.route(c, f"k{n % (n_keys + 3):08d}")
        n += 1
        time.sleep(0.005)


class RouterFleet:
    def __init__(
        self,
        url: str,
        public_pem: bytes,
        *,
        processes: int,
        per_process: int,
        n_keys: int,
        **client_options: Any,
    ) -> None:
        self._ctx = mp.get_context("spawn")
        self._stop = self._ctx.Event()
        self._ready: Any = self._ctx.Queue()
        self._out: Any = self._ctx.Queue()
        self._procs = [
            self._ctx.Process(
                target=_serve,
                args=(
                    url, public_pem, [f"r{p:02d}-{i:02d}" for i in range(per_process)], n_keys,
                    client_options, self._ready, self._stop, self._out,
                ),
                daemon=True,
            )
            for p in range(processes)
        ]  # fmt: skip

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def start(self, timeout_s: float = 60.0) -> RouterFleet:
        for p in self._procs:
            p.start()
        for _ in self._procs:
            self._ready.get(timeout=timeout_s)
        return self

    def stop(self, timeout_s: float = 60.0) -> list[RouterHistory]:
        self._stop.set()
        histories: list[RouterHistory] = []
        try:
            for _ in self._procs:
                histories += [RouterHistory.from_dict(d) for d in self._out.get(timeout=timeout_s)]
        except queue.Empty:
            pass
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        return histories
