"""Engines' own signals, end to end: emulated engines publishing vLLM-format KV events and
/metrics, the watcher (`streams.engines.watch`) reading both and producing EngineSignals
to the real broker, the planner consuming them, and `cacheroute status` showing each
destination's figures with their source and age."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from planner_svc.cli.main import main as cli_main
from planner_svc.devstack.engines import start_engines
from planner_svc.server import build_service
from streams.engines.watch import EngineWatch
from tests.service.harness import feed, planner_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def test_status_shows_what_each_engine_reports(redis_server, broker, tmp_path, capsys):
    fleet = start_engines(tmp_path, 2, extra=["--time-scale", "0", "--kv-events",
                                              "--kv-tokens", "8192"])
    topic = f"signals-{uuid.uuid4().hex[:8]}"
    settings = planner_settings(redis_server.url, tmp_path / "planner",
                                bootstrap=broker.bootstrap, engine_signals_topic=topic,
                                snapshots_topic=f"snap-{uuid.uuid4().hex[:8]}",
                                destinations=tuple(fleet.urls))
    svc = build_service(settings, consume=True, durable=False)
    svc.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    kv = {d: f"{pub}/{replay.removeprefix('tcp://')}" for d, (pub, replay)
          in fleet.kv_events.items()}
    watch = EngineWatch({**kv, "not-ours": kv["e0"]}, dict(fleet.urls), 0.3,
                        lambda dest, value: producer.produce(topic, value, dest.encode()),
                        lambda: producer.poll(0))
    stop = threading.Event()
    runner = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    runner.start()
    try:
        for i in range(30):
            engine = f"e{i % 2}"
            body = json.dumps({"model": "emulated-model", "max_tokens": 4, "messages": [
                {"role": "user", "content": f"report {i}: " + "figures " * 200}]}).encode()
            req = urllib.request.Request(f"{fleet.urls[engine]}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()

        def reported() -> bool:
            signals = svc.planner.engine_signals
            return len(signals) == 2 and all(
                s.kv_events and s.blocks_resident > 0 and s.metrics for s in signals.values())

        assert eventually(reported, 20)
        assert svc.planner.unknown_signals > 0  # "not-ours" is refused, not stored
        feed(svc)  # a window of rates: the mean reusable prefix is 800 tokens
        capsys.readouterr()
        assert cli_main(["status", "--planner", f"127.0.0.1:{svc.port}", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        engines = {e["destination"]: e for e in status["engines"]}
        assert set(engines) == {"e0", "e1"}
        for e in engines.values():
            assert e["engine"] == "vllm" and e["kv_events"]["blocks_resident"] > 0
            assert e["kv_events"]["block_size"] == 16 and e["kv_events"]["gaps"] == 0
            assert 0 < e["metrics"]["kv_usage"] <= 1
            assert time.time() * 1000 - e["observed_at_ms"] < 10_000
        # W measured: what the engines hold, in prefixes of the mean reusable size
        w = status["warm_slots"]
        resident = sorted(e["kv_events"]["blocks_resident"] for e in engines.values())
        assert w["measured_destinations"] == 2 and w["mean_prefix_tokens"] == 800
        assert min(resident) * 16 / 800 <= w["measured"] <= max(resident) * 16 / 800
        assert cli_main(["status", "--planner", f"127.0.0.1:{svc.port}"]) == 0
        text = capsys.readouterr().out
        assert "engines" in text and "blocks resident" in text and "(/metrics)" in text
        assert "measured" in text and "from the KV events of 2 destination(s)" in text
    finally:
        stop.set()
        runner.join(5)
        producer.flush(5)
        svc.stop(0)
        fleet.stop()


def test_an_emulated_engine_reports_its_queue_as_vllm_does(tmp_path):
    """More requests than its batch holds: the engine model queues them, and /metrics says
    so in vLLM's names, which the watcher's parser reads and the planner's saturation rule
    calls saturated."""
    from cacheroute.engine_metrics import parse_engine_metrics
    from cacheroute.v1 import signals_pb2
    from planner_svc.control.saturation import SaturationSettings, saturation_reason

    fleet = start_engines(tmp_path, 1, extra=["--time-scale", "6", "--batch-limit", "1"])
    url = fleet.urls["e0"]
    body = json.dumps({"model": "emulated-model", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "why is the sky blue " * 20}]})

    def ask() -> None:
        req = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()

    callers = [threading.Thread(target=ask) for _ in range(5)]
    try:
        for t in callers:
            t.start()

        def scrape() -> Any:
            return parse_engine_metrics(
                urllib.request.urlopen(url + "/metrics", timeout=5).read().decode())
        assert eventually(lambda: scrape().waiting >= 3, 10)
        m = scrape()
        assert m.running == 1 and m.running + m.waiting <= 5  # one in the batch, the rest queue
        report = signals_pb2.EngineSignals(destination="e0", metrics=True,
                                           running=int(m.running), waiting=int(m.waiting))
        assert saturation_reason(report, SaturationSettings()).startswith("waiting")
        for t in callers:
            t.join(60)
        assert scrape().waiting == 0 and scrape().running == 0
    finally:
        fleet.stop()


def test_get_load_reports_the_tokens_of_requests_still_running(tmp_path):
    """The SGLang gateway's power_of_two compares the tokens each engine's `/get_load`
    reports: an engine whose requests have all finished reports none, even before its next
    request (the engine model releases finished requests lazily; the handler catches up)."""
    fleet = start_engines(tmp_path, 1, extra=["--time-scale", "0"])
    try:
        url = fleet.urls["e0"]
        body = json.dumps({"model": "emulated-model", "max_tokens": 4, "messages": [
            {"role": "user", "content": "load " * 300}]}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["usage"]["prompt_tokens"] > 0
        with urllib.request.urlopen(f"{url}/get_load", timeout=10) as r:
            (rank,) = json.loads(r.read())
        assert rank["num_tokens"] == 0 and rank["num_reqs"] == 0
    finally:
        fleet.stop()


def test_a_fleet_started_where_another_ran_answers_on_its_own_urls(tmp_path):
    """The engines announce their URLs in their log; a second fleet in the same directory
    must not be handed the first one's (dead) URLs from the old log."""
    first = start_engines(tmp_path, 1, extra=["--time-scale", "0"])
    first.stop()
    second = start_engines(tmp_path, 1, extra=["--time-scale", "0"])
    try:  # (the old URL refuses: its engine is gone)
        with urllib.request.urlopen(f"{second.urls['e0']}/health", timeout=10) as r:
            assert r.status == 200
    finally:
        second.stop()
