"""The planner's destinations kept in step with a Gateway API Inference Extension pool
(pure: API objects in, an edit of the destination list out).

An InferencePool (`inference.networking.k8s.io/v1`) names its model-server pods by a
label selector and the port they serve on. A pod is a destination while it is Running,
Ready and not being deleted, with an IP: id = the pod's name, address =
`http://<pod IP>:<target port>`. `reconcile` turns the difference between the planner's
list and the pool's into the UpdateConfig edit that moves the planner there gently:

- a new ready pod is added (a draining one that came back is added again);
- a pod that left or stopped being ready is drained first: routers see it leave and no
  new request goes there, while requests in flight finish;
- a drained pod still absent `remove_after_s` later is removed;
- a pod whose IP changed (same name: rescheduled) is added again at its new address
  (the planner replaces the address; its keys rewarm there).

Objects are the API's JSON (camelCase), as `kubectl get -o json` or the client's raw
responses give them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from planner_svc.errors import InvalidRequest
from router_client.plan import DestinationSpec


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    selector: dict[str, str]
    port: int

    @property
    def label_selector(self) -> str:
        """The selector in the API's query syntax (`a=b,c=d`)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


def pool_spec(obj: Mapping[str, Any]) -> PoolSpec:
    """Read an InferencePool object; InvalidRequest says what is missing or wrong."""
    name = str(obj.get("metadata", {}).get("name", "?"))
    spec = obj.get("spec")
    if obj.get("kind") not in (None, "InferencePool") or not isinstance(spec, Mapping):
        raise InvalidRequest(f"{name}: not an InferencePool with a spec")
    labels = spec.get("selector", {}).get("matchLabels") if isinstance(
        spec.get("selector"), Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        raise InvalidRequest(f"InferencePool {name}: spec.selector.matchLabels is empty")
    ports = spec.get("targetPorts")
    if not isinstance(ports, list) or len(ports) != 1 or not isinstance(ports[0], Mapping):
        raise InvalidRequest(f"InferencePool {name}: spec.targetPorts must list one port")
    number = ports[0].get("number")
    if not isinstance(number, int) or not 0 < number < 65536:
        raise InvalidRequest(f"InferencePool {name}: target port {number!r} is not a port")
    return PoolSpec(name, {str(k): str(v) for k, v in labels.items()}, number)


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def pool_destinations(spec: PoolSpec, pods: Iterable[Mapping[str, Any]]) -> list[DestinationSpec]:
    """The pool's ready pods that carry its labels, as destinations, by name."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if not (meta.get("name") and ip and _ready(pod)):
            continue
        if any(labels.get(k) != v for k, v in spec.selector.items()):
            continue  # the API filtered by selector already; a stale cache may not have
        host = f"[{ip}]" if ":" in ip else ip
        out.append(DestinationSpec(str(meta["name"]), f"http://{host}:{spec.port}"))
    return sorted(out, key=lambda d: d.id)


@dataclass(frozen=True, slots=True)
class PoolEdit:
    add: list[DestinationSpec] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.add or self.drain or self.remove)


def reconcile(current: Iterable[DestinationSpec], desired: Iterable[DestinationSpec], *,
              drained_since: Mapping[str, float], now: float,
              remove_after_s: float = 60.0) -> PoolEdit:
    """The edit that moves `current` (the planner's list) toward `desired` (the pool's);
    `drained_since` says when each draining destination was seen drained first."""
    have = {d.id: d for d in current}
    want = {d.id: d for d in desired}
    edit = PoolEdit()
    for ident, d in want.items():
        held = have.get(ident)
        if held is None or held.draining or held.address != d.address:
            edit.add.append(d)  # new, back in service, or at a new address
    for ident, held in have.items():
        if ident in want:
            continue
        if not held.draining:
            edit.drain.append(ident)
        elif now - drained_since.get(ident, now) >= remove_after_s:
            edit.remove.append(ident)
    return edit
