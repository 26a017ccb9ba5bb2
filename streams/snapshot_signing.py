"""Ed25519 signatures on the rate snapshots a worker publishes, checked by the planner.

Anyone who may produce to the snapshots topic could otherwise write a plausible window
and steer the plan. A worker signs each part with its private key; the planner holds only
the workers' public keys, so neither the planner nor a topic producer can forge a part.

Wire form (snapshot.proto, `RateSnapshot.key_id` / `.signature`): the part's bytes with
neither field set, then those two fields serialized after them. Protobuf merges the
appended fields into the message, so readers that do not verify parse it as before; a
verifier checks the signature over exactly the bytes that were signed, never over a
re-serialization.

Pure apart from the key-file helpers (`load_or_create_private_key`, `load_public_keys`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cacheroute.v1 import snapshot_pb2
from streams.errors import SnapshotError

# Signed bytes are prefixed with this, so a snapshot signature can never be taken for a
# signature over anything else made with the same key.
DOMAIN = b"cacheroute.v1.RateSnapshot\x00"


class SignatureError(SnapshotError):
    """A snapshot part without a valid signature by a configured worker key."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class SnapshotSigner:
    """Signs serialized `RateSnapshot` parts with one worker key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.key_id = key_id(private_key.public_key())

    def sign(self, part: bytes) -> bytes:
        """`part` (serialized without key_id/signature) followed by both fields."""
        trailer = snapshot_pb2.RateSnapshot(key_id=self.key_id,
                                            signature=self._key.sign(DOMAIN + part))
        return part + trailer.SerializeToString()


class SnapshotVerifier:
    """Parses a part and accepts it only when a pinned worker key signed it."""

    def __init__(self, public_keys: Iterable[Ed25519PublicKey]) -> None:
        self.keys: Mapping[str, Ed25519PublicKey] = {key_id(k): k for k in public_keys}

    def verify(self, raw: bytes) -> snapshot_pb2.RateSnapshot:
        """The parsed part; raises SignatureError (unsigned, unknown key, bad signature) or
        DecodeError (not a RateSnapshot)."""
        snap = snapshot_pb2.RateSnapshot.FromString(raw)
        if not snap.signature:
            raise SignatureError(f"unsigned snapshot part (worker {snap.worker_id!r})")
        key = self.keys.get(snap.key_id)
        if key is None:
            raise SignatureError(f"snapshot signed by key {snap.key_id[:32]!r}, which is not "
                                 "a configured worker key")
        trailer = snapshot_pb2.RateSnapshot(key_id=snap.key_id,
                                            signature=snap.signature).SerializeToString()
        if not raw.endswith(trailer):
            raise SignatureError("the signature fields are not the last bytes of the part")
        try:
            key.verify(snap.signature, DOMAIN + raw[:-len(trailer)])
        except InvalidSignature as exc:
            raise SignatureError(f"snapshot signature by {snap.key_id} does not verify") from exc
        return snap


def public_key_path(private_key_path: Path) -> Path:
    """Where the public half of a worker key is written: `name.pem` -> `name.pub.pem`."""
    return private_key_path.with_name(private_key_path.name.removesuffix(".pem") + ".pub.pem")


def load_or_create_private_key(path: Path) -> Ed25519PrivateKey:
    """The worker key at `path`; when missing, created (0600) with its public half beside
    it for the planner (`public_key_path`). A key given read-only (a mounted secret) is only
    read: its public half is the operator's to hand to the planner."""
    if not path.exists():
        _create(path)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def _create(path: Path) -> None:
    """Write a new key pair. The private file appears whole or not at all (written aside,
    then linked, never over an existing file), so workers sharing the path all end up
    with the first one made."""
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    try:
        os.link(aside, path)
    except FileExistsError:
        return  # another worker made it first: its key is the one
    finally:
        aside.unlink()
    public_key_path(path).write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def load_public_keys(paths: Iterable[str | Path]) -> list[Ed25519PublicKey]:
    """Worker public keys from PEM files (each may hold one key)."""
    keys = []
    for path in paths:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{path} does not hold an Ed25519 public key")
        keys.append(key)
    return keys


__all__ = ["DOMAIN", "SignatureError", "SnapshotSigner", "SnapshotVerifier",
           "key_id", "load_or_create_private_key", "load_public_keys", "public_key_path"]
