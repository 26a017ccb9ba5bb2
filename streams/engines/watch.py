"""`python -m streams engines`: watch engines' own signals and publish them for the planner.

    python -m streams engines --bootstrap kafka:9092 \\
        --metrics e0=http://10.0.0.5:8000,e1=http://10.0.0.6:8000 \\
        --kv e0=tcp://10.0.0.5:5557/10.0.0.5:5558,e1=tcp://10.0.0.6:5557

For each destination: its KV-cache events over ZMQ (`--kv id=PUB endpoint[/replay
endpoint]`, vLLM's `--kv-events-config`), and its `/metrics` page (`--metrics id=base
URL`, vLLM or SGLang), scraped every `--period-s`. Every period one `EngineSignals` per
destination goes to `--topic` (default `cacheroute.engine-signals`), keyed by destination;
the planner shows the newest in `cacheroute status`. Destination ids are the planner's.
A scrape that fails is reported in the message (`metrics_error`) and tried again next
period; a KV stream with gaps is replayed or rebuilt (streams.engines.kv_bridge).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable

from cacheroute.engine_metrics import (
    EngineLoad,
    EngineMetrics,
    MetricsError,
    load_between,
    parse_engine_metrics,
)
from streams.engines.kv_bridge import KvEventSubscriber
from streams.engines.signals import engine_signals

log = logging.getLogger("cacheroute.engines")
MAX_METRICS_BYTES = 8 << 20


def _pairs(text: str, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        ident, eq, value = item.partition("=")
        if not eq or not ident or not value:
            raise SystemExit(f"{flag} {item!r}: expected id=value")
        out[ident] = value
    return out


def kv_endpoints(spec: str) -> tuple[str, str | None]:
    """`tcp://host:5557[/[tcp://]host:5558]` -> (PUB endpoint, replay endpoint or None)."""
    scheme, sep, rest = spec.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise SystemExit(f"--kv {spec!r}: expected tcp://host:port[/host:port]")
    pub, slash, replay = rest.partition("/")
    if not slash:
        return f"{scheme}://{pub}", None
    replay = replay if "://" in replay else f"{scheme}://{replay}"
    return f"{scheme}://{pub}", replay


class MetricsScraper:
    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.timeout_s = timeout_s
        self.last: tuple[float, EngineMetrics] | None = None
        self.error = ""

    def scrape(self) -> tuple[str, EngineLoad | None]:
        """(engine kind, EngineLoad over the time since the previous scrape, or None)."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                text = resp.read(MAX_METRICS_BYTES + 1).decode("utf-8", "replace")
            current = parse_engine_metrics(text)
        except (OSError, MetricsError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return "", None
        self.error = ""
        now = time.monotonic()
        previous, self.last = self.last, (now, current)
        if previous is None:
            return current.engine, None
        return current.engine, load_between(previous[1], current, max(1e-3, now - previous[0]))


class EngineWatch:
    """The watcher's loop: KV subscribers polled continuously, everything reported every
    period through `send(destination, payload)`."""

    def __init__(self, kv: dict[str, str], metrics: dict[str, str], period_s: float,
                 send: Callable[[str, bytes], None],
                 idle: Callable[[], object] = lambda: None) -> None:
        self.subs: dict[str, KvEventSubscriber] = {}
        for dest, spec in kv.items():
            endpoint, replay = kv_endpoints(spec)
            self.subs[dest] = KvEventSubscriber(dest, endpoint, replay)
        self.scrapers = {d: MetricsScraper(u) for d, u in metrics.items()}
        self.period_s = period_s
        self.send = send
        self.idle = idle  # called every turn of the loop (the producer's delivery reports)
        self.reports = 0

    def run(self, stop: threading.Event) -> None:
        next_report = time.monotonic() + self.period_s
        while not stop.is_set():
            for sub in self.subs.values():
                sub.poll(timeout_ms=0 if len(self.subs) > 1 else 20)
            if not self.subs:
                stop.wait(0.05)
            if time.monotonic() >= next_report:
                next_report += self.period_s
                self.report()
            self.idle()
        for sub in self.subs.values():
            sub.close()

    def report(self) -> None:
        now, wall_ms = time.monotonic(), int(time.time() * 1000)
        for dest in sorted(set(self.subs) | set(self.scrapers)):
            sub, scraper = self.subs.get(dest), self.scrapers.get(dest)
            engine, load = scraper.scrape() if scraper else ("", None)
            cache = sub.state.signals(now) if sub else None
            counts = ((sub.counters.gaps, sub.counters.resyncs,
                       sum(sub.counters.garbage.values())) if sub else (0, 0, 0))
            msg = engine_signals(dest, wall_ms, cache=cache, kv_counts=counts, engine=engine,
                                 load=load, metrics_error=scraper.error if scraper else "")
            self.send(dest, msg.SerializeToString())
        self.reports += 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m streams engines", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    env = os.environ.get
    p.add_argument("--bootstrap", default=env("CACHEROUTE_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--topic", default=env("CACHEROUTE_ENGINE_SIGNALS_TOPIC",
                                          "cacheroute.engine-signals"))
    p.add_argument("--kv", default="", help="id=tcp://host:pub_port[/host:replay_port],... "
                   "(vLLM's KV-event publisher and its replay socket)")
    p.add_argument("--metrics", default="", help="id=http://engine:port,... (/metrics pages)")
    p.add_argument("--period-s", type=float, default=1.0)
    args = p.parse_args(argv)
    kv, metrics = _pairs(args.kv, "--kv"), _pairs(args.metrics, "--metrics")
    if not kv and not metrics:
        raise SystemExit("python -m streams engines: give --kv and/or --metrics")
    if not args.period_s > 0:
        raise SystemExit("--period-s must be > 0")
    from streams.producer import RenewingProducer

    producer = RenewingProducer({"bootstrap.servers": args.bootstrap, "linger.ms": 20})
    watch = EngineWatch(kv, metrics, args.period_s,
                        lambda dest, value: producer.produce(args.topic, value, dest.encode()),
                        lambda: producer.poll(0))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"watching {len(set(kv) | set(metrics))} engines -> {args.topic}", flush=True)
    watch.run(stop)
    producer.flush(10.0)
    return 0
