"""Install a full plan by editing the held lookup instead of building a new one (pure).

Building the lookup of a 100k-key plan from scratch costs ~30 ms of CPU on a
small machine: a str object, a hash and a dict insert per key, most of it cache
misses. Consecutive plans share almost every key and set, so a router that holds
a table applies a full plan as an edit of it:

    lookup' = copy(lookup)            one C-level copy of the hash table (~1 ms)
              - keys that left        a str only for those
              + keys added or moved   a str only for those

What changed is found in numpy, by comparing the new plan's key columns with those
of the *base*: the last full plan the held table was built from (`PlanKeys`).
Deltas applied since then are accounted for by the keys they touched: such a key
is always rewritten from the new plan, or dropped if the new plan lacks it.

Keys are matched by position when the key blobs are identical (the common case),
else by a 64-bit fingerprint of their first 64 bytes and length; every match is
then checked byte for byte, so a fingerprint collision costs speed, never
correctness. Sets are compared by destination *id*, in order. The result must hold
exactly as many keys as the plan; anything unexpected returns None and the caller
builds the table from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cacheroute import keyhash
from router_client.plan import PlanKeys

_PREFIX_WORDS = 8  # fingerprints read the first 64 bytes of a key
_MAX_TOUCHED_BLOBS = 256  # deltas since the base; beyond that, rebuild from scratch
_CHUNK_KEYS = 8192  # keys fingerprinted per numpy pass


@dataclass(frozen=True)
class Edit:
    """How to turn the held lookup into the new plan's: drop `drop`, then write
    `keys` with their sets (CSR over the new plan's destination indices)."""

    drop: list[str]
    keys: list[str]
    set_offsets: np.ndarray
    members: np.ndarray


def spans(keys: PlanKeys) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) byte offsets of each key in the blob (end: its NUL); cached."""
    if "spans" not in keys.derived:
        keys.derived["spans"] = (_starts(keys.key_ends), keys.key_ends)
    return keys.derived["spans"]


def sorted_fingerprints(keys: PlanKeys) -> tuple[np.ndarray, np.ndarray]:
    """(fingerprints in ascending order, the key index of each); cached."""
    if "sorted" not in keys.derived:
        start, end = spans(keys)
        fp = fingerprints(keys.blob, start, end)
        order = np.argsort(fp, kind="stable")
        keys.derived["sorted"] = (fp[order], order)
    return keys.derived["sorted"]


def _spans(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    end = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)
    return _starts(end), end


def _starts(end: np.ndarray) -> np.ndarray:
    """Where each key starts, from where each one ends (its NUL)."""
    start = np.empty_like(end)
    start[:1] = 0
    start[1:] = end[:-1] + 1
    return start


def _prefix_words(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The first 64 bytes of each key, zero-padded, as uint64 words (n x up to 8)."""
    lengths = end - start
    width = min(_PREFIX_WORDS, max(1, -(-int(lengths.max(initial=0)) // 8)))
    column = np.arange(width * 8)
    padded = buf[np.minimum(start[:, None] + column, buf.size - 1)]
    padded[column >= lengths[:, None]] = 0
    return padded.view("<u8")


def fingerprints(blob: bytes, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A 64-bit multiply-xorshift hash of each key's length and first 64 bytes."""
    if start.size <= _CHUNK_KEYS:
        return _fingerprints(blob, start, end)
    # In chunks: the byte gather of 100k keys at once would take ~30 MB of temporaries,
    # which a router's tuned malloc keeps mapped afterwards.
    return np.concatenate([
        _fingerprints(blob, start[i:i + _CHUNK_KEYS], end[i:i + _CHUNK_KEYS])
        for i in range(0, start.size, _CHUNK_KEYS)
    ])


def _fingerprints(blob: bytes, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    if not start.size:
        return np.zeros(0, dtype=np.uint64)
    words = _prefix_words(np.frombuffer(blob, np.uint8), start, end)
    return keyhash.fingerprints(words, end - start)


def prepare(keys: PlanKeys) -> None:
    """Compute what editing onto `keys` needs, ahead of time. A router calls this
    a little after installing a full plan, off the fleet's apply burst; otherwise
    the next edit computes it (~10-15 ms for 100k keys)."""
    sorted_fingerprints(keys)


def plan_edit(base: PlanKeys, touched: Sequence[bytes], new: PlanKeys) -> Edit | None:
    """The edit from a lookup holding `base` plus deltas (whose touched keys are in
    the `touched` key blobs) to plan `new`; None: rebuild from scratch instead.
    The caller checks that the edited lookup holds exactly `len(new)` keys."""
    if len(touched) > _MAX_TOUCHED_BLOBS:
        return None
    match = _match_keys(base, new)
    matched = match >= 0
    same = matched.copy()
    same[matched] = _same_sets(base, match[matched], new, np.flatnonzero(matched))
    touched_blob = b"".join(touched)
    if touched_blob:
        # A key a delta touched may hold another value than in `base`: rewrite it.
        in_base = _rows_in(base, touched_blob)
        base_touched = np.zeros(len(base), dtype=bool)
        base_touched[in_base[in_base >= 0]] = True
        same[matched] &= ~base_touched[match[matched]]
    rewrite = np.flatnonzero(~same)
    new_start, new_end = spans(new)
    keys = _key_strings(new.blob, new_start[rewrite], new_end[rewrite])
    kept = np.zeros(len(base), dtype=bool)
    kept[match[matched]] = True
    b_start, b_end = spans(base)
    gone = np.flatnonzero(~kept)
    drop = _key_strings(base.blob, b_start[gone], b_end[gone])
    if touched_blob:
        # Keys that deltas added or changed and the new plan lacks. A touched key the
        # new plan has is among `keys`: it matched a touched base row or no base row.
        written = set(keys)
        drop += [k for k in touched_blob.decode("utf-8").split("\0")[:-1] if k not in written]
    offsets, members = _subset(new.set_offsets, new.members, rewrite)
    return Edit(drop, keys, offsets, members)


def _rows_in(base: PlanKeys, blob: bytes) -> np.ndarray:
    """For each key of the (small) key blob `blob`, its row in `base`, or -1."""
    start, end = _spans(blob)
    base_fp, order = sorted_fingerprints(base)
    rows = np.full(start.size, -1, dtype=np.int64)
    if not base_fp.size or not start.size:
        return rows
    fp = fingerprints(blob, start, end)
    pos = np.minimum(np.searchsorted(base_fp, fp), base_fp.size - 1)
    cand = np.flatnonzero(base_fp[pos] == fp)
    rows[cand] = order[pos[cand]]
    ok = _same_bytes(blob, start[cand], end[cand], base, rows[cand])
    for i in cand[~ok].tolist():
        # a fingerprint shared by several base keys (they sit side by side in the
        # sorted order): compare with each
        rows[i] = -1
        b_start, b_end = spans(base)
        p = int(pos[i])
        while p < base_fp.size and base_fp[p] == fp[i]:
            row = int(order[p])
            if blob[start[i]:end[i]] == base.blob[b_start[row]:b_end[row]]:
                rows[i] = row
                break
            p += 1
    return rows


def _same_bytes(blob: bytes, start: np.ndarray, end: np.ndarray, base: PlanKeys,
                rows: np.ndarray) -> np.ndarray:
    """Whether blob[start[i]:end[i]] equals base key rows[i], byte for byte."""
    if not rows.size:
        return np.zeros(0, dtype=bool)
    b_start, b_end = spans(base)
    bs, be = b_start[rows], b_end[rows]
    ok = (end - start) == (be - bs)
    buf, base_buf = np.frombuffer(blob, np.uint8), np.frombuffer(base.blob, np.uint8)
    for i in range(0, rows.size, _CHUNK_KEYS):  # in chunks: see `fingerprints`
        part = slice(i, i + _CHUNK_KEYS)
        ok[part] &= np.all(_prefix_words(buf, start[part], end[part])
                           == _prefix_words(base_buf, bs[part], be[part]), axis=-1)
    for k in np.flatnonzero(ok & ((end - start) > 8 * _PREFIX_WORDS)).tolist():
        ok[k] = blob[start[k]:end[k]] == base.blob[bs[k]:be[k]]  # the tail past 64 bytes
    return ok


def _match_keys(base: PlanKeys, new: PlanKeys) -> np.ndarray:
    """For each key of `new`, the index of the identical key of `base`, or -1."""
    n = len(new)
    if n == len(base) and new.blob == base.blob:
        return np.arange(n)
    if not n or not len(base):
        return np.full(n, -1, dtype=np.int64)
    start, end = spans(new)
    fp = fingerprints(new.blob, start, end)
    base_fp, order = sorted_fingerprints(base)
    pos = np.minimum(np.searchsorted(base_fp, fp), base_fp.size - 1)
    match = np.where(base_fp[pos] == fp, order[pos], -1)
    cand = np.flatnonzero(match >= 0)
    # a miss here (a fingerprint collision) only makes the key a rewrite
    match[cand[~_same_bytes(new.blob, start[cand], end[cand], base, match[cand])]] = -1
    return match


def _same_sets(base: PlanKeys, b_rows: np.ndarray, new: PlanKeys, n_rows: np.ndarray) -> np.ndarray:
    """Whether base key b_rows[i] and new key n_rows[i] name the same destinations
    (by id, in order)."""
    if (base.destination_ids == new.destination_ids and np.array_equal(b_rows, n_rows)
            and b_rows.size == len(base) == len(new)
            and np.array_equal(base.set_offsets, new.set_offsets)):
        # Same keys, same set sizes, same destinations: compare the member columns.
        differs = np.flatnonzero(base.members != new.members)
        same = np.ones(b_rows.size, dtype=bool)
        same[np.searchsorted(new.set_offsets, differs, side="right") - 1] = False
        return same
    position = {d: i for i, d in enumerate(new.destination_ids)}
    to_new = np.array([position.get(d, -1) for d in base.destination_ids], dtype=np.int64)
    b_off = base.set_offsets.astype(np.int64)
    n_off = new.set_offsets.astype(np.int64)
    b_size = b_off[b_rows + 1] - b_off[b_rows]
    n_size = n_off[n_rows + 1] - n_off[n_rows]
    same = b_size == n_size
    rows = np.flatnonzero(same)
    if not rows.size:
        return same
    sizes = n_size[rows]
    total = int(sizes.sum())
    within = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    b_members = to_new[base.members[np.repeat(b_off[b_rows[rows]], sizes) + within]]
    n_members = new.members[np.repeat(n_off[n_rows[rows]], sizes) + within].astype(np.int64)
    differs = np.repeat(np.arange(rows.size), sizes)[b_members != n_members]
    same[rows[np.unique(differs)]] = False
    return same


def _subset(set_offsets: np.ndarray, members: np.ndarray,
            rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR sets of `rows` only."""
    off = set_offsets.astype(np.int64)
    sizes = off[rows + 1] - off[rows]
    out = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    within = np.arange(int(out[-1])) - np.repeat(out[:-1], sizes)
    return out, members[np.repeat(off[rows], sizes) + within]


def _key_strings(blob: bytes, start: np.ndarray, end: np.ndarray) -> list[str]:
    """Keys by byte span, decoded one by one (only edited keys come here)."""
    return [blob[a:b].decode("utf-8") for a, b in zip(start.tolist(), end.tolist(), strict=True)]
