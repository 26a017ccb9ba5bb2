"""Ed25519 signatures over plan payloads: routers pin the planner's public key.

Write access to Redis therefore cannot inject routes: a router accepts a blob
only if its SHA-256 matches and its signature verifies under a pinned key.

Pure apart from the two file helpers (`save_*`/`load_*`), which read and write
PEM files the operator hands over.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from cacheroute.v1 import plan_pb2
from router_client.errors import PlanRejected
from router_client.plan import MAX_PLAN_BYTES

PLAN = plan_pb2.SignedBlob.PLAN
DELTA = plan_pb2.SignedBlob.DELTA

PublicKeys = Mapping[str, Ed25519PublicKey]


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw public key: names the key in blobs."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def pin(keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """The `public_keys` mapping `verify_blob` wants (key id -> key)."""
    return {key_id(k): k for k in keys}


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created 0600 from the first byte (never world-readable, not even for an instant),
    # and never over an existing file.
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def save_public_key(key: Ed25519PublicKey, path: str | Path) -> None:
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    Path(path).write_bytes(pem)


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(Path(path).read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} does not hold an Ed25519 public key")
    return key


def sign_blob(payload: bytes, kind: int, private_key: Ed25519PrivateKey) -> bytes:
    """Serialized `SignedBlob`: payload, its SHA-256, and the signature over the digest."""
    digest = hashlib.sha256(payload).digest()
    blob = plan_pb2.SignedBlob(
        payload=payload,
        digest=digest,
        signature=private_key.sign(digest),
        key_id=key_id(private_key.public_key()),
        kind=kind,  # type: ignore[arg-type]
    )
    return blob.SerializeToString()


def verify_blob(
    raw: bytes,
    public_keys: PublicKeys | Iterable[Ed25519PublicKey],
    max_bytes: int = MAX_PLAN_BYTES,
) -> tuple[int, bytes, bytes]:
    """Check size, digest and signature; return (kind, payload, digest) or raise PlanRejected.

    `public_keys`: the pinned keys, as `pin(...)` returns them (key id -> key) or
    as a plain list of public keys.
    """
    if not isinstance(public_keys, Mapping):
        public_keys = pin(public_keys)
    if len(raw) > max_bytes:
        raise PlanRejected("oversize", f"blob of {len(raw)} bytes exceeds {max_bytes}")
    blob = plan_pb2.SignedBlob()
    try:
        blob.ParseFromString(raw)
    except DecodeError as exc:
        raise PlanRejected("malformed", f"signed blob does not parse: {exc}") from exc
    if blob.kind not in (PLAN, DELTA):
        raise PlanRejected("malformed", f"signed blob has unknown kind {blob.kind}")
    digest = hashlib.sha256(blob.payload).digest()
    if digest != blob.digest:
        raise PlanRejected("digest_mismatch", "payload does not match its SHA-256")
    key = public_keys.get(blob.key_id)
    if key is None:
        raise PlanRejected("unknown_key", f"signed by key {blob.key_id!r}, which is not pinned")
    try:
        key.verify(blob.signature, digest)
    except InvalidSignature as exc:
        raise PlanRejected("bad_signature", f"signature by {blob.key_id} does not verify") from exc
    return int(blob.kind), bytes(blob.payload), digest
