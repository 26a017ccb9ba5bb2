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
last received, `GET /engines/<id>/last_request`. Fault modes:
    ok | status (answer `status`, e.g. 500 or 503) | hang (never answer completions) |
    die_mid_stream (cut the connection after `after_chunks` events) | slow (`delay_s`
    before answering) | unhealthy (/health 503) | down (stop listening; `up` restarts)
"""

from __future__ import annotations

import argparse
import asyncio
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

from aiohttp import web

from planner_svc.devstack.processes import ManagedProcess, ServerStartError
from planner_svc.simulator import text as txt
from planner_svc.simulator.replica import Replica, ReplicaModel

MAX_OUTPUT_TOKENS = 4096
DEFAULT_OUTPUT_TOKENS = 16
TOKENS_PER_EVENT = 4  # streamed answers: one SSE event per this many tokens


@dataclass
class Fault:
    mode: str = "ok"
    status: int = 500
    after_chunks: int = 2
    delay_s: float = 0.0


@dataclass
class EngineCounters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    running: int = 0
    by_path: dict[str, int] = field(default_factory=dict)


class EmulatedEngine:
    """One engine: its replica model, its HTTP app, its faults and counters."""

    def __init__(self, engine_id: str, model: ReplicaModel, *, served_model: str,
                 host: str = "127.0.0.1", faults: bool = False) -> None:
        self.id = engine_id
        self.replica = Replica(model)
        self.block_tokens = model.block_tokens
        self.served_model = served_model
        self.host = host
        self.faults_enabled = faults
        self.fault = Fault()
        self.counters = EngineCounters()
        self.last_request: dict[str, Any] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._clock_origin = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=32 << 20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        return app

    async def start(self, port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await self._listen(port)

    async def _listen(self, port: int) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, port, backlog=4096, reuse_address=True)
        await self._site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- OpenAI endpoints ---------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        messages = body.get("messages")
        if not isinstance(messages, list):
            return _error(400, "messages must be a list")
        prompt = txt.render_chat(m for m in messages if isinstance(m, dict)).encode()
        return await self._serve(request, body, prompt, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = " ".join(map(str, prompt))
        return await self._serve(request, body, str(prompt or "").encode(), chat=False)

    async def _serve(self, request: web.Request, body: dict[str, Any], prompt: bytes, *,
                     chat: bool) -> web.StreamResponse:
        if self.faults_enabled:  # what tests check arrived (headers, body) — never in production
            self.last_request = {"headers": [list(h) for h in request.headers.items()],
                                 "body": body, "path": request.path}
        fault = self.fault
        if fault.mode == "status":
            headers = {"retry-after": "1"} if fault.status in (429, 503) else {}
            return web.json_response(
                {"error": {"message": f"engine {self.id} fault: status {fault.status}",
                           "type": "engine_error", "code": fault.status}},
                status=fault.status, headers={**headers, **self._headers()})
        if fault.mode == "hang":
            await asyncio.sleep(3600)
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay_s)
        output_tokens = _output_tokens(body)
        ids = txt.block_chain(prompt, self.block_tokens)
        answer = txt.answer_text(prompt, output_tokens)
        answer_ids = txt.answer_chain(prompt, answer.encode(), ids, self.block_tokens)
        prompt_tokens = txt.token_count(prompt)
        now = time.monotonic()
        served = self.replica.admit(txt.as_chain(ids), prompt_tokens, output_tokens, now,
                                    txt.as_chain(answer_ids))
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
        try:
            if body.get("stream") is True:
                return await self._stream(request, body, answer, usage, served, meta)
            await _sleep_until(served.finish_time)
            return web.json_response(meta.full(answer, usage), headers=self._headers())
        finally:
            c.running -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any], answer: str,
                      usage: dict[str, Any], served: Any, meta: _Meta) -> web.StreamResponse:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **self._headers()})
        await resp.prepare(request)
        words = [answer[i:i + txt.BYTES_PER_TOKEN]
                 for i in range(0, len(answer), txt.BYTES_PER_TOKEN)]
        pieces = ["".join(words[i:i + TOKENS_PER_EVENT])
                  for i in range(0, len(words), TOKENS_PER_EVENT)]
        await _sleep_until(served.first_token_time)
        start, span = served.first_token_time, served.finish_time - served.first_token_time
        null_usage = {"usage": None} if include_usage else {}
        await resp.write(_sse(meta.chunk({"role": "assistant", "content": ""}, None,
                                          null_usage)))
        for n, piece in enumerate(pieces, 1):
            if self.fault.mode == "die_mid_stream" and n > self.fault.after_chunks:
                assert request.transport is not None
                request.transport.abort()
                return resp
            await _sleep_until(start + span * n / len(pieces))
            finish = "length" if n == len(pieces) else None
            await resp.write(_sse(meta.chunk({"content": piece}, finish, null_usage)))
        if include_usage:
            await resp.write(_sse(meta.usage_chunk(usage)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _headers(self) -> dict[str, str]:
        return {"x-emulated-engine": self.id}

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.served_model, "object": "model", "created": 0,
             "owned_by": "cacheroute-emulator", "max_model_len": 131072}]})

    async def _health(self, _request: web.Request) -> web.Response:
        if self.fault.mode == "unhealthy":
            return web.Response(status=503, text="unhealthy")
        return web.Response(text="")

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body.get("messages"), list):
            data = txt.render_chat(m for m in body["messages"] if isinstance(m, dict)).encode()
        else:
            data = str(body.get("prompt") or "").encode()
        n = txt.token_count(data)
        tokens = [int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little") & 0xFFFFFF
                  for i in range(0, len(data), 4)]
        return web.json_response({"count": n, "tokens": tokens, "max_model_len": 131072})

    async def _metrics(self, _request: web.Request) -> web.Response:
        c, r = self.counters, self.replica
        labels = f'{{model_name="{self.served_model}",engine="0"}}'
        usage = r.cache.used_blocks / r.cache.capacity_blocks
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {c.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} 0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{labels} {usage:.6f}",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{labels} {c.prompt_tokens}",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{labels} {c.cached_tokens}",
            "# TYPE vllm:request_success counter",
            f"vllm:request_success_total{labels} {c.requests}",
        ]
        return web.Response(text="\n".join(lines) + "\n",
                            content_type="text/plain", charset="utf-8")

    async def set_fault(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        mode = str(body.get("mode", "ok"))
        if mode == "down":  # as if the process died: no listener, open connections cut
            if self._site is not None:
                await self._site.stop()
                self._site = None
            assert self._runner is not None and self._runner.server is not None
            for handler in list(self._runner.server.connections):
                if handler.transport is not None:
                    handler.transport.abort()
            return web.json_response({"mode": "down"})
        if mode == "up":
            if self._site is None:
                await self._listen(self.port)
            mode = "ok"
        self.fault = Fault(mode=mode, status=int(body.get("status", 500)),
                           after_chunks=int(body.get("after_chunks", 2)),
                           delay_s=float(body.get("delay_s", 0.0)))
        return web.json_response({"mode": self.fault.mode})

    async def last_request_view(self, _request: web.Request) -> web.Response:
        return web.json_response({**self.last_request, "requests": self.counters.requests,
                                  "by_path": self.counters.by_path})

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="the body is not JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="the body must be a JSON object")
        return body


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


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "engine_error",
                                        "code": status}}, status=status)


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
    control: str = ""  # the control server's URL (with --faults)

    def destinations(self) -> str:
        """The `--destinations` value for a planner or gateway: id=url,..."""
        return ",".join(f"{i}={u}" for i, u in self.urls.items())

    def stop(self) -> None:
        self.process.stop()


def start_engines(workdir: Path, count: int = 4, *, extra: Sequence[str] = (),
                  name: str = "engines", timeout_s: float = 20.0) -> EngineFleet:
    """Start `python -m planner_svc.devstack.engines` and wait for its engines' URLs."""
    log_path = workdir / f"{name}.log"
    proc = ManagedProcess(name, [sys.executable, "-m", "planner_svc.devstack.engines",
                                 "--count", str(count), *extra], log_path)
    proc.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ServerStartError(f"{name} exited:\n{proc.log_tail()}")
        urls: dict[str, str] = {}
        control = ""
        for line in log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict) and "url" in row:
                    urls[row["id"]] = row["url"]
                elif isinstance(row, dict) and "control" in row:
                    control = row["control"]
                elif isinstance(row, dict) and row.get("ready"):
                    return EngineFleet(proc, urls, control)
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
    p.add_argument("--faults", action="store_true", help="enable POST /_fault (tests only)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    model = ReplicaModel(kv_capacity_tokens=args.kv_tokens, block_tokens=args.block_tokens,
                         batch_limit=args.batch_limit).time_scaled(args.time_scale)
    engines = [EmulatedEngine(f"e{i}", model, served_model=args.model, host=args.host,
                              faults=args.faults) for i in range(args.count)]
    for e in engines:
        await e.start()
        print(json.dumps({"id": e.id, "url": e.url}), flush=True)
    control = None
    if args.faults:
        control = await _control_server(engines, args.host)
        print(json.dumps({"control": f"http://{args.host}:{control.addresses[0][1]}"}),
              flush=True)
    print(json.dumps({"ready": True}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for e in engines:
        with contextlib.suppress(Exception):
            await e.stop()
    if control is not None:
        await control.cleanup()


async def _control_server(engines: list[EmulatedEngine], host: str) -> web.AppRunner:
    """Test-only control endpoints, on their own port so an engine that is `down` can be
    brought back up."""
    by_id = {e.id: e for e in engines}

    def engine_of(request: web.Request) -> EmulatedEngine:
        engine = by_id.get(request.match_info["id"])
        if engine is None:
            raise web.HTTPNotFound(text=f"no engine {request.match_info['id']!r}")
        return engine

    async def fault(request: web.Request) -> web.Response:
        return await engine_of(request).set_fault(request)

    async def last(request: web.Request) -> web.Response:
        return await engine_of(request).last_request_view(request)

    app = web.Application()
    app.router.add_post("/engines/{id}/fault", fault)
    app.router.add_get("/engines/{id}/last_request", last)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    return runner


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
