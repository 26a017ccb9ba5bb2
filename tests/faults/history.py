"""Router histories and the checker that validates them afterwards (pure).

Each router in a test records what it applied (`RouterHistory.on_applied`, the
client's `on_applied` hook) and samples of its decisions (`RouterHistory.route`:
the table before and after the call, and the answer). Afterwards
`check_history` tells what broke, as a list of readable violations:

- applied versions strictly increase (so none is applied twice);
- every applied version was published, with the digest that was published,
  and was valid (only versions in `published` count);
- the router reached the final version;
- every sampled decision is allowed by the table before or the table after it
  (a decision that mixes two versions is allowed by neither).

Histories are plain data (`to_dict`/`from_dict`) so router processes can hand
them back as JSON. Times are wall-clock milliseconds (one machine, one clock).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from router_client.plan import Version

# (version, key, planned) -> destination ids allowed for that key by that version:
# its set T(b) when planned and admitted, else every destination of the plan.
Allowed = Callable[[Version, str, bool], Collection[str]]


class _Table(Protocol):
    version: Version
    digest: bytes


class _Router(Protocol):
    core: Any

    def route(self, key: str) -> str: ...


@dataclass(frozen=True)
class AppliedRecord:
    version: Version
    digest: bytes
    at_ms: float


@dataclass(frozen=True)
class DecisionSample:
    key: str
    destination: str
    before: Version | None
    after: Version | None
    planned: bool  # the router was in planned mode before and after the call


@dataclass
class RouterHistory:
    router_id: str
    applied: list[AppliedRecord] = field(default_factory=list)
    decisions: list[DecisionSample] = field(default_factory=list)

    def on_applied(self, table: _Table, kind: str = "") -> None:
        """The router client's `on_applied` hook."""
        self.applied.append(AppliedRecord(table.version, bytes(table.digest), time.time() * 1000))

    def route(self, client: _Router, key: str) -> str:
        """Route `key` with `client` and keep the sample."""
        core = client.core
        before, mode_before = core.table, core.mode
        dest = client.route(key)
        after, mode_after = core.table, core.mode
        planned = mode_before == mode_after == "planned"
        self.decisions.append(DecisionSample(key, dest, _v(before), _v(after), planned))
        return dest

    @property
    def last_version(self) -> Version | None:
        return self.applied[-1].version if self.applied else None

    def wait_for(self, version: Version, timeout_s: float = 5.0) -> bool:
        """Until the hook has recorded `version` (or a later one). The client swaps its table
        in before it calls the hook, so `client.version` can be ahead of the history."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            last = self.last_version
            if last is not None and last >= version:
                return True
            time.sleep(0.01)
        return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "router_id": self.router_id,
            "applied": [
                [a.version.epoch, a.version.seq, a.digest.hex(), a.at_ms] for a in self.applied
            ],
            "decisions": [
                [d.key, d.destination, _pair(d.before), _pair(d.after), d.planned]
                for d in self.decisions
            ],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RouterHistory:
        applied = [
            AppliedRecord(Version(e, s), bytes.fromhex(d), t) for e, s, d, t in raw["applied"]
        ]
        decisions = [
            DecisionSample(k, dest, _unpair(b), _unpair(a), p)
            for k, dest, b, a, p in raw["decisions"]
        ]
        return cls(raw["router_id"], applied, decisions)


def _v(table: _Table | None) -> Version | None:
    return None if table is None else table.version


def _pair(v: Version | None) -> list[int] | None:
    return None if v is None else [v.epoch, v.seq]


def _unpair(p: list[int] | None) -> Version | None:
    return None if p is None else Version(p[0], p[1])


def check_history(
    h: RouterHistory,
    *,
    published: Mapping[Version, bytes],
    final: Version | None,
    allowed: Allowed | None = None,
) -> list[str]:
    """Violations in one router's history (empty: it holds). See the module docstring."""
    out = [f"{h.router_id}: {v}" for v in _applied_violations(h.applied, published)]
    if final is not None and h.last_version != final:
        out.append(f"{h.router_id}: ended on {h.last_version}, not the final {final}")
    if allowed is not None:
        out += [f"{h.router_id}: {v}" for v in _decision_violations(h.decisions, allowed)]
    return out


def check_histories(histories: Iterable[RouterHistory], **kw: Any) -> list[str]:
    return [v for h in histories for v in check_history(h, **kw)]


def _applied_violations(
    applied: list[AppliedRecord], published: Mapping[Version, bytes]
) -> Iterable[str]:
    for prev, cur in itertools.pairwise(applied):
        if cur.version <= prev.version:
            yield f"applied {cur.version} after {prev.version} (not strictly increasing)"
    for a in applied:
        digest = published.get(a.version)
        if digest is None:
            yield f"applied {a.version}, which was never published as a valid plan"
        elif a.digest and digest and a.digest != digest:
            got, want = a.digest.hex()[:12], digest.hex()[:12]
            yield f"applied {a.version} with digest {got}, published {want}"


def _decision_violations(samples: list[DecisionSample], allowed: Allowed) -> Iterable[str]:
    for d in samples:
        if d.before is None or d.after is None:
            continue  # no plan yet: power of two choices over the known fleet
        versions = {d.before, d.after}
        if not any(d.destination in allowed(v, d.key, d.planned) for v in versions):
            yield f"{d.key} -> {d.destination} allowed by neither {d.before} nor {d.after}"


def propagation_delays_ms(
    h: RouterHistory, published_at_ms: Mapping[Version, float]
) -> list[float]:
    """For each published version: when this router first held it or a newer one,
    minus when it was published (versions never reached are left out)."""
    delays, i = [], 0
    applied = h.applied
    for v, t in sorted(published_at_ms.items()):
        while i < len(applied) and applied[i].version < v:
            i += 1
        if i < len(applied):
            delays.append(max(0.0, applied[i].at_ms - t))
    return delays


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(histories: Iterable[RouterHistory]) -> dict[str, Any]:
    hs = list(histories)
    return {
        "routers": len(hs),
        "applied": sum(len(h.applied) for h in hs),
        "samples": sum(len(h.decisions) for h in hs),
    }


__all__ = [
    "Allowed",
    "AppliedRecord",
    "DecisionSample",
    "RouterHistory",
    "check_histories",
    "check_history",
    "percentile",
    "propagation_delays_ms",
    "summary",
]
