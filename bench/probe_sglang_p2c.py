"""Does the SGLang model gateway's `power_of_two` route by the tokens its workers' `/get_load`
report? A direct probe, for the simulator's model of it (reactive.SGLangPowerOfTwo).

Two emulated engines on a very slow clock (time scale 200: a request runs for minutes), the
first holding a few long requests sent to it directly, the second idle; the gateway
(`smg launch --policy power_of_two`) starts, and after `--settle-s` (past its first load
poll) `--requests` requests go through it, one every 0.12 s. Each request's engine is read
from the engines' counters as it lands. Under the rule as the gateway's source states it
(the lower polled `num_tokens` of two distinct workers, held until the next poll every 5 s),
every request lands on the idle engine until a poll; under power of two on the gateway's own
in-flight counts, the two alternate.

    .venv/bin/python bench/probe_sglang_p2c.py --runs 2

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.devstack.engines import EngineFleet, start_engines  # noqa: E402
from planner_svc.devstack.routers import RouterSpec, start_routers  # noqa: E402

MODEL = "arena-model"


def _post(url: str, text: str, timeout_s: float) -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 50,
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    # the answer does not matter (and takes minutes): only where the request landed
    with contextlib.suppress(Exception):
        urllib.request.urlopen(req, timeout=timeout_s).read()


def _tokens(url: str) -> int:
    """What `/get_load` reports: the ranks' tokens (SGLang's shape) or `load` (vllm-router's)."""
    with urllib.request.urlopen(f"{url}/get_load", timeout=5) as r:
        answer = json.loads(r.read())
    if isinstance(answer, dict):
        return int(answer["load"])
    return sum(int(rank["num_tokens"]) for rank in answer)


def _send(url: str, text: str) -> None:
    threading.Thread(target=_post, args=(url, text, 30.0), daemon=True).start()


def probe(requests: int, hold: int, settle_s: float, load_shape: str = "sglang"
          ) -> tuple[str, int, int]:
    """One run: the engine each request landed on ("0": the loaded one, "1": the idle
    one), and the tokens each reported just before the gateway started."""
    work = Path(tempfile.mkdtemp(prefix="probe-p2c-"))
    fleet: EngineFleet = start_engines(work, 2, extra=["--time-scale", "200", "--model", MODEL,
                                                       "--faults", "--load-shape", load_shape])
    try:
        loaded, idle = fleet.urls["e0"], fleet.urls["e1"]
        for i in range(hold):
            _send(loaded, f"hold {i} " + "x " * 400)
        time.sleep(1.0)
        tokens = (_tokens(loaded), _tokens(idle))
        routers = start_routers(RouterSpec("probe", "sglang", "power_of_two"), 1,
                                dict(fleet.urls), work)
        try:
            time.sleep(settle_s)
            last = (fleet.load("e0"), fleet.load("e1"))
            seq = []
            for i in range(requests):
                _send(routers.urls[0], f"probe {i} " + "y " * 50)
                time.sleep(0.12)
                now = (fleet.load("e0"), fleet.load("e1"))
                seq.append("0" if now[0] > last[0] else "1" if now[1] > last[1] else "?")
                last = now
        finally:
            routers.stop()
        return "".join(seq), tokens[0], tokens[1]
    finally:
        fleet.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--hold", type=int, default=3, help="long requests held on engine 0")
    ap.add_argument("--load-shape", choices=("sglang", "vllm"), default="sglang",
                    help="the engines' /get_load answer: SGLang's per-rank list (num_tokens) "
                         "or vllm-router's {\"load\": running requests}")
    ap.add_argument("--settle-s", type=float, default=7.0,
                    help="wait after the gateway starts (its load monitor polls every 5 s)")
    args = ap.parse_args()
    if not RouterSpec("probe", "sglang", "power_of_two").installed:
        raise SystemExit("sglang-router is not installed: pip install -e '.[arena]'")
    rows = []
    print(f"{'run':>3} {'tokens loaded / idle':>21}  sequence (0 = the loaded engine)")
    for run in range(1, args.runs + 1):
        seq, t0, t1 = probe(args.requests, args.hold, args.settle_s, args.load_shape)
        rows.append(seq)
        print(f"{run:>3} {t0:>10} / {t1:<8}  {seq}")
    landed = "".join(rows)
    share = landed.count("0") / max(1, landed.count("0") + landed.count("1"))
    print(f"share of requests on the loaded engine: {share:.0%} (the polled-token rule: ~0 % "
          "until a poll; own in-flight counts: ~50 %)")
    print(json.dumps({"sequences": rows, "loaded_engine_share": round(share, 3),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           / 1024, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
