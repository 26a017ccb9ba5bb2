"""What vLLM and SGLang say about their load on `/metrics`, parsed (pure).

The text is Prometheus exposition, read with `prometheus_client`'s parser. Names, by
engine (vLLM's V1 engine metrics as of 0.9+, with the older `gpu_` names accepted;
SGLang's `sglang:` metrics):

- requests running: `vllm:num_requests_running`, `sglang:num_running_reqs`;
- requests waiting: `vllm:num_requests_waiting`, `sglang:num_queue_reqs`;
- KV cache in use (0-1): `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before),
  `sglang:token_usage`;
- prefix cache, tokens queried / hit: `vllm:prefix_cache_queries_total` / `..._hits_total`
  (`vllm:gpu_prefix_cache_*` before), `sglang:prompt_tokens_total` /
  `sglang:cached_tokens_total`;
- preemptions: `vllm:num_preemptions_total`;
- TTFT histogram: `vllm:time_to_first_token_seconds`, `sglang:time_to_first_token_seconds`.

A process serving several models or data-parallel engines reports one series per label
set: counts are summed, the KV usage is the largest. `load_between(before, after)` turns
two scrapes into rates and the TTFT quantiles of the requests in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

MAX_TEXT_BYTES = 8 << 20

_NAMES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries",
                "sglang:prompt_tokens"),
    "hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits", "sglang:cached_tokens"),
    "preemptions": ("vllm:num_preemptions",),
}
_TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")


class MetricsError(ValueError):
    """Text that is not a vLLM or SGLang metrics page; the message says why."""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    engine: str  # "vllm" or "sglang"
    running: float
    waiting: float
    kv_usage: float | None
    prefix_queries: float | None  # cumulative tokens
    prefix_hits: float | None
    preemptions: float | None
    ttft_buckets: tuple[tuple[float, float], ...] = field(default=())  # (le, cumulative)
    ttft_count: float = 0.0


def parse_engine_metrics(text: str) -> EngineMetrics:
    if len(text) > MAX_TEXT_BYTES:
        raise MetricsError(f"a metrics page of {len(text)} bytes is over {MAX_TEXT_BYTES}")
    values: dict[str, list[float]] = {}
    buckets: dict[float, float] = {}
    count = 0.0
    engine = ""
    try:
        for family in text_string_to_metric_families(text):
            for key, names in _NAMES.items():
                if family.name in names:
                    engine = engine or family.name.split(":", 1)[0]
                    values.setdefault(key, []).extend(
                        s.value for s in family.samples
                        if s.name in (family.name, family.name + "_total"))
            if family.name in _TTFT:
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + s.value
                    elif s.name.endswith("_count"):
                        count += s.value
    except (ValueError, KeyError, TypeError) as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from None
    if "running" not in values or "waiting" not in values:
        raise MetricsError("no running / waiting request gauges: not a vLLM or SGLang "
                           "metrics page")

    def total(key: str) -> float | None:
        v = values.get(key)
        return math.fsum(v) if v else None

    usage = values.get("kv_usage")
    return EngineMetrics(engine, total("running") or 0.0, total("waiting") or 0.0,
                         max(usage) if usage else None, total("queries"), total("hits"),
                         total("preemptions"), tuple(sorted(buckets.items())), count)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: float
    waiting: float
    kv_usage: float | None
    prefix_hit_rate: float | None  # hits / queries between the two scrapes
    preemptions_per_s: float | None
    ttft_p50_s: float | None  # of the requests between the two scrapes (interpolated)
    ttft_p99_s: float | None
    requests: float  # first tokens between the two scrapes


def load_between(before: EngineMetrics, after: EngineMetrics, seconds: float) -> EngineLoad:
    """Gauges from `after`; rates and quantiles over what happened since `before` (a
    counter that went back, a restarted engine, counts from zero)."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")

    def delta(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return None
        return b - a if b >= a else b

    queries = delta(before.prefix_queries, after.prefix_queries)
    hits = delta(before.prefix_hits, after.prefix_hits)
    preempt = delta(before.preemptions, after.preemptions)
    restarted = after.ttft_count < before.ttft_count
    old = {} if restarted else dict(before.ttft_buckets)
    window = [(le, c - old.get(le, 0.0)) for le, c in after.ttft_buckets]
    n = after.ttft_count - (0.0 if restarted else before.ttft_count)
    return EngineLoad(
        after.running, after.waiting, after.kv_usage,
        hits / queries if queries and hits is not None else None,
        preempt / seconds if preempt is not None else None,
        _quantile(window, n, 0.50), _quantile(window, n, 0.99), n)


def _quantile(buckets: list[tuple[float, float]], n: float, q: float) -> float | None:
    """The q-quantile, interpolated linearly inside the bucket that holds it, as
    Prometheus's `histogram_quantile` does (vLLM's TTFT buckets jump from 1 s to 2.5 s: the
    bucket's upper bound would read any p99 past 1 s as 2.5 s, over a 2-s SLO). Past the
    last finite bucket: infinite (a histogram knows nothing beyond, only that it is past)."""
    if n <= 0:
        return None
    rank = q * n
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return math.inf
            inside = cumulative - below
            share = (rank - below) / inside if inside > 0 else 1.0
            return lower + (le - lower) * share
        lower, below = le, cumulative
    return math.inf
