"""The demo fleet against an existing stack (compose): `cacheroute demo` without starting one.

    python /opt/cacheroute/bin/demo_fleet.py --bootstrap kafka:9092 \
        --redis-url redis://:PASSWORD@redis:6379/0 --public-key /keys/planner-signing-key.pub.pem \
        --destinations 8 [--duration 3600] [--keys 3000] [--rate 300]

It runs the same synthetic fleet as `cacheroute demo` (planner_svc.cli.demo.run_demo): a
router following the planner's plan in Redis, engines emitting events to Kafka, and a
Flat-LB fleet on the same requests as the baseline. Destination ids are engine-00.. as in
the local stack, so the planner must be configured with the same list.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from planner_svc.cli.demo import print_summary, run_demo
from planner_svc.devstack.fleet import FleetOptions
from planner_svc.devstack.stack import StackOptions


@dataclass(frozen=True)
class ExistingStack:
    """What `run_demo` reads from a stack, pointed at servers someone else runs."""

    options: StackOptions
    bootstrap: str
    redis_url: str
    public_key_path: Path


def wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no planner public key at {path} after {timeout_s:.0f}s")
        time.sleep(1.0)


def main() -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", default=env("CACHEROUTE_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--redis-url", default=env("CACHEROUTE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--public-key", type=Path, required=True)
    p.add_argument("--events-topic", default=env("CACHEROUTE_EVENTS_TOPIC", "cacheroute.events"))
    p.add_argument("--destinations", type=int, default=8)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--keys", type=int, default=3000)
    p.add_argument("--rate", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    wait_for(args.public_key, 120.0)
    options = StackOptions(destinations=args.destinations, events_topic=args.events_topic)
    stack = ExistingStack(options, args.bootstrap, args.redis_url, args.public_key)
    fleet = FleetOptions(keys=args.keys, total_rate=args.rate, seed=args.seed)
    print_summary(run_demo(stack, fleet, args.duration))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
