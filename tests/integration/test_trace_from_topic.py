"""`cacheroute replay|diagnose --trace kafka://HOST:PORT/TOPIC`: the traffic the gateways
recorded in the events topic, read back from a real broker and replayed."""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest

from planner_svc.cli.main import main
from streams.emitter import EventEmitter
from tests.integration.test_stream_support import make_topics

pytestmark = pytest.mark.integration


def test_diagnose_reads_the_events_a_gateway_wrote(broker):
    topics = make_topics(broker.bootstrap, partitions=3)
    rng = random.Random(5)
    keys = [f"app-{i}" for i in range(30)]
    start_ms, used = 1_700_000_000_000, set()
    with EventEmitter(broker.bootstrap, topics.events, producer_id="gw-test") as em:
        for i in range(1_500):
            key = keys[min(int(rng.paretovariate(1.2)) - 1, len(keys) - 1)]
            sent = start_ms + i * 100
            prompt = 1_000 + rng.randrange(500)
            used.add(key)
            # as the gateway does: the prompt is unknown (0) at dispatch, known at the end
            em.emit_request(key, "e0", prompt_tokens=0, router_id="gw-test", timestamp_ms=sent)
            if i % 10:  # one in ten never answered: its prompt is imputed, not 0
                em.emit_cache_hit(key, "e0", prompt_tokens=prompt, cached_tokens=0,
                                  output_tokens=30, e2e_ms=80.0, timestamp_ms=sent + 80)
        assert em.flush(30) == 0
    argv = ["diagnose", "--trace", f"kafka://{broker.bootstrap}/{topics.events}",
            "--destinations", "4", "--json"]
    # These made-up outcomes (nothing ever cached, 80 ms each) are not what any engine
    # model does with this traffic: the fidelity gate refuses to answer for them.
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(argv) == 3
    assert "fidelity gate FAILED" in err.getvalue() and "measured 0.0%" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--no-fidelity-gate"])
    assert code == 0, err.getvalue()
    d = json.loads(out.getvalue())
    assert d["requests"] == 1_500 and d["keys"] == len(used)
    assert d["offered_qps"] == pytest.approx(10.0, rel=0.01)
    assert d["verdict"] in {"win", "tie", "lose", "undecided"}
    assert "150 of 1500 requests had no usage event" in err.getvalue()


def test_a_missing_topic_is_one_line(broker):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["diagnose", "--trace", f"kafka://{broker.bootstrap}/no-such-topic"])
    assert code == 2
    assert err.getvalue().strip() == (f"diagnose: topic 'no-such-topic' does not exist at "
                                      f"{broker.bootstrap}")
