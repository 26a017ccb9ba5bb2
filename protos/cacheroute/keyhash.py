"""The one 64-bit fingerprint of routing keys, for the libraries on both sides of the wire:
routers match plan keys by it when they edit a lookup (`router_client.rebase`), the stream
interns event keys by it (`streams.wire`). Both check every match byte for byte, so a
collision costs speed, never correctness. Hand-written beside the generated code, like
`keyblob`: both libraries import it, and neither may import the other."""

from __future__ import annotations

import numpy as np


def fingerprints(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A multiply-xorshift hash of each key's byte length and of its bytes as zero-padded
    little-endian uint64 words (`words`: one row per key). Only the words a key reaches are
    mixed in, so its fingerprint does not depend on how long the other keys of its batch
    are (a router compares fingerprints of two different plans' blobs)."""
    fp = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for w in range(words.shape[1]):
            mixed = (fp ^ words[:, w]) * np.uint64(0xBF58476D1CE4E5B9)
            mixed ^= mixed >> np.uint64(31)
            reached = lengths > 8 * w
            fp = mixed if reached.all() else np.where(reached, mixed, fp)  # (the common case)
    return fp
