"""Real engines: llama.cpp's llama-server on the tiny random model (slow tier: the binary
is built on first use, ~8 minutes on 2 cores; CACHEROUTE_LLAMA_DIR points at a built one).

A repeated prompt is served from the slot's cache, `load` reads the server's own
counters, `reset` gives a cold engine on the same address, and the reference gateway in
front of two engines keeps a conversation on the engine that holds its prefix."""

from __future__ import annotations

import json
import urllib.request

import pytest

from planner_svc.devstack.llama import start_llama_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SYSTEM = " ".join(["bal fen kir mos"] * 300)


def chat(url: str, user: str) -> dict:
    body = {"model": "arena-model", "max_tokens": 8,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["usage"]


@pytest.mark.timeout(1200)
def test_llama_server_caches_prefixes_and_resets_cold(tmp_path):
    pytest.importorskip("gguf")
    fleet = start_llama_fleet(tmp_path, 2)
    try:
        url = fleet.urls["engine-00"]
        first = chat(url, "question one")
        again = chat(url, "question two")
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        # everything up to the user turn came from the slot's KV
        assert again["prompt_tokens_details"]["cached_tokens"] >= 0.9 * again["prompt_tokens"]
        assert fleet.load("engine-00") == first["prompt_tokens"] + again["prompt_tokens"]
        assert fleet.load("engine-01") == 0
        fleet.reset("engine-00")
        assert fleet.urls["engine-00"] == url
        assert chat(url, "question two")["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        fleet.stop()
