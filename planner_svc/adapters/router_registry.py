"""The fleet of routers as the planner sees it, read from the routers' own status keys.

Each router's Redis user may write exactly one key, ``{ns}:{plan}:router:<its id>``
(deploy/redis/users.acl.template), and nothing else: not the registry, not another
router's key, no scripts. Everything a router writes there is still untrusted: a router
credential in hostile hands can put any bytes of any size, any type, with or without a
TTL, into its key. So the planner

- finds the status keys itself (SCAN over the plan's slot), at most `MAX_ROUTERS` of them;
- reads a value only after its type, size and TTL are known to be a status's
  (`classify`), and deletes one that is not, so a bad write lasts one read at most;
- keeps a status only when it parses, names the router its key names, and carries
  plausible versions and times (`plausible`);
- writes the registry (``{ns}:{plan}:routers``, which routers read to count their peers)
  from what it kept, atomically, so nobody else can add, age out or retype its members.

`classify` and `plausible` are pure; `RouterRegistry` is the Redis shell around them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError

from cacheroute.v1 import plan_pb2
from router_client.layout import ROUTER_STATUS_TTL_S, Layout
from router_client.plan import MAX_EPOCH, MAX_SEQ

MAX_ROUTERS = 10_000
MAX_ROUTER_ID_CHARS = 128
# A status is a few hundred bytes; its one unbounded part lists unhealthy destinations.
MAX_STATUS_BYTES = 256 * 1024
MAX_UNHEALTHY = 10_000
# Routers write their key with a TTL of ROUTER_STATUS_TTL_S; a longer one (or none) is a
# key that would outlive its router, which only a hand-made write produces.
MAX_STATUS_TTL_MS = 20 * ROUTER_STATUS_TTL_S * 1000
# A router's clock may run a little ahead of the planner's.
MAX_FUTURE_MS = 60_000

_REPLACE_LUA = """
redis.call('DEL', KEYS[1])
for i = 1, #ARGV, 2 do redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1]) end
return #ARGV / 2
"""


@dataclasses.dataclass
class RegistryCounts:
    """What the registry threw away, by reason (exported as metrics by the planner)."""

    wrong_type: int = 0
    oversized: int = 0
    no_ttl: int = 0
    unparsable: int = 0
    implausible: int = 0
    bad_id: int = 0
    over_limit: int = 0

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))


def valid_router_id(router_id: str) -> bool:
    return (0 < len(router_id) <= MAX_ROUTER_ID_CHARS and router_id.isprintable()
            and not any(c in router_id for c in "*?[]\\ "))


def classify(kind: Any, size: Any, pttl_ms: Any) -> str:
    """Why a status key must go ("" if it may be read): from its TYPE, STRLEN and PTTL."""
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "none":
        return "gone"
    if kind != "string":
        return "wrong_type"
    if not isinstance(size, int) or size > MAX_STATUS_BYTES:
        return "oversized"
    if not isinstance(pttl_ms, int) or pttl_ms == -1 or pttl_ms > MAX_STATUS_TTL_MS:
        return "no_ttl"
    return "" if pttl_ms != -2 else "gone"


def plausible(status: plan_pb2.RouterStatus, router_id: str, now_ms: int) -> bool:
    """Whether a parsed status can be what the router `router_id` reported."""
    versions = (status.applied, status.last_rejected)
    return (status.router_id == router_id
            and all(v.epoch < MAX_EPOCH and v.seq < MAX_SEQ for v in versions)
            and 0 <= status.reported_at_ms <= now_ms + MAX_FUTURE_MS
            and 0 <= status.applied_at_ms <= now_ms + MAX_FUTURE_MS
            and len(status.unhealthy_destinations) <= MAX_UNHEALTHY
            and len(status.mode) <= 64)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RouterRegistry:
    """Reads the routers' status keys and keeps the registry that routers read."""

    def __init__(self, client: Any, layout: Layout) -> None:
        self._redis = client
        self.layout = layout
        self.counts = RegistryCounts()
        self._prefix = layout.router_status("")
        self._replace = client.register_script(_REPLACE_LUA)

    def _status_keys(self) -> list[bytes]:
        keys: list[bytes] = []
        for key in self._redis.scan_iter(match=_glob_escape(self._prefix) + "*", count=1000):
            if len(keys) >= MAX_ROUTERS:
                self.counts.over_limit += 1
                break
            keys.append(key)
        return keys

    def statuses(self, max_age_s: float = 60.0) -> list[plan_pb2.RouterStatus]:
        """Every router's status that is recent (within `max_age_s`) and well formed, one
        per router; the registry is rewritten from them."""
        now_ms = int(time.time() * 1000)
        keys = self._status_keys()
        readable = self._inspect(keys)
        out: list[plan_pb2.RouterStatus] = []
        if readable:
            for (key, router_id), raw in zip(readable, self._redis.mget([k for k, _ in readable]),
                                             strict=True):
                if raw is None:  # expired since it was inspected
                    continue
                status = self._parse(raw, router_id, now_ms)
                if status is None:
                    self._redis.delete(key)
                elif status.reported_at_ms >= now_ms - max_age_s * 1000:
                    out.append(status)
        self._write_registry(out)
        return out

    def _inspect(self, keys: list[bytes]) -> list[tuple[bytes, str]]:
        """The keys whose values may be read, each with its router id; deletes the rest."""
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
            pipe.strlen(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False) if keys else []
        readable, doomed = [], []
        for i, key in enumerate(keys):
            router_id = key[len(self._prefix):].decode("utf-8", "replace")
            reason = classify(*replies[3 * i: 3 * i + 3])
            if reason == "" and not valid_router_id(router_id):
                reason = "bad_id"
            if reason == "":
                readable.append((key, router_id))
            elif reason != "gone":
                setattr(self.counts, reason, getattr(self.counts, reason) + 1)
                doomed.append(key)
        if doomed:
            self._redis.delete(*doomed)
        return readable

    def _parse(self, raw: bytes, router_id: str, now_ms: int) -> plan_pb2.RouterStatus | None:
        if len(raw) > MAX_STATUS_BYTES:  # rewritten since it was inspected
            self.counts.oversized += 1
            return None
        status = plan_pb2.RouterStatus()
        try:
            status.ParseFromString(raw)
        except DecodeError:
            self.counts.unparsable += 1
            return None
        if not plausible(status, router_id, now_ms):
            self.counts.implausible += 1
            return None
        return status

    def _write_registry(self, statuses: Iterable[plan_pb2.RouterStatus]) -> None:
        args: list[Any] = []
        for s in statuses:
            args += [s.reported_at_ms, s.router_id]
        self._replace(keys=[self.layout.routers], args=args)
