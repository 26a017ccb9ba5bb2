"""Signed snapshot parts (streams.snapshot_signing), no servers."""

from __future__ import annotations

import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cacheroute.v1 import snapshot_pb2
from streams.snapshot_signing import (
    SignatureError,
    SnapshotSigner,
    SnapshotVerifier,
    load_or_create_private_key,
    load_public_keys,
    public_key_path,
)


def part() -> bytes:
    s = snapshot_pb2.RateSnapshot(window_start_ms=0, window_end_ms=10_000, source_partition=1,
                                  partition_count=2, part_index=0, part_count=1, worker_id="w")
    s.keys.rate_per_s.extend([1.5, 2.5])
    return s.SerializeToString()


def test_a_signed_part_verifies_and_parses_like_the_unsigned_one():
    key = Ed25519PrivateKey.generate()
    signed = SnapshotSigner(key).sign(part())
    snap = SnapshotVerifier([key.public_key()]).verify(signed)
    assert list(snap.keys.rate_per_s) == [1.5, 2.5] and snap.source_partition == 1
    plain = snapshot_pb2.RateSnapshot.FromString(signed)  # readers that do not verify
    assert plain.worker_id == "w" and plain.key_id == SnapshotSigner(key).key_id


@pytest.mark.parametrize("forge", ["unsigned", "rogue_key", "tampered", "moved_trailer"])
def test_a_forged_part_is_refused(forge):
    key = Ed25519PrivateKey.generate()
    verifier = SnapshotVerifier([key.public_key()])
    signed = SnapshotSigner(key).sign(part())
    raw = {
        "unsigned": part(),
        "rogue_key": SnapshotSigner(Ed25519PrivateKey.generate()).sign(part()),
        # one byte of the signed body changed (a rate's last byte)
        "tampered": signed[:len(part()) - 1] + b"\x41" + signed[len(part()):],
        # the signature fields first, then more fields: merged the same, signed bytes not
        "moved_trailer": signed[len(part()):] + part(),
    }[forge]
    with pytest.raises(SignatureError):
        verifier.verify(raw)


def test_no_configured_key_refuses_every_part():
    key = Ed25519PrivateKey.generate()
    with pytest.raises(SignatureError):
        SnapshotVerifier([]).verify(SnapshotSigner(key).sign(part()))


def test_the_worker_key_is_created_once_private_with_its_public_half(tmp_path):
    path = tmp_path / "keys" / "snapshot-signing-key.pem"
    key = load_or_create_private_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_private_key(path)
    assert SnapshotSigner(again).key_id == SnapshotSigner(key).key_id
    (pub,) = load_public_keys([public_key_path(path)])
    assert SnapshotVerifier([pub]).verify(SnapshotSigner(key).sign(part()))
