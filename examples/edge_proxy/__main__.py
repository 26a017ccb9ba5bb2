"""Run the edge proxy:

    python -m examples.edge_proxy --redis-url redis://127.0.0.1:6379/0 \\
        --public-key planner.pub --backend d0=http://10.0.0.1:8000 --backend d1=... \\
        [--kafka-bootstrap 127.0.0.1:9092 --topic cacheroute.events] [--listen 0.0.0.0:8080]
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from examples.edge_proxy.proxy import EdgeProxy, EventSink
from router_client import RouterClient, signing
from router_client.redis_source import RedisPlanSource


def main() -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible edge proxy routed by CacheRoute")
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--namespace", default="cacheroute")
    ap.add_argument("--public-key", action="append", required=True, help="pinned planner key")
    ap.add_argument("--backend", action="append", default=[], help="ID=URL (else plan address)")
    ap.add_argument("--listen", default="127.0.0.1:8080")
    ap.add_argument("--router-id", default="edge-proxy")
    ap.add_argument("--cache-path", default=None)
    ap.add_argument("--max-plan-age-s", type=float, default=300.0)
    ap.add_argument("--kafka-bootstrap", default=None)
    ap.add_argument("--topic", default="cacheroute.events")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)

    keys = signing.pin(signing.load_public_key(p) for p in args.public_key)
    backends = dict(b.split("=", 1) for b in args.backend)
    client = RouterClient(
        RedisPlanSource(args.redis_url, namespace=args.namespace),
        router_id=args.router_id,
        public_keys=keys,
        cache_path=args.cache_path,
        max_plan_age_s=args.max_plan_age_s,
        destination_ids=list(backends),
    ).start(initial_wait_s=2.0)
    sink: EventSink | None = None
    if args.kafka_bootstrap:
        from streams.emitter import EventEmitter

        sink = EventEmitter(args.kafka_bootstrap, args.topic, producer_id=args.router_id)
    host, port = args.listen.rsplit(":", 1)
    proxy = EdgeProxy(client, backends, sink=sink, listen=(host, int(port))).start()
    logging.info("edge proxy on %s, plan %s (%s)", proxy.url, client.version, client.mode)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    proxy.stop()
    client.stop()
    if sink is not None:
        sink.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
