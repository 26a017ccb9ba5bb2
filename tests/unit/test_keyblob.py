"""The one key-column codec of both wire formats (plans and snapshots), and how each
library reports a malformed blob."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheroute.keyblob import decode_keys, encode_keys
from router_client.errors import PlanRejected
from router_client.plan import decode_keys as plan_keys
from streams.columns import decode_keys as snapshot_keys
from streams.errors import SnapshotError

KEYS = st.lists(st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
                        max_size=20), max_size=50)


@given(KEYS)
def test_round_trip_in_both_libraries(keys):
    blob = encode_keys(keys)
    assert decode_keys(blob) == plan_keys(blob) == snapshot_keys(blob) == keys


@pytest.mark.parametrize("blob", [b"no terminator", b"\xff\xfe\0"])
def test_malformed_blobs_are_each_librarys_own_error(blob):
    with pytest.raises(ValueError):
        decode_keys(blob)
    with pytest.raises(PlanRejected):
        plan_keys(blob)
    with pytest.raises(SnapshotError):
        snapshot_keys(blob)


def test_a_key_fingerprint_does_not_depend_on_the_other_keys_of_its_batch():
    """The one fingerprint both libraries use: a key hashes alike in a batch of short keys
    and in one with a long key (its zero padding is not mixed in)."""
    import numpy as np

    from cacheroute.keyhash import fingerprints

    def fp(keys: list[bytes]) -> list[int]:
        width = max(-(-len(k) // 8) for k in keys)
        words = np.zeros((len(keys), width * 8), np.uint8)
        for i, k in enumerate(keys):
            words[i, :len(k)] = np.frombuffer(k, np.uint8)
        lengths = np.array([len(k) for k in keys], np.int64)
        return fingerprints(words.view("<u8"), lengths).tolist()

    short = fp([b"tenant-1", b"t2"])
    mixed = fp([b"tenant-1", b"t2", b"a-much-longer-key-that-spans-several-words"])
    assert mixed[:2] == short
    assert len(set(mixed)) == 3
    assert fp([b"ab"]) != fp([b"ab\0"])  # the length counts, not only the padded bytes
