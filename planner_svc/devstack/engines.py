"""Emulated engines: R OpenAI-compatible HTTP servers in one process, each a `Replica`.

    python -m planner_svc.devstack.engines --count 4 [--time-scale 1.0] [--faults]

prints one JSON line per engine (`{"id": "e0", "url": "http://127.0.0.1:PORT"}`), then
`{"ready": true}`, and serves until SIGTERM/SIGINT. Each engine runs the simulator's
content-level replica model (planner_svc.simulator.replica) in real time: prompts are
rendered and tokenized as `planner_svc.simulator.text` describes, the replica decides
cached tokens and timing, and the HTTP layer waits until those times (`--time-scale`
stretches them; 0 answers at once, for measuring routers rather than engines).

Endpoints (what CacheRoute's gateway and the peer routers call):
    POST /v1/chat/completions, /v1/completions   non-streamed and SSE, with `usage`
         (prompt_tokens_details.cached_tokens) and `stream_options.include_usage`
    GET  /v1/models, /health, /metrics (vLLM-style gauges and counters)
    POST /tokenize                                 {"tokens": [...], "count": n}
With `--faults`, a control server (its URL printed as `{"control": url}`) lets tests
change how one engine behaves, `POST /engines/<id>/fault {"mode": ...}`, and see what it
last received, `GET /engines/<id>/last_request`, and when each request since the last reset
arrived, the TTFT the model gave it and how late its first token went out,
`GET /engines/<id>/timings`. Fault modes:
    ok | status (answer `status`, e.g. 500 or 503) | hang (never answer completions) |
    die_mid_stream (cut the connection after `after_chunks` events) | slow (`delay_s`
    before answering) | linger (keep a stream open `delay_s` after its [DONE]) |
    unhealthy (/health 503) | down (stop listening; `up` restarts)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner_svc.devstack.processes import ManagedProcess, ServerStartError
from planner_svc.simulator import text as txt
from planner_svc.simulator.replica import Replica, ReplicaModel
from router_client.gateway.http11 import HttpServer, Request, Responder, ServerLimits

MAX_OUTPUT_TOKENS = 4096
DEFAULT_OUTPUT_TOKENS = 16
TOKENS_PER_EVENT = 4  # streamed answers: one SSE event per this many tokens
MAX_TIMINGS = 200_000  # per engine between resets (`EngineCounters.timings`), ~10 MB


@dataclass
class Fault:
    mode: str = "ok"
    status: int = 500
    after_chunks: int = 2
    delay_s: float = 0.0


# vLLM's `vllm:time_to_first_token_seconds` buckets (vllm/v1/metrics/loggers.py, v0.10-0.11).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


@dataclass
class EngineCounters:
    received: int = 0  # requests that arrived (before any fault applies)
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    running: int = 0
    by_path: dict[str, int] = field(default_factory=dict)
    # TTFT histogram: per bucket of TTFT_BUCKETS_S (then +Inf), requests whose first token
    # came within it, not cumulative; the sum in seconds.
    ttft_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS_S) + 1))
    ttft_sum_s: float = 0.0
    # Per request, for splitting a client's TTFT into the engine's and everything around it
    # (`timings`): when it arrived (time.monotonic, the same clock in every process here),
    # the TTFT the engine model decided, and how late the first token was written (this
    # process's event loop behind its deadline: CPU contention). Bounded; `timings_dropped`
    # counts what did not fit.
    timings: list[tuple[float, float, float]] = field(default_factory=list)
    timings_dropped: int = 0

    def first_token(self, arrived: float, first_token_at: float) -> None:
        """Note a request's first token, written now, that the model put at
        `first_token_at`: into the TTFT histogram and, while there is room, `timings`."""
        ttft_s = first_token_at - arrived
        self.ttft_counts[bisect.bisect_left(TTFT_BUCKETS_S, ttft_s)] += 1
        self.ttft_sum_s += ttft_s
        if len(self.timings) < MAX_TIMINGS:
            late = max(0.0, time.monotonic() - first_token_at)
            self.timings.append((arrived, ttft_s, late))
        else:
            self.timings_dropped += 1


class EmulatedEngine:
    """One engine: its replica model, its HTTP server, its faults and counters."""

    def __init__(self, engine_id: str, model: ReplicaModel, *, served_model: str,
                 host: str = "127.0.0.1", faults: bool = False,
                 load_shape: str = "sglang", kv_events: bool = False) -> None:
        self.id = engine_id
        self.replica = Replica(model)
        # vLLM-format KV-cache events (--kv-events): the block pool's changes, published
        # as vLLM's ZmqEventPublisher does, a batch every KV_EVENT_PERIOD_S.
        self.kv_publisher: Any = None
        self._kv_stored: list[int] = []
        self._kv_removed: list[int] = []
        self._kv_clear = False
        if kv_events:
            from planner_svc.devstack.kv_publisher import KvEventPublisher

            self.kv_publisher = KvEventPublisher(host)
            self._observe(self.replica)
        self.block_tokens = model.block_tokens
        self.served_model = served_model
        self.host = host
        self.faults_enabled = faults
        self.load_shape = load_shape
        self.fault = Fault()
        self.counters = EngineCounters()
        # In-flight requests' prefill start times, by ticket: what /metrics calls waiting.
        self._prefill_starts: dict[int, float] = {}
        self._ticket = 0
        self.last_request: dict[str, Any] = {}
        self.port = 0
        self.server: HttpServer | None = None
        self._routes: dict[tuple[str, str], Any] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions/render"): self._render_chat,
            ("POST", "/v1/completions/render"): self._render_completions,
            ("POST", "/tokenize"): self._tokenize,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/get_load"): self._load,
            ("GET", "/metrics"): self._metrics,
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, port: int = 0) -> None:
        self.server = HttpServer(self._handle, ServerLimits(max_body_bytes=32 << 20))
        await self.server.start(self.host, port)
        self.port = self.server.port

    async def stop(self) -> None:
        if self.kv_publisher is not None:
            self.kv_publisher.close()
        if self.server is not None:
            await self.server.close(1.0)

    async def _handle(self, request: Request, out: Responder) -> None:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            _send(out, 404, {"error": {"message": f"no route {request.path}", "code": 404}})
            return
        await handler(request, out)

    # --- OpenAI endpoints ---------------------------------------------------------------

    async def _chat(self, request: Request, out: Responder) -> None:
        body = _json(request, out)
        if body is None:
            return
        messages = body.get("messages")
        if not isinstance(messages, list):
            _send(out, 400, _error_body(400, "messages must be a list"))
            return
        prompt = txt.render_chat(m for m in messages if isinstance(m, dict)).encode()
        await self._serve(request, out, body, prompt, chat=True)

    async def _completions(self, request: Request, out: Responder) -> None:
        body = _json(request, out)
        if body is None:
            return
        await self._serve(request, out, body, _completion_prompt(body), chat=False)

    async def _serve(self, request: Request, out: Responder, body: dict[str, Any],
                     prompt: bytes, *, chat: bool) -> None:
        if self.faults_enabled:  # what tests check arrived (headers, body) — never in production
            self.last_request = {"headers": [list(h) for h in request.headers],
                                 "body": body, "path": request.path}
        self.counters.received += 1
        fault = self.fault
        if fault.mode == "status":
            headers = [("retry-after", "1")] if fault.status in (429, 503) else []
            _send(out, fault.status, _error_body(
                fault.status, f"engine {self.id} fault: status {fault.status}"),
                [*headers, *self._headers()])
            return
        if fault.mode == "hang":
            await asyncio.sleep(3600)
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay_s)
        output_tokens = _output_tokens(body)
        ids = txt.block_chain(prompt, self.block_tokens)
        answer = txt.answer_text(prompt, output_tokens)
        answer_ids = txt.answer_chain(prompt, answer.encode(), ids, self.block_tokens)
        prompt_tokens = txt.token_count(prompt)
        arrived = time.monotonic()
        served = self.replica.admit(txt.as_chain(ids), prompt_tokens, output_tokens,
                                    arrived, txt.as_chain(answer_ids))
        c = self.counters
        c.requests += 1
        c.prompt_tokens += prompt_tokens
        c.cached_tokens += served.cached_tokens
        c.by_path[request.path] = c.by_path.get(request.path, 0) + 1
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                 "total_tokens": prompt_tokens + output_tokens,
                 "prompt_tokens_details": {"cached_tokens": served.cached_tokens}}
        meta = _Meta(chat, body.get("model") or self.served_model, f"cmpl-{uuid.uuid4().hex}")
        c.running += 1
        ticket = self._ticket = self._ticket + 1
        self._prefill_starts[ticket] = served.prefill_start_time
        try:
            if body.get("stream") is True:
                await self._stream(out, body, answer, usage, served, meta, arrived)
                return
            await _sleep_until(served.first_token_time)
            c.first_token(arrived, served.first_token_time)
            await _sleep_until(served.finish_time)
            _send(out, 200, meta.full(answer, usage), self._headers())
        finally:
            c.running -= 1
            del self._prefill_starts[ticket]

    def _waiting(self) -> int:
        """In-flight requests whose prefill has not begun (queued, as vLLM counts them)."""
        now = time.monotonic()
        return sum(1 for t in self._prefill_starts.values() if t > now)

    async def _stream(self, out: Responder, body: dict[str, Any], answer: str,
                      usage: dict[str, Any], served: Any, meta: _Meta,
                      arrived: float) -> None:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        words = [answer[i:i + txt.BYTES_PER_TOKEN]
                 for i in range(0, len(answer), txt.BYTES_PER_TOKEN)]
        pieces = ["".join(words[i:i + TOKENS_PER_EVENT])
                  for i in range(0, len(words), TOKENS_PER_EVENT)]
        await _sleep_until(served.first_token_time)
        self.counters.first_token(arrived, served.first_token_time)
        out.start(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                        *self._headers()])
        start, span = served.first_token_time, served.finish_time - served.first_token_time
        null_usage = {"usage": None} if include_usage else {}
        await out.write(_sse(meta.chunk({"role": "assistant", "content": ""}, None, null_usage)))
        for n, piece in enumerate(pieces, 1):
            if self.fault.mode == "die_mid_stream" and n > self.fault.after_chunks:
                out.abort()
                return
            await _sleep_until(start + span * n / len(pieces))
            finish = "length" if n == len(pieces) else None
            await out.write(_sse(meta.chunk({"content": piece}, finish, null_usage)))
        if include_usage:
            await out.write(_sse(meta.usage_chunk(usage)))
        await out.write(b"data: [DONE]\n\n")
        if self.fault.mode == "linger":
            await asyncio.sleep(self.fault.delay_s)
        out.end()

    def _headers(self) -> list[tuple[str, str]]:
        return [("x-emulated-engine", self.id)]

    async def _models(self, _request: Request, out: Responder) -> None:
        _send(out, 200, {"object": "list", "data": [
            {"id": self.served_model, "object": "model", "created": 0,
             "owned_by": "cacheroute-emulator", "max_model_len": 131072}]})

    async def _health(self, _request: Request, out: Responder) -> None:
        if self.fault.mode == "unhealthy":
            out.send(503, [], b"unhealthy")
        else:
            out.send(200, [], b"")

    async def _load(self, _request: Request, out: Responder) -> None:
        """`/get_load`: the SGLang model gateway's shape (a list per data-parallel rank), or
        vllm-router's (`{"load": n}`); the two routers poll the same path."""
        running = self.counters.running
        # The engine model releases finished requests lazily (at the next admission): bring
        # it to now first, or an idle engine would report the tokens of requests long done
        # (the SGLang gateway's power_of_two compares exactly these tokens).
        self.replica.in_flight(time.monotonic())
        if self.load_shape == "vllm":
            _send(out, 200, {"load": running})
        else:
            waiting = self._waiting()
            _send(out, 200, [{"dp_rank": 0, "num_reqs": max(0, running - waiting),
                              "num_waiting_reqs": waiting,
                              "num_tokens": self.replica.kv_held}])

    def _token_ids(self, data: bytes) -> list[int]:
        return [int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little") & 0xFFFFFF
                for i in range(0, len(data), txt.BYTES_PER_TOKEN)]

    async def _tokenize(self, request: Request, out: Responder) -> None:
        body = _json(request, out)
        if body is None:
            return
        if isinstance(body.get("messages"), list):
            data = txt.render_chat(m for m in body["messages"] if isinstance(m, dict)).encode()
        else:
            data = _completion_prompt(body)
        tokens = self._token_ids(data)
        _send(out, 200, {"count": len(tokens), "max_model_len": 131072, "tokens": tokens,
                         "token_strs": None})

    async def _render_chat(self, request: Request, out: Responder) -> None:
        """vLLM's `/v1/chat/completions/render` (what vllm-router's cache_aware reads)."""
        body = _json(request, out)
        if body is None:
            return
        raw = body.get("messages")
        messages: list[Any] = raw if isinstance(raw, list) else []
        data = txt.render_chat(m for m in messages if isinstance(m, dict)).encode()
        _send(out, 200, {"request_id": uuid.uuid4().hex, "token_ids": self._token_ids(data),
                         "model": body.get("model"), "stream": bool(body.get("stream"))})

    async def _render_completions(self, request: Request, out: Responder) -> None:
        body = _json(request, out)
        if body is None:
            return
        _send(out, 200, [{"request_id": uuid.uuid4().hex,
                          "token_ids": self._token_ids(_completion_prompt(body))}])

    async def _metrics(self, _request: Request, out: Responder) -> None:
        c, r = self.counters, self.replica
        labels = f'{{model_name="{self.served_model}",engine="0"}}'
        usage = r.cache.used_blocks / r.cache.capacity_blocks
        waiting = self._waiting()
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {max(0, c.running - waiting)}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} {waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{labels} {usage:.6f}",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{labels} {c.prompt_tokens}",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{labels} {c.cached_tokens}",
            "# TYPE vllm:request_success counter",
            f"vllm:request_success_total{labels} {c.requests}",
            "# TYPE vllm:time_to_first_token_seconds histogram",
        ]
        cumulative = 0
        for le, n in zip((*TTFT_BUCKETS_S, "+Inf"), c.ttft_counts, strict=True):
            cumulative += n
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",'
                         f'model_name="{self.served_model}"}} {cumulative}')
        lines += [f"vllm:time_to_first_token_seconds_sum{labels} {c.ttft_sum_s:.6f}",
                  f"vllm:time_to_first_token_seconds_count{labels} {cumulative}"]
        out.send(200, [("Content-Type", "text/plain; version=0.0.4")],
                 ("\n".join(lines) + "\n").encode())

    # --- test control -------------------------------------------------------------------

    async def set_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        mode = str(body.get("mode", "ok"))
        if mode == "down":  # as if the process died: no listener, open connections cut
            if self.server is not None:
                self.server.kill()
            return {"mode": "down"}
        if mode == "up":
            if self.server is None or self.server.killed:
                await self.start(self.port)
            mode = "ok"
        self.fault = Fault(mode=mode, status=int(body.get("status", 500)),
                           after_chunks=int(body.get("after_chunks", 2)),
                           delay_s=float(body.get("delay_s", 0.0)))
        return {"mode": self.fault.mode}

    def _observe(self, replica: Replica) -> None:
        def on_change(stored: Any, removed: Any) -> None:
            self._kv_stored.extend(stored)
            self._kv_removed.extend(removed)
        replica.cache.observer = on_change

    def publish_kv_events(self) -> None:
        """One batch of what the block pool did since the last one (if anything)."""
        from planner_svc.devstack.kv_publisher import cleared, removed, stored

        if self.kv_publisher is None:
            return
        events: list[dict[str, Any]] = []
        if self._kv_clear:
            events.append(cleared())
            self._kv_clear = False
        if self._kv_stored:
            events.append(stored(self._kv_stored, None, self.block_tokens))
        if self._kv_removed:
            events.append(removed(self._kv_removed))
        self._kv_stored, self._kv_removed = [], []
        if events:
            self.kv_publisher.publish(events)

    def reset(self) -> dict[str, Any]:
        """A cold engine again: empty cache, counters at zero (between benchmark runs)."""
        self.replica = Replica(self.replica.model)
        if self.kv_publisher is not None:
            self._observe(self.replica)
            self._kv_stored, self._kv_removed, self._kv_clear = [], [], True
        self.counters = EngineCounters()
        self.fault = Fault()
        return {"reset": self.id}

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"requests": c.requests, "prompt_tokens": c.prompt_tokens,
                "cached_tokens": c.cached_tokens, "running": c.running,
                "kv_used_blocks": self.replica.cache.used_blocks,
                "kv_cached_blocks": self.replica.cache.cached_blocks,
                "kv_evicted_blocks": self.replica.cache.evicted_blocks}

    def timings_view(self) -> dict[str, Any]:
        """`EngineCounters.timings` as columns: arrived_s (time.monotonic), ttft_s (the
        engine model's), late_s (first token written behind its time)."""
        c = self.counters
        columns = list(zip(*c.timings, strict=True)) or [(), (), ()]
        return {"arrived_s": list(columns[0]), "ttft_s": list(columns[1]),
                "late_s": list(columns[2]), "dropped": c.timings_dropped}

    def last_request_view(self) -> dict[str, Any]:
        return {**self.last_request, "requests": self.counters.requests,
                "received": self.counters.received,
                "by_path": self.counters.by_path}


@dataclass(frozen=True, slots=True)
class _Meta:
    chat: bool
    model: str
    id: str

    def full(self, answer: str, usage: dict[str, Any]) -> dict[str, Any]:
        created = int(time.time())
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": answer},
                      "finish_reason": "length"}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": answer, "finish_reason": "length", "logprobs": None}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": created, "model": self.model,
                "choices": [choice], "usage": usage}

    def chunk(self, delta: dict[str, Any], finish: str | None,
              extra: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta.get("content", ""), "finish_reason": finish,
                      "logprobs": None}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": int(time.time()),
                "model": self.model, "choices": [choice], **extra}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": int(time.time()),
                "model": self.model, "choices": [], "usage": usage}


def _send(out: Responder, status: int, obj: Any,
          headers: list[tuple[str, str]] | None = None) -> None:
    out.send(status, [("Content-Type", "application/json"), *(headers or [])],
             json.dumps(obj, separators=(",", ":")).encode())


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "engine_error", "code": status}}


def _json(request: Request, out: Responder) -> dict[str, Any] | None:
    try:
        body = json.loads(request.body)
    except ValueError:
        _send(out, 400, _error_body(400, "the body is not JSON"))
        return None
    if not isinstance(body, dict):
        _send(out, 400, _error_body(400, "the body must be a JSON object"))
        return None
    return body


def _completion_prompt(body: dict[str, Any]) -> bytes:
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    return str(prompt or "").encode()


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _output_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_OUTPUT_TOKENS
    try:
        return max(1, min(int(value), MAX_OUTPUT_TOKENS))
    except (TypeError, ValueError):
        return DEFAULT_OUTPUT_TOKENS


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


# --- the process -----------------------------------------------------------------------------

@dataclass
class EngineFleet:
    """A started emulator process and its engines' URLs (id -> url)."""

    process: ManagedProcess
    urls: dict[str, str]
    control_url: str = ""  # the control server's URL (with --faults)
    # (with --kv-events) id -> (KV-event PUB endpoint, replay endpoint)
    kv_events: dict[str, tuple[str, str]] = field(default_factory=dict)

    def destinations(self) -> str:
        """The `--destinations` value for a planner or gateway: id=url,..."""
        return ",".join(f"{i}={u}" for i, u in self.urls.items())

    def control(self, engine: str, action: str, body: dict[str, Any] | None = None) -> Any:
        """Call the control server (started with --faults) for one engine."""
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.control_url}/engines/{engine}/{action}", data=data,
                                     headers={"Content-Type": "application/json"},
                                     method="POST" if data is not None else "GET")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self, engine: str) -> None:
        """Cold caches, zero counters (the arena's start of a run)."""
        self.control(engine, "reset", {})

    def load(self, engine: str) -> float:
        """Requests served so far."""
        return float(self.control(engine, "stats")["requests"])

    def timings(self, engine: str) -> dict[str, Any]:
        """Per request since the last reset: arrival (time.monotonic), the engine model's
        TTFT, and how late its first token was written (`EmulatedEngine.timings_view`)."""
        return dict(self.control(engine, "timings"))

    def stop(self) -> None:
        self.process.stop()


def start_engines(workdir: Path, count: int = 4, *, extra: Sequence[str] = (),
                  name: str = "engines", timeout_s: float = 20.0,
                  wrap: Sequence[str] = ()) -> EngineFleet:
    """Start `python -m planner_svc.devstack.engines` and wait for its engines' URLs.
    `wrap` prefixes the command (e.g. `taskset -c 1` to pin it to a core)."""
    log_path = workdir / f"{name}.log"
    # The engines announce their URLs in this log, and processes append to theirs: a log left
    # by an earlier fleet in the same directory would hand back its (dead) URLs at once.
    log_path.unlink(missing_ok=True)
    proc = ManagedProcess(name, [*wrap, sys.executable, "-m", "planner_svc.devstack.engines",
                                 "--count", str(count), *extra], log_path)
    proc.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ServerStartError(f"{name} exited:\n{proc.log_tail()}")
        urls: dict[str, str] = {}
        kv: dict[str, tuple[str, str]] = {}
        control = ""
        for line in log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict) and "url" in row:
                    urls[row["id"]] = row["url"]
                    if "kv_events" in row:
                        kv[row["id"]] = (row["kv_events"], row["kv_replay"])
                elif isinstance(row, dict) and "control" in row:
                    control = row["control"]
                elif isinstance(row, dict) and row.get("ready"):
                    return EngineFleet(proc, urls, control, kv)
        time.sleep(0.05)
    proc.stop()
    raise ServerStartError(f"{name} did not start in {timeout_s} s:\n{proc.log_tail()}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m planner_svc.devstack.engines",
                                description="Emulated OpenAI-compatible engines (see module doc).")
    p.add_argument("--count", type=int, default=4, help="engines to start (default 4)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    p.add_argument("--model", default="emulated-model", help="served model name")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply the replica model's durations (0 = instant; default 1)")
    p.add_argument("--kv-tokens", type=int, default=ReplicaModel().kv_capacity_tokens,
                   help="KV cache capacity per engine, tokens")
    p.add_argument("--block-tokens", type=int, default=ReplicaModel().block_tokens)
    p.add_argument("--batch-limit", type=int, default=ReplicaModel().batch_limit)
    p.add_argument("--faults", action="store_true",
                   help="start the control server for faults (tests only)")
    p.add_argument("--load-shape", choices=("sglang", "vllm"), default="sglang",
                   help="/get_load answer: SGLang's per-rank list or vllm-router's {load}")
    p.add_argument("--kv-events", action="store_true",
                   help="publish vLLM-format KV-cache events over ZMQ (endpoints printed)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    model = ReplicaModel(kv_capacity_tokens=args.kv_tokens, block_tokens=args.block_tokens,
                         batch_limit=args.batch_limit).time_scaled(args.time_scale)
    engines = [EmulatedEngine(f"e{i}", model, served_model=args.model, host=args.host,
                              faults=args.faults, load_shape=args.load_shape,
                              kv_events=args.kv_events)
               for i in range(args.count)]
    for e in engines:
        await e.start()
        row: dict[str, Any] = {"id": e.id, "url": e.url}
        if e.kv_publisher is not None:
            row["kv_events"] = e.kv_publisher.endpoint
            row["kv_replay"] = e.kv_publisher.replay_endpoint
        print(json.dumps(row), flush=True)
    publishing = (asyncio.create_task(_publish_kv_events(engines)) if args.kv_events
                  else None)
    control = None
    if args.faults:
        control = await _control_server(engines, args.host)
        print(json.dumps({"control": f"http://{args.host}:{control.port}"}), flush=True)
    print(json.dumps({"ready": True}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if publishing is not None:
        publishing.cancel()
    for e in engines:
        with contextlib.suppress(Exception):
            await e.stop()
    if control is not None:
        await control.close(1.0)


KV_EVENT_PERIOD_S = 0.02  # a batch per ~scheduler step, as vLLM publishes


async def _publish_kv_events(engines: list[EmulatedEngine]) -> None:
    while True:
        await asyncio.sleep(KV_EVENT_PERIOD_S)
        for e in engines:
            e.publish_kv_events()


async def _control_server(engines: list[EmulatedEngine], host: str) -> HttpServer:
    """Test-only control endpoints, on their own port so an engine that is `down` can be
    brought back up: POST /engines/<id>/fault, GET /engines/<id>/last_request, POST
    /engines/<id>/reset, GET /engines/<id>/stats, GET /engines/<id>/timings."""
    by_id = {e.id: e for e in engines}

    async def handle(request: Request, out: Responder) -> None:
        parts = request.path.strip("/").split("/")
        engine = by_id.get(parts[1]) if len(parts) == 3 and parts[0] == "engines" else None
        if engine is None:
            _send(out, 404, _error_body(404, f"no such engine path {request.path}"))
        elif parts[2] == "fault" and request.method == "POST":
            body = _json(request, out)
            if body is not None:
                _send(out, 200, await engine.set_fault(body))
        elif parts[2] == "last_request":
            _send(out, 200, engine.last_request_view())
        elif parts[2] == "reset" and request.method == "POST":
            _send(out, 200, engine.reset())
        elif parts[2] == "stats":
            _send(out, 200, engine.stats())
        elif parts[2] == "timings":
            _send(out, 200, engine.timings_view())
        else:
            _send(out, 404, _error_body(404, f"no such engine path {request.path}"))

    return await HttpServer(handle).start(host, 0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
