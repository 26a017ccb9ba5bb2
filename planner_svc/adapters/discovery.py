"""Destinations discovered instead of typed in (pure: a source's answer in, destinations out).

`cacheroute discover` keeps the planner's destination list equal to what a source says
(`planner_svc.orchestration.reconcile.reconcile` turns the difference into a gentle edit: new
destinations join the next plan, vanished ones drain, then go). Sources, and how each
answer becomes destinations:

- **a watched file** (`destinations_from_file`): JSON, a list of
  `{id, address, weight}` (or an object with a `destinations` list), or plain lines
  `id address [weight]` (`#` starts a comment). An operator or a config-management tool
  edits it; the sync re-reads it when it changes.
- **DNS** (`destinations_from_a` / `destinations_from_srv`): the addresses of a name (A and
  AAAA, one port for all) or its SRV records (each target with its own port; the record's
  weight is the capacity weight relative to the mean). Ids are `host:port`, so a
  destination keeps its id (and its keys) while it stays in the answer.
- **Kubernetes**: an InferencePool's ready pods (`pool_spec`, `pool_destinations`) or the
  ready endpoints of a Service's EndpointSlices (`destinations_from_endpoint_slices`).
  Objects are the API's JSON (camelCase), as `kubectl get -o json` or the client's raw
  responses give them. An InferencePool (`inference.networking.k8s.io/v1`) names its
  model-server pods by a label selector and the port they serve on; a pod is a destination
  while it is Running, Ready and not being deleted, with an IP: id = the pod's name,
  address = `http://<pod IP>:<target port>`.

Every parser refuses bad input with `InvalidRequest` naming the entry; the sync then keeps
the planner's list as it is (a typo in the file must not drain the fleet).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planner_svc.errors import InvalidRequest
from router_client.plan import DestinationSpec

MAX_DESTINATIONS = 4096  # a source naming more is refused, not truncated
MAX_ID_BYTES = 253  # a DNS name's length: ids are host:port or pod names
MAX_FILE_BYTES = 4 << 20


def _url(host: str, port: int, scheme: str = "http") -> str:
    host = host.rstrip(".")
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _checked(out: list[DestinationSpec], what: str) -> list[DestinationSpec]:
    ids = [d.id for d in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InvalidRequest(f"{what}: destination ids repeat: {', '.join(dup[:5])}")
    if len(out) > MAX_DESTINATIONS:
        raise InvalidRequest(f"{what}: {len(out)} destinations (at most {MAX_DESTINATIONS})")
    return sorted(out, key=lambda d: d.id)


def _destination(ident: Any, address: Any, weight: Any, where: str) -> DestinationSpec:
    if not isinstance(ident, str) or not ident or len(ident.encode()) > MAX_ID_BYTES + 6 \
            or any(c.isspace() for c in ident):
        raise InvalidRequest(f"{where}: id {ident!r} must be a non-empty word")
    if not isinstance(address, str) or not address.startswith(("http://", "https://")):
        raise InvalidRequest(f"{where}: address {address!r} must be an http(s) URL")
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{where}: weight {weight!r} is not a number") from None
    if not (math.isfinite(w) and w > 0):
        raise InvalidRequest(f"{where}: weight {weight!r} must be > 0")
    return DestinationSpec(ident, address, w)


def destinations_from_file(text: str, name: str = "file") -> list[DestinationSpec]:
    """A destinations file's text (JSON, or `id address [weight]` lines)."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise InvalidRequest(f"{name}: larger than {MAX_FILE_BYTES >> 20} MiB")
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"{name}: not valid JSON: {exc}") from None
        if isinstance(data, Mapping):
            data = data.get("destinations")
        if not isinstance(data, list):
            raise InvalidRequest(f"{name}: expected a list of destinations")
        out = []
        for i, entry in enumerate(data):
            if not isinstance(entry, Mapping):
                raise InvalidRequest(f"{name}: entry {i} is not a mapping")
            out.append(_destination(entry.get("id"), entry.get("address"),
                                    entry.get("weight", 1.0), f"{name}: entry {i}"))
        return _checked(out, name)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise InvalidRequest(f"{name}:{n}: expected 'id address [weight]'")
        out.append(_destination(words[0], words[1], words[2] if len(words) == 3 else 1.0,
                                f"{name}:{n}"))
    return _checked(out, name)


def destinations_from_a(addresses: Iterable[str], port: int, name: str) -> list[DestinationSpec]:
    """A name's A/AAAA answer: one destination per address, all on `port`."""
    if not 0 < port < 65536:
        raise InvalidRequest(f"{name}: port {port} is not a port")
    hosts = sorted(set(addresses))
    return _checked([DestinationSpec(f"{h}:{port}", _url(h, port)) for h in hosts], name)


def destinations_from_srv(records: Iterable[tuple[int, int, int, str]],
                          name: str) -> list[DestinationSpec]:
    """A name's SRV answer as (priority, weight, port, target): the records of the best
    (lowest) priority, as SRV's clients use them; weights relative to their mean (a
    weight of 0 everywhere means equal)."""
    recs = [r for r in records if 0 < r[2] < 65536 and r[3].rstrip(".")]
    if not recs:
        return []
    best = min(r[0] for r in recs)
    recs = [r for r in recs if r[0] == best]
    mean = sum(r[1] for r in recs) / len(recs)
    out = [DestinationSpec(f"{t.rstrip('.')}:{port}", _url(t, port),
                           (w / mean) if mean > 0 and w > 0 else 1.0)
           for _, w, port, t in recs]
    return _checked(out, name)


def _endpoint_ready(ep: Mapping[str, Any]) -> bool:
    cond = ep.get("conditions") or {}
    # Absent `ready` means ready (the API's documented default); terminating ones leave.
    return cond.get("ready", True) is not False and not cond.get("terminating", False)


def destinations_from_endpoint_slices(slices: Iterable[Mapping[str, Any]], port_name: str,
                                      name: str) -> list[DestinationSpec]:
    """A Service's EndpointSlices (discovery.k8s.io/v1 JSON): its ready endpoints on the
    port named `port_name` ("" = the slice's only port). Id: the pod's name when the
    endpoint names one (`targetRef`), else `address:port`."""
    out: dict[str, DestinationSpec] = {}
    for s in slices:
        ports = [p for p in s.get("ports") or [] if isinstance(p, Mapping)]
        chosen = [p for p in ports if (p.get("name") or "") == port_name] if port_name \
            else ports
        if len(chosen) != 1 or not isinstance(chosen[0].get("port"), int):
            continue  # this slice does not carry the port (another address family, say)
        port = int(chosen[0]["port"])
        for ep in s.get("endpoints") or []:
            if not isinstance(ep, Mapping) or not _endpoint_ready(ep):
                continue
            addresses = [a for a in ep.get("addresses") or [] if isinstance(a, str)]
            if not addresses:
                continue
            ref = ep.get("targetRef") or {}
            ident = str(ref.get("name") or f"{addresses[0]}:{port}")
            out[ident] = DestinationSpec(ident, _url(addresses[0], port))
    return _checked(list(out.values()), name)


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
