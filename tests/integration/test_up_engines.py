"""`cacheroute up --engines`, as a user runs it: one command, one OpenAI base URL in front of
the engines, every address in `--json`, and nothing left behind at Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from planner_svc.devstack.engines import EngineFleet, start_engines
from planner_svc.devstack.processes import free_port
from tests.integration.test_demo_cli import alive, descendants
from tests.timing import bound

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "planner_svc.cli.main"]
# Long enough to fill several of the emulated engine's cache blocks.
SYSTEM = " ".join(f"rule {i}: answer briefly and cite the handbook." for i in range(60))


@pytest.fixture()
def engines(tmp_path: Path) -> Iterator[EngineFleet]:
    fleet = start_engines(tmp_path, 2, extra=["--time-scale", "0.02"])
    yield fleet
    fleet.stop()


def stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C, then SIGKILL if it is ignored."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_up_with_engines_serves_the_openai_api_with_cached_prefixes(
        engines: EngineFleet, tmp_path: Path) -> None:
    up_and_ask(list(engines.urls.values()), "emulated-model", SYSTEM, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_up_in_front_of_llama_servers(tmp_path: Path) -> None:
    """The same with llama.cpp's llama-server on the tiny random model (built on first use,
    planner_svc/devstack/llama.py)."""
    pytest.importorskip("gguf")
    from planner_svc.devstack.llama import start_llama_fleet

    fleet = start_llama_fleet(tmp_path, 2)
    try:
        up_and_ask(list(fleet.urls.values()), fleet.options.model_name,
                   " ".join(["bal fen kir mos"] * 300), tmp_path)
    finally:
        fleet.stop()


def up_and_ask(urls: list[str], model: str, system: str, tmp_path: Path) -> None:
    """`up --engines` on fixed free ports; a chat request through its base URL, twice."""
    ports = {flag: free_port() for flag in
             ("--port", "--broker-port", "--redis-port", "--planner-port", "--metrics-port")}
    # One engine named by its URL alone, one with an id.
    given = f"{urls[0]},second={urls[1]}"
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "up", "--engines", given, "--json", "--workdir", str(tmp_path / "up"),
         *(str(v) for kv in ports.items() for v in kv)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"`up` printed nothing; stderr:\n{proc.stderr.read() if proc.stderr else ''}"
        got = json.loads(line)
        first_id = urls[0].removeprefix("http://")
        assert got["engines"] == {first_id: urls[0], "second": urls[1]}
        assert got["openai_base_url"] == f"http://127.0.0.1:{ports['--port']}/v1"
        assert got["planner"] == f"127.0.0.1:{ports['--planner-port']}"
        assert got["redis"] == f"redis://127.0.0.1:{ports['--redis-port']}/0"
        assert got["bootstrap"] == f"127.0.0.1:{ports['--broker-port']}"
        assert got["metrics"] == f"http://127.0.0.1:{ports['--metrics-port']}/metrics"
        children = descendants(proc.pid)

        client = openai.OpenAI(base_url=got["openai_base_url"], api_key="none", max_retries=0,
                               timeout=30)
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": "What does rule 7 say?"}]
        answers = []
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
            answers.append((raw.parse(), raw.headers["x-cacheroute-destination"]))
        bound(time.monotonic() - started, 60.0, "`up --engines` to its first answers, s")
        (first, where_first), (second, where_second) = answers
        assert first.choices[0].message.content is not None
        # The same prompt goes to the same engine, whose prefix cache now holds it.
        assert where_first == where_second and where_first in got["engines"]
        details = second.usage.prompt_tokens_details if second.usage else None
        assert details is not None and (details.cached_tokens or 0) > 0, second.usage
    finally:
        stop(proc)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    time.sleep(0.5)
    assert children and not [p for p in children if alive(p)]
