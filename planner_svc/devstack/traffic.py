"""The arena's traffic: session workloads played through the real `openai` async SDK.

Each conversation (planner_svc.simulator.sessions) starts at its time, then sends its turns
one after another: a turn waits for the previous answer plus its think time and carries
the whole history, so reuse is causal. Requests are streamed (`stream_options.
include_usage`), which gives the time to the first token and the served cache figures
(`usage.prompt_tokens_details.cached_tokens`). With several router URLs, consecutive
requests go to them in turn (a round-robin load balancer in front of router replicas).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import openai

from planner_svc.simulator.sessions import Population, Session, Transcript


@dataclass(slots=True)
class Record:
    sid: int
    turn: int
    tenant: int
    sent_s: float  # since the start of the run
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ok: bool
    error: str = ""
    # The engine that answered, where the answer says (the emulator's `x-emulated-engine`,
    # if the router passes it on)
    engine: str = ""


HeaderFn = Callable[[Session], dict[str, str]]


class Driver:
    def __init__(self, urls: Sequence[str], pop: Population, *, model: str = "arena-model",
                 headers: HeaderFn | None = None, timeout_s: float = 60.0,
                 session_affine: bool = False) -> None:
        """Several `urls` (router replicas) take requests in turn, or with `session_affine`
        every turn of a conversation goes to the same one (a session-affine balancer)."""
        self.pop = pop
        self.session_affine = session_affine
        self.model = model
        self.headers = headers
        limits = httpx2.Limits(max_connections=2000, max_keepalive_connections=2000)
        self.clients = [
            openai.AsyncOpenAI(base_url=u.rstrip("/") + "/v1", api_key="arena", max_retries=0,
                               timeout=timeout_s,
                               http_client=openai.DefaultAsyncHttpxClient(limits=limits))
            for u in urls]
        self._next = itertools.cycle(range(len(self.clients)))
        self.records: list[Record] = []
        self._t0 = 0.0

    @property
    def started_at(self) -> float:
        """When the last `run` began, on time.monotonic (`Record.sent_s` counts from it)."""
        return self._t0

    async def run(self, sessions: Sequence[Session], until_s: float,
                  progress: Callable[[float], None] | None = None) -> list[Record]:
        """Play `sessions`; stop everything at `until_s` (in-flight requests are cancelled
        and not recorded)."""
        self._t0 = time.monotonic()
        tasks = [asyncio.create_task(self._session(s, until_s)) for s in sessions
                 if s.start_s < until_s]
        ticker = asyncio.create_task(self._tick(progress, until_s)) if progress else None
        try:
            await asyncio.wait(tasks, timeout=until_s + 1.0)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if ticker is not None:
                ticker.cancel()
            for c in self.clients:
                await c.close()
        return self.records

    async def _tick(self, progress: Callable[[float], None], until_s: float) -> None:
        while True:
            progress(min(1.0, (time.monotonic() - self._t0) / until_s))
            await asyncio.sleep(1.0)

    def _now(self) -> float:
        return time.monotonic() - self._t0

    async def _session(self, s: Session, until_s: float) -> None:
        await asyncio.sleep(max(0.0, s.start_s - self._now()))
        transcript = Transcript(self.pop, s)
        headers = self.headers(s) if self.headers else {}
        for j, turn in enumerate(s.turns):
            if turn.think_s:
                await asyncio.sleep(turn.think_s)
            if self._now() >= until_s:
                return
            answer = await self._ask(s, j, transcript.ask(j), turn.output_tokens, headers)
            if answer is None:
                return  # a failed turn ends the conversation (the user gives up)
            transcript.answered(answer)

    async def _ask(self, s: Session, j: int, messages: list[dict[str, Any]], output: int,
                   headers: dict[str, str]) -> str | None:
        client = (self.clients[s.sid % len(self.clients)] if self.session_affine
                  else self.clients[next(self._next)])
        sent = self._now()
        first = None
        parts: list[str] = []
        usage = None
        try:
            stream = await client.chat.completions.create(  # type: ignore[call-overload]
                model=self.model, messages=messages, max_tokens=output, stream=True,
                stream_options={"include_usage": True}, extra_headers=headers or None)
            engine = stream.response.headers.get("x-emulated-engine", "")
            async for chunk in stream:
                if first is None:
                    first = self._now()
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                if chunk.usage is not None:
                    usage = chunk.usage
        except (openai.APIError, httpx2.HTTPError) as exc:
            self.records.append(Record(s.sid, j, s.tenant, sent, float("nan"),
                                       self._now() - sent, 0, 0, 0, False, type(exc).__name__))
            return None
        done = self._now()
        prompt = usage.prompt_tokens if usage else 0
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        cached = (details.cached_tokens or 0) if details is not None else 0
        self.records.append(Record(s.sid, j, s.tenant, sent, (first or done) - sent,
                                   done - sent, prompt, cached,
                                   usage.completion_tokens if usage else 0, usage is not None,
                                   engine=engine))
        return "".join(parts)
