"""Bad plans, each broken in one way, and a raw writer that puts one in Redis.

`bad_blobs` returns SignedBlob bytes for one plan broken every way a router must
refuse: the corrupt ones fail verification, the rest are properly signed by the
planner's own key (an insider or a planner bug) and must fail the plan checks.
`install_raw` bypasses the planner's install script: it writes a blob, moves the
pointer to it and publishes a notification, as a compromised writer could.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cacheroute.v1 import plan_pb2
from router_client import signing
from router_client.layout import Layout, Pointer, version_member
from router_client.plan import RoutingPlan, Version, plan_to_pb

# kind -> the PlanRejected reason a router reports for it
EXPECTED_REASON = {
    "truncated": "malformed",
    "digest_mismatch": "digest_mismatch",
    "bad_signature": "bad_signature",
    "unknown_key": "unknown_key",
    "unknown_schema": "unknown_schema",
    "no_destinations": "no_destinations",
    "unknown_destination": "unknown_destination",
    "duplicate_key": "duplicate_key",
    "oversize": "oversize",
}


def _signed(pb: plan_pb2.RoutingPlan, key: Ed25519PrivateKey) -> bytes:
    return signing.sign_blob(pb.SerializeToString(), signing.PLAN, key)


def _reblob(blob: bytes, **changes: Any) -> bytes:
    pb = plan_pb2.SignedBlob.FromString(blob)
    for name, value in changes.items():
        setattr(pb, name, value)
    return pb.SerializeToString()


def bad_blobs(plan: RoutingPlan, key: Ed25519PrivateKey, oversize_bytes: int) -> dict[str, bytes]:
    """One broken SignedBlob per kind in `EXPECTED_REASON` (plan: >= 2 keys, >= 2 dests)."""
    good = _signed(plan_to_pb(plan), key)
    sb = plan_pb2.SignedBlob.FromString(good)
    out = {
        "truncated": good[: len(good) // 2],
        "digest_mismatch": _reblob(good, payload=bytes(sb.payload) + b"\x00"),
        "bad_signature": _reblob(good, signature=bytes(64)),
        "unknown_key": _signed(plan_to_pb(plan), signing.generate_private_key()),
    }
    schema = plan_to_pb(plan)
    schema.schema = 99
    no_dest = plan_to_pb(plan)
    del no_dest.destinations[:]
    no_dest.table.Clear()
    unknown = plan_to_pb(plan)
    members = bytearray(unknown.table.members_u32le)
    members[0:4] = (len(plan.destinations) + 7).to_bytes(4, "little")
    unknown.table.members_u32le = bytes(members)
    dup = plan_to_pb(plan)
    first, second = plan.table.keys[0], plan.table.keys[1]
    dup.table.keys = bytes(dup.table.keys).replace(
        second.encode() + b"\0", first.encode() + b"\0", 1
    )
    big = plan_to_pb(plan)
    big.config.built_by = "x" * oversize_bytes
    out.update(
        unknown_schema=_signed(schema, key),
        no_destinations=_signed(no_dest, key),
        unknown_destination=_signed(unknown, key),
        duplicate_key=_signed(dup, key),
        oversize=_signed(big, key),
    )
    return out


def declared_digest(blob: bytes) -> bytes:
    """The digest a blob claims (or SHA-256 of the bytes when it does not parse)."""
    try:
        return bytes(plan_pb2.SignedBlob.FromString(blob).digest) or hashlib.sha256(blob).digest()
    except Exception:
        return hashlib.sha256(blob).digest()


def install_raw(r: Any, layout: Layout, version: Version, blob: bytes) -> Pointer:
    """Write `blob` as `version`, point `current` at it and notify (no checks at all)."""
    pointer = Pointer(version, declared_digest(blob))
    note = plan_pb2.PlanNotification(
        version=plan_pb2.PlanVersion(epoch=version.epoch, seq=version.seq), digest=pointer.digest
    ).SerializeToString()
    pipe = r.pipeline(transaction=True)
    pipe.set(layout.plan(version), blob)
    pipe.delete(layout.delta(version))
    pipe.set(layout.digest(version), pointer.digest.hex())
    pipe.zadd(layout.versions, {version_member(version): 0})
    pipe.set(layout.current, pointer.encode())
    pipe.publish(layout.channel, note)
    pipe.execute()
    return pointer
