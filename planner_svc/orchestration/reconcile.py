"""The planner's destinations kept in step with a discovery source (pure: the planner's list
and the source's in, an edit of the destination list out).

The sources (a file, DNS, an InferencePool's pods, a Service's EndpointSlices) and how
their answers become destinations are in planner_svc.adapters.discovery. `reconcile` turns
the difference between the planner's list and the source's into the UpdateConfig edit that
moves the planner there gently:

- a new destination is added (a draining one that came back is added again);
- a destination that left (a pod no longer ready, a name gone from DNS) is drained
  first: routers see it leave and no new request goes there, while requests in flight
  finish;
- a drained destination still absent `remove_after_s` later is removed;
- a destination whose address changed (same id: a rescheduled pod) is added again at its
  new address (the planner replaces the address; its keys rewarm there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from router_client.plan import DestinationSpec


@dataclass(frozen=True, slots=True)
class DestinationEdit:
    add: list[DestinationSpec] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.add or self.drain or self.remove)


def reconcile(current: Iterable[DestinationSpec], desired: Iterable[DestinationSpec], *,
              drained_since: Mapping[str, float], now: float,
              remove_after_s: float = 60.0) -> DestinationEdit:
    """The edit that moves `current` (the planner's list) toward `desired` (the pool's);
    `drained_since` says when each draining destination was seen drained first."""
    have = {d.id: d for d in current}
    want = {d.id: d for d in desired}
    edit = DestinationEdit()
    for ident, d in want.items():
        held = have.get(ident)
        # (an entry without an address has no opinion on it: one set at run time stands)
        if held is None or held.draining or (d.address and held.address != d.address):
            edit.add.append(d)  # new, back in service, or at a new address
    for ident, held in have.items():
        if ident in want:
            continue
        if not held.draining:
            edit.drain.append(ident)
        elif now - drained_since.get(ident, now) >= remove_after_s:
            edit.remove.append(ident)
    return edit
