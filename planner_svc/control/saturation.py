"""Destinations whose engines stay saturated, planned at the capacity they actually have
(pure).

The planner's capacity of a destination is `q_cap x capacity_weight`, typed in by the
operator. An engine can be slower than that: a smaller GPU, a noisy neighbour, longer
prompts than the knee was measured with. Its own metrics then say so (streams/engines): a
queue that keeps growing beside the running batch, or a KV cache full enough to preempt.
A destination reported saturated for `dwell_s` on end is planned as overloaded, at the
capacity it showed: the least arrival rate it received while saturated, less the rate its
queue grew at (what it served), less `drain_margin` (so the backlog drains). Placement
then moves keys off it, and the staleness account prices the overload the installed plan
puts on it. It is restored only after `clear_s` without saturation
(longer than `dwell_s`, so one quiet scrape does not flip it back and forth), and never
planned below `floor` of its configured weight (a misreporting engine cannot starve
itself of traffic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner_svc.planning.config import DestinationSpec


@dataclass(frozen=True, slots=True)
class SaturationSettings:
    # Queue rule: more requests waiting than this share of the running batch (and at least
    # `min_waiting`): the engine admits slower than requests arrive.
    waiting_per_running: float = 0.5
    min_waiting: float = 2.0
    # KV rule: the cache this full while the engine preempts running requests.
    kv_usage: float = 0.98
    dwell_s: float = 20.0
    clear_s: float = 60.0
    floor: float = 0.25
    drain_margin: float = 0.1
    # A report older than this says nothing about now.
    max_age_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Saturation:
    """One destination's saturation record."""

    since_ms: int | None = None  # first report of the current saturated run
    clear_since_ms: int | None = None  # first unsaturated report after a derated run
    derated: bool = False
    knee_per_s: float | None = None  # capacity measured while saturated, before derating
    reason: str = ""
    least_arrival_per_s: float | None = None
    first_waiting: float = 0.0


def saturation_reason(signals: Any, settings: SaturationSettings) -> str:
    """Why this EngineSignals report shows a saturated engine ("" if it does not)."""
    if not signals.metrics:
        return ""
    running, waiting = float(signals.running), float(signals.waiting)
    if waiting >= max(settings.min_waiting, settings.waiting_per_running * running):
        return f"waiting {waiting:g} beside {running:g} running"
    if (signals.HasField("kv_usage") and signals.kv_usage >= settings.kv_usage
            and signals.HasField("preemptions_per_s") and signals.preemptions_per_s > 0):
        return (f"KV {signals.kv_usage:.0%} full, "
                f"{signals.preemptions_per_s:.2g} preemptions/s")
    return ""


def observe(held: Saturation, signals: Any, arrival_per_s: float | None,
            settings: SaturationSettings) -> Saturation:
    """The record after one more report from the destination's engine. `arrival_per_s`:
    the stream's newest arrival rate at that destination (None if unknown)."""
    now = int(signals.observed_at_ms)
    reason = saturation_reason(signals, settings)
    if reason:
        if held.since_ms is None:  # a new saturated run
            held = Saturation(now, None, held.derated, held.knee_per_s, reason, None,
                              float(signals.waiting))
        assert held.since_ms is not None
        if held.derated:  # frozen: from now on the plan itself lowers the arrivals
            return Saturation(held.since_ms, None, True, held.knee_per_s, reason,
                              held.least_arrival_per_s, held.first_waiting)
        least = held.least_arrival_per_s
        if arrival_per_s is not None and arrival_per_s > 0:
            # An engine that queues is sent more than it serves: every arrival rate seen
            # while it stayed saturated bounds its capacity from above.
            least = arrival_per_s if least is None else min(least, arrival_per_s)
        knee = held.knee_per_s
        elapsed_s = (now - held.since_ms) / 1000
        if least is not None:
            growth = (float(signals.waiting) - held.first_waiting) / elapsed_s if elapsed_s else 0
            knee = max(0.0, least - max(0.0, growth)) * (1 - settings.drain_margin)
        derated = elapsed_s >= settings.dwell_s
        return Saturation(held.since_ms, None, derated, knee, reason, least, held.first_waiting)
    if not held.derated:
        return Saturation()
    clear_since = held.clear_since_ms if held.clear_since_ms is not None else now
    if now - clear_since >= settings.clear_s * 1000:
        return Saturation()
    # Still planned as overloaded until it has been clear long enough; a new saturated
    # run starts from here.
    return Saturation(None, clear_since, True, held.knee_per_s, held.reason)


def effective_weight(spec: DestinationSpec, record: Saturation | None, q_cap: float,
                     settings: SaturationSettings) -> float:
    """The capacity weight to plan `spec` with."""
    if record is None or not record.derated:
        return spec.capacity_weight
    capacity = q_cap * spec.capacity_weight  # can underflow to 0 for a tiny q_cap
    # Saturated with no measured load to size it by: half.
    known = record.knee_per_s is not None and capacity > 0
    share = record.knee_per_s / capacity if known else 0.5  # type: ignore[operator]
    share = min(1.0, max(settings.floor, share))
    return spec.capacity_weight * share


def derated_fleet(fleet: Sequence[DestinationSpec], records: Mapping[str, Saturation],
                  q_cap: float, settings: SaturationSettings) -> list[DestinationSpec]:
    """`fleet` with every derated destination's weight cut to its measured capacity."""
    out = []
    for d in fleet:
        weight = effective_weight(d, records.get(d.id), q_cap, settings)
        out.append(d if weight == d.capacity_weight
                   else dataclasses.replace(d, capacity_weight=weight))
    return out
