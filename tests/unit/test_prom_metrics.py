"""Engine load from vLLM's and SGLang's /metrics text (cacheroute.engine_metrics)."""

from __future__ import annotations

import math

import pytest

from cacheroute.engine_metrics import MetricsError, load_between, parse_engine_metrics

# Shaped as vLLM 0.9+ (V1 engine) exposes them: one series per engine, counters with
# _total and _created, the TTFT histogram with its buckets.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.625
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="2.5",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} 12.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.31
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",tp_rank="0"} 5000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",tp_rank="0"} 4000.0
"""


def vllm(running=7.0, queries=1000.0, hits=600.0, b1=10.0, b2=90.0, b3=100.0):
    return VLLM.format(running=running, queries=queries, hits=hits, b1=b1, b2=b2, b3=b3)


def test_a_vllm_page():
    m = parse_engine_metrics(vllm())
    assert (m.engine, m.running, m.waiting, m.kv_usage) == ("vllm", 7.0, 3.0, 0.625)
    assert (m.prefix_queries, m.prefix_hits, m.preemptions) == (1000.0, 600.0, 2.0)
    assert m.ttft_count == 100.0 and m.ttft_buckets[0] == (0.1, 10.0)


def test_rates_and_quantiles_between_two_scrapes():
    before = parse_engine_metrics(vllm())
    after = parse_engine_metrics(vllm(running=9.0, queries=3000.0, hits=2500.0,
                                      b1=10.0, b2=140.0, b3=200.0))
    load = load_between(before, after, 10.0)
    assert load.running == 9.0 and load.prefix_hit_rate == pytest.approx(1900 / 2000)
    assert load.requests == 100.0
    # 50 in (0.1, 0.5], 50 in (0.5, 2.5]: interpolated inside the bucket, as Prometheus does
    assert load.ttft_p50_s == 0.5 and load.ttft_p99_s == pytest.approx(0.5 + 2.0 * 49 / 50)
    # a restarted engine: counters back to small numbers count from zero
    restarted = parse_engine_metrics(vllm(queries=100.0, hits=50.0, b1=1, b2=2, b3=4))
    again = load_between(after, restarted, 10.0)
    assert again.prefix_hit_rate == 0.5 and again.requests == 4.0


def test_an_sglang_page_and_several_series():
    m = parse_engine_metrics(SGLANG + SGLANG.replace('tp_rank="0"', 'tp_rank="1"'))
    assert (m.engine, m.running, m.waiting) == ("sglang", 8.0, 2.0)
    assert m.kv_usage == 0.31 and (m.prefix_queries, m.prefix_hits) == (10000.0, 8000.0)
    assert load_between(m, m, 1.0).ttft_p99_s is None  # no histogram, no quantile


@pytest.mark.parametrize("text, why", [
    ("# TYPE x gauge\nx 1\n", "not a vLLM or SGLang"),
    ("vllm:num_requests_running{ 1\n", "not Prometheus text"),
])
def test_other_pages_are_refused(text, why):
    with pytest.raises(MetricsError, match=why):
        parse_engine_metrics(text)


def test_quantile_past_the_last_finite_bound_is_infinite():
    from cacheroute.engine_metrics import _quantile

    buckets = [(0.1, 1.0), (2.5, 5.0), (math.inf, 10.0)]
    assert _quantile(buckets, 10.0, 0.5) == 2.5
    assert math.isinf(_quantile(buckets, 10.0, 0.99))  # type: ignore[arg-type]
    assert _quantile(buckets, 0.0, 0.5) is None
