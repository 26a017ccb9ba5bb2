"""Which destinations the routers, taken together, say are down (pure).

Each router reports the destinations it currently skips as unhealthy
(`RouterStatus.unhealthy_destinations`). One router's view may be its own network's
problem; a destination that a strict majority of the routers reporting recently
calls down is treated by the planner as draining until that majority is gone, so the
next plan moves its keys instead of leaving them on a dead engine.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence

from router_client.plan import DestinationSpec


def reported_down(reports: Sequence[Iterable[str]], known: Iterable[str]) -> frozenset[str]:
    """Known destinations that more than half of `reports` (one per router) name."""
    if not reports:
        return frozenset()
    votes: Counter[str] = Counter()
    for unhealthy in reports:
        votes.update(set(unhealthy))
    quorum = len(reports) / 2
    return frozenset(d for d in known if votes[d] > quorum)


def with_reported_down(
    destinations: Sequence[DestinationSpec], down: frozenset[str]
) -> list[DestinationSpec]:
    """The destination list as planning sees it: reported-down ones draining."""
    return [dataclasses.replace(d, draining=True) if d.id in down and not d.draining else d
            for d in destinations]
