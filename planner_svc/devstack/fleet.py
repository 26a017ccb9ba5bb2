"""The demo's synthetic engine fleet, in real time, routed two ways side by side.

One request stream (paper-like skewed key rates, drifting by a lognormal random walk)
is served twice, by two identical fleets of engines (`planner_svc.simulator.replica`, the
content-level model the simulator and the emulated engines use):
- the *planned* fleet, routed by a real `router_client.RouterClient` that follows the
  planner's plan in Redis; its router emits request events and its engines emit
  cache-hit events to Kafka, which is what the stream and the planner learn from;
- the *Flat-LB* fleet, routed by power-of-two-choices (the same `RouterCore` with no
  plan), as the baseline of the same traffic.
Both fleets see exactly the same requests at the same times, so their hit rates compare.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates
from planner_svc.simulator.replica import Replica, ReplicaModel


@dataclass(frozen=True)
class FleetOptions:
    keys: int = 3000
    total_rate: float = 300.0  # requests/s offered to each fleet
    mean_prefix_tokens: float = 1500.0
    new_tokens: int = 200  # per request, on top of the reusable prefix
    output_tokens: int = 64
    cache_capacity_tokens: int = 250_000
    drift_every_s: float = 20.0
    drift_sigma: float = 0.3
    # A popularity shift (a tenant onboarding, a time-of-day change): at `shift_at_s` the
    # hottest keys carrying `shift_share` of the traffic trade rates with cold keys.
    shift_at_s: float = 0.0
    shift_share: float = 0.5
    seed: int = 7
    # The demo's engines are fast (small prefill cost) so the two fleets differ by cache
    # behaviour, not by queueing; the simulator is where latency is studied.
    prefill_s_per_token: float = 2e-6
    decode_s_per_token: float = 2e-4


@dataclass
class Tally:
    """Counters of one fleet over a reporting period."""

    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    requests: int = 0
    per_destination: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def imbalance(self) -> float:
        counts = list(self.per_destination.values())
        mean = sum(counts) / len(counts) if counts else 0.0
        return max(counts) / mean if mean else 1.0

    def count(self, dest: str, prompt: int, cached: int) -> None:
        """One request served by `dest`."""
        self.requests += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.per_destination[dest] = self.per_destination.get(dest, 0) + 1

    def add(self, other: Tally) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.requests += other.requests
        for d, n in other.per_destination.items():
            self.per_destination[d] = self.per_destination.get(d, 0) + n


Router = Callable[[str], str]


@dataclass
class ModelFleet:
    """R engines of the replica model (in process, no HTTP) behind one router: the demo's
    fleet. `serve` dispatches, `complete` retires finished work. (The HTTP engines are
    `devstack.engines.EngineFleet`.)"""

    name: str
    engines: dict[str, Replica]
    route: Router
    started: Callable[[str], None]
    finished: Callable[[str], None]
    on_dispatch: Callable[[str, str, int, int], object] | None = None
    on_complete: Callable[[str, str, int, int, int, float], object] | None = None
    tally: Tally = field(default_factory=Tally)
    _pending: list[tuple[float, int, str, str, int, int, float]] = field(default_factory=list)
    _n: int = 0

    def serve(self, key: str, prefix: int, prompt: int, output: int, now: float) -> None:
        dest = self.route(key)
        self.started(dest)
        cached, finish = admit_stream(self.engines[dest], key, prompt, prefix, output, now)
        if self.on_dispatch is not None:
            self.on_dispatch(key, dest, prompt, prefix)
        self._n += 1
        heapq.heappush(self._pending, (finish, self._n, key, dest, prompt, cached, now))
        self.tally.count(dest, prompt, cached)

    def complete(self, now: float, output: int) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            finish, _, key, dest, prompt, cached, start = heapq.heappop(pending)
            self.finished(dest)
            if self.on_complete is not None:
                self.on_complete(key, dest, prompt, cached, output, (finish - start) * 1000.0)

    def take_tally(self) -> Tally:
        t, self.tally = self.tally, Tally(per_destination=dict.fromkeys(self.engines, 0))
        return t


def make_engines(ids: list[str], options: FleetOptions) -> dict[str, Replica]:
    model = ReplicaModel(
        kv_capacity_tokens=options.cache_capacity_tokens,
        prefill_s_per_token=options.prefill_s_per_token,
        decode_s_per_step=options.decode_s_per_token,
    )
    return {d: Replica(model) for d in ids}


def admit_stream(engine: Replica, key: str, prompt: int, prefix: int, output: int,
                 now: float) -> tuple[int, float]:
    """Admit a request whose key is one growing stream of content, of which it shares
    `prefix` tokens with earlier requests: (cached tokens, finish time)."""
    chain = [(hash(key), prompt // engine.model.block_tokens)]
    served = engine.admit(chain, prompt, output, now, reuse_limit_tokens=prefix)
    return served.cached_tokens, served.finish_time


class Workload:
    """Paper-like key rates with per-key reusable prefixes; drifts every few seconds."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.rng = np.random.default_rng(options.seed)
        self.keys = paper_like_keys(options.keys)
        self.rates = paper_like_rates(options.keys, options.total_rate, seed=options.seed)
        sizes = self.rng.lognormal(np.log(options.mean_prefix_tokens), 0.5, options.keys)
        self.prefix = np.clip(sizes, 128, 8 * options.mean_prefix_tokens).astype(np.int64)
        self._queue: list[int] = []
        self._next_drift = options.drift_every_s
        self._shifted = options.shift_at_s <= 0

    def drift_if_due(self, elapsed_s: float) -> bool:
        if self.options.drift_every_s <= 0 or elapsed_s < self._next_drift:
            return False
        self._next_drift += self.options.drift_every_s
        walked = lognormal_walk(self.rates, self.options.drift_sigma, self.rng)
        self.rates = walked * (self.options.total_rate / walked.sum())
        self._queue.clear()
        return True

    def shift_if_due(self, elapsed_s: float) -> bool:
        if self._shifted or elapsed_s < self.options.shift_at_s:
            return False
        self._shifted = True
        order = np.argsort(-self.rates, kind="stable")
        share = np.cumsum(self.rates[order]) / self.rates.sum()
        n = int(np.searchsorted(share, self.options.shift_share)) + 1
        hot = order[:n]
        cold = self.rng.choice(order[2 * n :], size=n, replace=False)
        self.rates[hot], self.rates[cold] = self.rates[cold].copy(), self.rates[hot].copy()
        self._queue.clear()
        return True

    def arrivals(self, dt_s: float) -> list[int]:
        """Key indices of the requests arriving in the next `dt_s` seconds (Poisson)."""
        n = int(self.rng.poisson(self.options.total_rate * dt_s))
        if len(self._queue) < n:
            p = self.rates / self.rates.sum()
            self._queue.extend(self.rng.choice(len(p), size=max(n, 4096), p=p).tolist())
        out, self._queue = self._queue[:n], self._queue[n:]
        return out


def run_fleets(
    workload: Workload,
    fleets: list[ModelFleet],
    duration_s: float,
    report_every_s: float,
    report: Callable[[float, list[Tally]], None],
    tick_s: float = 0.01,
) -> list[Tally]:
    """Drive every fleet with the same arrivals for `duration_s` of wall time."""
    o = workload.options
    start = last = time.monotonic()
    next_report = report_every_s
    totals = [Tally() for _ in fleets]
    while (now := time.monotonic()) - start < duration_s:
        elapsed = now - start
        workload.drift_if_due(elapsed)
        if workload.shift_if_due(elapsed):
            print(
                f"{elapsed:5.0f}  -- popularity shift: the hottest keys carrying "
                f"{o.shift_share:.0%} of traffic swap rates with cold keys --",
                flush=True,
            )
        for i in workload.arrivals(now - last):
            prefix = int(workload.prefix[i])
            for fleet in fleets:
                fleet.serve(workload.keys[i], prefix, prefix + o.new_tokens, o.output_tokens, now)
        last = now
        for fleet in fleets:
            fleet.complete(now, o.output_tokens)
        if elapsed >= next_report:
            next_report += report_every_s
            period = [f.take_tally() for f in fleets]
            for total, t in zip(totals, period, strict=True):
                total.add(t)
            report(elapsed, period)
        time.sleep(tick_s)
    return totals
