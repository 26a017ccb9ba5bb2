"""Plan signatures (router_client.signing)."""

from __future__ import annotations

import pytest

from cacheroute.v1 import plan_pb2
from router_client import signing
from router_client.errors import PlanRejected


@pytest.fixture(scope="module")
def key():
    return signing.generate_private_key()


def test_sign_then_verify_returns_kind_payload_and_digest(key):
    raw = signing.sign_blob(b"payload", signing.PLAN, key)
    kind, payload, digest = signing.verify_blob(raw, signing.pin([key.public_key()]))
    assert (kind, payload) == (signing.PLAN, b"payload")
    assert signing.verify_blob(raw, [key.public_key()])[1] == b"payload"  # a plain list works
    import hashlib

    assert digest == hashlib.sha256(b"payload").digest()


def _reason(raw, keys, max_bytes=1 << 20):
    with pytest.raises(PlanRejected) as err:
        signing.verify_blob(raw, keys, max_bytes)
    return err.value.reason


def test_every_kind_of_bad_blob_is_rejected_with_its_reason(key):
    keys = signing.pin([key.public_key()])
    good = signing.sign_blob(b"x" * 100, signing.DELTA, key)
    assert _reason(good, keys, max_bytes=50) == "oversize"
    assert _reason(b"\xff\xff\xff", keys) == "malformed"
    blob = plan_pb2.SignedBlob.FromString(good)
    blob.payload = b"y" * 100
    assert _reason(blob.SerializeToString(), keys) == "digest_mismatch"
    blob = plan_pb2.SignedBlob.FromString(good)
    blob.signature = bytes(64)
    assert _reason(blob.SerializeToString(), keys) == "bad_signature"
    other = signing.generate_private_key()
    assert _reason(signing.sign_blob(b"x", signing.PLAN, other), keys) == "unknown_key"
    # A blob re-signed by another key but claiming the pinned key id still fails.
    forged = plan_pb2.SignedBlob.FromString(signing.sign_blob(b"x", signing.PLAN, other))
    forged.key_id = signing.key_id(key.public_key())
    assert _reason(forged.SerializeToString(), keys) == "bad_signature"


def test_pem_round_trip(tmp_path, key):
    signing.save_private_key(key, tmp_path / "k.pem")
    signing.save_public_key(key.public_key(), tmp_path / "k.pub")
    loaded = signing.load_private_key(tmp_path / "k.pem")
    pub = signing.load_public_key(tmp_path / "k.pub")
    assert signing.key_id(pub) == signing.key_id(key.public_key())
    raw = signing.sign_blob(b"p", signing.PLAN, loaded)
    assert signing.verify_blob(raw, signing.pin([pub]))[1] == b"p"
    assert (tmp_path / "k.pem").stat().st_mode & 0o077 == 0
