"""Plans whose destination ids tell their versions apart, for history checks.

Version seq s names its destinations "g{s % GROUPS}-{j}" and moves every key's
set with s, so a decision names (up to the period GROUPS·R) the version it came
from: a decision that mixed two tables is allowed by neither of them.
"""

from __future__ import annotations

import functools

from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.routing import RoutingTable

GROUPS = 7
R = 5


def versioned_plan(seq: int, n_keys: int = 40, epoch: int = 1) -> RoutingPlan:
    """Keys k0..k{n-1}; every 5th key has k_b = 2; sets move with `seq`."""
    ids = [f"g{seq % GROUPS}-{j}" for j in range(R)]
    sets = [
        ((i + seq) % R,) if i % 5 else ((i + seq) % R, (i + seq + 1) % R) for i in range(n_keys)
    ]
    return RoutingPlan(
        config=PlanConfig(10.0, max(1, n_keys // R), n_keys),
        destinations=tuple(DestinationSpec(d) for d in ids),
        table=KeyTable.from_sets([f"k{i}" for i in range(n_keys)], sets, [1.0] * n_keys),
        version=Version(epoch, seq),
    )


def allowed(version: Version, key: str, planned: bool, n_keys: int = 40) -> frozenset[str]:
    """Destination ids `version` of an `n_keys` plan allows for `key`
    (see tests.faults.history.Allowed; bind n_keys with functools.partial)."""
    admitted = planned and int(key[1:]) < n_keys
    return _allowed(version.seq % (GROUPS * R), key, admitted)


@functools.cache
def _table(seq: int) -> RoutingTable:
    # n_keys only extends the key range: key i's set does not depend on it.
    return RoutingTable.from_plan(versioned_plan(seq, n_keys=2000))


@functools.cache
def _allowed(seq: int, key: str, admitted: bool) -> frozenset[str]:
    table = _table(seq)
    members = table.members_of(key) if admitted else ()
    ids = table.destination_ids
    return frozenset(ids[m] for m in members) if members else frozenset(ids)
