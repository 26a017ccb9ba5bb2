"""The request path: CacheRoute's gateway against the SGLang model gateway and vllm-router.

Same run, same emulated engines, same load: four engines (planner_svc.devstack.engines at
time scale 0, so they answer at once and the figures are the routers'), each router in
turn in front of them, pinned to one core (`taskset -c 0`); the engines and the load
generator (`wrk`) share the other core. Measured per router:

- added latency at one connection: p50 / p99 through the router minus p50 / p99 straight
  to one engine (wrk, non-streamed chat completions);
- throughput at 1, 8 and 64 connections;
- streamed requests: time to the first event through the router minus straight, p50;
- the router's CPU seconds per 1,000 requests and peak RSS;
- the cost of tracing: CacheRoute's gateway a second time, with `--otlp-endpoint` pointed
  at an OTLP collector in this process (which counts the spans and drops them), its CPU per
  request next to tracing off's (the `tracing` extra; without it the row says so).

The engines' own ceiling (straight, 64 connections) is reported: no router can exceed it.
Peers run with their default policy (cache_aware) and with round_robin (their fastest),
bound to 127.0.0.1 with their metrics on loopback ports.

    .venv/bin/python bench/gateway.py [--quick]

Needs `wrk` (apt) and the peers (`pip install sglang-router vllm-router`); a missing
peer is reported, not faked. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.devstack.engines import EngineFleet, start_engines  # noqa: E402
from planner_svc.devstack.processes import ManagedProcess, free_port  # noqa: E402

ROUTER_CORE, LOAD_CORE = "0", "1"
TRACED = "cacheroute tracing on"
BODY = {"model": "m", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Summarise the quarterly report in two lines."}]}
LUA = ('wrk.method = "POST"\n'
       f"wrk.body = '{json.dumps(BODY)}'\n"
       'wrk.headers["Content-Type"] = "application/json"\n')


def wrk(url: str, connections: int, seconds: float, script: Path) -> dict[str, float]:
    """Requests/s and latency percentiles (ms) from wrk, pinned to the load core."""
    out = subprocess.run(
        ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s",
         "--latency", "-s", str(script), url + "/v1/chat/completions"],
        capture_output=True, text=True, timeout=seconds + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    pct = {p: _ms(v) for p, v in re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": pct.get("50", float("nan")),
            "p99_ms": pct.get("99", float("nan")),
            "non_2xx": float(errors.group(1)) if errors else 0.0}


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def stream_ttft_ms(url: str, n: int) -> tuple[float, float]:
    """p50 and p99 time to the first SSE event of n sequential streamed requests (raw
    HTTP/1.1, TCP_NODELAY as asyncio clients such as the openai SDK set it)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({**BODY, "stream": True, "max_tokens": 8}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    times: list[float] = []
    resets = 0
    while len(times) < n:
        try:  # a router may close a kept-alive connection: reconnect, measure on
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while len(times) < n:
                    times.append(_first_event_s(s, head + body))
        except ConnectionError:
            resets += 1
            if resets > 10:
                raise
    ms = sorted(t * 1000 for t in times)
    return statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]


def _first_event_s(s: socket.socket, request: bytes) -> float:
    """Send one streamed request on `s`; seconds to its first SSE event (reads it to the end)."""
    t0 = time.perf_counter()
    s.sendall(request)
    data = b""
    while b"data:" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed before the first event")
        data += chunk
    first = time.perf_counter() - t0
    while b"[DONE]" not in data or not data.endswith((b"0\r\n\r\n", b"[DONE]\n\n")):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return first


def wait_ready(url: str, path: str, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200 and (path != "/readiness" or b"ready" in r.read()):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


class SpanCounter:
    """An OTLP trace collector on a free loopback port that counts what it receives."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

        self.spans = 0
        counter = self

        class Servicer(pb_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # the gRPC method's name
                counter.spans += sum(len(ss.spans) for rs in request.resource_spans
                                     for ss in rs.scope_spans)
                return pb.ExportTraceServiceResponse()

        from concurrent import futures
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        pb_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.endpoint = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


def router_argv(kind: str, policy: str, port: int, metrics_port: int,
                fleet: EngineFleet, otlp_endpoint: str = "") -> tuple[list[str], str]:
    urls = list(fleet.urls.values())
    bindir = Path(sys.executable).parent
    if kind == "cacheroute":
        traced = ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else []
        return [str(bindir / "cacheroute"), "gateway", "--port", str(port),
                "--destinations", fleet.destinations(), "--probe-path", "", *traced], "/readyz"
    if kind == "sglang":
        return [str(bindir / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--worker-urls", *urls, "--policy", policy, "--log-level", "warn"], "/readiness"
    return [str(bindir / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-urls", *urls, "--policy", policy, "--worker-startup-check-interval", "1",
            "--log-level", "warning"], "/readiness"


def version_of(package: str) -> str:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:
        return "not installed"


def measure_router(name: str, kind: str, policy: str, fleet: EngineFleet, work: Path,
                   script: Path, seconds: float, ttft_n: int,
                   otlp_endpoint: str = "") -> dict[str, Any]:
    port, metrics_port = free_port(), free_port()
    argv, ready_path = router_argv(kind, policy, port, metrics_port, fleet, otlp_endpoint)
    if not Path(argv[0]).exists():
        return {"router": name, "error": f"{argv[0]} not installed"}
    proc = ManagedProcess(name, ["taskset", "-c", ROUTER_CORE, *argv], work / f"{name}.log")
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(url, ready_path):
            return {"router": name, "error": "did not become ready: " + proc.log_tail(5)}
        wrk(url, 8, 1.0, script)  # warm the connection pools
        row: dict[str, Any] = {"router": name}
        cpu0 = cpu_seconds(proc.pid)
        served = 0.0
        for c in (1, 8, 64):
            r = wrk(url, c, seconds, script)
            row[f"rps_c{c}"] = r["rps"]
            row[f"non_2xx_c{c}"] = r["non_2xx"]
            served += r["rps"] * seconds
            if c == 1:
                row["p50_ms"], row["p99_ms"] = r["p50_ms"], r["p99_ms"]
        row["cpu_s_per_1k"] = (cpu_seconds(proc.pid) - cpu0) / max(served, 1) * 1000
        row["served"] = served
        row["ttft_ms"], row["ttft_p99_ms"] = stream_ttft_ms(url, ttft_n)
        row["peak_rss_mb"] = proc.peak_rss_mb()
        return row
    finally:
        proc.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s per point instead of 6")
    ap.add_argument("--out", type=Path, default=None,
                    help="also write the JSON summary here (e.g. docs/results/gateway/"
                         "gateway.json, which bench/sim_vs_arena.py --transport reads)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("bench/gateway.py needs wrk: apt-get install wrk", file=sys.stderr)
        return 2
    seconds = 2.0 if args.quick else 6.0
    ttft_n = 100 if args.quick else 300
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    script = work / "post.lua"
    script.write_text(LUA)
    fleet = start_engines(work, 4, extra=["--time-scale", "0"], wrap=["taskset", "-c", LOAD_CORE])
    rows: list[dict[str, Any]] = []
    collector: SpanCounter | None = None
    try:
        collector = SpanCounter()
    except ImportError as exc:
        print(f"tracing on not measured: {exc} (pip install 'cacheroute[tracing]')",
              file=sys.stderr)
    try:
        engine = next(iter(fleet.urls.values()))
        wrk(engine, 8, 1.0, script)
        direct1, direct64 = wrk(engine, 1, seconds, script), wrk(engine, 64, seconds, script)
        direct_ttft, direct_ttft_p99 = stream_ttft_ms(engine, ttft_n)
        routers = [("cacheroute", "cacheroute", "plan"),
                   ("sglang cache_aware", "sglang", "cache_aware"),
                   ("sglang round_robin", "sglang", "round_robin"),
                   ("vllm-router cache_aware", "vllm", "cache_aware"),
                   ("vllm-router round_robin", "vllm", "round_robin")]
        routers.insert(1, (TRACED, "cacheroute", "plan"))
        for i, (name, kind, policy) in enumerate(routers, 1):
            print(f"[{i}/{len(routers)}] {name} ...", file=sys.stderr, flush=True)
            if name == TRACED and collector is None:
                rows.append({"router": name, "error": "the tracing extra is not installed"})
                continue
            endpoint = collector.endpoint if name == TRACED and collector is not None else ""
            rows.append(measure_router(name, kind, policy, fleet, work, script, seconds, ttft_n,
                                       endpoint))
            if name == TRACED and collector is not None:
                # its spans are exported at its SIGTERM at the latest (measure_router's end)
                rows[-1]["spans"] = collector.spans
    finally:
        fleet.stop()
        if collector is not None:
            collector.stop()

    print(f"engines straight: {direct64['rps']:,.0f} req/s at 64 connections (the ceiling); "
          f"p50 {direct1['p50_ms']:.3f} ms, p99 {direct1['p99_ms']:.3f} ms at 1; "
          f"stream first event {direct_ttft:.3f} ms")
    header = (f"{'router':26} {'added p50':>10} {'added p99':>10} {'req/s c1':>9} "
              f"{'c8':>8} {'c64':>8} {'TTFT +ms':>9} {'p99 +ms':>8} {'cpu s/1k':>9} {'RSS MB':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['router']:26} {r['error']}")
            continue
        r["added_p50_ms"] = r["p50_ms"] - direct1["p50_ms"]
        r["added_p99_ms"] = r["p99_ms"] - direct1["p99_ms"]
        r["ttft_added_ms"] = r["ttft_ms"] - direct_ttft
        r["ttft_added_p99_ms"] = r["ttft_p99_ms"] - direct_ttft_p99
        print(f"{r['router']:26} {r['added_p50_ms']:10.3f} {r['added_p99_ms']:10.3f} "
              f"{r['rps_c1']:9,.0f} {r['rps_c8']:8,.0f} {r['rps_c64']:8,.0f} "
              f"{r['ttft_added_ms']:9.3f} {r['ttft_added_p99_ms']:8.3f} {r['cpu_s_per_1k']:9.3f} "
              f"{r['peak_rss_mb']:7.1f}")
    ours = next(r for r in rows if r["router"] == "cacheroute")
    traced = next(r for r in rows if r["router"] == TRACED)
    peers = [r for r in rows if not r["router"].startswith("cacheroute") and "error" not in r]
    if "error" not in traced and "error" not in ours:
        print(f"tracing: CPU per request {ours['cpu_s_per_1k'] * 1000:.1f} us off, "
              f"{traced['cpu_s_per_1k'] * 1000:.1f} us on; {traced['spans']:,} spans exported "
              f"for {traced['served'] + ttft_n:,.0f} requests")
    best = max(peers, key=lambda r: r["rps_c64"]) if peers else None
    summary = {
        "engine_ceiling_requests_per_s_c64": round(direct64["rps"], 1),
        "added_p50_ms": round(ours.get("added_p50_ms", float("nan")), 3),
        "added_p99_ms": round(ours.get("added_p99_ms", float("nan")), 3),
        "requests_per_s_c1": round(ours.get("rps_c1", 0.0), 1),
        "requests_per_s_c8": round(ours.get("rps_c8", 0.0), 1),
        "requests_per_s_c64": round(ours.get("rps_c64", 0.0), 1),
        "stream_ttft_added_ms": round(ours.get("ttft_added_ms", float("nan")), 3),
        "best_peer": best["router"] if best else "",
        "best_peer_requests_per_s_c64": round(best["rps_c64"], 1) if best else 0.0,
        "best_peer_added_p50_ms": round(best["added_p50_ms"], 3) if best else None,
        "throughput_vs_best_peer": round(ours.get("rps_c64", 0.0) / best["rps_c64"], 3)
        if best else None,
        # what each router adds to a streamed request's first event (p50, p99): the
        # simulator's transport cost per router (bench/sim_vs_arena.py --transport)
        "engine_first_event_ms": {"p50": round(direct_ttft, 3),
                                  "p99": round(direct_ttft_p99, 3)},
        "first_event_added_ms": {
            r["router"]: {"p50": round(r["ttft_added_ms"], 3),
                          "p99": round(r["ttft_added_p99_ms"], 3)}
            for r in rows if "error" not in r and r["router"] != TRACED},
        "peer_versions": {"sglang-router": version_of("sglang-router"),
                          "vllm-router": version_of("vllm-router")},
        "peak_rss_mb": round(ours.get("peak_rss_mb", 0.0), 1),
        # the cost of tracing (same run, same load): the gateway's CPU per request with
        # tracing off (the default) and on (--otlp-endpoint, every span exported)
        "tracing_off_cpu_us_per_request": round(ours.get("cpu_s_per_1k", float("nan")) * 1000,
                                                1),
        "tracing_on_cpu_us_per_request": round(traced.get("cpu_s_per_1k", float("nan")) * 1000,
                                               1),
        "tracing_on_requests_per_s_c64": round(traced.get("rps_c64", 0.0), 1),
        "tracing_on_spans_exported": traced.get("spans", 0),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
