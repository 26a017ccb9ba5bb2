"""Publish signed, versioned plans to Redis for the routers (the planner's side).

The key layout is `router_client.layout` (one Cluster slot, hash tag ``{plan}``).
`install` writes the signed plan, the signed delta from the previous plan, the
version index and the current-version pointer, and PUBLISHes a small
notification, all in ONE Lua script, so the step is atomic on the server.
`stage` may upload the blobs beforehand (keys with a TTL); the script then
renames them into place, so the atomic step sends and blocks Redis for no
megabytes and the routers' clock starts with the pointer move. In that step:

- the pointer never moves backwards (two planners cannot regress it);
- a version number is never reused for different bytes;
- re-installing the very same version and bytes is a no-op (safe retries);
- no reader ever sees the pointer name a version whose blobs are missing;
- the last `retain` versions are kept; older ones are trimmed in the same step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cacheroute.v1 import plan_pb2
from planner_svc.adapters.router_registry import RouterRegistry
from planner_svc.errors import (
    CorruptPointer,
    NotLeader,
    PublishError,
    Unavailable,
    VersionConflict,
    VersionRegression,
)
from router_client import signing
from router_client.delta import make_delta
from router_client.layout import DEFAULT_NAMESPACE, Layout, Pointer, parse_member, version_member
from router_client.plan import RoutingPlan, Version, decode_plan, encode_plan
from router_client.redis_source import connect
from router_client.redis_topology import parse_redis_url

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["PlanPublisher", "PublishError", "VersionConflict", "VersionRegression"]


class _NotStaged(Exception):
    """A staged install's blobs are no longer in Redis."""


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    version: Version
    digest: bytes


@dataclass(frozen=True, slots=True)
class PreparedInstall:
    """Signed blobs ready to install (see `PlanPublisher.prepare`)."""

    version: Version
    digest: bytes
    plan_blob: bytes
    delta_blob: bytes  # b"" when there is no usable base
    staged: bool = False  # the blobs wait in Redis under Layout.staged keys


STAGED_TTL_S = 600

# KEYS: current, versions, plan, delta, digest, staged plan, staged delta, leader lease
# ARGV: member, digest hex, plan blob, delta blob ('' = none), notification,
#       channel, retain, version key prefix, '1' = take the blobs from the staged keys
#       (then ARGV[3] is '' and ARGV[4] is 'delta' when a delta was staged too),
#       the lease value this planner holds ('' = no leader election),
#       'PUBLISH' or (Redis Cluster) 'SPUBLISH': the notify channel carries the {plan}
#       hash tag, so a sharded publish reaches the routers subscribed on this slot's node
# The lease check is the fence: it runs in the same atomic script as the install, so a
# planner whose lease lapsed (paused, partitioned, deposed) can never install, even with
# a write already in flight.
_INSTALL_LUA = """
if ARGV[10] ~= '' and redis.call('GET', KEYS[8]) ~= ARGV[10] then
  return redis.error_reply('CRNOTLEADER')
end
local member, digest = ARGV[1], ARGV[2]
local cur = redis.call('GET', KEYS[1])
-- a pointer that is not ours (tampered, junk) does not hold versions back
if cur and not string.find(cur, '^' .. string.rep('%x', 32) .. ' ') then cur = nil end
if cur then
  local cur_member = string.sub(cur, 1, 32)
  if member < cur_member then
    return redis.error_reply('CRBACKWARDS ' .. cur_member)
  end
  if member == cur_member then
    if string.sub(cur, 34) == digest then return 0 end
    return redis.error_reply('CRCONFLICT ' .. cur_member)
  end
end
local old = redis.call('GET', KEYS[5])
if old and old ~= digest then
  return redis.error_reply('CRCONFLICT ' .. member)
end
if ARGV[9] == '1' then
  if redis.call('EXISTS', KEYS[6]) == 0 then return redis.error_reply('CRNOTSTAGED') end
  if ARGV[4] == 'delta' and redis.call('EXISTS', KEYS[7]) == 0 then
    return redis.error_reply('CRNOTSTAGED')
  end
  redis.call('RENAME', KEYS[6], KEYS[3])
  redis.call('PERSIST', KEYS[3])
  if ARGV[4] == 'delta' then
    if redis.call('EXISTS', KEYS[7]) == 0 then return redis.error_reply('CRNOTSTAGED') end
    redis.call('RENAME', KEYS[7], KEYS[4])
    redis.call('PERSIST', KEYS[4])
  end
else
  redis.call('SET', KEYS[3], ARGV[3])
  if ARGV[4] ~= '' then redis.call('SET', KEYS[4], ARGV[4]) end
end
redis.call('SET', KEYS[5], digest)
redis.call('ZADD', KEYS[2], 0, member)
redis.call('SET', KEYS[1], member .. ' ' .. digest)
redis.call(ARGV[11], ARGV[6], ARGV[5])
local retain = tonumber(ARGV[7])
local n = redis.call('ZCARD', KEYS[2])
if n > retain then
  local gone = redis.call('ZRANGE', KEYS[2], 0, n - retain - 1)
  for _, m in ipairs(gone) do
    if m ~= member then
      local k = ARGV[8] .. m
      redis.call('DEL', k .. ':plan', k .. ':delta', k .. ':digest')
      redis.call('ZREM', KEYS[2], m)
    end
  end
end
return 1
"""


# Acquire or renew the leader lease. KEYS: lease, term counter. ARGV: holder id, lease ms,
# the value held ('' = acquire). A new holder gets the next term: "<term> <holder id>".
_LEASE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[3] ~= '' and cur == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return cur
  end
  return false
end
if ARGV[3] ~= '' then return false end
local value = redis.call('INCR', KEYS[2]) .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""

# Give the lease up at shutdown (only if still ours), so the standby need not wait it out.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# What the install fence holds while this planner is a standby: never a lease's value.
STANDBY_FENCE = "standby"


# Redis answering "not now": a cluster slot migrating (TRYAGAIN, a redirect redis-py gave
# up on), a cluster or a primary down, a write reaching a demoted primary (READONLY).
_MOVING = (redis.exceptions.TryAgainError, redis.exceptions.ClusterError,
           redis.exceptions.AskError, redis.exceptions.ReadOnlyError,
           redis.exceptions.RedisClusterException)


def _outage_is_unavailable(fn: F) -> F:
    """Redis being unreachable is `Unavailable` to the planner (and UNAVAILABLE to callers
    of its API, which retry it), never an internal error."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        except _MOVING as exc:
            raise Unavailable(f"Redis is reconfiguring: {exc}") from exc
    return wrapped  # type: ignore[return-value]


class PlanPublisher:
    """Writes plans for routers; every method is one or a few Redis round trips."""

    def __init__(
        self,
        redis_url: str,
        private_key: Ed25519PrivateKey,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        retain: int = 50,
        lease_namespace: str = "",
        **redis_options: Any,
    ) -> None:
        """`lease_namespace`: where the leader lease lives ("" = `namespace`). A planner
        running several pools (router_client.pools) holds one lease for all of them, in
        its own namespace; every pool's install is fenced by it. All namespaces share the
        `{plan}` hash tag, so the lease is in the install script's slot either way."""
        if retain < 2:
            raise ValueError("retain must keep at least 2 versions (the current and its base)")
        options = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0, **redis_options}
        options["decode_responses"] = False  # blobs are bytes
        self._redis: Any = connect(redis_url, **options)
        self._publish_command = ("SPUBLISH" if parse_redis_url(redis_url).sharded_pubsub
                                 else "PUBLISH")
        self._key = private_key
        self._keys = signing.pin([private_key.public_key()])
        self.layout = Layout(namespace)
        self._lease_layout = Layout(lease_namespace or namespace)
        self.retain = retain
        self.junk_index_members = 0  # versions-index members that are not versions
        self._install = self._redis.register_script(_INSTALL_LUA)
        self._lease = self._redis.register_script(_LEASE_LUA)
        self._release = self._redis.register_script(_RELEASE_LUA)
        self._registry = RouterRegistry(self._redis, self.layout)
        # The leader lease value installs must match ('' = no leader election).
        self.fence = ""

    # --- the leader lease (planner_svc.orchestration.leadership) ----------------------

    @_outage_is_unavailable
    def acquire_lease(self, holder: str, lease_ms: int, held: str) -> str | None:
        """Renew `held`, or (held == "") acquire a free lease; the lease value, or None
        when another planner holds it or `held` lapsed."""
        value = self._lease(keys=[self._lease_layout.leader, self._lease_layout.leader_term],
                            args=[holder, lease_ms, held])
        return value.decode() if isinstance(value, bytes) else None

    @_outage_is_unavailable
    def release_lease(self, held: str) -> None:
        self._release(keys=[self._lease_layout.leader], args=[held])

    @_outage_is_unavailable
    def lease_holder(self) -> str:
        """The current lease value ("" when none): "<term> <holder id>"."""
        value = self._redis.get(self._lease_layout.leader)
        return value.decode(errors="replace") if value else ""

    @_outage_is_unavailable
    def install(self, plan: RoutingPlan, previous: RoutingPlan | None) -> PublishedVersion:
        """Publish `plan` (its version set by the caller) with a delta from `previous`.

        Raises VersionRegression if the pointer is already past `plan.version`, and
        VersionConflict if that version was installed with other bytes. Installing
        the same version with the same bytes again is a no-op.
        """
        return self.commit(self.prepare(plan, previous))

    @_outage_is_unavailable
    def prepare(self, plan: RoutingPlan, previous: RoutingPlan | None) -> PreparedInstall:
        """The CPU half of `install` (encode, sign, delta): no write yet."""
        payload = encode_plan(plan)
        plan_blob = signing.sign_blob(payload, signing.PLAN, self._key)
        digest = _digest_of(plan_blob)
        delta_blob = self._delta_blob(plan, previous, digest) if previous is not None else b""
        return PreparedInstall(plan.version, digest, plan_blob, delta_blob)

    @_outage_is_unavailable
    def stage(self, prepared: PreparedInstall) -> PreparedInstall:
        """Upload the blobs ahead of `commit` (one round trip; they expire unless
        committed within STAGED_TTL_S). Returns the install to commit."""
        v, lay = prepared.version, self.layout
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(lay.staged(v, prepared.digest, "plan"), prepared.plan_blob, ex=STAGED_TTL_S)
        if prepared.delta_blob:
            pipe.set(lay.staged(v, prepared.digest, "delta"), prepared.delta_blob,
                     ex=STAGED_TTL_S)
        pipe.execute()
        return dataclasses.replace(prepared, staged=True)

    @_outage_is_unavailable
    def commit(self, prepared: PreparedInstall) -> PublishedVersion:
        """The atomic half of `install`: one Lua script call. A staged install whose
        blobs are gone (expired, evicted) is committed with the blobs inline."""
        try:
            self._commit(prepared)
        except _NotStaged:
            self._commit(dataclasses.replace(prepared, staged=False))
        return PublishedVersion(prepared.version, prepared.digest)

    def _commit(self, prepared: PreparedInstall) -> None:
        v, digest = prepared.version, prepared.digest
        note = plan_pb2.PlanNotification(
            version=plan_pb2.PlanVersion(epoch=v.epoch, seq=v.seq), digest=digest
        ).SerializeToString()
        lay = self.layout
        keys = [lay.current, lay.versions, lay.plan(v), lay.delta(v), lay.digest(v),
                lay.staged(v, digest, "plan"), lay.staged(v, digest, "delta"),
                self._lease_layout.leader]
        inline = not prepared.staged
        args = [
            version_member(v),
            digest.hex(),
            prepared.plan_blob if inline else b"",
            prepared.delta_blob if inline else (b"delta" if prepared.delta_blob else b""),
            note,
            lay.channel,
            self.retain,
            lay.version_prefix(),
            "0" if inline else "1",
            self.fence,
            self._publish_command,
        ]
        try:
            self._install(keys=keys, args=args)
        except _MOVING as exc:  # a slot migrating or a failover under way: retry later
            raise Unavailable(f"Redis is reconfiguring: {exc}") from exc
        except redis.ResponseError as exc:
            if str(exc).startswith("CRNOTSTAGED"):
                raise _NotStaged from exc
            raise _translate(exc, v) from exc

    def _delta_blob(self, plan: RoutingPlan, previous: RoutingPlan, digest: bytes) -> bytes:
        if previous.version >= plan.version:
            raise VersionRegression(f"previous {previous.version} is not older than {plan.version}")
        base_digest = self._stored_digest(previous.version)
        if base_digest is None:  # base no longer retained: routers will fetch the full plan
            return b""
        delta = make_delta(previous, plan, base_digest, digest)
        return signing.sign_blob(delta.SerializeToString(), signing.DELTA, self._key)

    def _stored_digest(self, v: Version) -> bytes | None:
        raw = self._redis.get(self.layout.digest(v))
        return bytes.fromhex(raw.decode()) if raw else None

    def current(self) -> PublishedVersion | None:
        """The pointer; CorruptPointer if the key holds junk or names a plan not stored."""
        raw = self._call(self._redis.get, self.layout.current)
        if raw is None:
            return None
        try:
            p = Pointer.decode(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptPointer(f"the current pointer is not a pointer: {bytes(raw)[:64]!r}") \
                from exc
        if not self._call(self._redis.exists, self.layout.plan(p.version)):
            raise CorruptPointer(f"the current pointer names {p.version}, which is not stored")
        return PublishedVersion(p.version, p.digest)

    def clear_corrupt_pointer(self) -> bool:
        """Delete the pointer if (and only if) it is still corrupt, so the next install sets
        it afresh (the install script refuses to move a pointer backwards, and a junk one
        naming version 1.2^64-1 would refuse every install forever). WATCH makes the check
        and the delete one step against a concurrent valid install."""
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(self.layout.current)
                try:
                    self.current()
                    return False  # valid again
                except CorruptPointer:
                    pass
                pipe.multi()
                pipe.delete(self.layout.current)
                pipe.execute()
                return True
            except redis.WatchError:
                return False
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise Unavailable(f"Redis is unreachable: {exc}") from exc

    def _call(self, fn: Any, *args: Any) -> Any:
        """Redis being unreachable is Unavailable to the planner (and UNAVAILABLE to
        callers of its API), never an internal error."""
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc

    @_outage_is_unavailable
    def load(self, version: Version) -> RoutingPlan:
        """The retained plan of `version`, verified; KeyError if it is not retained."""
        return self.decode_signed(self.signed_plan(version))

    @_outage_is_unavailable
    def signed_plan(self, version: Version) -> bytes:
        """The stored SignedBlob bytes of `version` (what routers fetch); KeyError if gone."""
        raw = self._redis.get(self.layout.plan(version))
        if raw is None:
            raise KeyError(f"plan version {version} is not retained")
        return bytes(raw)

    def decode_signed(self, blob: bytes) -> RoutingPlan:
        """Verify a SignedBlob of ours (e.g. from the durable history) and decode its plan."""
        _kind, payload, _digest = signing.verify_blob(blob, self._keys)
        return decode_plan(payload)

    def list_versions(self) -> list[Version]:
        """Retained versions, oldest first (members that are not versions are skipped: the
        index must not become unreadable because of one bad write)."""
        out = []
        for m in self._call(self._redis.zrange, self.layout.versions, 0, -1):
            try:
                out.append(parse_member(m))
            except (ValueError, UnicodeDecodeError):
                self.junk_index_members += 1
        return out

    @_outage_is_unavailable
    def router_statuses(self, max_age_s: float = 60.0) -> list[plan_pb2.RouterStatus]:
        """The status each router reported recently, validated (router_registry)."""
        return self._registry.statuses(max_age_s)

    @property
    def junk_router_statuses(self) -> int:
        """Status keys thrown away as malformed (skipped and deleted)."""
        return self._registry.counts.total

    @_outage_is_unavailable
    def fleet_view(self, stale_after_s: float = 5.0) -> list[RouterSync]:
        """Each recently reporting router with its sync state against the current pointer."""
        cur = self.current()
        now_ms = int(time.time() * 1000)
        current = cur.version if cur is not None else Version()
        return [sync_state(s, current, now_ms, stale_after_s) for s in self.router_statuses()]

    def ping(self) -> bool:
        return bool(self._redis.ping())

    def close(self) -> None:
        self._redis.close()


IN_SYNC = "in_sync"
STALE = "stale"
REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class RouterSync:
    router_id: str
    state: str  # IN_SYNC, STALE or REJECTED
    applied: Version
    report_age_s: float
    last_rejection: str
    mode: str


def sync_state(
    status: plan_pb2.RouterStatus, current: Version, now_ms: int, stale_after_s: float
) -> RouterSync:
    """Classify one router (pure): rejected the current version, behind it, or on it."""
    applied = Version(status.applied.epoch, status.applied.seq)
    rejected = Version(status.last_rejected.epoch, status.last_rejected.seq)
    age_s = max(0.0, (now_ms - status.reported_at_ms) / 1000)
    if rejected == current and applied < current:
        state = REJECTED
    elif applied < current or age_s > stale_after_s:
        state = STALE
    else:
        state = IN_SYNC
    return RouterSync(status.router_id, state, applied, age_s, status.last_rejection, status.mode)


def _digest_of(blob: bytes) -> bytes:
    pb = plan_pb2.SignedBlob()
    pb.ParseFromString(blob)
    return bytes(pb.digest)


def _translate(exc: redis.ResponseError, v: Version) -> PublishError | NotLeader:
    text = str(exc)
    if "CRNOTLEADER" in text:
        return NotLeader(f"not installing {v}: this planner does not hold the leader lease")
    if "CRBACKWARDS" in text:
        held = parse_member(text.split("CRBACKWARDS ")[1][:32])
        return VersionRegression(f"refused to move the plan pointer back from {held} to {v}")
    if "CRCONFLICT" in text:
        return VersionConflict(f"version {v} was already installed with different bytes")
    return PublishError(f"install of {v} failed: {text}")
