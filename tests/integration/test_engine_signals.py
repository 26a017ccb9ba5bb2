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
