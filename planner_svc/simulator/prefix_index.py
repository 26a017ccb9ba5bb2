"""What one router believes each destination has cached: a prefix index over content (pure).

Reactive cache-aware routers (SGLang `cache_aware`, llm-d's prefix scorer, Preble) keep a
tree of the prompts they sent where, and route a new prompt to the destination holding its
longest prefix. They learn only from their own traffic and never see an eviction: a tree
is trimmed by its own LRU rule, not by what the engine dropped (baselines.md).

The index works on the simulator's content chains (`kvcache.Chain`: `(segment, blocks)`
pairs; the arena's text is 1-block segments of chained hashes), so a router matches
exactly the content the engines cache, across keys too (a shared system prompt, a
document). A segment is identified under its parent, as in the engine's cache. Work per
request is a dictionary step per segment.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from planner_svc.simulator.kvcache import Chain

_ROOT = -1


class PrefixIndex:
    """Per destination: which segments (under their parent) it was sent, how many blocks
    of each, least recently sent first."""

    def __init__(self, n_destinations: int) -> None:
        self.n = n_destinations
        self._held: dict[tuple[int, int], dict[int, int]] = {}  # node -> destination -> blocks
        self._lru: list[OrderedDict[tuple[int, int], None]] = [
            OrderedDict() for _ in range(n_destinations)]
        self.blocks = [0] * n_destinations  # what each destination's tree holds

    def match(self, chain: Chain, limit_blocks: int | None = None) -> list[int]:
        """Blocks of `chain`'s prefix each destination holds (the first `limit_blocks` at
        most: a length-only trace's shared part)."""
        matched = [0] * self.n
        alive = list(range(self.n))
        parent, budget = _ROOT, limit_blocks
        for seg, count in chain:
            if budget is not None:
                count = min(count, budget)
                budget -= count
            held = self._held.get((parent, seg))
            if not held or count <= 0:
                break
            still = []
            for d in alive:
                h = held.get(d, 0)
                if h >= count:
                    matched[d] += count
                    still.append(d)
                else:
                    matched[d] += h
            if not still:
                break
            alive, parent = still, seg
        return matched

    def insert(self, chain: Chain, d: int) -> None:
        """`d` now holds all of `chain` (the router sent it the whole prompt)."""
        lru, parent = self._lru[d], _ROOT
        path = []
        for seg, count in chain:
            if count <= 0:  # nothing of it is a block: nothing to hold (nor to match)
                break
            node = (parent, seg)
            held = self._held.setdefault(node, {})
            old = held.get(d, 0)
            if count > old:
                held[d] = count
                self.blocks[d] += count - old
            path.append(node)
            parent = seg
        # Deepest first, so a prefix is always more recent than what extends it: trimming
        # takes leaves before the prefixes they hang from, as SGLang's tree evicts leaves.
        for node in reversed(path):
            if node in lru:
                lru.move_to_end(node)
            else:
                lru[node] = None

    def trim(self, max_blocks: int) -> None:
        """Forget each destination's least recently sent segments until it holds at most
        `max_blocks` (a tree's own size limit; engines are not asked)."""
        for d, lru in enumerate(self._lru):
            while self.blocks[d] > max_blocks and lru:
                node, _ = lru.popitem(last=False)
                held = self._held.get(node)
                if held is None:
                    continue
                self.blocks[d] -= held.pop(d, 0)
                if not held:
                    del self._held[node]


def key_chain(key: int, tokens: int, block_tokens: int) -> Sequence[tuple[int, int]]:
    """A length-only request as content: its key's one growing stream (chains.ChainBuilder
    does the same for the engines)."""
    return [(-2 - key, tokens // block_tokens)]
