"""Editing the planner's destination list (UpdateConfig): add (or re-address), drain,
remove, reweight, checked."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from planner_svc.errors import Conflict, InvalidRequest
from router_client.plan import DestinationSpec

MAX_DESTINATIONS = 10_000  # per planner (docs/security.md)


MAX_WEIGHT = 1e6


def edit_destinations(
    current: list[DestinationSpec], add: list[DestinationSpec], drain: list[str], remove: list[str],
    weights: Mapping[str, float] | None = None,
) -> list[DestinationSpec]:
    """The list after the edit; a drained destination stays listed (routers see it leave).
    `weights` gives existing destinations a new capacity weight."""
    by_id = {d.id: d for d in current}
    for ident, weight in (weights or {}).items():
        if ident not in by_id:
            raise InvalidRequest(f"unknown destination {ident!r}")
        if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
            raise InvalidRequest(f"capacity weight of {ident!r} must be in (0, {MAX_WEIGHT:g}], "
                                 f"got {weight}")
        by_id[ident] = dataclasses.replace(by_id[ident], capacity_weight=float(weight))
    for d in add:
        held = by_id.get(d.id)
        # Adding a listed destination is refused unless it brings it back from draining or
        # gives it a new address (a pod rescheduled under the same name: pool-sync).
        if held is not None and not held.draining and (not d.address
                                                       or d.address == held.address):
            raise Conflict(f"destination {d.id!r} already exists")
        by_id[d.id] = d
    for ident in [*drain, *remove]:
        if ident not in by_id:
            raise InvalidRequest(f"unknown destination {ident!r}")
    for ident in drain:
        by_id[ident] = dataclasses.replace(by_id[ident], draining=True)
    for ident in dict.fromkeys(remove):  # an id named twice is removed once
        del by_id[ident]
    if not by_id:
        raise InvalidRequest("removing every destination leaves nowhere to route")
    if len(by_id) > MAX_DESTINATIONS:
        raise InvalidRequest(f"at most {MAX_DESTINATIONS} destinations, asked for {len(by_id)}")
    return list(by_id.values())
