"""A planner in its own process, for crash tests with failpoints.

    CACHEROUTE_FAILPOINTS="publish.after_redis=kill" \
      python -m tests.faults.planner_proc --redis-url URL --data-dir DIR \
        --bootstrap HOST:PORT --state-topic TOPIC publish --seed 3

`publish`: build the real service (durable history in Kafka, resume from Redis and
the history exactly as `python -m planner_svc` does), feed one window of rates,
force one install, print the installed version and exit. A `kill` failpoint ends
the process with SIGKILL at that step instead. `serve`: run the service (timer:
republish + control steps) until SIGTERM, printing `PORT <grpc port>`; with
`--leader-lease-s` it is one of several replicas electing a leader, fed one window of
rates first (so whichever leads can plan).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from planner_svc.server import build_service
from planner_svc.settings import PlannerSettings
from tests.service.harness import DESTS, feed


def _settings(args: argparse.Namespace) -> PlannerSettings:
    return PlannerSettings(
        bootstrap=args.bootstrap,
        state_topic=args.state_topic,
        redis_url=args.redis_url,
        grpc_port=0,
        data_dir=str(Path(args.data_dir)),
        destinations=DESTS,
        q_cap=20.0,
        warm_slots_per_destination=8,
        interval_s=args.interval_s,
        leader_lease_s=args.leader_lease_s,
        leader_id=args.leader_id,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.faults.planner_proc")
    for flag in ("--redis-url", "--data-dir", "--bootstrap", "--state-topic"):
        p.add_argument(flag, required=True)
    p.add_argument("--interval-s", type=float, default=1.0)
    p.add_argument("--leader-lease-s", type=float, default=0.0)
    p.add_argument("--leader-id", default="")
    p.add_argument("mode", choices=("publish", "serve"))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    svc = build_service(_settings(args), consume=False, durable=True)
    if args.mode == "publish":
        feed(svc, seed=args.seed)
        result = svc.planner.replan(fresh=True, force=True, dry_run=False)
        assert result.installed is not None
        print(result.installed.plan.version, flush=True)
        svc.stop(0)
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.leader_lease_s > 0:
        feed(svc, seed=args.seed)  # rates of its own: a replica that takes over can plan
    svc.start()
    print(f"PORT {svc.port}", flush=True)
    stop.wait()
    svc.stop(0)


if __name__ == "__main__":
    main()
