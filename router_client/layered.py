"""A lookup as a shared base dict plus a small overlay of changes (pure).

Applying a delta used to copy the whole 100k-key dict (~1 ms of CPU, the
largest part of a delta apply) so that the table being replaced stays intact
for concurrent `route` calls. A `LayeredLookup` instead shares the base dict
with the previous table and holds only what changed since it: key -> new set,
or key -> None for a key the plan dropped. `RouterCore` routes through the two
layers directly; the client flattens a layered table into one dict a little
after the apply (`flatten`), off the fleet's apply burst, so the overlay stays
about one delta long and routing is back on the single-dict path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Union

Members = Union[int, tuple[int, ...]]  # noqa: UP007 - used at runtime as an alias


class LayeredLookup(Mapping[str, Members]):
    """`overlay` over `base`; an overlay value None hides the base key. Neither
    layer may change after construction (tables are immutable)."""

    __slots__ = ("_len", "base", "overlay", "removed")

    def __init__(self, base: dict[str, Members], overlay: dict[str, Members | None],
                 removed: frozenset[str] | None = None) -> None:
        """`removed`, if given, must be the overlay keys whose value is None (the
        caller often knows it; finding it costs a Python loop over the overlay)."""
        if removed is None:
            removed = frozenset(k for k, v in overlay.items() if v is None)
        self.base = base
        self.overlay = overlay
        self.removed = removed
        self._len = -1  # counted on first use: it needs a base probe per overlay key

    def __getitem__(self, key: str) -> Members:
        value = self.overlay.get(key, self.base.get(key))
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        value = self.overlay.get(key, self.base.get(key))
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self.overlay.get(key, self.base.get(key)) is not None  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[str]:
        overlay = self.overlay
        for key in self.base:
            if key not in overlay or overlay[key] is not None:
                yield key
        for key, value in overlay.items():
            if value is not None and key not in self.base:
                yield key

    def __len__(self) -> int:
        if self._len < 0:
            # Every overlay key either replaces a base key or adds one, except the
            # removed ones, which add nothing. `overlay.keys() & base.keys()` loops
            # over the smaller view in C (a `-` would loop over the whole base).
            base, overlay = self.base, self.overlay
            self._len = len(base) + len(overlay) - len(overlay.keys() & base.keys()) - len(
                self.removed)
        return self._len

    def flatten(self) -> dict[str, Members]:
        """One plain dict with the same content."""
        flat = dict(self.base)  # a C-level copy of the hash table
        for key, value in self.overlay.items():
            if value is None:
                flat.pop(key, None)
            else:
                flat[key] = value
        return flat


def layer(lookup: Mapping[str, Members], removed: list[str],
          upserted: dict[str, Members]) -> LayeredLookup:
    """`lookup` without the `removed` keys and with `upserted` written, sharing
    its base dict: only the overlay is copied."""
    if isinstance(lookup, LayeredLookup):
        base, overlay, gone = lookup.base, dict(lookup.overlay), lookup.removed
    else:
        base = lookup if isinstance(lookup, dict) else dict(lookup)
        overlay, gone = {}, frozenset()
    overlay.update(dict.fromkeys(removed))
    overlay.update(upserted)
    return LayeredLookup(base, overlay, (gone | frozenset(removed)) - upserted.keys())


def flat(lookup: Mapping[str, Members]) -> dict[str, Members]:
    """A new plain dict with the content of `lookup` (a C-level copy where possible)."""
    if isinstance(lookup, LayeredLookup):
        return lookup.flatten()
    return dict(lookup)
