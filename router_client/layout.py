"""The Redis key layout shared by the planner's publisher and the routers.

Every key carries the hash tag ``{plan}`` so that all of them live in one
Redis Cluster slot: the install script touches several keys atomically, and a
Lua script may only do that inside one slot. The namespace (``cacheroute`` by
default) is configuration, so several fleets can share one Redis.

=========================================  =======  ===========================================
key                                        type     value
=========================================  =======  ===========================================
``{ns}:{plan}:current``                    string   ``"<member> <digest hex>"`` of the installed
                                                    version (the current-version pointer)
``{ns}:{plan}:versions``                   zset     retained versions; every score is 0 and the
                                                    member is the version as 32 hex digits
                                                    (epoch, seq), so lexical order = version order
``{ns}:{plan}:v:<member>:plan``            string   ``SignedBlob`` (kind PLAN) of the full plan
``{ns}:{plan}:v:<member>:delta``           string   ``SignedBlob`` (kind DELTA) from the version
                                                    installed just before it (absent for the first)
``{ns}:{plan}:v:<member>:digest``          string   SHA-256 hex of the plan payload: the script
                                                    refuses to reuse a version for other bytes
``{ns}:{plan}:staged:<member>:<digest>:*``  string   a plan / delta blob uploaded ahead of its
                                                    install (TTL); the install renames it into place
``{ns}:{plan}:router:<router id>``         string   ``RouterStatus`` of one router, with a TTL
``{ns}:{plan}:routers``                    zset     router ids scored by last report (ms): the
                                                    planner writes it from the status keys it
                                                    found and validated; routers read it
``{ns}:{plan}:notify``                     channel  ``PlanNotification`` (version + digest): a hint
``{ns}:{plan}:history``                    channel  where routers placed conversations (JSON;
                                                    router_client.shared_history)
=========================================  =======  ===========================================

Routers read the pointer with GET, a plan with GET, and a chain of deltas
(every retained version after the one they hold) with ZRANGEBYLEX over the versions
index, then one MGET of the deltas. Routers run no scripts (their ACL forbids it); a
delta trimmed between the two reads makes them fetch the full plan instead.

Write order inside the install script: blobs, digest, version index, then the
pointer, then PUBLISH; so no reader ever sees a pointer to a missing plan.
Trimming never removes the version the pointer names.

This module is pure (no Redis import): names only.
"""

from __future__ import annotations

from dataclasses import dataclass

from router_client.plan import Version

DEFAULT_NAMESPACE = "cacheroute"
# Routers re-write their status key every re-check; the TTL lets a dead router vanish.
ROUTER_STATUS_TTL_S = 15


def version_member(v: Version) -> str:
    """The zset member / key part of a version: fixed-width hex, lexically ordered."""
    if v.epoch < 0 or v.seq < 0 or v.epoch >= 1 << 64 or v.seq >= 1 << 64:
        raise ValueError(f"version {v} out of range")
    return f"{v.epoch:016x}{v.seq:016x}"


def parse_member(member: str | bytes) -> Version:
    text = member.decode() if isinstance(member, bytes) else member
    if len(text) != 32:
        raise ValueError(f"not a version member: {text!r}")
    return Version(int(text[:16], 16), int(text[16:], 16))


@dataclass(frozen=True, slots=True)
class Pointer:
    """What the current-version key holds."""

    version: Version
    digest: bytes

    def encode(self) -> str:
        return f"{version_member(self.version)} {self.digest.hex()}"

    @classmethod
    def decode(cls, raw: str | bytes) -> Pointer:
        text = raw.decode() if isinstance(raw, bytes) else raw
        member, _, digest_hex = text.partition(" ")
        return cls(parse_member(member), bytes.fromhex(digest_hex))


@dataclass(frozen=True, slots=True)
class Layout:
    """Key names for one namespace."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{{plan}}:"

    @property
    def current(self) -> str:
        return self.prefix + "current"

    @property
    def versions(self) -> str:
        return self.prefix + "versions"

    @property
    def channel(self) -> str:
        return self.prefix + "notify"

    @property
    def history_channel(self) -> str:
        """Where a plan's routers tell each other where conversations went."""
        return self.prefix + "history"

    @property
    def routers(self) -> str:
        return self.prefix + "routers"

    def version_prefix(self) -> str:
        """Keys of version m are this + m + ':plan' / ':delta' / ':digest'."""
        return self.prefix + "v:"

    def plan(self, v: Version) -> str:
        return f"{self.version_prefix()}{version_member(v)}:plan"

    def delta(self, v: Version) -> str:
        return f"{self.version_prefix()}{version_member(v)}:delta"

    def digest(self, v: Version) -> str:
        return f"{self.version_prefix()}{version_member(v)}:digest"

    def staged(self, v: Version, digest: bytes, part: str) -> str:
        """Where the publisher uploads `part` ("plan" or "delta") of an install ahead
        of it; the digest keeps two candidate plans of one version apart."""
        return f"{self.prefix}staged:{version_member(v)}:{digest.hex()[:16]}:{part}"

    @property
    def leader(self) -> str:
        """The planners' leader lease: "<term> <holder id>", with a TTL (one slot with the
        plan keys, so the install script can check it)."""
        return self.prefix + "leader"

    @property
    def leader_term(self) -> str:
        return self.prefix + "leader:term"

    def router_status(self, router_id: str) -> str:
        return f"{self.prefix}router:{router_id}"
