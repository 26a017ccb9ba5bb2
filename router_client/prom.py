"""A router client's metrics as a Prometheus collector (prometheus_client).

    registry.register(RouterCollector(client))

Every figure comes from `BaseRouterClient.metrics()` at scrape time, so nothing is
counted twice and the hot path does no metric work. Names are
`cacheroute_router_<name>` (`_total` for counters), labelled with the router id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from router_client.client_base import BaseRouterClient

# name -> (kind, help)
METRICS: dict[str, tuple[str, str]] = {
    "plan_epoch": ("gauge", "Epoch of the applied plan version."),
    "plan_seq": ("gauge", "Sequence of the applied plan version."),
    "plan_age_s": ("gauge", "Seconds since the plan was last confirmed current."),
    "fallback": ("gauge", "1 when routing everything by power-of-two-choices."),
    "rejected_versions": ("counter", "Plan versions refused by verification."),
    "ignored_older": ("counter", "Older versions or hints ignored."),
    "applied_full": ("counter", "Full plans applied."),
    "applied_full_edited": ("counter", "Full plans applied as an edit of the held table "
                            "(the rest were built from scratch)."),
    "applied_delta": ("counter", "Deltas applied."),
    "delta_fallbacks": ("counter", "Deltas that could not be used (full plan fetched)."),
    "reconnects": ("counter", "Plan-source reconnects."),
    "unavailable_rounds": ("counter", "Sync rounds that found the source unreachable."),
    "failed_rounds": ("counter", "Sync rounds that failed unexpectedly (see the log)."),
    "destinations_unhealthy": ("gauge", "Destinations currently skipped as unhealthy."),
    "ejections": ("counter", "Destinations marked unhealthy (outlier detection or probes)."),
    "readmissions": ("counter", "Destinations readmitted after being unhealthy."),
    "peer_routers": ("gauge", "Other routers that reported on this plan within the status "
                     "TTL (idle re-homing pauses while there are any)."),
    # Idle re-homing (`--idle-rehome-s`), when it is on:
    "rehome_paused": ("gauge", "1 while idle re-homing is paused beside other routers "
                      "(--idle-rehome-with-peers keeps it on)."),
    "rehome_window_s": ("gauge", "Idle gap after which a key is re-homed (learned with "
                        "--idle-rehome-learn)."),
    "rehome_outcomes": ("gauge", "Returns' cache outcomes the learned window rests on "
                        "(faded, weighted)."),
    # The shared conversation memory (router_client.redis_history), when it is on:
    "history_moves_sent": ("counter", "Conversation placements published to the other routers."),
    "history_moves_lost": ("counter", "Placements not published (Redis unreachable)."),
    "history_moves_unshared": ("counter", "Placements dropped from a full outbox."),
    "history_moves_learned": ("counter", "Other routers' placements applied here."),
    "history_messages_rejected": ("counter", "History messages refused as malformed."),
    "history_errors": ("counter", "Redis errors of the history exchange (it reconnects)."),
}


class RouterCollector(Collector):
    def __init__(self, client: BaseRouterClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        values = self.client.metrics()
        rid = self.client.router_id
        decisions = CounterMetricFamily("cacheroute_router_decisions", "Routing decisions by path.",
                                        labels=["router", "path"])
        for name, value in values.items():
            if name.startswith("decisions_"):
                decisions.add_metric([rid, name[len("decisions_"):]], value)
        yield decisions
        for name, (kind, text) in METRICS.items():
            if name not in values:
                continue
            family_cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_cls(f"cacheroute_router_{name}", text, labels=["router"])
            family.add_metric([rid], values[name])
            yield family


def labelled_union(parts: Iterable[tuple[str, Collector]], label: str) -> Iterator[Metric]:
    """Several collectors of one kind (one per pool) as one set of families: every sample
    gains `label=<its part's name>`, so two pools' same-named metrics stay one family
    (an exposition may not repeat a family)."""
    families: dict[str, Metric] = {}
    for name, collector in parts:
        for family in collector.collect():
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                        family.type)
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, label: name}, sample.value,
                                  sample.timestamp)
    yield from families.values()
